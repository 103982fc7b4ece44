"""Every Triton kernel, compiled on the GPU, against the fp32 reference at the real shapes.

Shapes are those of the embedded model (dim 256, 8/2 heads of 32) and of
Qwen2.5-0.5B (dim 896, 14/2 heads of 64, vocab 151,936); dtype bf16 as served
(and fp32 for the denoising-step attention). The criterion is tests/kernels':
the kernel's max error against the reference on fp32-upcast inputs may be at
most twice plain PyTorch's error in the same dtype plus a small atol, and the
relative error stays inside METHOD.md's band for the dtype. Output buffers are
poisoned (NaN), so an unwritten element fails.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_helpers import SHAPES, assert_close, attention_lowp, rms_norm_lowp, rotary_lowp

DEV = "cuda"
BF16 = torch.bfloat16


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rows", [1, 32, 2048])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm(gpu_tops, shape, rows, with_residual):
    from dlm.kernels import reference as ref

    d = SHAPES[shape][0]
    x, w = rnd(rows, d), (1 + 0.3 * torch.randn(d, device=DEV)).to(BF16)
    r = rnd(rows, d) if with_residual else None
    normed, summed = gpu_tops.rms_norm(x, w, 1e-6, r)
    t_normed, t_summed = ref.rms_norm(x.float(), w.float(), 1e-6, None if r is None else r.float())
    b_normed, b_summed = rms_norm_lowp(x, w, 1e-6, r)
    assert normed.dtype == BF16 and summed.dtype == BF16
    assert_close(normed, t_normed, b_normed, 1e-5, "rms_norm normed")
    assert_close(summed, t_summed, b_summed, 1e-6, "rms_norm summed")
    assert torch.equal(summed, ref.rms_norm(x, w, 1e-6, r)[1])  # the residual stream is exactly x + r in bf16


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("T", [1, 32, 2048])
def test_rotary(gpu_tops, shape, T):
    from dlm.kernels import reference as ref

    _dim, Hq, Hk, D, _V = SHAPES[shape]
    cos, sin = ref.rotary_tables(D, 8192, 1e6, device=DEV)
    q = rnd(1, T, Hq, D).transpose(1, 2)  # (1, Hq, T, D), a view as the model makes it
    k = rnd(1, T, Hk, D).transpose(1, 2)
    pos = torch.arange(T, device=DEV) + 5
    qo, ko = gpu_tops.apply_rotary(q, k, cos, sin, pos)
    tq, tk = ref.apply_rotary(q.float(), k.float(), cos, sin, pos)
    bq, bk = rotary_lowp(q, k, cos, sin, pos)
    assert_close(qo, tq, bq, 1e-6, "rotary q")
    assert_close(ko, tk, bk, 1e-6, "rotary k")


# (label, Tq, Tc, context_len, bidirectional, n_splits): n_splits None = the launcher's choice (split-K
# on the GPU's SM count for the block queries), an int forces it
ATTN = [
    pytest.param(32, 2048, 2048, False, None, id="step-L32-cache2048-native"),
    pytest.param(32, 8192 - 32, 8192 - 32, False, 8, id="step-L32-cache8160-split8"),
    pytest.param(1, 2048, 2048, False, None, id="step-1slot-cache2048"),
    pytest.param(48, 700, 740, False, None, id="straddle-cache700-ctx740"),
    pytest.param(2048, 0, 2016, False, None, id="prefill2048-ctx2016"),
    pytest.param(32, 2048, 2048, True, None, id="dream-bidir-cache2048"),
    pytest.param(1056, 0, 0, True, None, id="dream-full-pass-bidir1056"),
]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("Tq,Tc,context_len,bidirectional,n_splits", ATTN)
def test_attention(gpu_tops, shape, Tq, Tc, context_len, bidirectional, n_splits):
    from dlm.kernels import reference as ref

    _dim, Hq, Hk, D, _V = SHAPES[shape]  # GQA 4 (embedded) and 7 (0.5B)
    q = rnd(1, Tq, Hq, D).transpose(1, 2)
    k, v = rnd(1, Hk, Tq, D), rnd(1, Hk, Tq, D)
    cache = None
    if Tc:
        buf = rnd(2, 1, Hk, Tc + 64, D)  # the cache as a view of a longer buffer, as PrefixCache grows
        cache = (buf[0, :, :, :Tc], buf[1, :, :, :Tc])
    out = gpu_tops.attention(q, k, v, context_len=context_len, kv_cache=cache, bidirectional=bidirectional,
                             n_splits=n_splits)
    up = None if cache is None else (cache[0].float(), cache[1].float())
    truth = ref.attention(q.float(), k.float(), v.float(), context_len=context_len, kv_cache=up,
                          bidirectional=bidirectional)
    base = attention_lowp(q, k, v, context_len, cache, bidirectional)
    assert out.dtype == BF16
    assert_close(out, truth, base, 1e-4, "attention")


def test_attention_fp32_step_matches_reference_closely(gpu_tops):
    """fp32 inputs take IEEE fp32 dots (not TF32): the model's fp32 path is comparable with torch's."""
    from dlm.kernels import reference as ref

    q = torch.randn(1, 32, 14, 64, device=DEV).transpose(1, 2)
    k, v = torch.randn(1, 2, 32, 64, device=DEV), torch.randn(1, 2, 32, 64, device=DEV)
    cache = (torch.randn(1, 2, 1500, 64, device=DEV), torch.randn(1, 2, 1500, 64, device=DEV))
    out = gpu_tops.attention(q, k, v, context_len=1500, kv_cache=cache)
    truth = ref.attention(q.double(), k.double(), v.double(), context_len=1500,
                          kv_cache=(cache[0].double(), cache[1].double()))
    rel = ((out.double() - truth).norm() / truth.norm()).item()
    assert rel < 1e-5, f"fp32 attention relative error {rel:.3g}: TF32 dots or a wrong mask?"


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rule", ["max_prob", "margin", "entropy"])
@pytest.mark.parametrize("M", [1, 32])
def test_unmask_scores(gpu_tops, shape, rule, M):
    from dlm.kernels import reference as ref

    d, V = SHAPES[shape][0], SHAPES[shape][4]
    N = 40
    hidden = rnd(N, d)
    w = rnd(V, d, scale=3 / math.sqrt(d))  # logits with std ~3, as a trained head gives
    pos = torch.randperm(N, device=DEV)[:M]
    tok, conf = gpu_tops.unmask_scores(hidden, w, pos, rule)
    assert tok.dtype == torch.int64 and conf.dtype == torch.float32 and tok.shape == (M,)
    logits = hidden[pos].float() @ w.float().t()  # (M, V) fp32 truth
    top = logits.topk(2, dim=-1)
    assert int(tok.min()) >= 0, f"unwritten token slot(s): {tok.tolist()}"
    clear = (top.values[:, 0] - top.values[:, 1]) > 1e-2
    assert torch.equal(tok[clear], top.indices[clear, 0]), "argmax differs from the fp32 reference"
    assert bool(((tok == top.indices[:, 0]) | (tok == top.indices[:, 1])).all()), "token not in the reference top 2"
    _t, t_conf = ref.unmask_scores(hidden.float(), w.float(), pos, rule)
    base = ref.confidence_from_logits((hidden[pos] @ w.t()).float(), rule)[1]  # logits in bf16, then stats
    assert_close(conf, t_conf, base, 2e-5, f"unmask_scores {rule}")


def test_dispatch_auto_picks_triton_on_cuda(cuda_ops, monkeypatch):
    """impl="auto" on CUDA tensors reaches the compiled kernels (no silent fallback to the reference)."""
    import dlm.kernels as K

    monkeypatch.delenv("DLM_KERNELS", raising=False)
    monkeypatch.setattr(K, "_auto_choice", {})
    calls = []
    real = cuda_ops.rms_norm
    monkeypatch.setattr(cuda_ops, "rms_norm", lambda *a: calls.append(1) or real(*a))
    x, w = rnd(3, 256), torch.ones(256, device=DEV, dtype=BF16)
    K.rms_norm(x, w, 1e-6)
    assert calls == [1] and K.resolve_impl("auto", "cuda") == "triton"
