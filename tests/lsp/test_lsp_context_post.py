"""Unit tests: context windows (region snapping, hysteresis) and post-processing."""

from __future__ import annotations

import time

from dlm.coder_model.budget import CHARS_PER_TOKEN, chars_for, plan
from dlm.coder_model.types import LayoutBudget
from dlm.lsp import context, postprocess
from dlm.lsp.documents import Document
from dlm.lsp.options import ContextOptions, parse_options


def _build(doc, row, col, mode, opts, budget: LayoutBudget | None = None):
    return context.build(doc, row, col, mode, opts, context.windows_for(budget or LayoutBudget(), opts))

PY = "".join(f"v{i} = {i}\n" for i in range(400)) + "def f(a,\n      b):\n    return g(a,\n             b)\n"


def test_typing_region_is_cursor_line_plus_rest_of_statement():
    doc = Document("file:///c.py", PY, 1, "python")
    b = _build(doc, 402, 12, "typing", ContextOptions())
    assert (b.start_line, b.end_line) == (402, 403)
    assert b.prompt.region == "    return g(a,\n             b)"
    assert b.prompt.region[: b.prompt.cursor] == "    return g"
    assert b.prompt.suffix.startswith("\n")
    assert b.prompt.prefix.endswith("      b):\n")
    assert b.prompt.language == "python"


def test_wide_region_spans_a_few_lines_snapped_to_statements():
    doc = Document("file:///c.py", PY, 1, "python")
    b = _build(doc, 402, 4, "wide", ContextOptions())
    assert b.start_line == 400 and b.end_line == 404  # widened to the def header; ends at the last line
    assert len(b.prompt.region) <= ContextOptions().wide_region_tokens * CHARS_PER_TOKEN


def test_windows_respect_budgets_and_start_at_line_boundaries():
    opts = ContextOptions(prefix_tokens=100, suffix_tokens=20)
    doc = Document("file:///c.py", PY, 1, "python")
    b = _build(doc, 200, 0, "typing", opts)
    assert len(b.prompt.prefix) <= chars_for(100)
    assert b.prompt.prefix.startswith("v") and b.prompt.prefix.endswith("\n")
    assert len(b.prompt.suffix) <= chars_for(20)


def test_prefix_window_start_is_stable_while_typing_and_pressing_enter():
    opts = ContextOptions(prefix_tokens=100)
    doc = Document("file:///c.py", PY, 1, "python")
    first = _build(doc, 200, 7, "typing", opts).prompt.prefix
    start_line = doc.anchors["prefix"]
    version = 2
    for ch in "abc":  # typing inside the line
        doc.apply((200, 7), (200, 7), ch, version)
        version += 1
        assert _build(doc, 200, 8, "typing", opts).prompt.prefix == first
    doc.apply((200, 10), (200, 10), "\n", version)  # Enter: the prefix grows by one line, same start
    p = _build(doc, 201, 0, "typing", opts).prompt.prefix
    assert p.startswith(first) and doc.anchors["prefix"] == start_line
    # A jump far away re-anchors.
    _build(doc, 20, 0, "typing", opts)
    assert doc.anchors["prefix"] != start_line


def test_anchor_follows_lines_inserted_above():
    opts = ContextOptions(prefix_tokens=100)
    doc = Document("file:///c.py", PY, 1, "python")
    before = _build(doc, 200, 0, "typing", opts).prompt.prefix
    a = doc.anchors["prefix"]
    doc.apply((0, 0), (0, 0), "import x\n", 2)
    assert doc.anchors["prefix"] == a + 1
    assert _build(doc, 201, 0, "typing", opts).prompt.prefix == before


def test_minified_line_gives_no_prompt():
    doc = Document("file:///m.js", "x=1;" * 1000, 1, "javascript")
    assert _build(doc, 0, 5, "typing", ContextOptions()) is None


def test_mode_typing_only_right_after_an_edit_near_the_cursor():
    doc = Document("file:///c.py", PY, 1, "python")
    assert context.choose_mode(doc, 10, ContextOptions()) == "wide"
    doc.apply((10, 0), (10, 0), "x", 2)
    assert context.choose_mode(doc, 10, ContextOptions()) == "typing"
    assert context.choose_mode(doc, 50, ContextOptions()) == "wide"  # a jump
    assert context.choose_mode(doc, 10, ContextOptions(), now=doc.last_change_at + 1.0) == "wide"


