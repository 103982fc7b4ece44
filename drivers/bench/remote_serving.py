"""Remote-mode benchmark: what the network hop adds, and batched throughput.

    dlm-lsp bench --remote [--model DIR] [--device cpu] [--clients 1,4,16,32]
    python -m dlm.drivers.bench.remote_serving [same options]

1. Local: LocalEngine replays typing one keystroke after another -> p50/p99.
2. Remote: the same keystrokes through RemoteEngine to a `dlm-lsp serve`
   subprocess on 127.0.0.1 -> p50/p99, and the difference to local.
3. Throughput: N concurrent clients (each its own connection and document)
   send requests back to back; the server batches their denoising steps.

Without --model and without an embedded checkpoint, a randomly initialised
model of --random-preset is used: its timings are those of the shipping
shape, but its suggestions are noise (and a random model never writes
<eom>, so every request runs its full step budget: a worst case).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from dlm.coder_model.devices import device_choice
from dlm.coder_model.quantiles import percentile
from dlm.coder_model.remote.client import parse_host_port
from dlm.coder_model.remote.listening import read_listening_address
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from dlm.drivers.command import run_command

SAMPLE = '''import os
import sys


def read_config(path):
    """Read a key=value file into a dict."""
    result = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def main(argv):
    config = read_config(argv[1])
    for key in sorted(config):
        print(key, config[key])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the remote bench; `dlm-lsp bench` may already define --model/--device."""

    def add(*names, **kw):
        try:
            parser.add_argument(*names, **kw)
        except argparse.ArgumentError:  # already defined by the host parser
            pass

    add("--model", default=None, metavar="DIR", help="checkpoint (default: embedded, else a random model)")
    add("--device", type=device_choice, default="cpu", help="device of the local run and of the served model (default cpu)")
    add("--clients", default="1,4,16,32", help="concurrent client counts for the throughput table")
    add("--requests", type=int, default=8, help="requests per client in the throughput runs")
    add("--keystrokes", type=int, default=40, help="keystrokes replayed for the latency comparison")
    add_model_overrides(add)


def add_model_overrides(add) -> None:
    """The options `_ensure_model` and `_params` read (the random model's shape, the sampler's
    overrides), declared through `add` (a parser's add_argument, or a wrapper of it)."""
    add("--random-preset", default="cpu-small", help="model shape when no checkpoint exists")
    add("--steps", type=int, default=None, help="override SamplerParams.steps")
    add("--block-len", type=int, default=None, help="override SamplerParams.block_len")
    add("--max-blocks", type=int, default=None, help="override SamplerParams.max_blocks")


def typing_prompts(n: int, path: str = "bench.py", shift: int = 0) -> list[Prompt]:
    """Keystrokes typing SAMPLE's lines, cursor-line region, windowed prefix/suffix."""
    lines = SAMPLE.splitlines(keepends=True)
    out: list[Prompt] = []
    li = 3 + shift % 10
    col = 0
    while len(out) < n:
        line = lines[li % len(lines)]
        body = line.rstrip("\n")
        if col > len(body) or not body:
            li, col = li + 1, 0
            continue
        prefix = "".join(lines[max(0, li - 40) : li])
        suffix = "".join(lines[li + 1 : li + 21])
        out.append(Prompt(prefix=prefix, region=body[:col], cursor=col, suffix=suffix, language="python",
                          path=path))
        col += 1
    return out


def _pct(values: list[float], q: float) -> float:
    """The project's percentile (q as a fraction here); nan when empty, for the tables."""
    p = percentile(values, q * 100)
    return float("nan") if p is None else p


def _ensure_model(args) -> tuple[str, str]:
    """(checkpoint dir, description)."""
    if args.model:
        return args.model, Path(args.model).name
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir

    emb = embedded_checkpoint_dir()
    if (emb / "config.json").exists():
        return str(emb), "embedded"
    from dlm.coder_model.checkpoint import save_checkpoint
    from dlm.coder_model.config import ModelConfig
    from dlm.coder_model.model import DLM
    from dlm.coder_model.tokenizer import train_tokenizer

    d = Path(tempfile.mkdtemp(prefix="dlm-bench-random-"))
    import dlm.coder_model

    src = Path(dlm.coder_model.__file__).resolve().parent  # the model package's own sources
    texts = [p.read_text(errors="replace") for p in sorted(src.rglob("*.py"))] or [SAMPLE]
    tok = train_tokenizer(iter(texts * 4), vocab_size=4096)
    cfg = ModelConfig.preset(args.random_preset, vocab_size=max(tok.vocab_size, 512))
    model = DLM(cfg, impl="reference")
    model.init_weights(0)
    save_checkpoint(model, tok, d)
    return str(d), f"random {args.random_preset} (no trained checkpoint)"


def _params(args) -> SamplerParams:
    p = SamplerParams()
    over = {k: v for k, v in (("steps", args.steps), ("block_len", args.block_len),
                              ("max_blocks", args.max_blocks)) if v is not None}
    return replace(p, **over)


