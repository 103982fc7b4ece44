"""Every proposal the check lets through is ranked by its own confidence (coder_model.verify.ranked),
and the engine answers the ranking with the prediction (Prediction.proposal_confidences): the
language server lists the runners-up as alternatives to the answer."""

from __future__ import annotations

import pytest
from dlm.coder_model.types import CancelToken, MemoryProposal, Prompt, SamplerParams
from dlm.coder_model.verify import Mix, choose, ranked

PROMPT = {"prefix": "import os\n\n\ndef read(path):\n", "region": "    with ", "cursor": 9,
          "suffix": "\n        return f.read()\n", "language": "python", "path": "m.py"}


def test_ranked_orders_by_the_mixed_confidence_and_leaves_out_the_vetoed():
    proposals = (MemoryProposal("a", 0.2), MemoryProposal("b", 0.7), MemoryProposal("c", 0.5),
                 MemoryProposal("d", 0.9))
    mix = Mix(model_weight=1.0, veto=0.05, passes=2)
    order = ranked(proposals, [0.9, 0.01, 0.5, None], mix)  # b is vetoed, d did not fit the block
    assert [j for j, _ in order] == [2, 0]  # c: 0.5 x 0.5 beats a: 0.2 x 0.9 under this mix
    assert [c for _, c in order] == pytest.approx([mix.combine(0.5, 0.5), mix.combine(0.2, 0.9)])
    assert choose(proposals, [0.9, 0.01, 0.5, None], mix) == order[0]


def test_ranked_without_the_model_follows_the_memory_and_ties_keep_its_order():
    proposals = (MemoryProposal("a", 0.4), MemoryProposal("b", 0.6), MemoryProposal("c", 0.4))
    assert [j for j, _ in ranked(proposals, [None] * 3, Mix(passes=0))] == [1, 0, 2]
    assert ranked(proposals, [None] * 3, Mix(passes=2)) == []  # with the model, an unscored proposal is vetoed


def test_the_engine_answers_the_best_proposal_with_every_ones_confidence(engine):
    proposals = (MemoryProposal("open(path) as f:", 0.4), MemoryProposal("os.fdopen(path) as f:", 0.3),
                 MemoryProposal("x" * 400, 0.9))  # longer than the block: never scored, never listed
    # every proposal checked (sampler.memoryFirst above 1: no fast path for the sure one)
    pred = engine.predict(Prompt(**PROMPT, proposals=proposals), SamplerParams(memory_first=2.0, verify_passes=2), CancelToken())
    listed = pred.proposal_confidences
    assert sorted(t for t, _ in listed) == sorted(p.text for p in proposals[:2])
    assert [c for _, c in listed] == sorted((c for _, c in listed), reverse=True)
    # the answer is the best of them
    assert pred.text == "    with " + listed[0][0] and pred.confidence == listed[0][1]


def test_a_free_decode_has_no_proposal_confidences(engine):
    pred = engine.predict(Prompt(**PROMPT), SamplerParams(steps=2, max_blocks=1), CancelToken())
    assert pred.proposal_confidences == ()
