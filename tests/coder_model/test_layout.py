"""The native layout: segments round-trip, budgets hold, typing keeps the prefix tokens."""

from __future__ import annotations

from dlm.coder_model.layout import LayoutBudget, decode_context, encode_prompt
from dlm.coder_model.types import Prompt

PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))


def test_segments_round_trip(tiny_model):
    _, tok = tiny_model
    p = Prompt(prefix="import os\n", region="x = os.path\n", cursor=5, suffix="print(x)\n",
               history=("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n",), language="python", path="m.py")
    seg = decode_context(tok, encode_prompt(tok, p))
    assert seg["prefix"] == "import os\n" and seg["suffix"] == "print(x)\n"
    assert seg["region_before_cursor"] == "x = o" and seg["region_after_cursor"] == "s.path\n"
    assert seg["history"] == p.history[0] and seg["file"] == "python:m.py\n"


def test_budget_and_prefix_stable_while_typing(tiny_model):
    _, tok = tiny_model
    b = LayoutBudget.for_window(256)
    starts = set()
    for typed in range(30):
        region = "    value = compute(" [: typed % 21] + "\n"
        ids = encode_prompt(tok, Prompt(prefix=PREFIX, region=region, cursor=len(region) - 1, suffix="x\n"), b)
        assert len(ids) <= 256
        p = ids.index(tok.special["<prefix>"])
        starts.add(tuple(ids[: p + 8]))  # the first prefix tokens
    assert len(starts) == 1  # typing in the region never moves the prefix start


# -- layout 2: insertion while typing, retrieved snippets ------------------------------------------


def test_insertion_prompt_round_trips_and_is_told_apart_from_a_rewrite(tiny_model):
    from dlm.coder_model.layout import answer_text, encode_target, new_region
    from dlm.coder_model.types import RetrievedSnippet

    _, tok = tiny_model
    p = Prompt(prefix="import os\n", region="x = os.pa(1)", cursor=9, suffix="\nprint(x)\n", language="python",
               path="m.py", insert=True,
               snippets=(RetrievedSnippet("pkg/util.py", "y = os.path.join(a)\n"), RetrievedSnippet("b.py", "z = 1\n")))
    ids = encode_prompt(tok, p)
    assert ids[-1] == tok.special["<cursor>"] and tok.special["<rewrite>"] not in ids
    seg = decode_context(tok, ids)
    assert seg["mode"] == "insert" and seg["file"] == "python:m.py\n"
    assert seg["snippets"] == "pkg/util.py\ny = os.path.join(a)\n\x00b.py\nz = 1\n"
    assert seg["region_before_cursor"] == "x = os.pa" and seg["region_after_cursor"] == "(1)"
    assert seg["prefix"] == "import os\n" and seg["suffix"] == "\nprint(x)\n"
    # the block holds only the insertion; the engine turns it back into the new region
    assert answer_text(p, "x = os.path(1)") == "th"
    assert new_region(p, "th") == "x = os.path(1)"
    assert encode_target(tok, "th") == tok.encode("th") + [tok.eom_id]
    rewrite = Prompt(prefix=p.prefix, region=p.region, cursor=p.cursor, suffix=p.suffix, language="python", path="m.py")
    assert decode_context(tok, encode_prompt(tok, rewrite))["mode"] == "rewrite"
    assert encode_prompt(tok, rewrite)[-1] == tok.special["<rewrite>"]
    assert answer_text(rewrite, "x = os.path(1)") == new_region(rewrite, "x = os.path(1)") == "x = os.path(1)"


def test_an_insertion_target_that_is_not_an_insertion_is_refused():
    import pytest
    from dlm.coder_model.layout import answer_text

    p = Prompt(prefix="", region="x = 1", cursor=3, suffix="", insert=True)
    with pytest.raises(ValueError, match="insert=False"):
        answer_text(p, "y = 1")  # rewrites the typed text: an edit, not an insertion


def test_snippets_keep_to_their_budget_and_never_move_while_typing(tiny_model):
    from dlm.coder_model.budget import plan
    from dlm.coder_model.types import RetrievedSnippet

    _, tok = tiny_model
    b = LayoutBudget.for_window(384)
    long_snippets = tuple(RetrievedSnippet(f"p{i}.py", "".join(f"v{j} = g({j})\n" for j in range(60))) for i in range(3))
    heads, prefix_starts = set(), set()
    for typed in range(21):
        region = "    value = compute("[:typed]
        p = Prompt(prefix=PREFIX, region=region, cursor=len(region), suffix="\nx\n", insert=True, snippets=long_snippets)
        ids = encode_prompt(tok, p, b)
        assert len(ids) <= 384
        files = [i for i, t in enumerate(ids) if t == tok.special["<file>"]]
        assert len(files) == 2  # the first snippet took the whole room (best first), then the file's own
        assert files[-1] - 1 == plan(b).snippets  # the snippets' tokens, <file> markers included
        heads.add(tuple(ids[: files[-1]]))
        pos = ids.index(tok.special["<prefix>"])
        prefix_starts.add(tuple(ids[: pos + 8]))
    assert len(heads) == 1 and len(prefix_starts) == 1  # typing keeps every token before the region


