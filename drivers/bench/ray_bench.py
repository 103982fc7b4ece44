"""Plain `dlm-lsp serve` against `dlm-lsp serve --engine ray` (1 and 2 replicas), in one run.

    python -m dlm.drivers.bench.ray_bench [--model DIR] [--clients 4] [--requests 10]
                                             [--keystrokes 40] [--replica-threads 1]

Needs the `ray` extra (pip install -e '.[ray]'). Starts one local Ray cluster in this
process, then, one after another, three servers on 127.0.0.1, each a subprocess that the
clients reach over TCP with RemoteEngine, as an editor does:
  plain    `dlm-lsp serve` (the model in the server process)
  ray x1   `dlm-lsp serve --engine ray --replicas 1` (ingress + 1 Ray Serve replica)
  ray x2   the same with 2 replicas
1. Overhead: one client replays --keystrokes keystrokes, one at a time, against plain and
   ray x1 alternately (so load changes on a shared machine hit both alike): p50/p99, the
   difference and the ratio (the target is <= 5 ms p50 added); then the same requests split
   into the model's compute (the server's own prefill + denoise times) and the rest.
2. Throughput: --clients clients (each its own connection and document) send --requests
   requests back to back, all at once: requests/s, p50, p99, for each of the three.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from dlm.coder_model.types import CancelToken
from dlm.drivers.bench.remote_serving import (
    _concurrent,
    _ensure_model,
    _params,
    _pct,
    _replay,
    add_model_overrides,
    start_listening,
    typing_prompts,
)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _connect(port: int, n: int):
    from dlm.coder_model.remote.client import RemoteEngine

    engines = [RemoteEngine("127.0.0.1", port, request_timeout=120) for _ in range(n)]
    if not all(e.wait_connected(120) for e in engines):
        raise RuntimeError(f"not every bench client could connect to 127.0.0.1:{port}: {engines[0].status().message}")
    return engines


def _throughput(port: int, args, params) -> tuple:
    engines = _connect(port, args.clients)
    try:
        per_client = [typing_prompts(args.requests, path=f"client{i}.py", shift=i) for i in range(args.clients)]
        _concurrent(engines, [p[:2] for p in per_client], params)  # warm-up: caches, measured step times
        lat, _tokens, wall = _concurrent(engines, per_client, params)
    finally:
        for e in engines:
            e.close()
    return len(lat), wall, len(lat) / wall, _pct(lat, 0.5), _pct(lat, 0.99)


def _timed(engine, prompt, params) -> tuple[float, float]:
    """(round trip ms, the model's ms: the server's prefill + denoise) of one request."""
    t0 = time.perf_counter()
    pred = engine.predict(prompt, params, CancelToken())
    lat = (time.perf_counter() - t0) * 1e3
    if pred.cancelled:
        raise RuntimeError("a benchmark request came back cancelled (connection lost?)")
    return lat, pred.prefill_ms + pred.denoise_ms


def run(args: argparse.Namespace) -> int:
    import ray

    model_dir, model_desc = _ensure_model(args)
    params = _params(args)
    serve_cmd = [sys.executable, "-m", "dlm.coder_model.remote.remote_cli", "--listen", "127.0.0.1:0",
                 "--model", model_dir, "--device", "cpu", "--log-level", "warning"]
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, logging_level="ERROR")
    address = ray.get_runtime_context().gcs_address
    ray_cmd = serve_cmd + ["--engine", "ray", "--ray-address", address, "--replica-cpus", "1",
                           "--replica-threads", str(args.replica_threads)]
    print(f"# ray_bench: model {model_desc}, cpu, {os.cpu_count()} CPUs seen, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}, replica threads {args.replica_threads}, ray {ray.__version__}, "
          f"params steps={params.steps} block_len={params.block_len} max_blocks={params.max_blocks}", flush=True)
    rows = {}
    prompts = typing_prompts(args.keystrokes)
    try:
        plain, plain_port = start_listening(serve_cmd, "dlm-lsp serve")
        ray1, ray1_port = start_listening(ray_cmd + ["--replicas", "1"], "dlm-lsp serve --engine ray --replicas 1")
        try:
            (p_eng,), (r_eng,) = _connect(plain_port, 1), _connect(ray1_port, 1)
            try:
                _replay(p_eng, prompts[:3], params)  # warm-up
                _replay(r_eng, prompts[:3], params)
                plain_lat, ray_lat, plain_model, ray_model = [], [], [], []
                for i, p in enumerate(prompts):
                    order = ((p_eng, plain_lat, plain_model), (r_eng, ray_lat, ray_model))
                    for engine, sink, model_sink in order if i % 2 == 0 else order[::-1]:
                        lat, model_ms = _timed(engine, p, params)
                        sink.append(lat)
                        model_sink.append(model_ms)
            finally:
                p_eng.close()
                r_eng.close()
            print("  overhead done", file=sys.stderr, flush=True)
            if args.clients > 0:
                rows["plain `dlm-lsp serve`"] = _throughput(plain_port, args, params)
                print("  plain throughput done", file=sys.stderr, flush=True)
                rows["ray, 1 replica"] = _throughput(ray1_port, args, params)
                print("  ray x1 throughput done", file=sys.stderr, flush=True)
        finally:
            _stop(plain)
            _stop(ray1)
        if args.clients > 0:
            time.sleep(2)  # the first ingress deletes its application on exit
            ray2, ray2_port = start_listening(ray_cmd + ["--replicas", "2"], "dlm-lsp serve --engine ray --replicas 2")
            try:
                rows["ray, 2 replicas"] = _throughput(ray2_port, args, params)
            finally:
                _stop(ray2)
    finally:
        ray.shutdown()

    pp50, pp99, rp50, rp99 = _pct(plain_lat, 0.5), _pct(plain_lat, 0.99), _pct(ray_lat, 0.5), _pct(ray_lat, 0.99)
    print("\n## One request at a time, keystroke replay (ms)\n")
    print("| server | n | p50 | p99 | mean |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| plain `dlm-lsp serve` | {len(plain_lat)} | {pp50:.1f} | {pp99:.1f} | {statistics.fmean(plain_lat):.1f} |")
    print(f"| `--engine ray`, 1 replica | {len(ray_lat)} | {rp50:.1f} | {rp99:.1f} | {statistics.fmean(ray_lat):.1f} |")
    print(f"| added by Ray Serve | | {rp50 - pp50:+.1f} | {rp99 - pp99:+.1f} | "
          f"{statistics.fmean(ray_lat) - statistics.fmean(plain_lat):+.1f} |")
    print(f"| ratio ray / plain | | {rp50 / pp50:.2f} | {rp99 / pp99:.2f} | "
          f"{statistics.fmean(ray_lat) / statistics.fmean(plain_lat):.2f} |")
    # Where the added time goes: the scheduler's own prefill + denoising time of each request (the
    # model's compute, as the server reports it) and the rest of the round trip (hops, queues, network).
    print("\n## Split of the same requests: the model's compute (the scheduler's prefill + denoise) and the rest\n")
    print("| server | model p50 | rest of the round trip p50 |")
    print("| --- | --- | --- |")
    plain_rest = [a - b for a, b in zip(plain_lat, plain_model)]
    ray_rest = [a - b for a, b in zip(ray_lat, ray_model)]
    print(f"| plain `dlm-lsp serve` | {_pct(plain_model, 0.5):.1f} | {_pct(plain_rest, 0.5):.1f} |")
    print(f"| `--engine ray`, 1 replica | {_pct(ray_model, 0.5):.1f} | {_pct(ray_rest, 0.5):.1f} |")
    print(f"| added by Ray Serve | {_pct(ray_model, 0.5) - _pct(plain_model, 0.5):+.1f} | "
          f"{_pct(ray_rest, 0.5) - _pct(plain_rest, 0.5):+.1f} |")
    if not rows:
        return 0
    print(f"\n## Throughput, {args.clients} clients sending back to back ({args.requests} requests each)\n")
    print("| server | requests | wall s | requests/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (count, wall, rps, p50, p99) in rows.items():
        print(f"| {name} | {count} | {wall:.1f} | {rps:.2f} | {p50:.0f} | {p99:.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlm.drivers.bench.ray_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, metavar="DIR", help="checkpoint (default: the embedded one)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients in the throughput runs (0: measure the overhead only)")
    parser.add_argument("--requests", type=int, default=10, help="requests per client in the throughput runs")
    parser.add_argument("--keystrokes", type=int, default=40, help="keystrokes replayed for the overhead")
    parser.add_argument("--replica-threads", type=int, default=1, help="torch threads per replica (default 1)")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs the local Ray cluster offers (default 2)")
    add_model_overrides(parser.add_argument)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
