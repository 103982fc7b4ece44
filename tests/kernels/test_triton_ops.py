"""Triton kernels vs the PyTorch reference, in the Triton interpreter on CPU tensors.

Comparison as in flash-attention's tests (kernel_checks, shared with tests/cuda): the
truth is the reference op on the inputs upcast to fp32; the kernel's max error against
it may be at most twice the error of a plain PyTorch computation in the same dtype,
plus a small atol.
Output buffers are poisoned (conftest `tops`), so an unwritten element fails.
Inputs are fresh random tensors at odd sizes: non-power-of-two lengths,
1-slot blocks, empty context, GQA ratios 1/4/8.
"""

from __future__ import annotations

import math

import pytest
import torch
from dlm.kernels import reference as ref
from kernel_checks import assert_close, attention_lowp, check_attention, check_rms_norm, check_rotary

DTYPES = [torch.float32, torch.bfloat16]


# ----------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (7, 37), (2, 5, 96), (3, 200)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm(tops, dtype, shape, with_residual):
    d = shape[-1]
    x = torch.randn(shape).to(dtype)
    r = torch.randn(shape).to(dtype) if with_residual else None
    w = (1 + 0.3 * torch.randn(d)).to(dtype)
    check_rms_norm(tops, x, w, 1e-6, r)


def test_rms_norm_rejects_mismatched_residual(tops):
    with pytest.raises(ValueError, match="residual"):
        tops.rms_norm(torch.randn(3, 8), torch.ones(8), 1e-6, torch.randn(3, 9))


# ----------------------------------------------------------------------------- rotary


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
    check_rotary(tops, q, k, cos, sin, positions)


# ----------------------------------------------------------------------------- attention


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
    check_attention(tops, q, k, v, cache, context_len, bidirectional, n_splits, atol=1e-5)


def test_attention_custom_scale_matches_reference(tops):
    q, k, v, cache = _attn_inputs(1, 4, 2, 3, 10, 32, torch.float32)
    out = tops.attention(q, k, v, context_len=10, kv_cache=cache, scale=0.3)
    truth = ref.attention(q, k, v, context_len=10, kv_cache=cache, scale=0.3)
    base = attention_lowp(q, k, v, 10, cache, False, scale=0.3)
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
