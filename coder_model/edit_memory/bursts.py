"""Bursts: a document's changes grouped into edits, the units patterns are extracted from.

A burst is a run of changes to a few neighbouring lines with no pause longer than
`idle_s` (typing `foo` -> `bar` is one burst of six changes). A change farther than
`gap_lines` from the open burst, or after a pause, closes it. The burst keeps the text its
lines had before it started; its current text is read from the document. A burst that grows
over `max_lines` lines (a paste, a reformat) is marked big and yields nothing: it is not a
pattern, and its text is not copied.

Fed with `lsp.documents.Change`-like objects (start_line, old_end_line, new_end_line,
old_lines, at) after each change, with the document's lines; duck-typed, no lsp import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Burst:
    start: int  # first line, current document coordinates
    end: int  # last line (inclusive)
    old_lines: list[str] | None  # the lines' text before the burst; None: too big to be a pattern
    last_at: float


@dataclass(frozen=True)
class Edit:
    """A closed (or peeked) burst: lines start..start+len(old)-1 were `old`, are `new`."""

    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]
    at: float


class BurstTracker:
    def __init__(self, gap_lines: int = 2, idle_s: float = 1.5, max_lines: int = 40) -> None:
        self.gap_lines = gap_lines
        self.idle_s = idle_s
        self.max_lines = max_lines
        self.open: Burst | None = None

    def after_change(self, change, lines: list[str]) -> list[Edit]:
        """Record an applied change; returns the burst it closed, if any (at most one)."""
        sl, el, nl = change.start_line, change.old_end_line, change.new_end_line
        delta = nl - el
        b = self.open
        closed: list[Edit] = []

        def original(i: int) -> str:  # line i of the document before this change
            if sl <= i <= el:
                return change.old_lines[i - sl] if i - sl < len(change.old_lines) else ""
            j = i if i < sl else i + delta
            return lines[j] if 0 <= j < len(lines) else ""

        if b is not None:
            far = sl > b.end + self.gap_lines or el < b.start - self.gap_lines
            if far or change.at - b.last_at > self.idle_s:
                self.open = None
                if b.old_lines is not None:
                    new = tuple(original(i) for i in range(b.start, b.end + 1))
                    closed.append(Edit(b.start, tuple(b.old_lines), new, b.last_at))
                b = None
        if b is None:
            big = el - sl + 1 > self.max_lines or nl - sl + 1 > self.max_lines
            self.open = Burst(sl, nl, None if big else list(change.old_lines[: el - sl + 1]), change.at)
            return closed
        start, end_pre = min(b.start, sl), max(b.end, el)
        if b.old_lines is not None and end_pre - start + 1 + max(delta, 0) <= self.max_lines:
            old = [original(i) for i in range(start, b.start)]
            old += b.old_lines
            old += [original(i) for i in range(b.end + 1, end_pre + 1)]
            b.old_lines = old
        else:
            b.old_lines = None  # grew past max_lines: a paste or a reformat, not a pattern
        b.start, b.end, b.last_at = start, end_pre + delta, change.at
        return closed

    def peek(self, lines: list[str]) -> Edit | None:
        """The open burst as an edit so far (None: none open, or a big one)."""
        b = self.open
        if b is None or b.old_lines is None:
            return None
        return Edit(b.start, tuple(b.old_lines), tuple(lines[b.start : b.end + 1]), b.last_at)

    def reset(self) -> None:
        self.open = None
