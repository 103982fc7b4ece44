"""The one `--device` choice of every command (no torch: argparse checks it before a model loads)."""

from __future__ import annotations

import argparse
import re

DEVICE_HELP = "where the model runs: auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_choice(value: str) -> str:
    """argparse type of --device: auto, cpu, cuda or cuda:N (any case)."""
    v = value.strip().lower()
    if not _DEVICE.fullmatch(v):
        raise argparse.ArgumentTypeError(f"{value!r} is not a device; use auto, cpu, cuda or cuda:N")
    return v


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=device_choice, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help=DEVICE_HELP)


def cpu_threads() -> int | None:
    """Threads for the model on the CPU: one core fewer than the process may use, so that the
    server's event loop and its indexer keep a core. With every core in torch's pool, a busy
    indexer thread stalls the pool's spinning workers: on 2 cores, inline completions during an
    index build went from p50 120 / p99 238 ms (1 thread) to p50 279 / p99 2002 ms (2 threads),
    and idle ones were no faster (p50 105 against 108 ms; BENCHMARKS.md "Suggestions while
    indexing"). None when OMP_NUM_THREADS is set: the user chose."""
    import os

    if os.environ.get("OMP_NUM_THREADS"):
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - 1)
