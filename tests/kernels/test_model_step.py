"""The native model with impl="triton" (Triton interpreter, CPU) vs impl="reference".

A denoising step through every kernel (rms_norm + residual, rotary, attention
over the prefix cache, unmask_scores) must commit the same tokens as the
reference path. The model is the tiny random checkpoint of tests/conftest.py
with its (tied) embeddings scaled up so the logits are spread out like a
trained model's: a random init at std 0.02 gives near-uniform logits, whose
argmax would flip on the last bit and make token equality a coin toss. This
checks the kernels' plumbing and numerics, not what the model predicts.
"""

from __future__ import annotations

import pytest
import torch

CONTEXT = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, 2))\n"


@pytest.fixture(scope="module")
def models(tiny_checkpoint, tops_module):
    from dlm.coder_model.checkpoint import load_model

    out = {}
    for impl in ("reference", "triton"):
        model, tok = load_model(tiny_checkpoint, device="cpu", impl=impl)
        with torch.no_grad():
            model.lm_head_weight.mul_(25.0)  # logits std ~4 (see module docstring)
        out[impl] = model
    return out, tok


def test_one_step_hidden_and_scores_match(models):
    from dlm import kernels
    from dlm.coder_model.cache import PrefixCache

    (m, tok) = models
    ctx = tok.encode(CONTEXT)
    L = 7  # odd block
    block = torch.full((1, L), tok.mask_id, dtype=torch.long)
    block[0, 2] = ctx[3]  # one slot already committed
    hidden = {}
    for impl, model in m.items():
        cache = PrefixCache()
        with torch.inference_mode():
            model.prefill(ctx, cache)
            hidden[impl] = model.forward(block, start_pos=len(cache), context_len=len(cache), cache=cache)[0]
    # a tiny model in fp32: the two paths differ only by summation order
    assert torch.allclose(hidden["triton"], hidden["reference"], atol=2e-4, rtol=1e-4), (
        (hidden["triton"] - hidden["reference"]).abs().max()
    )
    pos = torch.tensor([0, 1, 3, 4, 5, 6])
    w = m["reference"].lm_head_weight
    for rule in ("max_prob", "margin", "entropy"):
        t_tok, t_conf = kernels.unmask_scores(hidden["triton"], w, pos, rule, impl="triton")
        r_tok, r_conf = kernels.unmask_scores(hidden["reference"], w, pos, rule, impl="reference")
        assert torch.equal(t_tok, r_tok), rule
        assert torch.allclose(t_conf, r_conf, atol=1e-4, rtol=1e-3), (rule, t_conf, r_conf)


def _generate(model, tok, params):
    from dlm.coder_model.sampler import generate

    dec = generate(model, tok, tok.encode(CONTEXT), params)
    return dec.output, dec.slots, dec.stats.committed_per_step


@pytest.mark.parametrize(
    "rule",
    ["margin", pytest.param("max_prob", marks=pytest.mark.slow), pytest.param("entropy", marks=pytest.mark.slow)],
)
def test_generate_commits_same_tokens(models, rule):
    """Whole requests (prefill, steps, block extension): identical commits, step by step."""
    from dlm.coder_model.types import SamplerParams

    (m, tok) = models
    params = SamplerParams(steps=3, block_len=5, max_blocks=2, rule=rule, threshold=0.5)
    ref_out = _generate(m["reference"], tok, params)
    tri_out = _generate(m["triton"], tok, params)
    assert sum(ref_out[2]) > 0
    assert tri_out == ref_out
