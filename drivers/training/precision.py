"""Pick fp32 or bf16 by measuring this machine, not by assumption.

bf16 autocast is several times faster than fp32 on CPUs with AMX (Sapphire
Rapids and later) and on every CUDA GPU, but ~10x slower on CPUs without
native bf16 matmuls (e.g. AMD EPYC with AVX2 only), where it is emulated.
`choose_dtype("auto", ...)` times one linear layer of the model's size
(forward and, for training, backward) in each dtype and keeps the faster.
Used by the trainer and the evaluator; `--dtype fp32|bf16` skips the measurement.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

DTYPES = ("auto", "fp32", "bf16")


def time_linear(dtype: str, dim: int, out_dim: int, tokens: int, device: torch.device, backward: bool,
                reps: int = 3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of x (tokens, dim) @ W (dim, out_dim) [+ backward] under `dtype` autocast."""
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, dim, generator=gen).to(dev).requires_grad_(backward)
    lin = torch.nn.Linear(dim, out_dim, bias=False).to(dev)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def once() -> None:
        with amp:
            y = lin(x)  # (tokens, out_dim)
        if backward:
            y.float().sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    once()  # warm-up: kernel selection, allocator
    t0 = clock()
    for _ in range(reps):
        once()
    return (clock() - t0) / reps


def pick_faster(seconds: dict[str, float]) -> str:
    """The dtype with the smaller time; fp32 on a tie (exact, and no casts)."""
    return "bf16" if seconds["bf16"] < seconds["fp32"] else "fp32"


def choose_dtype(requested: str, dim: int, out_dim: int, tokens: int, device: torch.device,
                 backward: bool = True, log: Callable[[str], None] | None = None,
                 timer: Callable[[str], float] | None = None) -> str:
    """'fp32' or 'bf16': as requested, or for 'auto' whichever the measurement finds faster.

    `timer(dtype) -> seconds` replaces the measurement (tests inject figures).
    """
    if requested not in DTYPES:
        raise ValueError(f"--dtype {requested!r}: use one of {', '.join(DTYPES)}")
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if requested != "auto":
        log(f"[dtype] {requested} (as requested)")
        return requested
    timer = timer or (lambda d: time_linear(d, dim, out_dim, tokens, device, backward))
    seconds = {d: timer(d) for d in ("fp32", "bf16")}
    choice = pick_faster(seconds)
    log(f"[dtype] linear {tokens}x{dim}->{out_dim}{' +backward' if backward else ''} on {torch.device(device).type}: "
        f"fp32 {seconds['fp32'] * 1e3:.2f} ms, bf16 {seconds['bf16'] * 1e3:.2f} ms -> {choice}")
    return choice
