"""The sampler: cache exactness, commit rules, <eom> handling, AR equivalence, cancellation."""

from __future__ import annotations

import torch
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.layout import encode_prompt
from dlm.coder_model.sampler import BlockDecoder, generate, output_head
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

PROMPT = Prompt(prefix="def add(a, b):\n", region="    return a\n", cursor=12, suffix="\nprint(add(1, 2))\n",
                path="m.py", language="python")


# the sampler without its defences against degenerate answers (repetition penalty, length-aware end)
PLAIN = {"repeat_penalty": 0.0, "end_threshold": 0.0}


def _ids(tok):
    return encode_prompt(tok, PROMPT)


def _uncached_generate(model, tok, ids, params):
    """Every step recomputes context + block from scratch; the decoder's own cache is never read."""
    dec = BlockDecoder(model, tok, ids, params)
    dec._new_block()
    with torch.inference_mode():
        while not dec.done:
            n_ctx = len(dec.context_ids)
            seq = torch.tensor([dec.context_ids + dec.block_input().tolist()])
            hidden = model(seq, context_len=n_ctx)[0, n_ctx:]  # (L, dim)
            dec.advance(hidden)
    return dec


def test_cached_and_uncached_sampling_commit_identical_tokens(tiny_model):
    model, tok = tiny_model
    for params in (SamplerParams(block_len=16, steps=16, threshold=0.3),
                   SamplerParams(block_len=8, steps=4, max_blocks=2)):
        cached = generate(model, tok, _ids(tok), params)
        uncached = _uncached_generate(model, tok, _ids(tok), params)
        assert cached.output == uncached.output
        assert cached.stats.committed_per_step == uncached.stats.committed_per_step


def test_cache_reused_across_calls_gives_same_tokens(tiny_model):
    model, tok = tiny_model
    params = SamplerParams(block_len=12, steps=12)
    cache = PrefixCache()
    first = generate(model, tok, _ids(tok), params, cache=cache)
    again = generate(model, tok, _ids(tok), params, cache=cache)
    fresh = generate(model, tok, _ids(tok), params)
    assert again.stats.cached_tokens == len(_ids(tok))
    assert first.output == again.output == fresh.output


def test_at_least_one_slot_per_step_and_step_budget(tiny_model):
    model, tok = tiny_model
    for steps in (1, 3, 32):
        dec = generate(model, tok, _ids(tok), SamplerParams(block_len=16, steps=steps, threshold=1.0, max_blocks=1))
        assert all(n >= 1 for n in dec.stats.committed_per_step)
        assert dec.stats.steps <= steps


def test_eom_pads_the_rest_of_the_block_at_once(tiny_model, monkeypatch):
    """The sampler's bookkeeping: a scorer that proposes <eom> at slot 3 ends the block there."""
    model, tok = tiny_model
    word = tok.encode("x")[0]

    def scorer(self, hidden, pos):
        toks = torch.tensor([tok.eom_id if int(p) == 3 else word for p in pos])
        conf = torch.tensor([0.99 if int(p) == 3 else 0.1 for p in pos])
        return toks, conf

    monkeypatch.setattr(BlockDecoder, "_score", scorer)
    # the penalties off: this is the bookkeeping of a scorer's answer (theirs: tests below)
    dec = generate(model, tok, _ids(tok), SamplerParams(block_len=32, steps=32, threshold=0.9, **PLAIN))
    # step 1 commits <eom> at slot 3 (above threshold): slots 4..31 become <pad>, and
    # slots 0..2 take one step each at most
    assert dec.stats.steps <= 4
    assert dec.output == [word] * 3 and dec.ended
    assert dec.stats.blocks == 1


def test_threshold_one_left_to_right_equals_greedy_autoregressive(tiny_model):
    model, tok = tiny_model
    L = 10
    ids = _ids(tok)
    dec = generate(model, tok, ids, SamplerParams(block_len=L, steps=L, threshold=1.0,
                                                  order="left_to_right", max_blocks=1, **PLAIN))
    # greedy AR on the same network: slot i is the argmax (over the tokens the sampler
    # may output) given slots < i, the rest masked
    w, token_of_row = output_head(model, tok)
    out = []
    with torch.inference_mode():
        for i in range(L):
            block = out + [tok.mask_id] * (L - i)
            h = model(torch.tensor([ids + block]), context_len=len(ids))[0, len(ids) + i]
            nxt = int(token_of_row[(h @ w.t()).argmax()])
            out.append(nxt)
            if nxt in (tok.eom_id, tok.pad_id):
                break
    content = []
    for t in out:
        if t in (tok.eom_id, tok.pad_id):
            break
        content.append(t)
    assert dec.output == content
    assert dec.stats.committed_per_step == [1] * dec.stats.steps


