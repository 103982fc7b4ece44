"""Infill decoding on a constructed model whose right answer is known, and the decoder's rules."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dlm.coder_model.families import load_family_model
from dlm.coder_model.families.infill import (
    InfillDecoder,
    InfillOptions,
    candidate_lengths,
    pick_length,
    select_slots,
)
from dlm.coder_model.types import CancelToken, SamplerParams
from family_helpers import SUCC_EOS, SUCC_MASK, make_succ_checkpoint

ONE_PER_STEP = SamplerParams(steps=8, block_len=4, threshold=1.0)


@pytest.fixture(scope="module", params=["dream", "llada"])
def succ(request, tmp_path_factory):
    d = make_succ_checkpoint(tmp_path_factory.mktemp(f"succ_{request.param}"), request.param)
    model, _tok, tokens, _arch = load_family_model(d, device="cpu", dtype="float32", impl="reference")
    return request.param, model, tokens


def decode(model, tokens, shift: bool, prefix, suffix, params=ONE_PER_STEP, **opt):
    model.arch = dataclasses.replace(model.arch, shift_logits=shift)
    opts = {"lengths": (), "dual_cache": False, "add_bos": False}
    opts.update(opt)
    return InfillDecoder(model, tokens, InfillOptions(**opts)).infill(prefix, suffix, params)


def test_alignment_decides_the_infill_both_ways(succ):
    family, model, tokens = succ
    native = model.arch.shift_logits
    assert native == (family == "dream")
    shifted = decode(model, tokens, True, [3], [9]).raw
    unshifted = decode(model, tokens, False, [3], [9]).raw
    model.arch = dataclasses.replace(model.arch, shift_logits=native)
    # read shifted, each slot sees the token before it: the model counts up from the prefix
    assert shifted == [4, 5, 6, 7]
    # read unshifted, each slot sees only its own mask
    assert unshifted == [7, 7, 7, 7]
    # the family's own handling gives its answer, the other gives a different (wrong) one
    right, wrong = (shifted, unshifted) if family == "dream" else (unshifted, shifted)
    assert decode(model, tokens, native, [3], [9]).raw == right != wrong
    model.arch = dataclasses.replace(model.arch, shift_logits=native)


@pytest.mark.parametrize("fill_after_eos", [True, False])
def test_content_ends_at_first_end_token(succ, fill_after_eos):
    _family, model, tokens = succ
    native = model.arch.shift_logits
    p = SamplerParams(steps=8, block_len=5, threshold=1.0)
    r = decode(model, tokens, True, [11], [], params=p, fill_after_eos=fill_after_eos)
    model.arch = dataclasses.replace(model.arch, shift_logits=native)
    assert r.tokens == [12, 13] and r.ended
    if fill_after_eos:
        assert r.raw == [12, 13, SUCC_EOS, SUCC_EOS, SUCC_EOS] and r.steps == 3  # no steps on the tail
    else:
        assert r.raw == [12, 13, SUCC_EOS, 0, 1] and r.steps == 5


def test_threshold_commits_in_parallel_and_dual_cache_agrees(succ):
    _family, model, tokens = succ
    native = model.arch.shift_logits
    p = SamplerParams(steps=8, block_len=4, threshold=0.5)  # every slot (conf 0.78 / ~1.0) passes
    a = decode(model, tokens, native, [3], [9], params=p)
    b = decode(model, tokens, native, [3], [9], params=p, dual_cache=True, refresh_every=3)
    assert a.steps == 1 and a.committed == 4
    assert b.raw == a.raw
    # the step budget forces parallel commits even under a threshold of 1
    c = decode(model, tokens, native, [3], [9], params=SamplerParams(steps=2, block_len=4, threshold=1.0))
    assert c.steps == 2 and c.committed == 4


def test_never_predicts_the_mask_token(succ):
    _, model, tokens = succ
    r = decode(model, tokens, model.arch.shift_logits, [3], [9])
    assert SUCC_MASK not in r.raw


def test_cancel_before_work(succ):
    _, model, tokens = succ
    c = CancelToken()
    c.cancel()
    r = InfillDecoder(model, tokens, InfillOptions(lengths=())).infill([3], [9], ONE_PER_STEP, c)
    assert r.cancelled and r.steps == 0


def test_length_search_probes_each_candidate(succ):
    _, model, tokens = succ
    dec = InfillDecoder(model, tokens, InfillOptions(lengths=(2, 4, 16), dual_cache=True))
    r = dec.infill([3], [9], SamplerParams(steps=8, block_len=8, threshold=0.9))
    assert sorted(r.scores) == [2, 4, 8]  # 16 > block_len is dropped, block_len itself is a candidate
    assert r.length == pick_length(r.scores)
    assert len(r.raw) == r.length


def test_empty_prefix_gets_a_start_token_for_shifted_models(succ):
    _, model, tokens = succ
    dec = InfillDecoder(model, tokens, InfillOptions(lengths=()))
    if model.arch.shift_logits:
        assert dec.layout([], [5]) == [tokens.bos_id if tokens.bos_id is not None else tokens.pad_id]
    else:
        assert dec.layout([], [5]) == ([] if tokens.bos_id is None else [tokens.bos_id])


def test_pick_length_prefers_confidence_then_shorter():
    assert pick_length({8: 0.5, 16: 0.9, 32: 0.7}) == 16
    assert pick_length({8: 0.9, 16: 0.9}) == 8
    assert candidate_lengths(InfillOptions(lengths=(8, 16, 32)), 24) == [8, 16, 24]


def test_select_slots_rules():
    conf = torch.tensor([0.95, 0.2, 0.99, 0.3, 0.91])
    masked = torch.tensor([True, True, True, True, False])
    assert sorted(select_slots(conf, masked, 0.9, 1, "confidence")) == [0, 2]
    assert select_slots(conf, masked, 0.999, 1, "confidence") == [2]  # at least one
    assert sorted(select_slots(conf, masked, 0.999, 3, "confidence")) == [0, 2, 3]  # step budget
    assert select_slots(conf, masked, 0.9, 1, "left_to_right") == [0]  # slot 1 is below: stop
    assert select_slots(conf, masked, 1.0, 1, "left_to_right") == [0]  # the autoregressive baseline
    assert select_slots(conf, torch.zeros(5, dtype=torch.bool), 0.5, 1, "confidence") == []
