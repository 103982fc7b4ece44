"""Text typed inside a docstring is prose to the syntax check: a doctest line that opens a bracket,
typed on a blank line of a long docstring (the window cannot start above it), is never held back;
code right after a closing quote still is."""

from __future__ import annotations

from dlm.lsp import syntax_check

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
