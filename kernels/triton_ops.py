"""Triton kernels for the denoiser's ops (docs/architecture.md §6).

Each public function here has the signature and semantics of the function of
the same name in `dlm.kernels.reference` (the spec). The public launchers check
shapes, dtypes and strides and then call private `@triton.jit` kernels.

The kernels run on CUDA tensors, and on CPU tensors in the Triton interpreter
when TRITON_INTERPRET=1 is set before this module is imported (the decorator
decides at definition time whether a kernel is compiled or interpreted). The
interpreter mis-multiplies bf16 in `tl.dot`, so in interpreter mode every dot
operand is cast to fp32 first (`DOT_F32`); on a GPU the dots take bf16/fp16
operands with fp32 accumulation, and fp32 inputs use IEEE fp32 dots (not TF32)
so that fp32 results are comparable with PyTorch's fp32 matmul.

Block sizes and warp counts are tunables (`TUNING`), chosen for an H100 at the
shapes of a denoising step (a block of 16-64 masked slots against a cached
context of a few thousand tokens, head_dim 64/128, vocab 32k-152k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Decided once, when the kernels below are defined (see module docstring).
INTERPRET: bool = bool(triton.knobs.runtime.interpret)


# The interpreter truncates fp32 -> bf16 (GPU rounds to nearest even); round by
# hand there so interpreter results carry the same rounding as the GPU's.
_MANUAL_BF16 = tl.constexpr(INTERPRET)


@triton.jit
def _cast(x, dtype: tl.constexpr):
    if _MANUAL_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even on the dropped half
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@dataclass
class Tuning:
    """Launch parameters. Defaults target an H100; override for experiments."""

    attn_block_m: int = 64  # query rows (queries x grouped heads) per program
    attn_block_n: int = 64  # keys per inner iteration
    attn_warps: int = 4
    attn_stages: int = 2
    # Split the key range over several programs (flash-decoding) when a
    # (batch, kv-head, row-block) grid alone cannot fill the GPU.
    attn_min_keys_per_split: int = 256
    rms_warps_small: int = 4  # d <= 1024
    rms_warps_large: int = 8
    rope_block_t: int = 16
    rope_warps: int = 4
    unmask_block_m: int = 16  # masked slots per program (tl.dot needs >= 16)
    unmask_block_v: int = 128  # vocab columns per tile
    unmask_block_k: int = 64  # hidden dims per dot
    unmask_warps: int = 4
    unmask_stages: int = 3
    # Programs to aim for across the vocab (the LM head is memory bound: every
    # SM must stream its share of the weight).
    target_programs: int = 264


TUNING = Tuning()


def _empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer a kernel writes comes from here (tests poison it to catch unwritten elements)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a few splits still exercise the combine path


def _check_device(*tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"tensors on different devices: {dev} and {t.device}; move them to one device")
    if dev.type != "cuda" and not INTERPRET:
        raise RuntimeError(
            f"Triton kernels got {dev.type} tensors but the interpreter is off: set TRITON_INTERPRET=1 "
            "before dlm.kernels.triton_ops is first imported, or use impl='reference' off the GPU"
        )


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products, as torch.matmul does by default.
    return "ieee" if dtype == torch.float32 else "tf32"


_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; the kernels take float32, bfloat16 or float16")


# ----------------------------------------------------------------------------
# RMSNorm fused with the residual add
# ----------------------------------------------------------------------------


@triton.jit
def _rms_norm_kernel(
    X, R, W, Y, S,
    d, s_x, s_r, s_y, s_s, eps,
    HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program per row; the whole row sits in registers (d <= 8192)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cm = cols < d
    x = tl.load(X + row * s_x + cols, mask=cm, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * s_r + cols, mask=cm, other=0.0)
        # the add rounds to the input dtype, like `x + residual` in torch
        summed = _cast(x.to(tl.float32) + r.to(tl.float32), S.dtype.element_ty)
        tl.store(S + row * s_s + cols, summed, mask=cm)
        h = summed.to(tl.float32)
    else:
        h = x.to(tl.float32)
    ms = tl.sum(h * h, axis=0) / d
    w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
    y = h * (1.0 / tl.sqrt(ms + eps)) * w
    tl.store(Y + row * s_y + cols, _cast(y, Y.dtype.element_ty), mask=cm)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """See reference.rms_norm. x, residual: (..., d); weight: (d,)."""
    _check_device(x, weight, *([] if residual is None else [residual]))
    _check_float("x", x)
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match the last dim of x ({d})")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}"
        )
    if d > 16384:
        raise ValueError(f"rms_norm kernel holds a row in registers; d={d} > 16384 is not supported")
    x2 = x.reshape(-1, d)  # (rows, d); a view for contiguous rows
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight.contiguous()
    rows = x2.shape[0]
    y = _empty((rows, d), x.dtype, x.device)
    if residual is not None:
        r2 = residual.reshape(-1, d)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        s = _empty((rows, d), x.dtype, x.device)
    else:
        r2, s = x2, x2  # unused by the kernel (HAS_RES=False)
    if rows > 0:
        block_d = triton.next_power_of_2(d)
        _rms_norm_kernel[(rows,)](
            x2, r2, weight, y, s,
            d, x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), float(eps),
            HAS_RES=residual is not None, BLOCK_D=block_d,
            num_warps=TUNING.rms_warps_small if d <= 1024 else TUNING.rms_warps_large,
        )
    summed = x if residual is None else s.view(x.shape)
    return y.view(x.shape), summed


# ----------------------------------------------------------------------------
# Rotary embedding (half-split convention)
# ----------------------------------------------------------------------------


@triton.jit
def _rope_tile(
    X, O, b, h, t0, s_xb, s_xh, s_xt, s_ob, s_oh, s_ot, c, s, offs_t, offs_h, tmask, HALF,
):
    # x1 = x[..., :HALF], x2 = x[..., HALF:]; out = [x1 c - x2 s, x2 c + x1 s]
    t = t0 + offs_t
    m = tmask[:, None] & (offs_h[None, :] < HALF)
    xb = X + b * s_xb + h * s_xh + t[:, None] * s_xt + offs_h[None, :]
    x1 = tl.load(xb, mask=m, other=0.0)
    x2 = tl.load(xb + HALF, mask=m, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    ob = O + b * s_ob + h * s_oh + t[:, None] * s_ot + offs_h[None, :]
    tl.store(ob, _cast(x1f * c - x2f * s, O.dtype.element_ty), mask=m)
    tl.store(ob + HALF, _cast(x2f * c + x1f * s, O.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, POS,
    Hq, Hk, T, HALF,
    s_qb, s_qh, s_qt, s_kb, s_kh, s_kt,
    s_qob, s_qoh, s_qot, s_kob, s_koh, s_kot,
    s_cos, s_pb,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # grid: (B * (Hq + Hk), cdiv(T, BLOCK_T)); q heads first, then k heads
    pid = tl.program_id(0)
    H = Hq + Hk
    b = (pid // H).to(tl.int64)
    h = pid % H
    t0 = tl.program_id(1) * BLOCK_T
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    tmask = (t0 + offs_t) < T
    pos = tl.load(POS + b * s_pb + t0 + offs_t, mask=tmask, other=0)  # (BLOCK_T,)
    cm = tmask[:, None] & (offs_h[None, :] < HALF)
    c = tl.load(COS + pos[:, None] * s_cos + offs_h[None, :], mask=cm, other=0.0)
    s = tl.load(SIN + pos[:, None] * s_cos + offs_h[None, :], mask=cm, other=0.0)
    if h < Hq:
        _rope_tile(Q, QO, b, h, t0, s_qb, s_qh, s_qt, s_qob, s_qoh, s_qot, c, s, offs_t, offs_h, tmask, HALF)
    else:
        _rope_tile(K, KO, b, h - Hq, t0, s_kb, s_kh, s_kt, s_kob, s_koh, s_kot, c, s, offs_t, offs_h, tmask,
                   HALF)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """See reference.apply_rotary. q: (B, Hq, T, D), k: (B, Hk, T, D), cos/sin: (P, D/2)."""
    _check_device(q, k, cos, sin, positions)
    _check_float("q", q)
    _check_float("k", k)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be (B, H, T, D); got {tuple(q.shape)} and {tuple(k.shape)}")
    B, Hq, T, D = q.shape
    if k.shape[0] != B or k.shape[2] != T or k.shape[3] != D:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in B, T or D")
    if D % 2:
        raise ValueError(f"rotary needs an even head_dim; got {D}")
    half = D // 2
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != half:
        raise ValueError(f"cos/sin must both be (P, {half}); got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if positions.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"positions must be int64 or int32, got {positions.dtype}")
    if positions.dim() == 1:
        if positions.shape[0] != T:
            raise ValueError(f"positions has {positions.shape[0]} entries for T={T}")
        pos, s_pb = positions.contiguous(), 0
    elif positions.dim() == 2 and tuple(positions.shape) == (B, T):
        pos = positions.contiguous()
        s_pb = pos.stride(0)
    else:
        raise ValueError(f"positions must be (T,) or (B, T) = ({B}, {T}); got {tuple(positions.shape)}")
    # cos/sin are fp32 tables in the reference; the kernel reads them as fp32
    cos = cos.float().contiguous()
    sin = sin.float().contiguous()
    # any strides for B, H, T (e.g. a transposed projection), unit stride on D
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    Hk = k.shape[1]
    qo = _empty(q.shape, q.dtype, q.device)
    ko = _empty(k.shape, k.dtype, k.device)
    if B * T == 0:
        return qo, ko
    block_t = TUNING.rope_block_t
    grid = (B * (Hq + Hk), triton.cdiv(T, block_t))
    _rope_kernel[grid](
        q, k, qo, ko, cos, sin, pos,
        Hq, Hk, T, half,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos.stride(0), s_pb,
        BLOCK_T=block_t, BLOCK_H=triton.next_power_of_2(half), num_warps=TUNING.rope_warps,
    )
    return qo, ko


# ----------------------------------------------------------------------------
# Attention: native mask, GQA, KV cache, flash-decoding split over keys
# ----------------------------------------------------------------------------


@triton.jit
def _attn_keys(
    acc, m_i, l_i, q, KB, VB, s_kt, s_vt, key_off, lo, hi, qpos, context_len, qk_scale,
    offs_n, offs_d, D,
    BIDIR: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr,
):
    """Online-softmax accumulation over keys at absolute positions [lo, hi).

    Key at absolute position p is row p - key_off of KB/VB. q: (BM, BD);
    acc: (BM, BD) fp32; m_i, l_i: (BM,) fp32 in log2 units.
    """
    dmask = offs_d < D
    for start in range(lo, hi, BLOCK_N):
        kpos = start + offs_n  # (BN,)
        kvalid = kpos < hi
        krow = (kpos - key_off).to(tl.int64)
        kt = tl.load(KB + krow[None, :] * s_kt + offs_d[:, None], mask=kvalid[None, :] & dmask[:, None],
                     other=0.0)  # (BD, BN)
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale  # (BM, BN), log2 units
        allowed = kvalid[None, :]
        if not BIDIR:
            # native mask: context queries causal over context keys; block queries see all
            allowed = allowed & ((qpos[:, None] >= context_len)
                                 | ((kpos[None, :] <= qpos[:, None]) & (kpos[None, :] < context_len)))
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no visible key yet keeps m = -inf; avoid inf - inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # (BM, BN) fp32
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VB + krow[:, None] * s_vt + offs_d[None, :], mask=kvalid[:, None] & dmask[None, :],
                    other=0.0)  # (BN, BD)
        pv = _cast(p, v.dtype)  # bf16 P on the GPU, as flash attention does
        if DOT_F32:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, KC, VC, O, ML,
    s_qb, s_qh, s_qt,
    s_kb, s_kh, s_kt,
    s_vb, s_vh, s_vt,
    s_kcb, s_kch, s_kct,
    s_vcb, s_vch, s_vct,
    s_ob, s_oh, s_ot,
    s_os,
    n_b, Hk, G, Tq, Tc, context_len, D, qk_scale, keys_per_split,
    BIDIR: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr, PREC: tl.constexpr,
):
    # grid: (cdiv(Tq * G, BLOCK_M), B * Hk, n_splits). Rows are (query i, group head g),
    # i-major (row = i * G + g), so that one program shares each K/V tile across the
    # G query heads of its kv head, and the rows of a tile cover a contiguous query range.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = (pid_bh // Hk).to(tl.int64)
    kvh = (pid_bh % Hk).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // G
    g = rows % G
    rvalid = qi < Tq
    qpos = Tc + qi  # absolute positions of the queries
    qh = kvh * G + g  # query head of each row
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    dmask = offs_d < D
    q = tl.load(Q + b * s_qb + qh[:, None] * s_qh + qi[:, None].to(tl.int64) * s_qt + offs_d[None, :],
                mask=rvalid[:, None] & dmask[None, :], other=0.0)  # (BM, BD)
    if DOT_F32:
        q = q.to(tl.float32)

    # last key any row of this tile can see (+1)
    Tk = Tc + Tq
    qpos_max = Tc + tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G, Tq - 1)
    if BIDIR:
        hi = Tk
    else:
        hi = tl.where(qpos_max >= context_len, Tk, tl.minimum(qpos_max + 1, context_len))
    lo = 0
    if SPLIT:
        lo = pid_s * keys_per_split
        hi = tl.minimum(hi, lo + keys_per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # cached context keys: absolute positions [0, Tc)
    acc, m_i, l_i = _attn_keys(
        acc, m_i, l_i, q, KC + b * s_kcb + kvh * s_kch, VC + b * s_vcb + kvh * s_vch, s_kct, s_vct,
        0, lo, tl.minimum(hi, Tc), qpos, context_len, qk_scale, offs_n, offs_d, D,
        BIDIR, BLOCK_N, DOT_F32, PREC,
    )
    # the new keys: absolute positions [Tc, Tc + Tq)
    acc, m_i, l_i = _attn_keys(
        acc, m_i, l_i, q, K + b * s_kb + kvh * s_kh, V + b * s_vb + kvh * s_vh, s_kt, s_vt,
        Tc, tl.maximum(lo, Tc), hi, qpos, context_len, qk_scale, offs_n, offs_d, D,
        BIDIR, BLOCK_N, DOT_F32, PREC,
    )
    omask = rvalid[:, None] & dmask[None, :]
    if SPLIT:
        # unnormalised partials: O is fp32 (splits, B, Hq, Tq, D), ML is (splits, B, Hq, Tq, 2)
        obase = pid_s.to(tl.int64) * s_os + b * s_ob + qh[:, None] * s_oh + qi[:, None].to(tl.int64) * s_ot
        tl.store(O + obase + offs_d[None, :], acc, mask=omask)
        # ML row index over the contiguous (splits, B, Hq, Tq) grid
        ml_row = ((pid_s.to(tl.int64) * n_b + b) * Hk * G + qh) * Tq + qi
        tl.store(ML + ml_row * 2, m_i, mask=rvalid)
        tl.store(ML + ml_row * 2 + 1, l_i, mask=rvalid)
    else:
        # a query with no visible key outputs 0 (reference: nan_to_num)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(O + b * s_ob + qh[:, None] * s_oh + qi[:, None].to(tl.int64) * s_ot + offs_d[None, :],
                 _cast(out, O.dtype.element_ty), mask=omask)


@triton.jit
def _attn_combine_kernel(
    OP, ML, O, n_splits, n_rows, D, s_os, s_o_row,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # OP: (splits, rows, D) fp32 partial accumulators; ML: (splits, rows, 2) m, l (log2 units)
    # O: (rows, D) rows of the contiguous (B, Hq, Tq, D) output
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < n_rows
    offs_d = tl.arange(0, BLOCK_D)
    m_all = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for sp in range(n_splits):
        m_s = tl.load(ML + (sp * n_rows + r) * 2, mask=rmask, other=float("-inf"))
        m_all = tl.maximum(m_all, m_s)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    om = rmask[:, None] & (offs_d[None, :] < D)
    for sp in range(n_splits):
        m_s = tl.load(ML + (sp * n_rows + r) * 2, mask=rmask, other=float("-inf"))
        l_s = tl.load(ML + (sp * n_rows + r) * 2 + 1, mask=rmask, other=0.0)
        w = tl.exp2(m_s - m_safe)  # 0 for a split that saw no key (m = -inf)
        l_all += l_s * w
        a = tl.load(OP + sp * s_os + r[:, None].to(tl.int64) * D + offs_d[None, :], mask=om, other=0.0)
        acc += a * w[:, None]
    l_safe = tl.where(l_all > 0.0, l_all, 1.0)
    tl.store(O + r[:, None].to(tl.int64) * s_o_row + offs_d[None, :], _cast(acc / l_safe[:, None], O.dtype.element_ty),
             mask=om)


def _attn_splits(n_tiles: int, Tk: int, device: torch.device, block_n: int) -> int:
    """How many key splits: enough programs to fill the GPU, each with enough keys to amortise."""
    sms = _sm_count(device)
    if n_tiles >= sms:
        return 1
    want = triton.cdiv(2 * sms, n_tiles)
    most = max(1, Tk // max(TUNING.attn_min_keys_per_split, block_n))
    return max(1, min(want, most))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    context_len: int,
    n_splits: int | None = None,  # this launcher's own: key splits of the decode kernel (None: chosen)
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    bidirectional: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """See reference.attention. q: (B, Hq, Tq, D); k, v: (B, Hk, Tq, D); cache (B, Hk, Tc, D) each.

    n_splits (extra, for tests/benchmarks): key-range splits; None picks by GPU size.
    """
    tensors = [q, k, v] + ([] if kv_cache is None else list(kv_cache))
    _check_device(*tensors)
    for name, t in zip(("q", "k", "v", "k_cache", "v_cache"), tensors):
        _check_float(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, T, D); got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; use one dtype")
    B, Hq, Tq, D = q.shape
    Hk = k.shape[1]
    if k.shape != (B, Hk, Tq, D) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (B={B}, Hk, Tq={Tq}, D={D})")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"query heads {Hq} not a multiple of kv heads {Hk}")
    if kv_cache is not None:
        kc, vc = kv_cache
        Tc = kc.shape[2]
        if kc.shape != (B, Hk, Tc, D) or vc.shape != kc.shape:
            raise ValueError(
                f"kv_cache shapes {tuple(kc.shape)}, {tuple(vc.shape)} must be (B={B}, Hk={Hk}, Tc, D={D})"
            )
    else:
        kc, vc, Tc = k, v, 0
    if D > 256:
        raise ValueError(f"attention kernel supports head_dim <= 256; got {D}")
    # unit stride on D; B/H/T strides are free (no copy of a transposed projection or a cache view)
    q, k, v, kc, vc = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, kc, vc))
    out = _empty((B, Hq, Tq, D), q.dtype, q.device)
    if B * Tq == 0:
        return out
    G = Hq // Hk
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qk_scale = scale * 1.4426950408889634  # log2(e): the kernel uses exp2
    Tk = Tc + Tq
    block_m = TUNING.attn_block_m if G * Tq > 16 else 16
    block_n = TUNING.attn_block_n
    block_d = max(16, triton.next_power_of_2(D))
    n_m = triton.cdiv(G * Tq, block_m)
    if n_splits is None:
        # splitting only helps rows that see (nearly) all keys: the block queries
        all_see_all = bidirectional or Tc >= context_len
        n_splits = _attn_splits(n_m * B * Hk, Tk, q.device, block_n) if all_see_all else 1
    n_splits = max(1, min(int(n_splits), triton.cdiv(Tk, block_n)))
    keys_per_split = triton.cdiv(triton.cdiv(Tk, n_splits), block_n) * block_n
    n_splits = triton.cdiv(Tk, keys_per_split)
    common = {
        "BIDIR": bool(bidirectional), "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": block_d,
        "DOT_F32": INTERPRET, "PREC": _dot_precision(q.dtype),
        "num_warps": TUNING.attn_warps, "num_stages": TUNING.attn_stages,
    }
    strides = (
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2),
    )
    if n_splits == 1:
        _attn_fwd_kernel[(n_m, B * Hk, 1)](
            q, k, v, kc, vc, out, out,
            *strides, out.stride(0), out.stride(1), out.stride(2), 0,
            B, Hk, G, Tq, Tc, int(context_len), D, qk_scale, Tk,
            SPLIT=False, **common,
        )
        return out
    part = _empty((n_splits, B, Hq, Tq, D), torch.float32, q.device)
    ml = _empty((n_splits, B, Hq, Tq, 2), torch.float32, q.device)
    _attn_fwd_kernel[(n_m, B * Hk, n_splits)](
        q, k, v, kc, vc, part, ml,
        *strides, part.stride(1), part.stride(2), part.stride(3), part.stride(0),
        B, Hk, G, Tq, Tc, int(context_len), D, qk_scale, keys_per_split,
        SPLIT=True, **common,
    )
    n_rows = B * Hq * Tq
    block_r = 16
    _attn_combine_kernel[(triton.cdiv(n_rows, block_r),)](
        part, ml, out, n_splits, n_rows, D, part.stride(0), out.stride(2),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4,
    )
    return out


# ----------------------------------------------------------------------------
# Unmasking scores: LM head + online softmax statistics over vocab tiles
# ----------------------------------------------------------------------------

_RULES = {"max_prob": 0, "margin": 1, "entropy": 2}


@triton.jit
def _merge_stats(m1a, m2a, ia, sa, ta, m1b, m2b, ib, sb, tb):
    """Merge two partial softmax summaries over disjoint vocab ranges (a before b).

    m1: max logit, m2: second largest, i: argmax (first index wins ties),
    s = sum exp(x - m1), t = sum exp(x - m1) * (x - m1). Empty partials have
    m1 = m2 = -inf, s = t = 0.
    """
    m1 = tl.maximum(m1a, m1b)
    m2 = tl.maximum(tl.minimum(m1a, m1b), tl.maximum(m2a, m2b))
    idx = tl.where(m1b > m1a, ib, ia)
    m_safe = tl.where(m1 == float("-inf"), 0.0, m1)
    wa = tl.exp(m1a - m_safe)
    wb = tl.exp(m1b - m_safe)
    # shift each t to the new max: sum e^(x-M)(x-M) = w (t + s (m1 - M)); guard 0 * -inf
    da = tl.where(sa > 0.0, m1a - m_safe, 0.0)
    db = tl.where(sb > 0.0, m1b - m_safe, 0.0)
    s = sa * wa + sb * wb
    t = wa * (ta + sa * da) + wb * (tb + sb * db)
    return m1, m2, idx, s, t


@triton.jit
def _unmask_partial_kernel(
    H, W, POS, PM1, PM2, PI, PS, PT,
    M, V, d, s_hn, s_wv, v_per_split,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr, PREC: tl.constexpr,
):
    # grid: (cdiv(M, BLOCK_M), n_splits); split j covers vocab [j * v_per_split, ...)
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    smask = slots < M
    rows = tl.load(POS + slots, mask=smask, other=0).to(tl.int64)  # rows of hidden
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.arange(0, BLOCK_V)
    v_lo = pid_s * v_per_split
    v_hi = tl.minimum(v_lo + v_per_split, V)

    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    idx = tl.zeros([BLOCK_M], tl.int32)
    s = tl.zeros([BLOCK_M], tl.float32)
    t = tl.zeros([BLOCK_M], tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + offs_v  # (BV,)
        cmask = cols < v_hi
        logits = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for k0 in range(0, d, BLOCK_K):
            kk = k0 + offs_k
            km = kk < d
            h = tl.load(H + rows[:, None] * s_hn + kk[None, :], mask=smask[:, None] & km[None, :],
                        other=0.0)  # (BM, BK)
            w = tl.load(W + cols[None, :].to(tl.int64) * s_wv + kk[:, None], mask=cmask[None, :] & km[:, None],
                        other=0.0)  # (BK, BV) = W^T tile
            if DOT_F32:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            logits = tl.dot(h, w, logits, input_precision=PREC)
        x = tl.where(cmask[None, :], logits, float("-inf"))
        # tile summary
        tm1 = tl.max(x, 1)
        targ = tl.argmax(x, 1, tie_break_left=True)  # (BM,) index within the tile
        tm2 = tl.max(tl.where(offs_v[None, :] == targ[:, None], float("-inf"), x), 1)
        tm_safe = tl.where(tm1 == float("-inf"), 0.0, tm1)
        xd = x - tm_safe[:, None]
        e = tl.where(cmask[None, :], tl.exp(xd), 0.0)
        ts = tl.sum(e, 1)
        tt = tl.sum(e * tl.where(cmask[None, :], xd, 0.0), 1)
        m1, m2, idx, s, t = _merge_stats(m1, m2, idx, s, t, tm1, tm2, (v0 + targ).to(tl.int32), ts, tt)
    off = pid_s * M + slots
    tl.store(PM1 + off, m1, mask=smask)
    tl.store(PM2 + off, m2, mask=smask)
    tl.store(PI + off, idx, mask=smask)
    tl.store(PS + off, s, mask=smask)
    tl.store(PT + off, t, mask=smask)


@triton.jit
def _unmask_combine_kernel(
    PM1, PM2, PI, PS, PT, TOK, CONF, M, n_splits,
    RULE: tl.constexpr, BLOCK: tl.constexpr,
):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sm = slots < M
    m1 = tl.full([BLOCK], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK], float("-inf"), tl.float32)
    idx = tl.zeros([BLOCK], tl.int32)
    s = tl.zeros([BLOCK], tl.float32)
    t = tl.zeros([BLOCK], tl.float32)
    for sp in range(n_splits):
        off = sp * M + slots
        m1, m2, idx, s, t = _merge_stats(
            m1, m2, idx, s, t,
            tl.load(PM1 + off, mask=sm, other=float("-inf")), tl.load(PM2 + off, mask=sm, other=float("-inf")),
            tl.load(PI + off, mask=sm, other=0), tl.load(PS + off, mask=sm, other=0.0),
            tl.load(PT + off, mask=sm, other=0.0),
        )
    s_safe = tl.where(s > 0.0, s, 1.0)
    m1 = tl.where(m1 == float("-inf"), 0.0, m1)  # only the padding slots beyond M
    if RULE == 0:  # max_prob: p1 = e^(m1 - m1) / s
        conf = 1.0 / s_safe
    elif RULE == 1:  # margin: p1 - p2
        conf = (1.0 - tl.exp(m2 - m1)) / s_safe
    else:  # entropy: -H = sum p log p = t / s - log s
        conf = t / s_safe - tl.log(s_safe)
    tl.store(TOK + slots, idx.to(tl.int64), mask=sm)
    tl.store(CONF + slots, conf, mask=sm)


def unmask_scores(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    mask_positions: torch.Tensor,
    rule: str,
    *,
    n_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See reference.unmask_scores. hidden: (N, d); lm_head_weight: (V, d); mask_positions: (M,).

    n_splits (extra, for tests/benchmarks): vocab splits; None picks by GPU size.
    """
    if rule not in _RULES:
        raise ValueError(f"unknown confidence rule {rule!r}: use max_prob, margin or entropy")
    _check_device(hidden, lm_head_weight, mask_positions)
    _check_float("hidden", hidden)
    _check_float("lm_head_weight", lm_head_weight)
    if hidden.dim() != 2 or lm_head_weight.dim() != 2 or hidden.shape[1] != lm_head_weight.shape[1]:
        raise ValueError(
            f"hidden (N, d) and lm_head_weight (V, d) must share d; got {tuple(hidden.shape)} and "
            f"{tuple(lm_head_weight.shape)}"
        )
    if mask_positions.dim() != 1 or mask_positions.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"mask_positions must be a 1-D integer tensor; got {mask_positions.dtype} "
                         f"{tuple(mask_positions.shape)}")
    _N, d = hidden.shape
    V = lm_head_weight.shape[0]
    M = mask_positions.shape[0]
    dev = hidden.device
    tok = _empty((M,), torch.int64, dev)
    conf = _empty((M,), torch.float32, dev)
    if M == 0:
        return tok, conf
    if V < 2:
        raise ValueError(f"vocab of {V} tokens: the confidence rules need at least 2")
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    w = lm_head_weight if lm_head_weight.stride(-1) == 1 else lm_head_weight.contiguous()
    pos = mask_positions.contiguous()
    bm, bv, bk = TUNING.unmask_block_m, TUNING.unmask_block_v, TUNING.unmask_block_k
    n_m = triton.cdiv(M, bm)
    n_tiles = triton.cdiv(V, bv)
    if n_splits is None:
        target = TUNING.target_programs if dev.type == "cuda" else _sm_count(dev)
        n_splits = max(1, triton.cdiv(target, n_m))
    n_splits = max(1, min(int(n_splits), n_tiles))
    v_per_split = triton.cdiv(n_tiles, n_splits) * bv
    n_splits = triton.cdiv(V, v_per_split)
    pm1, pm2, ps, pt = (_empty((n_splits, M), torch.float32, dev) for _ in range(4))
    pi = _empty((n_splits, M), torch.int32, dev)
    _unmask_partial_kernel[(n_m, n_splits)](
        hidden, w, pos, pm1, pm2, pi, ps, pt,
        M, V, d, hidden.stride(0), w.stride(0), v_per_split,
        BLOCK_M=bm, BLOCK_V=bv, BLOCK_K=bk, DOT_F32=INTERPRET, PREC=_dot_precision(hidden.dtype),
        num_warps=TUNING.unmask_warps, num_stages=TUNING.unmask_stages,
    )
    block = 64
    _unmask_combine_kernel[(triton.cdiv(M, block),)](
        pm1, pm2, pi, ps, pt, tok, conf, M, n_splits, RULE=_RULES[rule], BLOCK=block, num_warps=2,
    )
    return tok, conf


__all__ = ["INTERPRET", "TUNING", "Tuning", "apply_rotary", "attention", "rms_norm", "unmask_scores"]
