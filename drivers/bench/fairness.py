"""Fairness soak of `dlm-lsp serve`: a normal client's latency alone, then beside a heavy client.

    python -m dlm.drivers.bench.fairness [--model DIR] [--device cpu] [--requests 60]

1. Starts `dlm-lsp serve` on 127.0.0.1 (the embedded checkpoint unless --model).
2. The heavy client (one connection) sends a request far over the caps (block_len
   1024 x 3 blocks x 4096 steps, threshold 1) and reports how it is answered.
3. --rounds rounds of: solo, a normal client (its own connection) replays typing keystrokes
   one after another with the default sampler and the LSP's default deadline, pausing
   --think-ms between them, as an editor does; then shared, the same keystrokes while the
   heavy client keeps --heavy-inflight requests in flight (--heavy-block-len,
   --heavy-steps, threshold 1.0 so every step runs, no deadline), back to back. Solo and
   shared alternate so that other load on a shared machine falls on both alike.
4. p50/p99 of each, and the ratio of the shared p99 to the solo p99 (the target: within 2x).

Latency is the wall time of `RemoteEngine.predict` on the client, so it includes the
network hop, queueing on the server and the passes of other clients.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import threading
import time

from dlm.coder_model.limits import DEFAULT_DEADLINE_MS
from dlm.coder_model.types import CancelToken, SamplerParams
from dlm.drivers.bench.remote_serving import _ensure_model, _pct, start_listening, typing_prompts
from dlm.drivers.command import run_command

OVER_CAPS = SamplerParams(block_len=1024, max_blocks=3, steps=4096, threshold=1.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR", help="checkpoint (default: the embedded one)")
    parser.add_argument("--device", default="cpu", help="device of the served model (default cpu)")
    parser.add_argument("--requests", type=int, default=60, help="normal-client keystrokes per phase (default 60)")
    parser.add_argument("--rounds", type=int, default=4, help="solo/shared alternations (default 4)")
    parser.add_argument("--think-ms", type=float, default=50.0, help="pause between two keystrokes (default 50)")
    parser.add_argument("--deadline-ms", type=float, default=DEFAULT_DEADLINE_MS,
                        help=f"the normal client's deadline (default {DEFAULT_DEADLINE_MS}, as the LSP's)")
    parser.add_argument("--heavy-inflight", type=int, default=20, help="heavy requests in flight (default 20)")
    parser.add_argument("--heavy-block-len", type=int, default=128, help="heavy block_len (default 128)")
    parser.add_argument("--heavy-steps", type=int, default=16, help="heavy steps (default 16)")
    parser.add_argument("--heavy-max-blocks", type=int, default=1, help="heavy max_blocks (default 1)")
    parser.add_argument("--warmup", type=int, default=8, help="normal-client requests before measuring (default 8)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--serve-args", default="", metavar="ARGS",
                        help="more `dlm-lsp serve` options, e.g. '--max-batch-tokens 4096' (batching on a CPU)")


def start_server(model_dir: str, device: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", "127.0.0.1:0", "--model", model_dir,
           "--device", device, "--log-level", "warning", *extra]
    return start_listening(cmd, "`dlm-lsp serve`")


def _normal_phase(engine, prompts, params: SamplerParams, deadline_ms: float, think_s: float, into: dict) -> None:
    for p in prompts:
        t0 = time.perf_counter()
        pred = engine.predict(p, params, CancelToken(), time.monotonic() + deadline_ms / 1000.0)
        into.setdefault("lat", []).append((time.perf_counter() - t0) * 1000)
        into.setdefault("tokens", []).append(pred.tokens)
        into["empty"] = into.get("empty", 0) + (not pred.text or pred.cancelled)
        into["late"] = into.get("late", 0) + bool(pred.late)
        time.sleep(think_s)


def _figures(phase: dict) -> dict:
    lat, tokens = phase["lat"], phase["tokens"]
    return {"n": len(lat), "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99), "max_ms": max(lat),
            "mean_tokens": sum(tokens) / len(tokens), "empty": phase["empty"], "late": phase["late"]}


class HeavyClient:
    """One connection, `inflight` threads sending `params` requests back to back (no deadline)."""

    def __init__(self, port: int, params: SamplerParams, inflight: int) -> None:
        from dlm.coder_model.remote.client import RemoteEngine

        self.engine = RemoteEngine("127.0.0.1", port)
        self.params = params
        self.inflight = inflight
        self.stop = threading.Event()
        self.running = threading.Event()  # cleared: the threads send nothing new (pause)
        self.active = 0  # requests in flight
        self.completed = 0
        self.steps = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def probe(self, params: SamplerParams) -> tuple[bool, str]:
        """(answered with a result, the server's message when it was not)."""
        pred = self.engine.predict(typing_prompts(1, path="heavy-probe.py")[0], params, CancelToken())
        return (not pred.cancelled and pred.steps > 0), self.engine.status().message

    def _loop(self, i: int) -> None:
        prompts = typing_prompts(200, path=f"heavy{i}.py", shift=i)
        k = 0
        while not self.stop.is_set():
            if not self.running.wait(0.1):
                continue
            with self._lock:
                self.active += 1
            pred = self.engine.predict(prompts[k % len(prompts)], self.params, CancelToken())
            k += 1
            with self._lock:
                self.active -= 1
                if pred.steps > 0:
                    self.completed += 1
                    self.steps += pred.steps
                else:
                    self.refused += 1

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(self.inflight)]
        for t in self._threads:
            t.start()

    def resume(self) -> None:
        self.running.set()
        time.sleep(1.0)  # its requests fill the server first

    def pause(self, timeout_s: float = 120.0) -> None:
        """Send nothing new and wait for the requests in flight to be answered."""
        self.running.clear()
        give_up = time.monotonic() + timeout_s
        while self.active and time.monotonic() < give_up:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.engine.close()
        for t in self._threads:
            t.join(30)


