"""Open documents: text as a list of lines, versions, incremental changes.

A document keeps its text as lines *with* their terminators (`\\n`, `\\r\\n`
or `\\r`, the three LSP line breaks); the last line never has one (it is ""
when the text ends with a newline). Lines make the common operations cheap:
an incremental change splices a few list items, and the context windows
(lsp.context) join only the lines they need, so a 10 MB file costs nothing
per keystroke beyond the list splice.

Positions come in the negotiated encoding (lsp.positions) and are clamped:
a line past the end means the end of the document, a character past the end
of a line means the end of that line. Each change is reported as a `Change`
(in code points and lines) for the edit history, and forwarded to the
tree-sitter tree (lsp.syntax) as a byte-level edit; the reparse reads the
lines it needs from this list, never a joined copy of the document.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dlm.coder_model.limits import clean_text
from dlm.coder_model.regions import content, split_lines  # one line splitter for server and training
from dlm.lsp import positions
from dlm.lsp.history import History
from dlm.lsp.syntax import SyntaxTree, language_for

__all__ = ["Change", "Document", "Documents", "clean", "content", "split_lines"]

# Lone surrogates become U+FFFD (one place for every door: coder_model.limits.clean_text).
clean = clean_text


@dataclass(frozen=True)
class Change:
    """One applied change, in code points: lines [start_line, old_end_line] became
    [start_line, new_end_line]; `old_text` was replaced by `new_text` at
    (start_line, start_col)."""

    start_line: int
    start_col: int
    old_end_line: int
    new_end_line: int
    old_text: str
    new_text: str
    old_lines: tuple[str, ...]  # the touched lines before the change (with terminators)
    at: float  # time.monotonic() when applied


class Document:
    def __init__(
        self,
        uri: str,
        text: str,
        version: int = 0,
        language_id: str = "",
        encoding: str = positions.UTF16,
        max_syntax_chars: int = 2_000_000,
    ) -> None:
        self.uri = uri
        self.version = version
        self.language_id = language_id or ""
        self.encoding = encoding
        self.max_syntax_chars = max_syntax_chars
        text = clean(text)
        self.lines = split_lines(text)
        self._chars = len(text)
        self._binary: tuple[int, bool] | None = None  # (version, holds a NUL byte)
        self.last_change_at = 0.0  # monotonic time of the last edit (0 = never edited)
        self.last_change_line = -1
        self.syntax: SyntaxTree | None = None
        self._reset_syntax()
        # Line numbers that must follow edits (the context window starts, lsp.context).
        self.anchors: dict[str, int] = {}
        self.history: History | None = None

    # ---- text access -------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return "".join(self.lines)

    @property
    def binary(self) -> bool:
        """Does the text hold a NUL byte (a binary file opened as text)? Checked once a version."""
        if self._binary is None or self._binary[0] != self.version:
            self._binary = (self.version, any("\x00" in line for line in self.lines))
        return self._binary[1]

    @property
    def size(self) -> int:
        """Length in code points (kept up to date without joining)."""
        return self._chars

    def line(self, row: int) -> str:
        """Line content without terminator ('' past the end)."""
        return content(self.lines[row]) if 0 <= row < len(self.lines) else ""

    def clamp(self, line: int, character: int) -> tuple[int, int]:
        """(row, code-point column) for an LSP position, clamped into the document."""
        if line < 0:
            return 0, 0
        if line >= len(self.lines):
            last = len(self.lines) - 1
            return last, len(self.line(last))
        return line, positions.to_index(self.line(line), character, self.encoding)

    def to_position(self, row: int, col: int) -> tuple[int, int]:
        """LSP (line, character) in the negotiated encoding for a code-point column."""
        return row, positions.to_character(self.line(row), col, self.encoding)

    # ---- changes ------------------------------------------------------------------------------------
    def replace_all(self, text: str, version: int) -> Change:
        """A full-text change. It is turned into the smallest line-range change (common
        leading and trailing lines kept) so that history and tree-sitter see a real edit."""
        new = split_lines(clean(text))
        old = self.lines
        p = 0
        limit = min(len(old), len(new)) - 1  # the last lines (no terminator) compare as trailing
        while p < limit and old[p] == new[p]:
            p += 1
        s = 0
        while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
            s += 1
        if s == 0:
            el, ec = len(old) - 1, len(old[-1])
        else:
            el, ec = len(old) - s, 0
        return self._apply(p, 0, el, ec, "".join(new[p : len(new) - s]), version)

    def apply(self, start: tuple[int, int], end: tuple[int, int], text: str, version: int) -> Change:
        """Apply an incremental change given as LSP (line, character) positions."""
        sl, sc = self.clamp(*start)
        el, ec = self.clamp(*end)
        if (el, ec) < (sl, sc):  # a reversed range: treat it as the range it spans
            (sl, sc), (el, ec) = (el, ec), (sl, sc)
        return self._apply(sl, sc, el, ec, clean(text), version)

    def _apply(self, sl: int, sc: int, el: int, ec: int, text: str, version: int) -> Change:
        """Replace rows/code-point columns (sl, sc)-(el, ec) (already clamped) by `text`."""
        if sc == 0 and sl > 0 and self.lines[sl - 1].endswith("\r") and (text + self.lines[el][ec:]).startswith("\n"):
            # The previous line ends with a lone \r and the change puts a \n right after it:
            # together they are one \r\n line end. Take the \r into the change so the lines
            # are split as the client's text is (one line, not an empty one between).
            sl, sc = sl - 1, len(self.lines[sl - 1]) - 1
            text = "\r" + text
        now = time.monotonic()
        if self.history is not None:
            self.history.before_change(sl, el, now, self.lines)
        last = len(self.lines) - 1
        first_line = self.lines[sl]
        before = first_line[:sc]
        after = self.lines[el][ec:]
        old_lines = tuple(self.lines[sl : el + 1])
        if sl == el:
            old_text = first_line[sc:ec]
        else:
            old_text = first_line[sc:] + "".join(self.lines[sl + 1 : el]) + self.lines[el][:ec]
        new_lines = split_lines(before + text + after)
        if el != last and new_lines[-1] == "":
            new_lines.pop()  # the block ended with the terminator of a line that is not the last
        syntax = self.syntax
        if syntax is not None:
            syntax.edit_lines(self.lines, sl, sc, el, ec, before, old_text, text)
        self.lines[sl : el + 1] = new_lines
        self._chars += len(text) - len(old_text)
        self.version = version
        self.last_change_at = now
        self.last_change_line = sl
        if syntax is not None and self._chars > self.max_syntax_chars:
            self.syntax = None  # grew past the limit: plain text from now on
        change = Change(sl, sc, el, sl + len(new_lines) - 1, old_text, text, old_lines, now)
        if self.anchors:
            delta = change.new_end_line - el
            for key, row in self.anchors.items():
                if row > el:
                    self.anchors[key] = row + delta
                elif row > sl:
                    self.anchors[key] = sl
        if self.history is not None:
            self.history.after_change(change, self.lines)
        return change

    def _reset_syntax(self) -> None:
        self.syntax = None
        if self._chars <= self.max_syntax_chars:
            lang = language_for(self.language_id, self.uri)
            if lang is not None:
                self.syntax = SyntaxTree(lang, self.lines)


class Documents:
    """The open documents by URI."""

    def __init__(self, encoding: str = positions.UTF16, max_syntax_chars: int = 2_000_000) -> None:
        self.encoding = encoding
        self.max_syntax_chars = max_syntax_chars
        self._docs: dict[str, Document] = {}

    def open(self, uri: str, text: str, version: int, language_id: str = "") -> Document:
        doc = Document(uri, text, version, language_id, self.encoding, self.max_syntax_chars)
        self._docs[uri] = doc
        return doc

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def __len__(self) -> int:
        return len(self._docs)

    def __iter__(self):
        return iter(self._docs.values())