def test_cancel_stops_within_one_step(tiny_model):
    model, tok = tiny_model
    cancel = CancelToken()
    steps_seen = []
    orig = BlockDecoder.advance

    def advance_then_cancel(self, hidden):
        orig(self, hidden)
        steps_seen.append(self.stats.steps)
        cancel.cancel()  # the user typed: the next check must stop

    BlockDecoder.advance = advance_then_cancel
    try:
        dec = generate(model, tok, _ids(tok), SamplerParams(block_len=32, steps=32, threshold=1.0), cancel=cancel)
    finally:
        BlockDecoder.advance = orig
    assert dec.stats.cancelled and dec.stats.steps == 1


def test_cancelled_before_start_does_no_work(tiny_model):
    model, tok = tiny_model
    cancel = CancelToken()
    cancel.cancel()
    dec = generate(model, tok, _ids(tok), SamplerParams(), cancel=cancel)
    assert dec.stats.cancelled and dec.stats.steps == 0 and dec.stats.prefill_ms == 0


def test_block_extension_appends_a_second_block(tiny_model, monkeypatch):
    model, tok = tiny_model
    word = tok.encode("x")[0]
    monkeypatch.setattr(BlockDecoder, "_score",
                        lambda self, h, pos: (torch.full((len(pos),), word), torch.ones(len(pos))))
    dec = generate(model, tok, _ids(tok), SamplerParams(block_len=4, steps=4, max_blocks=3, threshold=0.5, **PLAIN))
    assert dec.stats.blocks == 3 and len(dec.output) == 12 and not dec.ended
    assert len(dec.cache) == len(_ids(tok)) + 8  # finished blocks became context


def test_layout_markers_and_mask_are_never_output(tiny_model):
    """The random tiny model's raw argmax is often a special token; the sampler only
    ever commits content tokens, <eom> and <pad>."""
    model, tok = tiny_model
    w, token_of_row = output_head(model, tok)
    forbidden = {tok.special[n] for n in tok.special if n not in ("<pad>", "<eom>")}
    assert not forbidden & set(token_of_row.tolist())
    assert w.shape[0] == len(token_of_row) == tok.vocab_size - len(forbidden)
    dec = generate(model, tok, _ids(tok), SamplerParams(block_len=16, steps=16, max_blocks=2))
    assert not forbidden & set(dec.output)


# ---- defences against degenerate answers


def _crafted_hidden(model, tok, rows_per_slot):
    """Hidden states (L, dim) whose logits put nearly all probability on the given output-head
    row of each slot (rows of a random head are nearly orthogonal: a scaled row picks itself)."""
    w, _ = output_head(model, tok)
    h = torch.stack([w[r] * (60.0 / w[r].norm() ** 2) for r in rows_per_slot])
    probs = torch.softmax(h @ w.t(), -1)
    assert (probs.argmax(-1) == torch.tensor(rows_per_slot)).all() and probs.max(-1).values.min() > 0.9
    return h


def test_planned_end_is_the_first_slot_the_model_thinks_has_ended():
    from dlm.coder_model.sampler import planned_end

    curve = [0.02, 0.1, 0.3, 0.55, 0.6, 0.5, 0.99]  # P(ended by slot j): rises, not monotone
    assert planned_end(curve, 0.5) == 3 and planned_end(curve, 0.3) == 2 and planned_end(curve, 0.995) is None


def test_length_aware_decoding_commits_eom_before_any_content(tiny_model):
    model, tok = tiny_model
    _w, token_of_row = output_head(model, tok)
    words = [5, 6, 7]  # output-head rows of three content tokens; row 0 is <pad>
    h = _crafted_hidden(model, tok, words + [0] * 5)
    # steps=1: every slot is committed in this one step
    dec = BlockDecoder(model, tok, _ids(tok), SamplerParams(block_len=8, steps=1, repeat_penalty=0.0))
    dec.prefill()
    dec.advance(h)
    assert dec.slots[3] == tok.eom_id and dec.slots[4:] == [tok.pad_id] * 4 and dec.stats.ended_by == "length"
    assert dec.slots[:3] == [int(token_of_row[r]) for r in words] and dec.done and dec.ended


def test_repeats_next_to_a_slot_are_found_on_both_sides(tiny_model):
    from dlm.coder_model.sampler import UNSET

    model, tok = tiny_model
    a, b, c, d = (tok.encode(x)[0] for x in ("a", "b", "c", "d"))
    dec = BlockDecoder(model, tok, _ids(tok), SamplerParams(block_len=10))
    dec._new_block()
    dec.slots = [a, b, a, b, UNSET, c, d, c, d, UNSET]
    reps, blank = dec._repeats(4)
    assert reps == {b, a, c, d} and not blank  # b, c adjacent; a starts a third (a b); d ends a third (c d)
    nl = tok.encode("x\n\n")
    dec.slots = nl + [UNSET] * (10 - len(nl))
    assert dec._repeats(len(nl))[1]  # after a blank line, a line break makes a second one
    left, right = tok.encode("x\n"), tok.encode("\ny")
    dec.slots = left + [UNSET] + right + [UNSET] * (9 - len(left) - len(right))
    assert dec._repeats(len(left))[1]  # between a line end and a blank line: the same
    dec.slots = left + [UNSET] + tok.encode("y") + [UNSET] * (8 - len(left))
    assert not dec._repeats(len(left))[1]  # one blank line is fine


