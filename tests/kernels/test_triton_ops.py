"""Triton kernels vs the PyTorch reference, in the Triton interpreter on CPU tensors.

Comparison as in flash-attention's tests: the truth is the reference op on the
inputs upcast to fp32; the kernel's max error against it may be at most twice
the error of a plain PyTorch computation in the same dtype, plus a small atol.
Output buffers are poisoned (conftest `tops`), so an unwritten element fails.
Inputs are fresh random tensors at odd sizes: non-power-of-two lengths,
1-slot blocks, empty context, GQA ratios 1/4/8.
"""

from __future__ import annotations

import math

import pytest
import torch
from dlm.kernels import reference as ref

DTYPES = [torch.float32, torch.bfloat16]


def assert_close(out: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, atol: float, what: str):
    assert out.shape == truth.shape, f"{what}: shape {tuple(out.shape)} != {tuple(truth.shape)}"
    out32 = out.float()
    n_bad = int((~torch.isfinite(out32)).sum())
    assert n_bad == 0, f"{what}: {n_bad} elements not finite (unwritten poison?)"
    err = (out32 - truth.float()).abs().max().item() if out.numel() else 0.0
    base = (baseline.float() - truth.float()).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * base + atol, f"{what}: kernel error {err:.3g} > 2 x torch-{out.dtype} error {base:.3g} + {atol}"


# ----------------------------------------------------------------------------- rms_norm


def torch_rms_norm_lowp(x, w, eps, r):
    """RMSNorm the plain way, every op in the input dtype (the baseline)."""
    s = x if r is None else x + r
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w, s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (7, 37), (2, 5, 96), (3, 200)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm(tops, dtype, shape, with_residual):
    d = shape[-1]
    x = torch.randn(shape).to(dtype)
    r = torch.randn(shape).to(dtype) if with_residual else None
    w = (1 + 0.3 * torch.randn(d)).to(dtype)
    eps = 1e-6
    normed, summed = tops.rms_norm(x, w, eps, r)
    t_normed, t_summed = ref.rms_norm(x.float(), w.float(), eps, None if r is None else r.float())
    b_normed, b_summed = torch_rms_norm_lowp(x, w, eps, r)
    assert normed.dtype == dtype and summed.dtype == dtype
    assert_close(normed, t_normed, b_normed, 1e-5, "rms_norm normed")
    assert_close(summed, t_summed, b_summed, 1e-6, "rms_norm summed")
    # the residual stream must be exactly `x + residual` in the dtype (it is carried to the next layer)
    _r_normed, r_summed = ref.rms_norm(x, w, eps, r)
    assert torch.equal(summed, r_summed)


def test_rms_norm_rejects_mismatched_residual(tops):
    with pytest.raises(ValueError, match="residual"):
        tops.rms_norm(torch.randn(3, 8), torch.ones(8), 1e-6, torch.randn(3, 9))


# ----------------------------------------------------------------------------- rotary


def torch_rotary_lowp(q, k, cos, sin, positions):
    c, s = cos[positions].to(q.dtype), sin[positions].to(q.dtype)
    c, s = (c[None, None], s[None, None]) if c.dim() == 2 else (c[:, None], s[:, None])

    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    return rot(q), rot(k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B,Hq,Hk,T,D,pos2d",
    [(1, 4, 1, 1, 32, False), (2, 8, 2, 7, 64, True), (1, 8, 8, 13, 128, False), (2, 4, 4, 5, 80, True)],
)
def test_apply_rotary(tops, dtype, B, Hq, Hk, T, D, pos2d):
    cos, sin = ref.rotary_tables(D, 300, 10000.0)
    # q/k as the model makes them: a (B, T, H, D) projection viewed as (B, H, T, D)
    q = torch.randn(B, T, Hq, D).to(dtype).transpose(1, 2)
    k = torch.randn(B, T, Hk, D).to(dtype).transpose(1, 2)
    positions = torch.randint(0, 300, (B, T) if pos2d else (T,))
    qo, ko = tops.apply_rotary(q, k, cos, sin, positions)
    tq, tk = ref.apply_rotary(q.float(), k.float(), cos, sin, positions)
    bq, bk = torch_rotary_lowp(q, k, cos, sin, positions)
    assert qo.dtype == dtype and ko.dtype == dtype
    assert_close(qo, tq, bq, 1e-6, "rotary q")
    assert_close(ko, tk, bk, 1e-6, "rotary k")