def start_listening(cmd: list[str], what: str) -> tuple[subprocess.Popen, int]:
    """Starts `cmd` (a `dlm-lsp serve` on port 0) and waits for its listening line: (process, port);
    RuntimeError naming `what` when it never comes."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    address = read_listening_address(proc.stderr, 300)
    if address is None:
        proc.kill()
        raise RuntimeError(f"{what} did not start; run `{shlex.join(cmd)}` by hand to see why")
    # keep draining stderr so the server never blocks on a full pipe
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, parse_host_port(address)[1]


def _start_server(model_dir: str, device: str) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "dlm.coder_model.remote.remote_cli", "--listen", "127.0.0.1:0", "--model", model_dir,
           "--device", device, "--log-level", "warning"]
    return start_listening(cmd, "`dlm-lsp serve`")


def _replay(engine, prompts: list[Prompt], params: SamplerParams) -> tuple[list[float], int]:
    lat, tokens = [], 0
    for p in prompts:
        t0 = time.perf_counter()
        pred = engine.predict(p, params, CancelToken())
        lat.append((time.perf_counter() - t0) * 1e3)
        if pred.cancelled:
            raise RuntimeError("a benchmark request came back cancelled (connection lost?)")
        tokens += pred.tokens
    return lat, tokens


def _concurrent(engines, per_client: list[list[Prompt]], params: SamplerParams) -> tuple[list[float], int, float]:
    """Every client replays its prompts back to back, all at once: (latencies ms, tokens, wall s)."""
    lat: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(len(engines))

    def work(i: int) -> None:
        barrier.wait()
        ls, tk = _replay(engines[i], per_client[i], params)
        with lock:
            lat.extend(ls)
            tokens[0] += tk

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(engines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, tokens[0], time.perf_counter() - t0


def run_remote_bench(args: argparse.Namespace) -> int:
    from dlm.coder_model.engine import load_engine
    from dlm.coder_model.remote.client import RemoteEngine

    model_dir, model_desc = _ensure_model(args)
    params = _params(args)
    clients = [int(c) for c in str(args.clients).split(",") if c.strip()]
    prompts = typing_prompts(args.keystrokes)
    import torch

    print(f"# dlm-lsp bench --remote: model {model_desc}, device {args.device}, torch threads "
          f"{torch.get_num_threads()}, params steps={params.steps} block_len={params.block_len} "
          f"max_blocks={params.max_blocks} threshold={params.threshold}", flush=True)

    proc, port = _start_server(model_dir, args.device)
    rows = []
    try:
        # Local and remote replay the same keystrokes alternately (which one goes first alternates
        # too), so load changes on a shared machine hit both columns alike.
        local = load_engine(model_dir, args.device)
        eng = RemoteEngine("127.0.0.1", port)
        try:
            if not eng.wait_connected(60):
                raise RuntimeError(f"could not connect to the bench server: {eng.status().message}")
            _replay(local, prompts[:3], params)  # warm-up
            _replay(eng, prompts[:3], params)
            local_lat, remote_lat = [], []
            for i, p in enumerate(prompts):
                order = ((local, local_lat), (eng, remote_lat))
                for engine, sink in order if i % 2 == 0 else order[::-1]:
                    sink.extend(_replay(engine, [p], params)[0])
        finally:
            eng.close()
            local.close()
        del local

        for n in clients:
            engines = [RemoteEngine("127.0.0.1", port) for _ in range(n)]
            try:
                if not all(e.wait_connected(60) for e in engines):
                    raise RuntimeError("not every bench client could connect")
                per_client = [typing_prompts(args.requests, path=f"client{i}.py", shift=i) for i in range(n)]
                lat, tokens, wall = _concurrent(engines, per_client, params)
                rows.append((n, len(lat), wall, len(lat) / wall, tokens / wall, _pct(lat, 0.5), _pct(lat, 0.99)))
                print(f"  {n} clients done: {len(lat) / wall:.2f} req/s", file=sys.stderr, flush=True)
            finally:
                for e in engines:
                    e.close()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()

    lp50, lp99, rp50, rp99 = (_pct(local_lat, 0.5), _pct(local_lat, 0.99), _pct(remote_lat, 0.5),
                              _pct(remote_lat, 0.99))
    print("\n## Latency of one request, keystroke replay (ms)\n")
    print("| path | n | p50 | p99 | mean |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| local (LocalEngine, in-process) | {len(local_lat)} | {lp50:.1f} | {lp99:.1f} | "
          f"{statistics.fmean(local_lat):.1f} |")
    print(f"| remote (127.0.0.1, serve subprocess) | {len(remote_lat)} | {rp50:.1f} | {rp99:.1f} | "
          f"{statistics.fmean(remote_lat):.1f} |")
    print(f"| added by the hop | | {rp50 - lp50:+.1f} | {rp99 - lp99:+.1f} | "
          f"{statistics.fmean(remote_lat) - statistics.fmean(local_lat):+.1f} |")
    print("\n## Batched throughput, concurrent clients over loopback\n")
    print("| clients | requests | wall s | requests/s | tokens/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, count, wall, rps, tps, p50, p99 in rows:
        print(f"| {n} | {count} | {wall:.1f} | {rps:.2f} | {tps:.0f} | {p50:.0f} | {p99:.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command("dlm.drivers.bench.remote_serving", __doc__, add_remote_arguments, run_remote_bench, argv)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
