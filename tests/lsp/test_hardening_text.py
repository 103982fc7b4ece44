"""Line ends: \\r, \\n and \\r\\n all end a line (LSP), in documents and suggestions."""

from __future__ import annotations

import pytest
from dlm.lsp.documents import Document, split_lines
from dlm.lsp.postprocess import filter_insertion, suggest


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_rewrite_of_the_rest_of_a_line_stays_on_that_line(eol):
    old = eol.join(["x = 0", "y = 2", "z = 3"])
    new = eol.join(["x = 1", "y = 2", "z = 3"])
    sugg = suggest(old, 4, new)
    # one line replaced up to its end, not the whole region as a multi-line completion
    assert (sugg.insert_text, sugg.replace_end, sugg.edits) == ("1", 5, [])


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_mid_line_insertion_is_cut_at_any_line_end(eol):
    assert filter_insertion(f"a, b{eol}c = 2", "f(", ")", "") == "a, b"


@pytest.mark.parametrize("eol", ["\n", "\r"])
def test_insertion_repeating_the_next_lines_is_trimmed(eol):
    text = f"foo(){eol}bar(){eol}baz()"
    assert filter_insertion(text, "", "", f"{eol}bar(){eol}baz(){eol}") == "foo()"


def test_a_cr_and_a_following_lf_become_one_line_end():
    doc = Document("file:///cr.py", "a\rb\nc")
    assert doc.lines == ["a\r", "b\n", "c"]
    doc.apply((1, 0), (1, 1), "", 2)  # delete "b": the lone \r and the \n meet
    assert doc.lines == split_lines(doc.text) == ["a\r\n", "c"]
    doc = Document("file:///cr.py", "a\rb")
    doc.apply((1, 0), (1, 0), "\n", 2)  # type a \n after a lone \r
    assert doc.lines == split_lines(doc.text) == ["a\r\n", "b"]
    assert doc.line(0) == "a" and doc.clamp(1, 1) == (1, 1)
