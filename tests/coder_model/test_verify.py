"""The denoiser checks the memory's proposals (coder_model.verify) with the embedded model: real
scores from the real checkpoint, no claims about how good they are (BENCHMARKS measures that)."""

from __future__ import annotations

import math

import pytest
from dlm.coder_model.types import CancelToken, MemoryProposal, Prompt, SamplerParams
from dlm.coder_model.verify import Mix, choose

CHECKED = 2.0  # SamplerParams.memory_first above 1: every proposal is checked (no fast path)
PASSES = 2  # the denoiser's check (SamplerParams.verify_passes: off by default, asked for here)
PROMPT = dict(prefix="import os\n\n\ndef read(path):\n", region="    with open(path) as f:", cursor=9,
              suffix="\n        return f.read()\n", language="python", path="m.py")


def test_the_model_scores_every_proposal_and_answers_one_of_them(engine):
    proposals = (MemoryProposal("open(path) as f:", 0.4), MemoryProposal("os.fdopen(path) as f:", 0.3))
    p = Prompt(**{**PROMPT, "region": "    with ", "cursor": 9}, proposals=proposals)
    pred = engine.predict(p, SamplerParams(model_weight=1.0, verify_passes=PASSES), CancelToken())
    assert pred.text in {"    with " + x.text for x in proposals}
    assert pred.steps == 2 and 0.0 < pred.confidence < 1.0  # two interleaved passes


def test_a_veto_above_every_score_answers_no_change(engine):
    proposals = (MemoryProposal("open(path) as f:", 0.9),)
    p = Prompt(**{**PROMPT, "region": "    with ", "cursor": 9}, proposals=proposals)
    pred = engine.predict(p, SamplerParams(veto=1.0, verify_passes=PASSES), CancelToken())
    assert pred.text == "    with " and pred.confidence is None


def test_without_the_model_the_memory_order_decides():
    proposals = (MemoryProposal("a", 0.2), MemoryProposal("b", 0.7))
    assert choose(proposals, [None, None], Mix(passes=0))[0] == 1
    i, conf = choose(proposals, [0.9, 0.01], Mix(model_weight=1.0, passes=PASSES))
    assert i == 0 and conf == pytest.approx(Mix(model_weight=1.0).combine(0.2, 0.9))
    assert choose(proposals, [0.9, 0.01], Mix(model_weight=0.0, passes=PASSES))[0] == 1  # the memory alone prefers b
    plain = Mix(memory_weight=1.0, model_weight=0.0, bias=0.0)
    assert plain.combine(0.3, None) == pytest.approx(0.3)  # weights (1, 0, 0): the memory's own probability
    assert math.isclose(Mix(bias=0.0, model_weight=1.0).combine(0.5, 1.0), 0.5)
    assert Mix().combine(0.5, 0.9) > Mix().combine(0.5, 0.1)  # the default mix trusts a proposal the model likes


def test_a_proposal_longer_than_the_block_is_not_scored(engine):
    p = Prompt(**{**PROMPT, "region": "    with ", "cursor": 9}, proposals=(MemoryProposal("x" * 400, 0.9),))
    pred = engine.predict(p, SamplerParams(block_len=8, memory_first=CHECKED, verify_passes=PASSES), CancelToken())
    assert pred.text == "    with "


def test_left_to_right_scoring_runs_one_pass_per_slot_of_the_longest_proposal(engine):
    import torch
    from dlm.coder_model.cache import PrefixCache
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.verify import score_proposals

    proposals = (MemoryProposal("open(path) as f:", 0.4), MemoryProposal("x:", 0.3))
    p = Prompt(**{**PROMPT, "region": "    with ", "cursor": 9}, proposals=proposals)
    cache = PrefixCache()
    with torch.inference_mode():
        engine.model.prefill(encode_prompt(engine.tok, p, engine.budget), cache)
    inter, n_inter = score_proposals(engine.model, engine.tok, cache, p.region, p.cursor, proposals, 32, 2)
    ltr, n_ltr = score_proposals(engine.model, engine.tok, cache, p.region, p.cursor, proposals, 32, 2,
                                 "left_to_right")
    longest = len(engine.tok.encode(p.region + proposals[0].text)) + 1 - len(engine.tok.encode(p.region))
    assert n_inter == 2 and longest - 1 <= n_ltr <= longest + 1
    assert all(0 < s < 1 for s in inter + ltr) and inter != ltr


