"""A tree-sitter tree per document, kept up to date incrementally.

Grammars come from the PyPI wheels (tree-sitter-python, ...). Each change is
forwarded as `tree.edit(...)` at once (cheap, O(log n)); the reparse is lazy:
it happens when the context builder asks for a statement span, so a burst of
1,000 changes costs one reparse, not 1,000. Languages without a grammar (and
documents over the size limit in lsp.documents) fall back to plain text:
`statement_span` then returns None and the context uses line heuristics.
"""

from __future__ import annotations

import logging
from functools import cache

from dlm.coder_model import regions
from dlm.coder_model.languages import language_name
from dlm.coder_model.regions import GRAMMARS, split_lines, utf8_length

log = logging.getLogger(__name__)

# The grammar table, the block node types and the statement rule are those of
# coder_model.regions, shared with the training example builders so that both cut the
# same regions; this module adds the incremental tree of an open document.
__all__ = ["GRAMMARS", "SyntaxTree", "language_for"]


@cache
def _warn_no_grammar(name: str) -> None:
    log.warning("no tree-sitter grammar %s installed; %s files use plain text", GRAMMARS[name][0], name)


def language_for(language_id: str, uri: str = ""):
    """A tree_sitter.Language for the document, or None (plain text)."""
    name = language_name(language_id, uri)
    if name not in GRAMMARS:
        return None
    language = regions.grammar(name)
    if language is None:
        _warn_no_grammar(name)
    return language


class SyntaxTree:
    def __init__(self, language, lines: list[str]) -> None:
        from tree_sitter import Parser

        self._parser = Parser(language)
        self.line_bytes = [utf8_length(line) for line in lines]
        self._lines = lines  # the document's list (same object; mutated in place by Document)
        self._tree = None
        self._dirty = True
        self.reparses = 0

    def edit_lines(
        self, lines: list[str], sl: int, sc: int, el: int, ec: int, before: str, old_text: str, new_text: str
    ) -> None:
        """Record a change before it is spliced into `lines` (rows/cols in code points)."""
        start_col = utf8_length(before)
        start_byte = sum(self.line_bytes[:sl]) + start_col
        old_end_byte = start_byte + utf8_length(old_text)
        new_end_byte = start_byte + utf8_length(new_text)
        old_end_point = (el, utf8_length(lines[el][:ec]))
        parts = split_lines(new_text)
        if len(parts) == 1:
            new_end_point = (sl, start_col + utf8_length(new_text))
        else:
            new_end_point = (sl + len(parts) - 1, utf8_length(parts[-1]))
        if self._tree is not None:
            self._tree.edit(
                start_byte=start_byte,
                old_end_byte=old_end_byte,
                new_end_byte=new_end_byte,
                start_point=(sl, start_col),
                old_end_point=old_end_point,
                new_end_point=new_end_point,
            )
        # New line byte lengths: the touched block after the splice.
        first = lines[sl][:sc] + new_text + lines[el][ec:]
        block = split_lines(first)
        if el != len(lines) - 1 and block[-1] == "":
            block.pop()
        self.line_bytes[sl : el + 1] = [utf8_length(b) for b in block]
        self._dirty = True

    def tree(self):
        if self._dirty or self._tree is None:
            lines = self._lines

            def read(_byte: int, point) -> bytes:
                # tree-sitter reads the text it needs by (row, byte column): one line at a time,
                # so a reparse never joins and re-encodes the whole document
                row, col = point
                return lines[row].encode("utf-8", "surrogatepass")[col:] if row < len(lines) else b""

            self._tree = self._parser.parse(read, self._tree) if self._tree else self._parser.parse(read)
            self._dirty = False
            self.reparses += 1
        return self._tree

    def statement_span(self, row: int, col: int = -1) -> tuple[int, int] | None:
        """Rows (first, last) of the statement containing (row, col), or None when there is
        no statement there (blank line, top of the tree); coder_model.regions.statement_span
        over this document's tree."""
        if not 0 <= row < len(self._lines) or not self._lines[row].strip():
            return None  # no statement on a blank line: no need to reparse to say so
        try:
            return regions.statement_span(self.tree().root_node, self._lines, row, col)
        except Exception:  # a grammar edge case must not cost the suggestion
            log.exception("tree-sitter lookup failed at row %d, column %d", row, col)
            return None