# ----------------------------------------------------------------------------- attention


def torch_attention_lowp(q, k, v, context_len, kv_cache, bidirectional, scale=None):
    """Attention the plain way in the input dtype (flash-attention's attention_ref, upcast=False)."""
    if kv_cache is not None:
        k = torch.cat([kv_cache[0], k], dim=2)
        v = torch.cat([kv_cache[1], v], dim=2)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-1, -2)
    mask = ref.attention_mask(q.shape[2], k.shape[2], context_len, bidirectional)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


# (B, Hq, Hk, Tq, Tc, D, context_len, bidirectional, n_splits)
ATTN_CASES = [
    # denoising step: every query in the block, cached context, GQA 8, one split and several
    pytest.param(1, 8, 1, 5, 37, 64, 37, False, None, id="block5-cache37-gqa8"),
    pytest.param(2, 4, 1, 7, 70, 32, 70, False, 3, id="block7-cache70-gqa4-split3"),
    # 1-slot block against a cache
    pytest.param(1, 4, 4, 1, 45, 64, 45, False, None, id="block1-cache45-mha"),
    pytest.param(1, 8, 1, 1, 19, 128, 19, False, 2, id="block1-cache19-gqa8-d128-split2"),
    # prefill with empty context: causal context then the block in one pass
    pytest.param(1, 4, 1, 23, 0, 32, 15, False, None, id="prefill23-ctx15-gqa4"),
    pytest.param(2, 8, 8, 9, 0, 64, 9, False, None, id="prefill9-all-causal"),
    pytest.param(1, 2, 2, 6, 0, 32, 0, False, None, id="all-block-no-context"),
    # extending a cache with more context and the block (queries straddle context_len)
    pytest.param(1, 8, 2, 11, 13, 64, 20, False, None, id="cache13-ctx20-straddle-gqa4"),
    pytest.param(1, 4, 1, 17, 40, 32, 50, False, 3, id="cache40-ctx50-straddle-gqa4-split3"),
    # dream/llada: fully bidirectional, with and without cache
    pytest.param(1, 4, 1, 9, 0, 64, 0, True, None, id="bidir9"),
    pytest.param(2, 8, 1, 6, 33, 32, 33, True, 2, id="bidir-cache33-gqa8-split2"),
]


def _attn_inputs(B, Hq, Hk, Tq, Tc, D, dtype):
    # q as the model makes it (a transposed projection); k/v contiguous; cache a view of a longer buffer
    q = torch.randn(B, Tq, Hq, D).to(dtype).transpose(1, 2)
    k = torch.randn(B, Hk, Tq, D).to(dtype)
    v = torch.randn(B, Hk, Tq, D).to(dtype)
    cache = None
    if Tc:
        buf = torch.randn(2, B, Hk, Tc + 5, D).to(dtype)
        cache = (buf[0, :, :, :Tc], buf[1, :, :, :Tc])
    return q, k, v, cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hk,Tq,Tc,D,context_len,bidirectional,n_splits", ATTN_CASES)
def test_attention(tops, dtype, B, Hq, Hk, Tq, Tc, D, context_len, bidirectional, n_splits):
    q, k, v, cache = _attn_inputs(B, Hq, Hk, Tq, Tc, D, dtype)
    out = tops.attention(q, k, v, context_len=context_len, kv_cache=cache, bidirectional=bidirectional,
                         n_splits=n_splits)
    up = None if cache is None else (cache[0].float(), cache[1].float())
    truth = ref.attention(q.float(), k.float(), v.float(), context_len=context_len, kv_cache=up,
                          bidirectional=bidirectional)
    base = torch_attention_lowp(q, k, v, context_len, cache, bidirectional)
    assert out.dtype == dtype
    assert_close(out, truth, base, 1e-5, "attention")


def test_attention_custom_scale_matches_reference(tops):
    q, k, v, cache = _attn_inputs(1, 4, 2, 3, 10, 32, torch.float32)
    out = tops.attention(q, k, v, context_len=10, kv_cache=cache, scale=0.3)
    truth = ref.attention(q, k, v, context_len=10, kv_cache=cache, scale=0.3)
    base = torch_attention_lowp(q, k, v, 10, cache, False, scale=0.3)
    assert_close(out, truth, base, 1e-5, "attention scale=0.3")


