"""Our loader + network against transformers references: logits and greedy infills."""

from __future__ import annotations

import pytest
import torch
from dlm.coder_model.families import load_family_model
from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
from dlm.coder_model.types import SamplerParams
from family_helpers import hf_bidirectional_logits

FAMILIES = ["dream_ckpt", "llada_ckpt"]


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request):
    d, ref = request.getfixturevalue(request.param)
    model, tok, tokens, arch = load_family_model(d, device="cpu", dtype="float32", impl="reference")
    return request.param, model, tok, tokens, arch, ref, d


def test_detected_family_and_alignment(loaded):
    name, _model, tok, tokens, arch, _ref, d = loaded
    if name == "dream_ckpt":
        assert (arch.family, arch.shift_logits, arch.qkv_bias) == ("dream", True, True)
    else:
        assert (arch.family, arch.shift_logits, arch.qkv_bias) == ("llada", False, False)
    assert tokens.mask_id == tok.token_to_id("<|mask|>")
    assert (d / "model.safetensors.index.json").is_file()  # both fixtures are sharded
    assert tok.token_to_id("<|endoftext|>") in tokens.eos_ids


def test_logits_match_transformers_fp32(loaded):
    _, model, _tok, tokens, arch, ref, _ = loaded
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, arch.vocab_size, (2, 23), generator=g)
    ids[0, 5:9] = tokens.mask_id
    hidden, _ = model(ids, torch.arange(23))
    ours = model.logits(hidden)
    want = hf_bidirectional_logits(ref, ids)
    assert ours.shape == want.shape
    torch.testing.assert_close(ours, want, atol=2e-4, rtol=1e-4)
    # bidirectional: changing the last token changes the first position's logits
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % arch.vocab_size
    hidden2, _ = model(ids2, torch.arange(23))
    assert (model.logits(hidden2)[:, 0] - ours[:, 0]).abs().max() > 1e-3


def test_cached_window_equals_full_pass_when_fresh(loaded):
    """The dual cache's block-only pass, right after a refresh, reproduces the full pass."""
    _, model, _tok, tokens, _arch, _ref, _ = loaded
    dec = InfillDecoder(model, tokens, InfillOptions(lengths=(), dual_cache=True))
    prefix, suffix, L = [5, 17, 40, 41, 42], [60, 61, 62], 6
    ids = torch.tensor([prefix + [tokens.mask_id] * L + suffix])
    ids[0, len(prefix) + 2] = 77  # a committed slot inside the block
    full, ctx = dec._full(ids, len(prefix), L, want_kv=True)
    window = dec._window(ids, len(prefix), L, ctx)
    torch.testing.assert_close(window, full, atol=1e-4, rtol=1e-4)


def reference_greedy_infill(ref, prefix, suffix, L, mask_id, shift):
    """One slot per step, most confident first, from transformers logits with the family's alignment."""
    x = torch.tensor([prefix + [mask_id] * L + suffix])
    P = len(prefix)
    while (x[0, P : P + L] == mask_id).any():
        logits = hf_bidirectional_logits(ref, x)[0]  # (N, V)
        rows = logits[P - shift : P - shift + L].clone()
        rows[:, mask_id] = float("-inf")
        p = rows.softmax(-1)
        conf, tok = p.max(-1)
        conf[x[0, P : P + L] != mask_id] = -1.0
        j = int(conf.argmax())
        x[0, P + j] = tok[j]
    return x[0, P : P + L].tolist()


@pytest.mark.parametrize("dual_cache", [False, True])
def test_greedy_infill_matches_reference(loaded, dual_cache):
    name, model, tok, tokens, _arch, ref, _ = loaded
    prefix = tok.encode("def add(a, b):\n    return", add_special_tokens=False).ids
    suffix = tok.encode("\n\nfor i in range(10):\n", add_special_tokens=False).ids
    L = 6
    opt = InfillOptions(
        lengths=(), dual_cache=dual_cache, refresh_every=1, fill_after_eos=False, add_bos=False
    )
    dec = InfillDecoder(model, tokens, opt)
    r = dec.infill(prefix, suffix, SamplerParams(steps=L, block_len=L, threshold=1.0))
    shift = {"dream_ckpt": 1, "llada_ckpt": 0}[name]  # the family's training alignment, not our detection
    want = reference_greedy_infill(ref, prefix, suffix, L, tokens.mask_id, shift)
    assert r.raw == want
    assert r.steps == L and r.length == L


def test_bf16_load_is_close_to_fp32(loaded):
    """bf16 weights (the GPU default) compute the same function within bf16 rounding."""
    _, model, _tok, _tokens, _arch, _ref, d = loaded
    m16, *_ = load_family_model(d, device="cpu", dtype="bfloat16", impl="reference")
    assert m16.embed.weight.dtype == torch.bfloat16
    ids = torch.arange(10)[None] + 7
    want = model.logits(model(ids, torch.arange(10))[0])
    got = m16.logits(m16(ids, torch.arange(10))[0])
    assert (got - want).abs().max() < 0.05 * want.abs().max()
