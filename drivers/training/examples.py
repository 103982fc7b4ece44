"""Training/evaluation examples in the native layout, as (Prompt, target region) pairs.

An `Example` is layout-independent: `dlm.coder_model.layout` turns its prompt
into context tokens and its target into the masked block's answer
(target tokens, then <eom>, then <pad>). The builders for each kind live in
their own modules: completion and fill-in-the-middle here, edits in
`synthetic_edits` (made from real code) and `commit_edits` (real commits), on `hunks`.

Completion and FIM regions are cut the way the server cuts them while the user
types (dlm.coder_model.regions, the rules of dlm.lsp.context): whole lines,
the cursor line plus the rest of its statement (tree-sitter where a grammar is
installed), short enough for one masked block, and sometimes the wider
few-line region the server sends after a pause. A typing region's prompt is an
insertion prompt (Prompt.insert, as the server's): the block holds only the
removed text, the layout's `answer_text`; a wide one's holds the whole region.
Retrieved snippets from the project's other files are attached by the example
stream (training.batches, training.project_snippets). The region ends at the last
line's text; its line break starts the suffix. So the target is exactly the
text the model must write before <eom>, as in serving: a model trained on
regions that end in "\n" or in the middle of the next statement learns to
keep writing where one short line belongs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from dlm.coder_model.regions import (
    Mode,
    RegionBudget,
    Span,
    content,
    region_rows,
    split_lines,
    statement_spans,
    typed_cut,
)
from dlm.coder_model.types import Prompt

KINDS = ("typing", "completion", "fim", "synthetic_edit", "real_edit", "noop")


@dataclass(frozen=True)
class Example:
    kind: str  # one of KINDS
    prompt: Prompt
    target: str  # the new text of prompt.region (the layout's answer_text makes the block of it)
    source: str = ""  # file or record it was made from (for splits and debugging)


def window(text: str, start: int, end: int, max_chars: int, side: str) -> str:
    """The text of [start, end) cut to max_chars on the far side, at a line boundary."""
    piece = text[start:end]
    if len(piece) <= max_chars:
        return piece
    if side == "before":
        piece = piece[-max_chars:]
        nl = piece.find("\n")
        return piece[nl + 1 :] if nl >= 0 else piece
    piece = piece[:max_chars]
    nl = piece.rfind("\n")
    return piece[: nl + 1] if nl >= 0 else piece


MAX_LINE_CHARS = 2000  # the server offers nothing on longer lines (minified code)
TYPING_BUDGET = RegionBudget()


@lru_cache(maxsize=16)
def _spans(text: str, language: str) -> Span | None:
    # the trainer draws several examples from a file in a row; parse it once
    return statement_spans(text, language)


@dataclass(frozen=True)
class Cut:
    """A server-shaped region of a file and a cursor in it."""

    a: int  # offset of the region's first character (a line start)
    b: int  # offset just after the region's last line's text (before its line break)
    cursor: int  # offset of the cursor inside the region
    mode: Mode


def server_region(
    text: str, rng: random.Random, language: str, mode: Mode, budget: RegionBudget = TYPING_BUDGET
) -> Cut | None:
    """A cursor at a random line and column (within the line's text), and the region the server
    would cut around it in `mode`; None for an empty region or an over-long cursor line."""
    lines = split_lines(text)
    row = rng.randrange(len(lines))
    line = content(lines[row])
    if len(line) > MAX_LINE_CHARS:
        return None
    indent = len(line) - len(line.lstrip())
    col = rng.randint(indent, len(line))  # users type after the indentation
    start, end = region_rows(lines, row, col, mode, budget, _spans(text, language))
    a = sum(len(x) for x in lines[:start])
    b = a + sum(len(x) for x in lines[start:end]) + len(content(lines[end]))
    if not text[a:b].strip():
        return None
    cursor = sum(len(x) for x in lines[start:row]) + col
    return Cut(a, b, cursor, mode)


def _prompt(text: str, cut: Cut, current: str, cursor: int, path: str, language: str,
            prefix_chars: int, suffix_chars: int) -> Prompt:
    return Prompt(
        prefix=window(text, 0, cut.a, prefix_chars, "before"),
        region=current,
        cursor=cursor,
        suffix=window(text, cut.b, len(text), suffix_chars, "after"),
        language=language,
        path=path,
        insert=cut.mode == "typing",  # typing: the block is the insertion at the cursor (lsp.context)
    )


def _draw_region(text: str, rng: random.Random, language: str, wide_share: float) -> tuple[Cut, str] | None:
    """A server-shaped region of `text` (typing, or wide with probability `wide_share`)."""
    if len(text) < 20:
        return None
    cut = server_region(text, rng, language, "wide" if rng.random() < wide_share else "typing")
    return None if cut is None else (cut, text[cut.a : cut.b])


def completion_example(
    text: str, rng: random.Random, path: str = "", language: str = "python",
    prefix_chars: int = 1500, suffix_chars: int = 600, wide_share: float = 0.2,
) -> Example | None:
    """Cursor in a server-shaped region (typing, or wide with probability `wide_share`); the
    text after the cursor is cut up to a random point (end of token, line or region) and
    the target restores it."""
    drawn = _draw_region(text, rng, language, wide_share)
    if drawn is None:
        return None
    cut, region = drawn
    cursor = cut.cursor
    rest = region[cursor:]
    # how much of the text after the cursor the user "has not typed yet"
    cut_kind = rng.random()
    if cut_kind < 0.35:  # rest of the token
        j = 0
        while j < len(rest) and (rest[j].isalnum() or rest[j] == "_"):
            j += 1
        n_cut = max(j, 1)
    elif cut_kind < 0.75:  # rest of the line
        nl = rest.find("\n")
        n_cut = nl if nl >= 0 else len(rest)
    else:  # rest of the region (the rest of the statement, while typing)
        n_cut = len(rest)
    n_cut = min(n_cut, len(rest))
    if n_cut <= 0:
        return None
    current = region[:cursor] + rest[n_cut:]
    prompt = _prompt(text, cut, current, cursor, path, language, prefix_chars, suffix_chars)
    return Example("completion", prompt, region, path)


def typing_example(
    text: str, rng: random.Random, path: str = "", language: str = "python",
    prefix_chars: int = 1500, suffix_chars: int = 600, statement_share: float = 0.15,
) -> Example | None:
    """A line being typed, as the server sees it and as the rest-of-line evaluation cuts it: the
    cursor at a word boundary or after the indentation (regions.typed_cut), the rest of the line not
    yet written (or, for `statement_share`, the rest of the typing region: a multi-line statement
    begun); the target restores it. `completion_example` puts its cursor at any column and often cuts
    only the rest of a token, which taught the model answers of a few characters (v4 wrote 3.7 tokens
    where the rest of a line has about 8) and never the whole rest of a line."""
    if len(text) < 20:
        return None
    lines = split_lines(text)
    row = rng.randrange(len(lines))
    line = content(lines[row])
    if not line.strip() or len(line) > MAX_LINE_CHARS:
        return None
    col = typed_cut(line, rng)
    start, end = region_rows(lines, row, col, "typing", TYPING_BUDGET, _spans(text, language))
    a = sum(len(x) for x in lines[:start])
    b = a + sum(len(x) for x in lines[start:end]) + len(content(lines[end]))
    cut = Cut(a, b, sum(len(x) for x in lines[start:row]) + col, "typing")
    region = text[a:b]
    rest = region[cut.cursor :]
    # the rest of the line's text (never its "\r" of a CRLF file: the terminator is not the answer)
    n_cut = len(rest) if end == row or rng.random() < statement_share else len(line) - col
    if n_cut <= 0 or not rest[:n_cut].strip():
        return None
    current = region[: cut.cursor] + rest[n_cut:]
    prompt = _prompt(text, cut, current, cut.cursor, path, language, prefix_chars, suffix_chars)
    return Example("typing", prompt, region, path)


def fim_example(
    text: str, rng: random.Random, path: str = "", language: str = "python",
    prefix_chars: int = 1500, suffix_chars: int = 600, max_span: int = 120, wide_share: float = 0.25,
) -> Example | None:
    """A random span removed at the cursor of a server-shaped region; the target restores it."""
    drawn = _draw_region(text, rng, language, wide_share)
    if drawn is None:
        return None
    cut, region = drawn
    s = cut.cursor
    if s >= len(region) or len(region.strip()) < 4:
        return None
    e = min(len(region), s + rng.randint(1, max_span))
    current = region[:s] + region[e:]
    prompt = _prompt(text, cut, current, s, path, language, prefix_chars, suffix_chars)
    return Example("fim", prompt, region, path)
