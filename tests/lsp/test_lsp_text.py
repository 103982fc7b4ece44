"""Unit tests: positions, documents (incremental changes, tree-sitter), history."""

from __future__ import annotations

import random

import pytest
from dlm.lsp import positions
from dlm.lsp.documents import Document, split_lines
from dlm.lsp.history import History
from dlm.lsp.options import HistoryOptions


@pytest.mark.parametrize(
    "line, ch, enc, idx",
    [
        ("abc", 2, "utf-16", 2),
        ("abc", 99, "utf-16", 3),  # past the end clamps
        ("a😀b", 1, "utf-16", 1),
        ("a😀b", 2, "utf-16", 1),  # between the surrogate halves: snaps to the code point
        ("a😀b", 3, "utf-16", 2),
        ("a😀b", 4, "utf-16", 3),
        ("héllo", 3, "utf-8", 2),
        ("héllo", 2, "utf-8", 1),  # inside the 2-byte é
        ("a😀b", 2, "utf-32", 2),
    ],
)
def test_to_index(line, ch, enc, idx):
    assert positions.to_index(line, ch, enc) == idx


def test_to_character_roundtrip():
    line = "x = '😀é' + y"
    for enc in positions.ENCODINGS:
        for i in range(len(line) + 1):
            assert positions.to_index(line, positions.to_character(line, i, enc), enc) == i


def test_choose_encoding():
    assert positions.choose_encoding(None) == "utf-16"
    assert positions.choose_encoding(["utf-16", "utf-8"]) == "utf-16"  # the client's first choice


def test_split_lines_keeps_terminators():
    assert split_lines("a\r\nb\rc\n") == ["a\r\n", "b\r", "c\n", ""]
    assert split_lines("") == [""]


