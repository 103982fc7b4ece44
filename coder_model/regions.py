"""Where the editable region starts and ends: the rules the server cuts by (docs/architecture.md §4).

- "typing" (the user is typing on this line): the cursor line plus the rest of its
  statement, at most `typing_region_lines` lines and about `typing_region_tokens`
  tokens, so the masked block stays short;
- "wide" (after a pause or a jump): a few lines around the cursor, widened to whole
  statements, within `wide_region_tokens`.

The region is whole lines without the last line's terminator: the terminator
belongs to the suffix, so the model's answer ends where the line's text ends and
<eom> follows at once. These rules are the ones of `dlm.lsp.context.region_rows`
(the server, over its incremental tree) and of the training example builders
(here, over a tree parsed once per file); a test checks that both cut the same
regions. No torch here; tree-sitter is imported only when a tree is asked for.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from dlm.coder_model.budget import CHARS_PER_TOKEN
from dlm.coder_model.caps import Cap, option

Mode = Literal["typing", "wide"]
Span = Callable[[int, int], "tuple[int, int] | None"]

# language name (dlm.coder_model.languages) -> (grammar module, function returning the language)
GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "javascriptreact": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "typescriptreact": ("tree_sitter_typescript", "language_tsx"),
    "rust": ("tree_sitter_rust", "language"),
    "go": ("tree_sitter_go", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "java": ("tree_sitter_java", "language"),
}
# Nodes whose children are statements: the parent of a "statement" in every grammar above.
BLOCKS = {
    "module", "program", "source_file", "translation_unit", "block", "statement_block",
    "compound_statement", "declaration_list", "class_body", "field_declaration_list",
    "interface_body", "enum_body", "switch_body", "switch_block", "constructor_body",
    "statement_list", "suite",
}  # fmt: skip
_BREAK = re.compile(r"\r\n|\r|\n")
_WORD_BOUNDARY = re.compile(r"\b")
# Of the lines a user types, the share where nothing is typed yet: the cursor stands after the
# indentation, where an editor puts it after Enter.
NOT_TYPED = 0.30


@dataclass
class RegionBudget:
    """Region sizes: training cuts by these, and the server's options (dlm.lsp.options.ContextOptions)
    are a subclass, so both start from the same defaults."""

    typing_region_tokens: int = option(
        48, Cap("int", 1, 4096), "while typing, the region (the cursor line and the rest of its statement) "
        "holds at most about this many tokens")
    typing_region_lines: int = option(
        4, Cap("int", 1, 200), "while typing, the region holds at most this many lines")
    wide_region_lines_before: int = option(
        2, Cap("int", 0, 200), "after a pause or a jump, the region starts this many lines above the cursor "
        "(widened to whole statements)")
    wide_region_lines_after: int = option(
        4, Cap("int", 0, 200), "after a pause or a jump, the region ends this many lines below the cursor "
        "(widened to whole statements)")
    wide_region_tokens: int = option(
        160, Cap("int", 1, 4096), "after a pause or a jump, the region holds at most about this many tokens")


def split_lines(text: str) -> list[str]:
    """Lines with their terminators; the last one is unterminated (maybe empty)."""
    out: list[str] = []
    pos = 0
    for m in _BREAK.finditer(text):
        out.append(text[pos : m.end()])
        pos = m.end()
    out.append(text[pos:])
    return out


def content(line: str) -> str:
    """A line without its terminator."""
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


def typed_cut(content: str, rng) -> int:
    """Where a user typing `content` (a line's text) stands: at a word boundary after the
    indentation (`\\b`, as a completion is asked for after a word or before one), or, for NOT_TYPED
    of the lines, right after the indentation. The one rule of the evaluation's rest-of-line cases
    (evaluation.repo_cases) and the trainer's typing examples (training.examples.typing_example), so
    that the model is trained where it is measured and used. Consumes `rng` as repo_cases always has:
    one random() only when a boundary exists, then one choice()."""
    indent = len(content) - len(content.lstrip())
    cuts = [m.start() for m in _WORD_BOUNDARY.finditer(content) if indent < m.start() < len(content)]
    typed = bool(cuts) and rng.random() >= NOT_TYPED
    return rng.choice(cuts) if typed else indent


def _chars(lines: list[str], a: int, b: int) -> int:
    return sum(len(x) for x in lines[a:b])


def region_rows(
    lines: list[str], row: int, col: int, mode: Mode, budget: RegionBudget, span: Span | None = None
) -> tuple[int, int]:
    """First and last (inclusive) line of the region for a cursor at (row, col).

    `span(r, c)` gives the rows of the statement at (r, c) (c = -1: the line's code),
    or None where there is none (blank line, a parse error): then the line alone counts.
    """
    last = len(lines) - 1
    cpt = CHARS_PER_TOKEN

    def stmt(r: int, c: int = -1) -> tuple[int, int]:
        s = span(r, c) if span is not None else None
        return s if s is not None else (r, r)

    if mode == "typing":
        end = min(max(stmt(row, col)[1], row), row + budget.typing_region_lines - 1, last)
        limit = budget.typing_region_tokens * cpt
        while end > row and _chars(lines, row, end + 1) > limit:
            end -= 1
        return row, end
    start = max(0, row - budget.wide_region_lines_before)
    end = min(last, row + budget.wide_region_lines_after)
    start = min(start, max(stmt(start)[0], row - 2 * budget.wide_region_lines_before))
    end = max(end, min(stmt(end)[1], row + 2 * budget.wide_region_lines_after, last))
    limit = budget.wide_region_tokens * cpt
    while _chars(lines, start, end + 1) > limit and (start < row or end > row):
        # shrink from the side farther from the cursor
        if end - row >= row - start and end > row:
            end -= 1
        else:
            start += 1
    return start, end


# -- statements from a tree-sitter tree ------------------------------------------------------------
@cache
def grammar(language: str):
    """The tree_sitter.Language for a language name, or None (no grammar installed or known)."""
    if language not in GRAMMARS:
        return None
    module_name, fn = GRAMMARS[language]
    try:
        from tree_sitter import Language

        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return Language(getattr(module, fn)())


def is_block(node_type: str) -> bool:
    return node_type in BLOCKS or node_type.endswith(("_block", "_body"))


def utf8_length(s: str) -> int:
    """Length in UTF-8 bytes (tree-sitter's columns); lone surrogates count as 3, as encoded."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def statement_span(root, lines: list[str], row: int, col: int = -1) -> tuple[int, int] | None:
    """Rows (first, last) of the statement containing (row, col) in a tree whose root node is
    `root`, or None when there is no statement there (blank line, top of the tree, a parse
    error). For a compound statement (a def, an if, a class) whose header holds the point,
    the span is the header."""
    if not 0 <= row < len(lines):
        return None
    text = lines[row].rstrip("\r\n")
    if not text.strip():
        return None
    first = len(text) - len(text.lstrip())
    last = len(text.rstrip()) - 1
    # Look at a character of this line's code: between tokens (end of line, indentation)
    # tree-sitter answers with the enclosing block instead of the statement on the line.
    col = first if col < 0 or col <= first else min(col, last)
    point = (row, utf8_length(text[:col]))
    node = root.descendant_for_point_range(point, point)
    if node is None:
        return None
    while node.parent is not None and not is_block(node.parent.type):
        node = node.parent
    if node.parent is None or node.has_error:
        # A half-typed line often makes an ERROR node that swallows the lines after it;
        # its extent says nothing about the statement, so fall back to the line.
        return None
    start, end = node.start_point[0], node.end_point[0]
    if end > start and node.end_point[1] == 0:
        end -= 1
    if end > row:
        for child in node.children:
            if is_block(child.type) and child.start_point[0] >= row:
                # A `{` opening the body belongs to the header line; an indented
                # Python body starts on the next line and does not.
                opens = child.children[0].type == "{" if child.child_count else False
                end = max(row, child.start_point[0] - (0 if opens else 1))
                break
    return start, max(end, row)


def statement_spans(text: str, language: str) -> Span | None:
    """A span function over `text` parsed once, or None without a grammar for the language."""
    lang = grammar(language)
    if lang is None:
        return None
    from tree_sitter import Parser

    lines = split_lines(text)
    root = Parser(lang).parse(text.encode("utf-8", "surrogatepass")).root_node

    def span(row: int, col: int = -1) -> tuple[int, int] | None:
        try:
            return statement_span(root, lines, row, col)
        except (ValueError, RuntimeError):  # a grammar edge case costs the statement, not the example
            return None

    return span
