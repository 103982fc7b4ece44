"""A tree-sitter tree per document, kept up to date incrementally.

Grammars come from the PyPI wheels (tree-sitter-python, ...). Each change is
forwarded as `tree.edit(...)` at once (cheap, O(log n)); the reparse is lazy:
it happens when the context builder asks for a statement span, so a burst of
1,000 changes costs one reparse, not 1,000. Languages without a grammar (and
documents over the size limit in lsp.documents) fall back to plain text:
`statement_span` then returns None and the context uses line heuristics.
"""

from __future__ import annotations

import importlib
import logging
from functools import cache

from dlm.coder_model.languages import language_name

log = logging.getLogger(__name__)

# language name (coder_model.languages, the one table) -> (module, function returning the language pointer)
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
_BLOCKS = {
    "module", "program", "source_file", "translation_unit", "block", "statement_block",
    "compound_statement", "declaration_list", "class_body", "field_declaration_list",
    "interface_body", "enum_body", "switch_body", "switch_block", "constructor_body",
    "statement_list", "suite",
}  # fmt: skip


@cache
def _language(name: str):
    from tree_sitter import Language

    module_name, fn = GRAMMARS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        log.warning("no tree-sitter grammar %s installed; %s files use plain text", module_name, name)
        return None
    return Language(getattr(module, fn)())


def language_for(language_id: str, uri: str = ""):
    """A tree_sitter.Language for the document, or None (plain text)."""
    name = language_name(language_id, uri)
    return _language(name) if name in GRAMMARS else None


def _is_block(node_type: str) -> bool:
    return node_type in _BLOCKS or node_type.endswith(("_block", "_body"))


def _nbytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


class SyntaxTree:
    def __init__(self, language, lines: list[str]) -> None:
        from tree_sitter import Parser

        self._parser = Parser(language)
        self.line_bytes = [_nbytes(line) for line in lines]
        self._lines = lines  # the document's list (same object; mutated in place by Document)
        self._tree = None
        self._dirty = True
        self.reparses = 0

    def edit_lines(
        self, lines: list[str], sl: int, sc: int, el: int, ec: int, before: str, old_text: str, new_text: str
    ) -> None:
        """Record a change before it is spliced into `lines` (rows/cols in code points)."""
        start_col = _nbytes(before)
        start_byte = sum(self.line_bytes[:sl]) + start_col
        old_end_byte = start_byte + _nbytes(old_text)
        new_end_byte = start_byte + _nbytes(new_text)
        old_end_point = (el, _nbytes(lines[el][:ec]))
        from dlm.lsp.documents import split_lines

        parts = split_lines(new_text)
        if len(parts) == 1:
            new_end_point = (sl, start_col + _nbytes(new_text))
        else:
            new_end_point = (sl + len(parts) - 1, _nbytes(parts[-1]))
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
        self.line_bytes[sl : el + 1] = [_nbytes(b) for b in block]
        self._dirty = True

    def tree(self):
        if self._dirty or self._tree is None:
            source = "".join(self._lines).encode("utf-8", "surrogatepass")
            self._tree = self._parser.parse(source, self._tree) if self._tree else self._parser.parse(source)
            self._dirty = False
            self.reparses += 1
        return self._tree

    def statement_span(self, row: int, col: int = -1) -> tuple[int, int] | None:
        """Rows (first, last) of the statement containing (row, col), or None when there is
        no statement there (blank line, top of the tree). For a compound statement
        (a def, an if, a class) whose header holds the point, the span is the header."""
        if not 0 <= row < len(self._lines):
            return None
        line = self._lines[row]
        text = line.rstrip("\r\n")
        if not text.strip():
            return None
        first = len(text) - len(text.lstrip())
        last = len(text.rstrip()) - 1
        # Look at a character of this line's code: between tokens (end of line, indentation)
        # tree-sitter answers with the enclosing block instead of the statement on the line.
        col = first if col < 0 or col <= first else min(col, last)
        point = (row, _nbytes(text[:col]))
        try:
            root = self.tree().root_node
            node = root.descendant_for_point_range(point, point)
        except Exception:  # a grammar edge case must not cost the suggestion
            log.exception("tree-sitter lookup failed at %s", point)
            return None
        if node is None:
            return None
        while node.parent is not None and not _is_block(node.parent.type):
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
                if _is_block(child.type) and child.start_point[0] >= row:
                    # A `{` opening the body belongs to the header line; an indented
                    # Python body starts on the next line and does not.
                    opens = child.children[0].type == "{" if child.child_count else False
                    end = max(row, child.start_point[0] - (0 if opens else 1))
                    break
        return start, max(end, row)
