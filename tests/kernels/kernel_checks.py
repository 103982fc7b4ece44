"""How a Triton kernel is checked against the reference, shared by tests/kernels (interpreter,
CPU tensors, odd sizes) and tests/cuda (compiled, real shapes; its conftest puts this folder
on sys.path). A module of its own: `conftest` names clash across test folders.

Comparison as in flash-attention's tests: the truth is the reference op on the inputs
upcast to fp32; the kernel's max error against it may be at most twice the error of a
plain PyTorch computation in the same dtype (the `*_lowp` baselines), plus a small atol.
Importing this sets no Triton mode: each conftest chooses interpreted or compiled kernels.
"""

from __future__ import annotations

import math
import os

import torch
from dlm.kernels import reference as ref


def assert_close(
    out: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, atol: float, what: str,
    relative_band: bool = False,
) -> None:  # fmt: skip
    """The kernel's max error may be at most twice the baseline's plus atol, and no element may be
    NaN (an unwritten, poisoned one). With `relative_band`, the relative error must also stay in
    METHOD.md's band for the dtype (the real-shape GPU tests)."""
    assert out.shape == truth.shape, f"{what}: shape {tuple(out.shape)} != {tuple(truth.shape)}"
    out32 = out.float()
    n_bad = int((~torch.isfinite(out32)).sum())
    assert n_bad == 0, f"{what}: {n_bad} elements not finite (unwritten poison?)"
    err = (out32 - truth.float()).abs().max().item() if out.numel() else 0.0
    base = (baseline.float() - truth.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * base + atol, f"{what}: kernel error {err:.3g} > 2 x torch-{out.dtype} error {base:.3g} + {atol}"
    if relative_band:
        rel = (out32 - truth.float()).norm().item() / max(truth.float().norm().item(), 1e-30)
        limit = 1e-2 if out.dtype in (torch.bfloat16, torch.float16) else 1e-4
        assert rel <= limit, f"{what}: relative error {rel:.3g} > {limit} (METHOD.md bands)"


def poisoned_empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A stand-in for triton_ops._empty: NaN (floats) or -7777 (ints), so an element a kernel
    forgets to write fails the comparison."""
    t = torch.empty(shape, dtype=dtype, device=device)
    t.fill_(float("nan") if dtype.is_floating_point else -7777)
    return t


def seed_torch() -> int:
    """Fresh random inputs per test, reproducible from the printed seed (shown on failure)."""
    seed = int(os.environ.get("DLM_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(seed)
    print(f"torch seed {seed} (rerun with DLM_TEST_SEED={seed})")
    return seed


# -- the baselines: each op the plain way, every op in the input dtype -----------------------------
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


def attention_lowp(q, k, v, context_len, kv_cache, bidirectional, scale=None):
    """Attention the plain way in the input dtype (flash-attention's attention_ref, upcast=False)."""
    if kv_cache is not None:
        k = torch.cat([kv_cache[0], k], dim=2)
        v = torch.cat([kv_cache[1], v], dim=2)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-1, -2)
    mask = ref.attention_mask(q.shape[2], k.shape[2], context_len, bidirectional, device=q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


# -- one op of `ops` (dlm.kernels.triton_ops) against the reference and the baseline --------------
def check_rms_norm(ops, x, w, eps: float, r, relative_band: bool = False) -> None:
    normed, summed = ops.rms_norm(x, w, eps, r)
    t_normed, t_summed = ref.rms_norm(x.float(), w.float(), eps, None if r is None else r.float())
    b_normed, b_summed = rms_norm_lowp(x, w, eps, r)
    assert normed.dtype == x.dtype and summed.dtype == x.dtype
    assert_close(normed, t_normed, b_normed, 1e-5, "rms_norm normed", relative_band)
    assert_close(summed, t_summed, b_summed, 1e-6, "rms_norm summed", relative_band)
    # the residual stream must be exactly `x + residual` in the dtype (it is carried to the next layer)
    assert torch.equal(summed, ref.rms_norm(x, w, eps, r)[1])


def check_rotary(ops, q, k, cos, sin, positions, relative_band: bool = False) -> None:
    qo, ko = ops.apply_rotary(q, k, cos, sin, positions)
    tq, tk = ref.apply_rotary(q.float(), k.float(), cos, sin, positions)
    bq, bk = rotary_lowp(q, k, cos, sin, positions)
    assert qo.dtype == q.dtype and ko.dtype == k.dtype
    assert_close(qo, tq, bq, 1e-6, "rotary q", relative_band)
    assert_close(ko, tk, bk, 1e-6, "rotary k", relative_band)


def check_attention(
    ops, q, k, v, cache, context_len: int, bidirectional: bool, n_splits: int | None, atol: float,
    relative_band: bool = False,
) -> None:  # fmt: skip
    """q (B, Hq, Tq, D), k/v (B, Hk, Tq, D), cache None or (k, v) each (B, Hk, Tc, D)."""
    out = ops.attention(q, k, v, context_len=context_len, kv_cache=cache, bidirectional=bidirectional,
                        n_splits=n_splits)
    up = None if cache is None else (cache[0].float(), cache[1].float())
    truth = ref.attention(q.float(), k.float(), v.float(), context_len=context_len, kv_cache=up,
                          bidirectional=bidirectional)
    base = attention_lowp(q, k, v, context_len, cache, bidirectional)
    assert out.dtype == q.dtype
    assert_close(out, truth, base, atol, "attention", relative_band)