def test_a_proposal_longer_than_one_block_but_within_max_blocks_is_scored(engine):
    # the sampler could write this region in max_blocks blocks: the check reads it, so the model
    # does not veto every proposal on a long statement for not fitting one block
    region = "    with "
    text = "open(path) as f:"
    slots = len(engine.tok.encode(region + text)) + 1
    block = (slots + 1) // 2  # the region and its <eom> need two blocks of this size
    assert block < slots
    p = Prompt(**{**PROMPT, "region": region, "cursor": len(region)}, proposals=(MemoryProposal(text, 0.9),))
    two = engine.predict(p, SamplerParams(block_len=block, max_blocks=2, veto=0.0, memory_first=CHECKED, verify_passes=PASSES),
                         CancelToken())
    assert two.text == region + text and two.confidence is not None
    one = engine.predict(p, SamplerParams(block_len=block, max_blocks=1, memory_first=CHECKED, verify_passes=PASSES), CancelToken())
    assert one.text == region  # one block too small: not scored, so vetoed


def test_typing_prompts_score_the_insertion_alone(engine):
    """Prompt.insert (layout 2): the block is the proposal and <eom>, not the region again, so a
    long typed line leaves the block's slots to the proposal."""
    import torch
    from dlm.coder_model.cache import PrefixCache
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.verify import score_proposals

    typed = "    result = compute_the_value(first_argument, second_argument, "
    proposals = (MemoryProposal("third_argument)", 0.4),)
    p = Prompt(**{**PROMPT, "region": typed, "cursor": len(typed)}, proposals=proposals, insert=True)
    cache = PrefixCache()
    with torch.inference_mode():
        engine.model.prefill(encode_prompt(engine.tok, p, engine.budget), cache)
    as_insertion, _ = score_proposals(engine.model, engine.tok, cache, p.region, p.cursor, proposals, 8, 2,
                                      insert=True)
    as_region, ran = score_proposals(engine.model, engine.tok, cache, p.region, p.cursor, proposals, 8, 2)
    assert as_region == [None] and ran == 0  # the whole region does not fit 8 slots
    assert as_insertion[0] is not None and 0 < as_insertion[0] < 1


def test_a_proposal_the_memory_is_sure_of_is_answered_without_a_pass(engine):
    """The fast path (SamplerParams.memory_first): the memory's best proposal, its own confidence
    at or over the threshold, is answered with no prefill and no pass; below it, the check runs."""
    proposals = (MemoryProposal("open(path) as f:", 0.9), MemoryProposal("os.fdopen(path) as f:", 0.05))
    p = Prompt(**{**PROMPT, "region": "    with ", "cursor": 9}, proposals=proposals)
    sure = Mix().combine(0.9, None)
    fast = engine.predict(p, SamplerParams(memory_first=sure, verify_passes=PASSES), CancelToken())
    assert fast.text == "    with open(path) as f:" and fast.steps == 0 and fast.prefill_ms < 1.0
    assert fast.confidence == pytest.approx(sure)
    assert [t for t, _ in fast.proposal_confidences] == ["open(path) as f:", "os.fdopen(path) as f:"]
    checked = engine.predict(p, SamplerParams(memory_first=sure + 1e-3, verify_passes=PASSES), CancelToken())
    assert checked.steps == 2


def test_the_fast_path_needs_passes_and_proposals():
    proposals = (MemoryProposal("a", 0.99),)
    assert Mix(first=0.5, passes=PASSES).checked(proposals).passes == 0
    assert Mix(first=1.5, passes=PASSES).checked(proposals).passes == PASSES
    assert Mix(first=0.0, passes=PASSES).checked(()).passes == PASSES
    assert Mix(first=0.0, passes=0).checked(proposals).passes == 0
    assert Mix(first=0.5, veto=0.1, passes=PASSES).checked(proposals).passes == PASSES  # a veto checks them all
