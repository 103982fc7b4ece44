"""Text typed inside a docstring is prose to the syntax check: a doctest line that opens a bracket,
typed on a blank line of a long docstring (the window cannot start above it), is never held back;
code right after a closing quote still is."""

from __future__ import annotations

import pytest
from dlm.coder_model import regions
from dlm.lsp import syntax_check
from tree_sitter import Parser

DOC = 'def combine(a, b):\n    """Combine.\n\n' + "".join(f"    line {i} of prose\n" for i in range(80))


def test_a_doctest_line_in_a_long_docstring_is_not_held_back() -> None:
    before = DOC + "    "
    after = '\n    ...\n    """\n    return a\n'
    assert syntax_check.check_text("python", before, after, ">>> x2 = xr.Dataset(") is None
    assert syntax_check.check_text("python", before, after, '...     name="a", dims="x"') is None


def test_after_a_closing_quote_the_code_is_still_checked() -> None:
    assert syntax_check.check_text("python", 'def f():\n    x = "abc"', "\n", ")") is not None
    assert syntax_check.check_text("python", "def f():\n    x = 1  # note", "\n", " more") is None


def test_closing_the_docstring_early_is_judged_and_held_back() -> None:
    """Typed inside a docstring, an insertion with the closing quotes makes the rest of the
    docstring code: the errors it causes below the edited line hold it back."""
    before = 'def unify(a, b):\n    """Unify the chunks.\n\n    See Also\n    --------\n    '
    after = '\n    dask.array.core.unify_chunks\n    """\n    return a\n'
    assert syntax_check.check_text("python", before, after, '"""') == "breaks the lines below it"
    assert syntax_check.check_text("python", before, after, "xarray.unify_chunks") is None


def test_closing_quotes_above_more_prose_and_the_docstrings_own_closing_quotes_are_held_back() -> None:
    """The prose below (`map_over_datasets`) reads as a valid expression and the docstring's own
    quotes pair with the next docstring's, so the window parses: the lines are read instead."""
    before = 'def filter(self):\n    """Keep some.\n\n    See Also\n    --------\n    match\n    '
    after = '\n    map_over_datasets\n    """\n    nodes = {}\n    return nodes\n\n\ndef match(self):\n    """\n    Match.\n    """\n'
    assert syntax_check.check_text("python", before, after, '"""') is not None
    assert syntax_check.check_text("python", before, after, "pipe") is None
    # where the docstring's closing quotes are missing, below its last line of prose, they are shown
    missing = after.replace('    map_over_datasets\n    """\n', "", 1)
    assert syntax_check.check_text("python", before + "map_over_datasets\n    ", missing, '"""') is None


@pytest.fixture
def parses():
    """This thread's Python parser swapped for one that counts its parses (the list grows by one
    each), with no parse kept from before."""
    real = syntax_check._parser("python")
    syntax_check._kept.clear()
    counted: list[int] = []

    class Counting:
        def parse(self, *args, **kwargs):
            counted.append(1)
            return real.parse(*args, **kwargs)

    syntax_check._parsers.by_language["python"] = Counting()
    yield counted
    syntax_check._parsers.by_language["python"] = real


def _unclosed(line: str) -> tuple[list[str], object]:
    """A module whose first function's docstring is not closed: `line` is its fourth line."""
    body = "".join(f"def f{i}(x):\n    \"\"\"Doc {i}.\"\"\"\n    return x + {i}\n\n\n" for i in range(30))
    text = 'def g(a):\n    """Unclosed.\n\n' + line + '\n    return a\n\n\n' + body
    return regions.split_lines(text), Parser(regions.grammar("python")).parse(text.encode()).root_node


def test_whether_a_docstring_swallows_code_is_read_once_per_line_for_all_drafts_and_keystrokes(parses) -> None:
    """Whether the closing quotes are needed is a whole-document parse (twice): the ranker asks it
    of the memory's 8 drafts and the server of its answer, at every keystroke on the line. The
    answer does not depend on what is typed, so the line's later checks parse nothing."""
    lines, root = _unclosed("    Ret")
    why = syntax_check.check("python", lines, 3, 7, "urns", False, root)
    assert why == "leaves open the triple-quoted string whose closing quotes the code below needs"
    first = len(parses)
    assert first >= 2  # the line blank, and with the closing quotes
    assert syntax_check.check("python", lines, 3, 7, "urns the sum", False, root) == why
    typed_on = lines[:3] + ["    Return\n"] + lines[4:]  # a keystroke later
    assert syntax_check.string_swallows_code("python", typed_on, 3, 10, root)
    assert len(parses) == first


def test_after_enter_in_a_docstring_the_document_as_it_is_stands_for_the_blank_line(parses) -> None:
    """On a line that holds only its indentation, the server's tree of the document is the
    document with the line blank: only the document with the closing quotes is parsed."""
    lines, root = _unclosed("    ")
    assert syntax_check.string_swallows_code("python", lines, 3, 4, root)
    assert len(parses) == 1
    # without the tree, both are parsed, with the same answer
    syntax_check._kept.clear()
    assert syntax_check.string_swallows_code("python", lines, 3, 4, None)
    assert len(parses) == 3