def run(args: argparse.Namespace) -> int:
    from dlm.coder_model.remote.client import RemoteEngine

    model_dir, model_desc = _ensure_model(args)
    proc, port = start_server(model_dir, args.device, shlex.split(args.serve_args))
    normal = RemoteEngine("127.0.0.1", port)
    heavy = None
    try:
        if not normal.wait_connected(120):
            raise RuntimeError(f"could not connect to the server: {normal.status().message}")
        params = SamplerParams()
        think_s = args.think_ms / 1000.0
        _normal_phase(normal, typing_prompts(args.warmup, path="warm.py"), params, args.deadline_ms, 0.0, {})

        heavy_params = SamplerParams(block_len=args.heavy_block_len, steps=args.heavy_steps,
                                     max_blocks=args.heavy_max_blocks, threshold=1.0)
        heavy = HeavyClient(port, heavy_params, args.heavy_inflight)
        if not heavy.engine.wait_connected(60):
            raise RuntimeError("the heavy client could not connect")
        refused_ok, refused_msg = heavy.probe(OVER_CAPS)
        heavy_ok, heavy_msg = heavy.probe(heavy_params)
        heavy.start()
        solo_raw: dict = {}
        shared_raw: dict = {}
        elapsed, done0, steps0, refused0 = 0.0, 0, 0, 0
        per_round = max(1, args.requests // max(1, args.rounds))
        for r in range(max(1, args.rounds)):
            prompts = typing_prompts(per_round, path=f"normal{r}.py", shift=r)
            _normal_phase(normal, prompts, params, args.deadline_ms, think_s, solo_raw)
            heavy.resume()
            t0, c0, s0, f0 = time.perf_counter(), heavy.completed, heavy.steps, heavy.refused
            _normal_phase(normal, prompts, params, args.deadline_ms, think_s, shared_raw)
            elapsed += time.perf_counter() - t0
            done0 += heavy.completed - c0
            steps0 += heavy.steps - s0
            refused0 += heavy.refused - f0
            heavy.pause()
        solo, shared = _figures(solo_raw), _figures(shared_raw)
        heavy_figures = {"params": vars_of(heavy_params), "inflight": args.heavy_inflight,
                         "accepted": heavy_ok, "message_if_refused": "" if heavy_ok else heavy_msg,
                         "completed_during_shared": done0,
                         "refused_during_shared": refused0,
                         "steps_per_s_during_shared": steps0 / elapsed}
    finally:
        if heavy is not None:
            heavy.close()
        normal.close()
        proc.terminate()
        proc.wait(30)
    ratio = shared["p99_ms"] / solo["p99_ms"] if solo["p99_ms"] else float("nan")
    print(f"model: {model_desc}, device {args.device}, serve {args.serve_args or '(defaults)'}; {args.rounds} rounds; "
          f"normal client: default SamplerParams, deadline "
          f"{args.deadline_ms:g} ms, {args.think_ms:g} ms between keystrokes")
    print(f"request over the caps {vars_of(OVER_CAPS)}: "
          f"{'ANSWERED' if refused_ok else 'refused: ' + refused_msg}")
    print(f"heavy client: {args.heavy_inflight} in flight, {vars_of(heavy_params)}: "
          f"{'accepted' if heavy_ok else 'REFUSED: ' + heavy_msg}; {heavy_figures['completed_during_shared']} "
          f"requests answered ({heavy_figures['refused_during_shared']} not), "
          f"{heavy_figures['steps_per_s_during_shared']:.1f} steps/s during the shared phase")
    print()
    print("| normal client | n | p50 ms | p99 ms | max ms | mean tokens | empty | late |")
    print("|---|---|---|---|---|---|---|---|")
    for name, f in (("alone", solo), ("beside the heavy client", shared)):
        print(f"| {name} | {f['n']} | {f['p50_ms']:.0f} | {f['p99_ms']:.0f} | {f['max_ms']:.0f} | "
              f"{f['mean_tokens']:.1f} | {f['empty']} | {f['late']} |")
    print()
    print(f"p99 beside the heavy client / p99 alone = {ratio:.2f} (target: within 2)")
    if args.json:
        print(json.dumps({"solo": solo, "shared": shared, "ratio_p99": ratio, "heavy": heavy_figures,
                          "over_caps_request_answered": refused_ok, "over_caps_request_message": refused_msg,
                          "machine": platform.processor() or platform.machine()}, indent=2))
    return 0


def vars_of(p: SamplerParams) -> dict:
    return {"block_len": p.block_len, "max_blocks": p.max_blocks, "steps": p.steps, "threshold": p.threshold}


def main(argv: list[str] | None = None) -> int:
    return run_command("dlm.drivers.bench.fairness", __doc__.split("\n")[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
