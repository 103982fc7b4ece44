"""Helpers of the CUDA tests (a module of its own: `conftest` names clash across test folders)."""

from __future__ import annotations

import math
import os

import torch

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


def assert_close(out: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, atol: float, what: str) -> None:
    """As tests/kernels: the kernel's max error against the fp32 truth may be at most twice the error of
    plain PyTorch in the same dtype (the baseline) plus atol; and no element may be NaN (poisoned buffer)."""
    assert out.shape == truth.shape, f"{what}: shape {tuple(out.shape)} != {tuple(truth.shape)}"
    out32 = out.float()
    n_bad = int((~torch.isfinite(out32)).sum())
    assert n_bad == 0, f"{what}: {n_bad} elements not finite (unwritten poison?)"
    err = (out32 - truth.float()).abs().max().item() if out.numel() else 0.0
    base = (baseline.float() - truth.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * base + atol, f"{what}: kernel error {err:.3g} > 2 x torch-{out.dtype} error {base:.3g} + {atol}"
    rel = (out32 - truth.float()).norm().item() / max(truth.float().norm().item(), 1e-30)
    limit = 1e-2 if out.dtype in (torch.bfloat16, torch.float16) else 1e-4
    assert rel <= limit, f"{what}: relative error {rel:.3g} > {limit} (METHOD.md bands)"


def rms_norm_lowp(x, w, eps, r):
    """RMSNorm the plain way, every op in the input dtype (the baseline)."""
    s = x if r is None else x + r
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w, s


def rotary_lowp(q, k, cos, sin, positions):
    c, s = cos[positions].to(q.dtype), sin[positions].to(q.dtype)
    c, s = (c[None, None], s[None, None]) if c.dim() == 2 else (c[:, None], s[:, None])

    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    return rot(q), rot(k)


def attention_lowp(q, k, v, context_len, kv_cache, bidirectional):
    """Attention the plain way in the input dtype (flash-attention's attention_ref, upcast=False)."""
    from dlm.kernels import reference as ref

    if kv_cache is not None:
        k = torch.cat([kv_cache[0], k], dim=2)
        v = torch.cat([kv_cache[1], v], dim=2)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scores = (q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    mask = ref.attention_mask(q.shape[2], k.shape[2], context_len, bidirectional, device=q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v