def test_snippets_come_from_the_best_lines_and_skip_weak_matches():
    from dlm.coder_model.memory.retrieve import Snippet
    from dlm.coder_model.snippets import MIN_SCORE, best_lines, pick, query_lines

    prefix = "".join(f"line_{i} = 0\n" for i in range(30)) + "conn = open_database(url)\ncursor = conn.cursor()\n"
    query = query_lines(prefix)
    assert len(query) == 10 and query[-1] == "cursor = conn.cursor()\n"
    window = "".join(f"other_{i} = 1\n" for i in range(12)) + "conn = open_database(DSN)\nrows = conn.cursor().fetch()\n"
    found = pick([Snippet("db.py", 0, window, 0.5), Snippet("weak.py", 0, "a = 1\n", MIN_SCORE / 2)], query)
    assert len(found) == 1 and found[0].path == "db.py"
    assert "open_database(DSN)" in found[0].text and found[0].text.count("\n") == 6
    a, b = best_lines(window.splitlines(keepends=True), {"conn", "open_database", "cursor"}, 2)
    assert (a, b) == (12, 14)


def test_short_snippets_share_the_room_best_first(tiny_model):
    from dlm.coder_model.types import RetrievedSnippet

    _, tok = tiny_model
    short = tuple(RetrievedSnippet(f"p{i}.py", f"v = g({i})\n") for i in range(3))
    ids = encode_prompt(tok, Prompt(prefix="a\n", region="b", cursor=1, suffix="", insert=True, snippets=short),
                        LayoutBudget.for_window(384))
    assert decode_context(tok, ids)["snippets"] == "p0.py\nv = g(0)\n\x00p1.py\nv = g(1)\n"  # MAX_SNIPPETS = 2


# -- layout 3: the repository memory's drafts ------------------------------------------------------


def _typing_prompt(proposals=()):
    from dlm.coder_model.types import MemoryProposal

    return Prompt(prefix=PREFIX, region="    value = comp", cursor=16, suffix="\nprint(value)\n", language="python",
                  path="m.py", insert=True, proposals=tuple(MemoryProposal(t, 0.5) for t in proposals))


def test_drafts_stand_between_the_suffix_and_the_region_for_a_model_with_a_drafts_window(tiny_model):
    _, tok = tiny_model
    b = LayoutBudget.for_window(384, 48)
    p = _typing_prompt(["ute(x)", "ute(y, z)", "ute(x)", "are(a, b)"])
    ids = encode_prompt(tok, p, b)
    assert len(ids) <= 384
    seg = decode_context(tok, ids)
    # best first, each once; the region and the suffix read as before
    assert seg["drafts"] == "ute(x)\x00ute(y, z)\x00are(a, b)"
    assert seg["suffix"] == "\nprint(value)\n" and seg["region_before_cursor"] == "    value = comp"
    s, r = ids.index(tok.special["<suffix>"]), ids.index(tok.special["<region>"])
    assert ids[s + 1 : r].count(tok.special["<edit>"]) == 3
    # the drafts take their room from the prefix: the context never grows past the window
    without = encode_prompt(tok, _typing_prompt(), b)
    assert len(without) <= 384 and "drafts" not in decode_context(tok, without)


def test_a_model_without_a_drafts_window_reads_layout_2_token_for_token(tiny_model):
    _, tok = tiny_model
    b = LayoutBudget.for_window(384)
    assert b.max_drafts == 0
    assert encode_prompt(tok, _typing_prompt(["ute(x)", "ute(y)"]), b) == encode_prompt(tok, _typing_prompt(), b)


def test_drafts_keep_to_their_count_their_length_and_their_room(tiny_model):
    from dlm.coder_model.budget import DRAFT_TOKENS, MAX_DRAFTS
    from dlm.coder_model.layout import render_drafts
    from dlm.coder_model.types import MemoryProposal

    _, tok = tiny_model
    many = tuple(MemoryProposal(f"ute(x{i})", 0.5) for i in range(MAX_DRAFTS + 3))
    ids = render_drafts(tok, many, 1000)
    assert ids.count(tok.special["<edit>"]) == MAX_DRAFTS
    long = (MemoryProposal("x" * 5 + " + y" * 200, 0.5),)
    assert len(render_drafts(tok, long, 1000)) == 1 + DRAFT_TOKENS
    # a draft that does not fit whole in the room left is left out, with every one after it
    room = len(render_drafts(tok, many[:2], 1000))
    assert render_drafts(tok, many, room) == render_drafts(tok, many[:2], 1000)
    assert render_drafts(tok, many, room - 1) == render_drafts(tok, many[:1], 1000)
    assert render_drafts(tok, many, 0) == [] and render_drafts(tok, (MemoryProposal("", 0.9),), 100) == []
