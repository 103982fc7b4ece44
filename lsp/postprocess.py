"""New region text -> what the editor shows (docs/architecture.md §2).

The engine returns the whole new text of the editable region. We turn it into
minimal edits; the one that inserts at the cursor (or replaces the rest of
the cursor line) becomes the inline completion (ghost text), the others are
edit predictions (`dlm/editPrediction`). While typing, the native model writes
only the insertion (Prompt.insert, docs/architecture.md §4) and the engine hands it back as
the region with that insertion at the cursor, so the inline item is exactly
what the model wrote (after the filters below), and nothing of the line is
re-typed or replaced. Filters on the inline text:
- nothing when the model proposes no change, or proposes to erase the whole region;
- single line when the cursor is mid-line (text after it on the line);
- drop text that only repeats what follows the cursor (the suffix / next lines),
  and trailing characters that the rest of the line already has (`)` typed twice);
- keep brackets balanced: cut the insertion before a closer that nothing before the cursor
  opens (a call opened a few lines up may be closed on a line of its own).
Before any of that, a degenerate answer (a unit or line repeated in a row, a run of
blank lines: `coder_model.degenerate`) is held back whole, with its reason in
`Suggestion.held_back` (the server counts it as `held_back_degenerate`).
All offsets here are code points inside the region; lsp.server converts to
LSP positions.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from dlm.coder_model.degenerate import degenerate_region

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}
_CLOSERS = set(")]}\"'`;, ")
# LSP line ends: \r\n, \n and a lone \r (old Mac files) all end a line.
_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class RegionEdit:
    start: int  # offsets in the old region
    end: int
    text: str


@dataclass
class Suggestion:
    insert_text: str = ""  # the inline completion ("" = none)
    replace_end: int | None = None  # region offset where the replaced rest of line ends, if any
    edits: list[RegionEdit] = field(default_factory=list)  # other edits in the region
    held_back: str = ""  # why nothing is shown although the model proposed a change (degenerate.REASONS)

    @property
    def empty(self) -> bool:
        return not self.insert_text and not self.edits


def minimal_edits(old: str, new: str) -> list[RegionEdit]:
    """Character-level edits turning `old` into `new`; edits separated by fewer than 3
    unchanged characters on one line are merged so a word change is one edit."""
    if old == new:
        return []
    ops = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()]
    edits: list[list[int]] = []  # [i1, i2, j1, j2]
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        if edits:
            p = edits[-1]
            gap = old[p[1] : i1]
            if len(gap) < 3 and not _BREAK.search(gap):
                p[1], p[3] = i2, j2
                continue
        edits.append([i1, i2, j1, j2])
    return [RegionEdit(i1, i2, new[j1:j2]) for i1, i2, j1, j2 in edits]


def _line_end(text: str, pos: int) -> int:
    m = _BREAK.search(text, pos)
    return len(text) if m is None else m.start()


def _line_start(text: str, pos: int) -> int:
    return max(text.rfind("\n", 0, pos), text.rfind("\r", 0, pos)) + 1


def _unmatched_closer(text: str, start: int) -> int:
    """Index of the first closer at or after `start` that has no opener before it, or -1."""
    stack: list[str] = []
    for i, ch in enumerate(text):
        if ch in _OPEN:
            stack.append(ch)
        elif ch in _CLOSE:
            if stack and stack[-1] == _CLOSE[ch]:
                stack.pop()
            elif i >= start:
                return i
            else:
                stack.clear()  # already unbalanced before the insertion: not ours to judge
    return -1


# Text before the cursor whose open brackets an insertion may close: a call opened a few lines up
# is closed by `)` on a line of its own (the commonest short completion in real code).
BRACKET_CONTEXT_CHARS = 2000


def filter_insertion(text: str, line_before: str, rest_of_line: str, following: str, opened: str = "") -> str:
    """Apply the inline filters to an insertion `text` at the cursor. `following` is the
    text after the cursor line (region rest + suffix); `opened` the text before the cursor
    (its brackets may be closed by the insertion; default: the cursor line's)."""
    if not text:
        return ""
    if rest_of_line.strip():  # mid-line: one line only
        text = text[: _line_end(text, 0)]
    # Trailing characters the line already has after the cursor (closers, quotes, ;).
    k = min(len(text), len(rest_of_line))
    while k > 0:
        tail = rest_of_line[:k]
        if set(tail) <= _CLOSERS and text.endswith(tail):
            text = text[: len(text) - k]
            break
        k -= 1
    # Lines that repeat the next lines of the document.
    lines = _BREAK.split(text)
    if len(lines) > 1:
        nxt = _BREAK.split(following)
        nxt = nxt[1:] if nxt and not nxt[0].strip() else nxt
        for k in range(len(lines) - 1, 0, -1):
            tail = [x.strip() for x in lines[len(lines) - k :]]
            if tail == [x.strip() for x in nxt[:k]] and any(tail):
                # cut the text before the break that starts the repeated lines
                ends = [m.start() for m in _BREAK.finditer(text)]
                text = text[: ends[len(lines) - k - 1]]
                break
    stripped = text.strip()
    if not stripped:
        return ""
    if (rest_of_line + following).lstrip().startswith(stripped):
        return ""  # the model only retyped what is already there
    # Brackets: cut before a closer that nothing before the cursor opens.
    opened = opened or line_before
    cut = _unmatched_closer(opened + text, len(opened))
    if cut >= 0:
        text = text[: cut - len(opened)]
    return text if text.strip() else ""


def degenerate_reason(old: str, new: str, prefix: str = "", suffix: str = "") -> str | None:
    """Why the model's new region `new` must not be shown (coder_model.degenerate), or None."""
    return degenerate_region(old, new, prefix, suffix)


def suggest(old: str, cursor: int, new: str, suffix: str = "", prefix: str = "") -> Suggestion:
    """Split the model's new region into the inline completion and other edits.

    `prefix`/`suffix`: the document text before/after the region, the context against which
    a repetition counts as the file's style rather than degeneration."""
    if new == old:
        return Suggestion()
    reason = degenerate_reason(old, new, prefix, suffix)
    if reason is not None:
        return Suggestion(held_back=reason)
    if not new.strip() and old.strip():
        # Erasing the whole region (cursor line included, under the user's hands) is what an
        # unsure model emits when it stops at once (<eom> first); never a useful proposal.
        return Suggestion()
    eol = _line_end(old, cursor)
    before, rest, after_line = old[:cursor], old[cursor:eol], old[eol:]
    line_before = before[_line_start(before, len(before)) :]
    following = after_line + suffix
    opened = (prefix + before)[-BRACKET_CONTEXT_CHARS:]
    out = Suggestion()
    if new.startswith(before) and new.endswith(old[cursor:]) and len(new) >= len(old):
        # A pure insertion at the cursor.
        ins = new[cursor : len(new) - len(old) + cursor]
        out.insert_text = filter_insertion(ins, line_before, rest, following, opened)
        return out
    if new.startswith(before) and new.endswith(after_line) and len(new) - len(after_line) >= cursor:
        # The rest of the cursor line is rewritten, the lines after it are kept.
        text = new[cursor : len(new) - len(after_line)]
        if not _BREAK.search(text) and text.strip() and text != rest:
            cut = _unmatched_closer(opened + text, len(opened))
            if cut < 0:
                out.insert_text, out.replace_end = text, eol
                return out
    for e in minimal_edits(old, new):
        if e.start == e.end == cursor and not out.insert_text:
            out.insert_text = filter_insertion(e.text, line_before, rest, following, opened)
        else:
            out.edits.append(e)
    return out
