"""Is a model answer degenerate? A pure check of text, shared by every path that shows one.

A small denoiser that has lost the thread does not write wrong code so much as
filler: a token or a short unit repeated (`get_get_get_get_`), the same line
over and over, or a run of blank lines to the end of its slots. None of these is
ever worth showing, and none is a judgement of correctness: each is a shape real
code almost never has. `is_degenerate(text, context)` names the shape (a reason
string) or returns None. `context` is the text around the answer (the document
near the cursor): a shape the file itself already has (a `# ========` rule, a
table of `None, None, None, None`, three blank lines between sections) is its
style, not degeneration, and is allowed up to the length the context has.

The LSP holds a degenerate answer back (`lsp.postprocess`, counted as
`held_back_degenerate` in `dlm/status`), the Zed endpoint answers nothing, and
the sampler benchmark counts them before any filter. The thresholds are set so
that the check holds back well under 1% of real lines (tests/coder_model/
test_degenerate.py runs it over this repository's and the standard library's
code).
"""

from __future__ import annotations

import re

REPEATED_UNIT = "repeated_ngram"  # a unit of characters (a token, an n-gram) repeated in a row
REPEATED_LINE = "repeated_line"  # the same line written again and again
BLANK_LINES = "blank_lines"  # a run of blank lines
REASONS = (REPEATED_UNIT, REPEATED_LINE, BLANK_LINES)

# PEP 8 and most style guides put at most two blank lines in a row; a third is filler.
MAX_BLANK_RUN = 2
# A unit written this many times in a row: `get_get_get_get_` (4) is filler, while real code
# repeats a short unit three times at most outside tables (`None, None, None`), which the
# context exemption covers.
MIN_UNIT_REPEATS = 4
# Longest unit looked for: a few tokens (`self.assertEqual(`), not whole lines (REPEATED_LINE).
MAX_UNIT_CHARS = 24
# The same non-blank line this many times in a row.
MIN_LINE_REPEATS = 3
# How much document text on each side of the region counts as its style (a few dozen lines).
STYLE_CONTEXT_CHARS = 2000

# a unit of 2..MAX_UNIT_CHARS characters, then at least MIN_UNIT_REPEATS - 1 more copies of it
_UNIT_RUN = re.compile(rf"(.{{2,{MAX_UNIT_CHARS}}}?)\1{{{MIN_UNIT_REPEATS - 1},}}", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_]")


def _blank_run(text: str) -> int:
    """Length of the longest run of blank lines in `text` (whitespace-only lines between breaks)."""
    best = 0
    for m in re.finditer(r"\n((?:[ \t]*\r?\n)+)", text):
        best = max(best, m.group(1).count("\n"))
    return best


def _unit_runs(text: str):
    """(unit, copies) for each run of a unit of characters repeated MIN_UNIT_REPEATS+ times.

    Only units with a letter or underscore count: runs of digits, punctuation or spaces are
    tables, rules and indentation (`0, 0, 0, 0`, `# -----`, `'    '`).
    """
    for m in _UNIT_RUN.finditer(text):
        unit = m.group(1)
        if _WORD.search(unit) is None:
            continue
        yield unit, len(m.group(0)) // len(unit)


def _line_runs(text: str):
    """(line, copies) for each non-blank line repeated MIN_LINE_REPEATS+ times in a row."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and lines[j + 1] == lines[i]:
            j += 1
        copies = j - i + 1
        if copies >= MIN_LINE_REPEATS and _WORD.search(lines[i]):
            yield lines[i], copies
        i = j + 1


def is_degenerate(text: str, context: str = "") -> str | None:
    """The reason `text` (what the model proposes) is degenerate filler, or None.

    `context`: the surrounding document text; a repetition or blank run at most as long as one
    the context already has is the file's own style and is allowed.
    """
    if not text:
        return None
    blank = _blank_run(text)
    if blank > MAX_BLANK_RUN and blank > _blank_run(context):
        return BLANK_LINES
    for line, copies in _line_runs(text):
        if (line + "\n") * copies not in context + "\n":
            return REPEATED_LINE
    for unit, copies in _unit_runs(text):
        if unit * copies not in context:
            return REPEATED_UNIT
    return None


def degenerate_region(old: str, new: str, prefix: str = "", suffix: str = "") -> str | None:
    """Why the model's new region `new` (replacing `old`, between `prefix` and `suffix`) is
    degenerate, or None; the old region and the document text around it are the context."""
    if new == old:
        return None
    return is_degenerate(new, prefix[-STYLE_CONTEXT_CHARS:] + old + suffix[:STYLE_CONTEXT_CHARS])