def test_repeat_penalty_moves_a_slot_off_a_repeating_token(tiny_model):
    model, tok = tiny_model
    _w, token_of_row = output_head(model, tok)
    a, b = int(token_of_row[5]), int(token_of_row[6])
    h = _crafted_hidden(model, tok, [5, 6, 5, 6, 5, 7, 7, 7])  # slot 4 wants `a` again: a b a b [a]
    for penalty, expect_a in ((0.0, True), (100.0, False)):
        dec = BlockDecoder(model, tok, _ids(tok), SamplerParams(block_len=8, steps=1, max_blocks=1,
                                                                end_threshold=0.0, repeat_penalty=penalty))
        dec._new_block()
        dec.slots[:4] = [a, b, a, b]
        dec.advance(h)  # steps=1: every slot committed, the block (and the answer) done
        assert dec.done and len(dec.output) == 8 and (dec.output[4] == a) == expect_a


def test_an_unterminated_answer_shows_only_its_whole_lines(tiny_model, monkeypatch):
    """No <eom> in max_blocks blocks: the answer is cut like a late one (whole lines inserted
    at the cursor), never shown as a region that stops mid-thought."""
    model, tok = tiny_model
    seq = tok.encode(PROMPT.region[: PROMPT.cursor] + " + b\nfoo bar baz qux quux corge grault garply")
    L = 8

    def scorer(self, hidden, pos):
        base = (self.stats.blocks - 1) * L
        toks = [seq[base + int(p)] if base + int(p) < len(seq) else seq[-1] for p in pos]
        return torch.tensor(toks), torch.ones(len(pos))

    monkeypatch.setattr(BlockDecoder, "_score", scorer)
    dec = generate(model, tok, _ids(tok), SamplerParams(block_len=L, steps=L, max_blocks=2, **PLAIN), prompt=PROMPT)
    assert dec.unterminated and len(dec.output) == 2 * L
    text, _ = dec.answer()
    assert text == "    return a + b\n"


def test_an_insertion_answer_is_the_region_with_the_insertion_at_the_cursor(tiny_model, monkeypatch):
    """Typing (Prompt.insert): the blocks hold only the insertion; the answer is still the new region
    (nothing changes for callers), complete or cut like a late one."""
    from dataclasses import replace

    model, tok = tiny_model
    prompt = replace(PROMPT, region="    return a(x)\n", cursor=12, insert=True)
    seq = tok.encode(" + b") + [tok.eom_id]
    L = 8

    def scorer(self, hidden, pos):
        toks = [seq[int(p)] if int(p) < len(seq) else tok.pad_id for p in pos]
        return torch.tensor(toks), torch.ones(len(pos))

    monkeypatch.setattr(BlockDecoder, "_score", scorer)
    ids = encode_prompt(tok, prompt)
    assert ids[-1] == tok.special["<cursor>"]
    dec = generate(model, tok, ids, SamplerParams(block_len=L, steps=L, max_blocks=1, **PLAIN), prompt=prompt)
    text, _ = dec.answer()
    assert dec.ended and text == "    return a + b(x)\n"
    # unterminated: the whole words of the insertion only, at the cursor
    seq[:] = tok.encode(" + bbb cc dd ee ff gg hh ii")
    dec = generate(model, tok, ids, SamplerParams(block_len=L, steps=L, max_blocks=1, **PLAIN), prompt=prompt)
    text, _ = dec.answer()
    assert dec.unterminated and text.startswith("    return a + bbb") and text.endswith("(x)\n")


def test_the_embedded_model_writes_no_filler_on_typing_prompts():
    """Standard-library lines typed halfway (bench.answers' cases): with the defaults, the
    embedded model's answers are not degenerate (without the defences 37 of 60 were, blank-line
    runs most). Measured in BENCHMARKS.md; here 12 prompts, at most one may slip through."""
    from dlm.coder_model.checkpoint import load_model
    from dlm.coder_model.degenerate import degenerate_region
    from dlm.coder_model.layout import LayoutBudget
    from dlm.drivers.bench.answers import typing_cases

    model, tok = load_model(None, impl="reference")
    budget = LayoutBudget.for_window(model.config.context_window)
    bad = []
    for prompt, _line in typing_cases(12):
        dec = generate(model, tok, encode_prompt(tok, prompt, budget), SamplerParams(), prompt=prompt)
        text, _ = dec.answer()
        assert dec.ended and dec.stats.blocks == 1
        if degenerate_region(prompt.region, text, prompt.prefix, prompt.suffix):
            bad.append(text)
    assert len(bad) <= 1, bad
