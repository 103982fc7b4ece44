"""LocalEngine behind the Engine protocol."""

from __future__ import annotations

import threading

from dlm.coder_model.engine import LocalEngine, load_engine
from dlm.coder_model.types import CancelToken, Engine, Prompt, SamplerParams


def test_local_engine_predicts_and_reuses_cache(tiny_checkpoint):
    eng = load_engine(tiny_checkpoint, "cpu")
    try:
        assert isinstance(eng, Engine) and isinstance(eng, LocalEngine)
        p = Prompt(prefix="x = 1\n", region="y = \n", cursor=4, suffix="", path="a.py")
        a = eng.predict(p, SamplerParams(block_len=8, steps=8), CancelToken())
        b = eng.predict(p, SamplerParams(block_len=8, steps=8), CancelToken())
        assert not a.cancelled and a.steps >= 1 and a.text == b.text
        assert a.cached_tokens == 0 and b.cached_tokens == b.context_tokens > 0
        assert eng.status().state == "ready"
    finally:
        eng.close()


def test_cancelled_while_queued_skips_the_model(tiny_checkpoint):
    eng = load_engine(tiny_checkpoint, "cpu")
    try:
        c = CancelToken()
        c.cancel()
        r = eng.predict(Prompt(prefix="", region="", cursor=0, suffix=""), SamplerParams(), c)
        assert r.cancelled and r.steps == 0 and eng.runs == 0
    finally:
        eng.close()


def test_concurrent_callers_are_serialised(tiny_checkpoint):
    eng = load_engine(tiny_checkpoint, "cpu")
    results = []
    try:
        def call(i):
            p = Prompt(prefix=f"v{i} = {i}\n", region="", cursor=0, suffix="", path=f"f{i}.py")
            results.append(eng.predict(p, SamplerParams(block_len=4, steps=4), CancelToken()))
        ts = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert len(results) == 4 and all(not r.cancelled for r in results)
    finally:
        eng.close()


def test_close_joins_the_inference_thread(tiny_checkpoint):
    """A process that exits right after close() must not race the thread's teardown
    (seen as 'terminate called without an active exception', exit 134)."""
    eng = load_engine(tiny_checkpoint, "cpu")
    eng.predict(Prompt(prefix="", region="x\n", cursor=1, suffix=""), SamplerParams(block_len=4, steps=2),
                CancelToken())
    eng.close()
    assert not eng._thread.is_alive()


def test_warm_up_runs_a_decode_and_a_proposal_check_and_leaves_no_trace(tiny_checkpoint, monkeypatch):
    """On a GPU the engine warms up before it says ready (the first Triton calls compile); the warm-up
    goes through both model paths, and leaves neither a prefix cache nor a counted run behind."""
    from dlm.coder_model import engine as engine_mod

    eng = load_engine(tiny_checkpoint, device="cpu")  # the CPU loads without a warm-up
    seen = []
    real = engine_mod.verify_prediction

    def spy(*a, **k):
        seen.append("verify")
        return real(*a, **k)

    monkeypatch.setattr(engine_mod, "verify_prediction", spy)
    try:
        assert eng.runs == 0
        took = engine_mod.warm_up(eng)
        assert took >= 0 and seen == ["verify"]
        assert eng.runs == 0 and engine_mod.WARM_UP_PROMPT.path not in eng._caches
        pred = eng.predict(Prompt(prefix="x = ", region="", cursor=0, suffix=""), SamplerParams(steps=2),
                           CancelToken())
        assert pred.steps >= 1 and eng.runs == 1
    finally:
        eng.close()


def test_a_model_trained_with_drafts_writes_from_them_unless_a_check_is_asked(make_checkpoint, tmp_path):
    """A checkpoint with a drafts window decodes with the memory's drafts in its context (no check
    pass asked); asked for a check, it checks them as any model does. A model without a drafts
    window answers from the memory's proposals (checked or in their order) and never decodes."""
    from dlm.coder_model.layout import decode_context, encode_prompt
    from dlm.coder_model.types import MemoryProposal

    prompt = Prompt(prefix="x = 1\n", region="y = ", cursor=4, suffix="\n", path="a.py", insert=True,
                    proposals=(MemoryProposal("x + 1", 0.6), MemoryProposal("x * 2", 0.3)))
    with_drafts = load_engine(make_checkpoint(tmp_path / "d", context_window=128, drafts_window=16), "cpu")
    without = load_engine(make_checkpoint(tmp_path / "n", context_window=128), "cpu")
    try:
        assert with_drafts.budget.max_drafts == 16 and without.budget.max_drafts == 0
        seg = decode_context(with_drafts.tok, encode_prompt(with_drafts.tok, prompt, with_drafts.budget))
        assert seg["drafts"] == "x + 1\x00x * 2"
        written = with_drafts.predict(prompt, SamplerParams(block_len=8, steps=4, verify_passes=0), CancelToken())
        assert written.steps >= 1 and written.tokens >= 1 and not written.proposal_confidences
        checked = with_drafts.predict(prompt, SamplerParams(block_len=8, steps=4, verify_passes=1), CancelToken())
        assert checked.tokens == 0 and checked.proposal_confidences
        ordered = without.predict(prompt, SamplerParams(block_len=8, steps=4, verify_passes=0), CancelToken())
        assert ordered.steps == 0 and ordered.text == "y = x + 1"
    finally:
        with_drafts.close()
        without.close()