def test_attention_rejects_bad_gqa(tops):
    q, k, v, _ = _attn_inputs(1, 6, 4, 3, 0, 32, torch.float32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        tops.attention(q, k, v, context_len=0)


# ----------------------------------------------------------------------------- unmask_scores

RULES = ["max_prob", "margin", "entropy"]


def torch_unmask_lowp(hidden, w, pos, rule):
    """The plain way: logits in the model dtype, then the statistics."""
    logits = hidden[pos] @ w.t()  # (M, V) in dtype
    return ref.confidence_from_logits(logits.float(), rule)


def check_tokens(tok, hidden, w, pos):
    """Argmax must match the fp32 truth except where the top two logits (near-)tie."""
    logits = hidden[pos].float() @ w.float().t()  # (M, V)
    top = logits.topk(2, dim=-1)
    assert int(tok.min()) >= 0, f"unwritten token slot(s): {tok.tolist()}"
    clear = (top.values[:, 0] - top.values[:, 1]) > 1e-3
    assert torch.equal(tok[clear], top.indices[clear, 0]), "argmax differs from the reference"
    tie_ok = (tok == top.indices[:, 0]) | (tok == top.indices[:, 1])
    assert bool(tie_ok.all()), "token is neither of the top-2 reference tokens"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(
    "N,d,V,M,n_splits",
    [(6, 48, 1000, 1, None), (17, 37, 517, 5, 3), (40, 64, 333, 20, 1), (9, 32, 129, 9, 2)],
)
def test_unmask_scores(tops, dtype, rule, N, d, V, M, n_splits):
    hidden = torch.randn(N, d).to(dtype)
    w = (torch.randn(V, d) * (3 / math.sqrt(d))).to(dtype)  # logits with std ~3, as a trained head gives
    pos = torch.randperm(N)[:M]  # unsorted slots
    tok, conf = tops.unmask_scores(hidden, w, pos, rule, n_splits=n_splits)
    assert tok.dtype == torch.int64 and conf.dtype == torch.float32 and tok.shape == (M,)
    check_tokens(tok, hidden, w, pos)
    _t_tok, t_conf = ref.unmask_scores(hidden.float(), w.float(), pos, rule)
    _b_tok, b_conf = torch_unmask_lowp(hidden, w, pos, rule)
    assert_close(conf, t_conf, b_conf, 2e-5, f"unmask_scores {rule}")


def test_unmask_scores_peaked_distribution(tops):
    """Near-one-hot rows (a confident model): margin and entropy must not cancel to garbage."""
    hidden = torch.randn(4, 32)
    w = torch.randn(300, 32) * 0.01
    w[7] = hidden[1] * 3  # one token far ahead for row 1
    pos = torch.tensor([1, 3])
    for rule in RULES:
        tok, conf = tops.unmask_scores(hidden, w, pos, rule, n_splits=2)
        _t_tok, t_conf = ref.unmask_scores(hidden, w, pos, rule)
        assert int(tok[0]) == 7
        assert torch.allclose(conf, t_conf, atol=2e-5, rtol=1e-4), (rule, conf, t_conf)


def test_unmask_scores_empty_and_errors(tops):
    tok, conf = tops.unmask_scores(torch.randn(3, 8), torch.randn(50, 8), torch.zeros(0, dtype=torch.long),
                                   "margin")
    assert tok.shape == (0,) and conf.shape == (0,)
    with pytest.raises(ValueError, match="unknown confidence rule"):
        tops.unmask_scores(torch.randn(3, 8), torch.randn(50, 8), torch.tensor([0]), "vibes")


# ----------------------------------------------------------------------------- dispatch


def test_dispatch_impl_triton_runs_the_kernel(tops, monkeypatch):
    """dlm.kernels.<op>(impl="triton") reaches triton_ops; impl="reference" never does."""
    import dlm.kernels as K

    calls = []
    real = tops.rms_norm
    monkeypatch.setattr(tops, "rms_norm", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(3, 16), torch.ones(16)
    out_t, _ = K.rms_norm(x, w, 1e-6, impl="triton")
    out_r, _ = K.rms_norm(x, w, 1e-6, impl="reference")
    assert calls == [1]
    assert torch.allclose(out_t, out_r, atol=1e-5)
