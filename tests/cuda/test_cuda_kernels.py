"""Every Triton kernel, compiled on the GPU, against the fp32 reference at the real shapes.

Shapes are those of the embedded model (dim 256, 8/2 heads of 32) and of
Qwen2.5-0.5B (dim 896, 14/2 heads of 64, vocab 151,936); dtype bf16 as served
(and fp32 for the denoising-step attention). The criterion is tests/kernels':
the kernel's max error against the reference on fp32-upcast inputs may be at
most twice plain PyTorch's error in the same dtype plus a small atol, and the
relative error stays inside METHOD.md's band for the dtype. Output buffers are
poisoned (NaN), so an unwritten element fails. The checks are tests/kernels/kernel_checks.py's.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_helpers import SHAPES
from kernel_checks import assert_close, check_attention, check_rms_norm, check_rotary

DEV = "cuda"
BF16 = torch.bfloat16


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rows", [1, 32, 2048])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm(gpu_tops, shape, rows, with_residual):

    d = SHAPES[shape][0]
    x, w = rnd(rows, d), (1 + 0.3 * torch.randn(d, device=DEV)).to(BF16)
    r = rnd(rows, d) if with_residual else None
    check_rms_norm(gpu_tops, x, w, 1e-6, r, relative_band=True)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("T", [1, 32, 2048])
def test_rotary(gpu_tops, shape, T):
    from dlm.kernels import reference as ref

    _dim, Hq, Hk, D, _V = SHAPES[shape]
    cos, sin = ref.rotary_tables(D, 8192, 1e6, device=DEV)
    q = rnd(1, T, Hq, D).transpose(1, 2)  # (1, Hq, T, D), a view as the model makes it
    k = rnd(1, T, Hk, D).transpose(1, 2)
    pos = torch.arange(T, device=DEV) + 5
    check_rotary(gpu_tops, q, k, cos, sin, pos, relative_band=True)


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

    _dim, Hq, Hk, D, _V = SHAPES[shape]  # GQA 4 (embedded) and 7 (0.5B)
    q = rnd(1, Tq, Hq, D).transpose(1, 2)
    k, v = rnd(1, Hk, Tq, D), rnd(1, Hk, Tq, D)
    cache = None
    if Tc:
        buf = rnd(2, 1, Hk, Tc + 64, D)  # the cache as a view of a longer buffer, as PrefixCache grows
        cache = (buf[0, :, :, :Tc], buf[1, :, :, :Tc])
    check_attention(gpu_tops, q, k, v, cache, context_len, bidirectional, n_splits, atol=1e-4, relative_band=True)


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
    assert_close(conf, t_conf, base, 2e-5, f"unmask_scores {rule}", relative_band=True)


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
