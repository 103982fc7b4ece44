"""coder_model.refine: a run that starts from the memory's best draft keeps it where the model
agrees, rewrites the slots it is sure of in parallel, and counts only rewritten tokens."""

from __future__ import annotations

import pytest
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.layout import encode_prompt, encode_target
from dlm.coder_model.refine import draft_block, refine
from dlm.coder_model.types import MemoryProposal, Prompt, SamplerParams

PROMPT = Prompt(prefix="x = 1\n", region="y = ", cursor=4, suffix="\n", path="a.py", insert=True,
                proposals=(MemoryProposal("x + 1", 0.6),))


def test_the_block_is_the_draft_then_its_end(tiny_model):
    _, tok = tiny_model
    block = draft_block(tok, "x + 1", 8)
    assert block[: len(encode_target(tok, "x + 1"))] == encode_target(tok, "x + 1") and len(block) == 8
    assert block[-1] == tok.pad_id
    assert draft_block(tok, "x + 1 " * 20, 8) == encode_target(tok, "x + 1 " * 20)[:8]  # cut, no end


def test_a_sure_of_nothing_model_keeps_the_draft_and_commits_no_token(tiny_model):
    model, tok = tiny_model
    ids = encode_prompt(tok, PROMPT)
    pred = refine(model, tok, ids, "x + 1", SamplerParams(block_len=8, steps=4, threshold=1.0),
                  cache=PrefixCache(), prompt=PROMPT)
    assert pred.text == "y = x + 1" and pred.tokens == 0 and pred.steps == 1 and 0 < pred.confidence <= 1


def test_rewrites_happen_in_parallel_and_only_they_count(make_checkpoint, tmp_path):
    from dlm.coder_model.checkpoint import load_model

    # untied output rows: a random model's guesses are not its input tokens (tied ones echo them)
    model, tok = load_model(make_checkpoint(tmp_path / "u", tie_embeddings=False), impl="reference")
    ids = encode_prompt(tok, PROMPT)
    params = SamplerParams(block_len=8, steps=3, threshold=0.0)
    pred = refine(model, tok, ids, "x + 1", params, cache=PrefixCache(), prompt=PROMPT)
    again = refine(model, tok, ids, "x + 1", params, cache=PrefixCache(), prompt=PROMPT)
    assert pred.text == again.text and pred.tokens == again.tokens  # deterministic
    # a random model disagrees with most of the draft: it rewrites several slots in its first step
    assert pred.tokens >= 2 and 1 <= pred.steps <= 3
    assert pred.text.startswith("y = ") or pred.text == PROMPT.region


def test_a_cancelled_run_touches_nothing(tiny_model):
    from dlm.coder_model.types import CancelToken

    model, tok = tiny_model
    c = CancelToken()
    c.cancel()
    pred = refine(model, tok, encode_prompt(tok, PROMPT), "x + 1", SamplerParams(block_len=8), cache=PrefixCache(),
                  cancel=c, prompt=PROMPT)
    assert pred.cancelled and pred.steps == 0


def test_a_model_trained_to_start_from_drafts_is_served_so(make_checkpoint, tmp_path):
    from dlm.coder_model.config import ModelConfig
    from dlm.coder_model.engine import load_engine
    from dlm.coder_model.types import CancelToken

    with pytest.raises(ValueError, match="draft_start needs a drafts window"):
        ModelConfig(context_window=128, draft_start=True)
    eng = load_engine(make_checkpoint(tmp_path / "b", context_window=128, drafts_window=16, draft_start=True), "cpu")
    try:
        sure = eng.predict(PROMPT, SamplerParams(block_len=8, steps=4, threshold=1.0, verify_passes=0),
                           CancelToken())
        assert sure.text == "y = x + 1" and sure.tokens == 0 and not sure.proposal_confidences
        checked = eng.predict(PROMPT, SamplerParams(block_len=8, steps=4, verify_passes=1), CancelToken())
        assert checked.proposal_confidences  # a check asked for is a check
    finally:
        eng.close()
