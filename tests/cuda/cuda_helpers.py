"""Helpers of the CUDA tests (a module of its own: `conftest` names clash across test folders)."""

from __future__ import annotations

import os

# Real shapes: the embedded checkpoint (cpu-small preset) and Qwen2.5-0.5B
# name: (dim, n_heads, n_kv_heads, head_dim, vocab)
SHAPES = {
    "embedded": (256, 8, 2, 32, 8192),
    "qwen2.5-0.5b": (896, 14, 2, 64, 151936),
}


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a server subprocess: compiled kernels (no interpreter), one CPU thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DLM_KERNELS")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env