def test_after_a_pause_or_a_jump_a_completion_point_still_gets_an_insertion():
    """Where the rest of a line can be offered, a pause, an explicit trigger or a cursor move changes
    nothing: the insertion (with the repository memory), as right after a keystroke; mid-line, the
    region rewrite keeps its place."""
    text = "def f(a):\n    return g(a\n    x = h()\n\n    if y:\n"
    doc = Document("file:///p.py", text, 1, "python")  # opened: no keystroke yet
    later = time.monotonic() + 10.0
    cases = [
        (1, len("    return g(a"), "typing"),  # the end of the line's text
        (2, len("    x = h("), "typing"),  # only a closing bracket after it
        (4, len("    if y"), "typing"),  # only a colon after it
        (3, 0, "typing"),  # an empty line
        (2, len("    x = "), "wide"),  # text after the cursor: the region rewrite
        (0, 4, "wide"),
    ]
    for row, col, mode in cases:
        assert context.choose_mode(doc, row, ContextOptions(), now=later, col=col) == mode, (row, col)
    assert context.at_completion_point("    s = f(\"a\")", len("    s = f(\"a")) is True
    assert context.at_completion_point("    s = f(a) + 1", len("    s = f(a")) is False


def test_options_from_initialization_options():
    opts, problems = parse_options(
        {
            "context": {"prefixTokens": 64, "bogus": 1},
            "sampler": {"steps": 8},
            "throttleMs": 5,
            "scheduler": {"throttleMs": "fast"},
        }
    )
    assert opts.context.prefix_tokens == 64 and opts.sampler == {"steps": 8}
    assert len(problems) == 3 and any("bogus" in p for p in problems)
    assert opts.scheduler.throttle_ms == 20  # the bad value kept the default
    assert parse_options([1])[1]


# ---- post-processing --------------------------------------------------------------------------------


def test_no_change_no_suggestion():
    assert postprocess.suggest("x = 1", 3, "x = 1").empty
    assert postprocess.suggest("x = 1\ny = 2", 3, "\n").empty  # erasing the region is no proposal


def test_pure_insertion_at_cursor():
    s = postprocess.suggest("x = ", 4, "x = foo(1)")
    assert s.insert_text == "foo(1)" and s.replace_end is None and not s.edits


def test_mid_line_is_single_line_and_closers_not_repeated():
    # cursor inside "print(|)": the model writes "x)\ny = 2" -> one line, no second ")"
    s = postprocess.suggest("print()", 6, "print(x)\ny = 2)")
    assert s.insert_text in ("", "x")
    s = postprocess.suggest("print()", 6, "print(x))")
    assert s.insert_text == "x"


def test_rewrite_of_the_rest_of_the_line_gets_a_range():
    old = "value = compute(a)\nnext()"
    new = "value = compute_all(a, b)\nnext()"
    s = postprocess.suggest(old, 15, new)
    assert s.insert_text == "_all(a, b)" and s.replace_end == len("value = compute(a)")


def test_edit_away_from_cursor_goes_to_edits():
    old = "def f(a):\n    return b\n"
    new = "def f(a, b):\n    return b\n"
    s = postprocess.suggest(old, len(old) - 1, new)
    assert not s.insert_text
    assert [(e.start, e.end, e.text) for e in s.edits] == [(7, 7, ", b")]


def test_drop_repeat_of_next_lines():
    old = "if x:\n    "
    new = "if x:\n    y = 1\n    return y"
    s = postprocess.suggest(old, len(old), new, suffix="\n    return y\n")
    assert s.insert_text == "y = 1"
    s = postprocess.suggest("a = ", 4, "a = b", suffix="b\n")
    assert s.insert_text == ""  # only retypes what follows


def test_unbalanced_closer_is_cut():
    s = postprocess.suggest("x = ", 4, "x = a + b) * 2")
    assert s.insert_text == "a + b"


def test_minimal_edits_merge_nearby_changes():
    edits = postprocess.minimal_edits("foo(abc)", "foo(xbz)")
    assert [(e.start, e.end, e.text) for e in edits] == [(4, 7, "xbz")]


def test_windows_are_the_models_cuts_under_the_users_caps():
    small = LayoutBudget.for_window(256)
    win = context.windows_for(small, ContextOptions())
    cuts = plan(small)
    assert (win.prefix_chars, win.suffix_chars) == (chars_for(256 - 16 - 64), chars_for(64))
    assert win.history_chars == cuts.history_chars
    capped = context.windows_for(LayoutBudget.for_window(8192), ContextOptions(prefix_tokens=1024, suffix_tokens=256))
    assert (capped.prefix_chars, capped.suffix_chars) == (chars_for(1024), chars_for(256))  # the caps hold
    assert context.windows_for(small, ContextOptions(prefix_tokens=10_000)).prefix_chars == win.prefix_chars


def test_an_insertion_may_close_a_bracket_opened_lines_above():
    """`)` on a line of its own closes a call opened above: the commonest short completion in real
    code, once cut by the bracket filter because the cursor line alone opens nothing."""
    prefix = "result = compute(\n    alpha,\n    beta,\n"
    s = postprocess.suggest("", 0, ")", "\nprint(result)\n", prefix)
    assert s.insert_text == ")"
    stray = postprocess.suggest("x = 1", 5, "x = 1)", "\n", "y = 2\n")
    assert stray.insert_text == ""  # nothing before the cursor opens it: still cut