def _apply_reference(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def test_incremental_changes_match_reference():
    rng = random.Random(0)
    text = "def f(x):\n    return x\n\nclass A:\n    pass\n"
    doc = Document("file:///t.py", text, 1, "python")
    for v in range(2, 300):
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        new = rng.choice(["", "x", "\n", "    y = 1\n", "é😀", "(", ")", "\r\n"])
        lines = split_lines(text)

        # offsets -> (line, utf-16 character)
        def pos(off, lines=lines):
            row = 0
            while off > len(lines[row]) and row < len(lines) - 1:
                off -= len(lines[row])
                row += 1
            return row, positions.to_character(lines[row], min(off, len(lines[row].rstrip("\r\n"))))

        sa, sb = pos(a), pos(b)

        # recompute the offsets the positions denote (a position inside \r\n clamps to the line end)
        def off(p, lines=lines):
            return sum(len(x) for x in lines[: p[0]]) + positions.to_index(lines[p[0]].rstrip("\r\n"), p[1])

        text = _apply_reference(text, off(sa), off(sb), new)
        doc.apply(sa, sb, new, v)
        assert doc.text == text
        assert doc.size == len(text)
    # the incrementally edited tree equals a fresh parse
    fresh = Document("file:///t.py", text, 1, "python")
    assert str(doc.syntax.tree().root_node) == str(fresh.syntax.tree().root_node)


def test_out_of_range_and_reversed_ranges_are_clamped():
    doc = Document("file:///t.txt", "ab\ncd", 1)
    doc.apply((99, 99), (120, 0), "!", 2)
    assert doc.text == "ab\ncd!"
    doc.apply((1, 1), (0, 1), "", 3)  # reversed: removes "b\nc"
    assert doc.text == "ad!"


def test_full_sync_becomes_a_line_range_change():
    doc = Document("file:///t.py", "a = 1\nb = 2\nc = 3\n", 1, "python")
    ch = doc.replace_all("a = 1\nb = 22\nc = 3\n", 2)
    assert (ch.start_line, ch.old_end_line, ch.new_end_line) == (1, 2, 2)
    assert doc.text == "a = 1\nb = 22\nc = 3\n"


def test_lone_surrogates_are_replaced():
    doc = Document("file:///t.txt", "a\ud800b", 1)
    assert doc.text == "a\ufffdb"
    assert doc.clamp(0, 2) == (0, 2)


@pytest.mark.parametrize(
    "lang, text, row, span",
    [
        ("python", "def f(x):\n    y = g(1,\n          2)\n    return y\n", 1, (1, 2)),
        ("python", "def f(x):\n    return x\n", 0, (0, 0)),
        ("javascript", "function f() {\n  const a = [1,\n    2];\n}\n", 1, (1, 2)),
        ("rust", "fn main() {\n    let x = 1;\n}\n", 0, (0, 0)),
        ("go", "package m\n\nfunc f() {\n\tx := 1\n\t_ = x\n}\n", 3, (3, 3)),
        ("c", "int f(void) {\n  return 1 +\n    2;\n}\n", 1, (1, 2)),
        ("cpp", "int f() {\n  auto x = 1;\n}\n", 1, (1, 1)),
        ("java", "class A {\n  int f() {\n    return 1;\n  }\n}\n", 2, (2, 2)),
        ("typescript", "let x: number =\n  1;\n", 0, (0, 1)),
        ("typescriptreact", "const a = <div>\n  hi</div>;\n", 0, (0, 1)),
    ],
)
def test_statement_spans(lang, text, row, span):
    doc = Document("file:///x", text, 1, lang)
    assert doc.syntax is not None
    assert doc.syntax.statement_span(row) == span


def test_half_typed_line_does_not_swallow_the_next_lines():
    doc = Document("file:///x.py", "def f(self):\n    self._\n    self.runs = 0\n    return 1\n", 1, "python")
    assert doc.syntax.statement_span(1, 10) in (None, (1, 1))


def test_plain_text_fallback_and_size_limit():
    assert Document("file:///x.unknownext", "abc", 1, "cobol").syntax is None
    assert Document("file:///x.py", "x = 1\n" * 10, 1, "python", max_syntax_chars=10).syntax is None


def _doc_with_history(text, **opts):
    doc = Document("file:///h.py", text, 1, "python")
    doc.history = History("h.py", HistoryOptions(**opts))
    return doc


def test_history_coalesces_typing_into_one_event_and_excludes_open_event():
    doc = _doc_with_history("a = 1\nb = 2\n", idle_s=1000)
    for i, ch in enumerate("xyz"):
        doc.apply((0, 5 + i), (0, 5 + i), ch, 2 + i)
    assert doc.history.rendered() == ()  # the event is still open
    doc.history.close_if_idle(0, doc.lines, cursor_line=100)  # a jump closes it
    (diff,) = doc.history.rendered()
    assert "-a = 1\n+a = 1xyz" in diff and diff.startswith("--- a/h.py\n+++ b/h.py\n@@ -1 +1 @@")


def test_history_splits_on_distance_and_keeps_budget():
    text = "".join(f"line{i}\n" for i in range(100))
    doc = _doc_with_history(text, idle_s=1000, gap_lines=8, max_events=6)
    for k, row in enumerate(range(0, 100, 10)):  # 10 edits, each 10 lines apart: 10 events
        doc.apply((row, 0), (row, 0), "#", 2 + k)
    doc.history.close_if_idle(0, doc.lines, cursor_line=-100)
    events = doc.history.rendered()
    assert len(events) == 6  # the last 6 kept
    assert "+#line90" in events[-1] and "+#line40" in events[0]
    small = _doc_with_history(text, idle_s=1000, max_tokens=20)
    for k, row in enumerate(range(0, 100, 10)):
        small.apply((row, 0), (row, 0), "#", 2 + k)
    small.history.close_if_idle(0, small.lines, cursor_line=-100)
    assert len(small.history.rendered()) == 1  # the budget keeps only the newest


def test_history_event_grows_across_nearby_lines_and_line_insertions():
    doc = _doc_with_history("a\nb\nc\nd\n", idle_s=1000)
    doc.apply((1, 1), (1, 1), "\nnew", 2)  # split line 1
    doc.apply((0, 0), (0, 0), "z", 3)  # edit above, within the gap
    doc.apply((4, 1), (4, 1), "!", 4)  # "d" (moved down by one) -> "d!"
    doc.history.close_if_idle(0, doc.lines, cursor_line=-100)
    (diff,) = doc.history.rendered()
    body = diff.split("\n", 2)[2]
    # one event, one -U0 hunk (coder_model.edit_history, as in training): no context lines
    assert body == "@@ -1,4 +1,5 @@\n-a\n-b\n-c\n-d\n+za\n+b\n+new\n+c\n+d!\n"
