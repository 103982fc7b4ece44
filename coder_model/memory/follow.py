"""Multi-line drafts: the lines that follow a line the memory proposes, where a source has them.

A line that opens a block (it ends with `:`) or leaves a bracket open goes on below it. When
the same line stands in a source the memory can read (the document above the cursor, another
open buffer, or an indexed file the retriever found like the lines above), the lines that
follow it there, up to the end of its block or its bracket and at most MAX_FOLLOW_LINES, are
the draft of the lines below the cursor, re-indented to the cursor's line.

The n-gram tables merge counts from every file, so their beam has no source to continue: the
continuation comes from a source that holds the whole line, never from the tables. Nothing is
proposed where the block's body is already below the cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dlm.coder_model.line_scan import code_chars, without_comment

MAX_FOLLOW_LINES = 8
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = set(_OPEN.values())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def bracket_depth(line: str) -> int:
    """Brackets the line leaves open (closers of brackets opened above count negative); strings
    are skipped roughly (coder_model.line_scan)."""
    depth = 0
    for _, ch in code_chars(without_comment(line)):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
    return depth


def opens_block(line: str) -> bool:
    """Does the line go on below: a block header (`:` at its end) or an open bracket?"""
    code = without_comment(line)
    return bool(code.strip()) and (code.endswith(":") or bracket_depth(code) > 0)


def block_after(lines: Sequence[str], i: int, max_lines: int = MAX_FOLLOW_LINES) -> list[str]:
    """The lines after lines[i] that belong to it: a header's body (lines indented deeper, blank
    lines inside it kept), or the lines up to the one that closes its open brackets. Empty when
    it opens nothing, when the body is cut by max_lines mid-bracket, or nothing follows."""
    line = lines[i]
    base = _indent(line)
    out: list[str] = []
    depth = bracket_depth(line)
    if depth > 0:
        for nxt in lines[i + 1 : i + 1 + max_lines]:
            out.append(nxt)
            depth += bracket_depth(nxt)
            if depth <= 0:
                return out
        return []  # the bracket does not close within max_lines: a cut call is no draft
    if not without_comment(line).endswith(":"):
        return []
    for nxt in lines[i + 1 :]:
        if nxt.strip() and _indent(nxt) <= base:
            break
        if len(out) == max_lines:
            break
        out.append(nxt)
    while out and not out[-1].strip():
        out.pop()
    return out


def reindent(block: Sequence[str], source_indent: int, cursor_indent: int) -> list[str]:
    """The block moved from a line indented `source_indent` to one indented `cursor_indent`."""
    delta = cursor_indent - source_indent
    out = []
    for line in block:
        if not line.strip():
            out.append("")
        elif delta >= 0:
            out.append(" " * delta + line)
        else:
            cut = min(-delta, _indent(line))
            out.append(line[cut:])
    return out


def body_present(line: str, after: str) -> bool:
    """Is the block `line` opens already written below the cursor? (the next non-blank line is
    indented deeper, or the bracket it opens is closed there)"""
    rest = after.split("\n")[1:]  # the cursor line's own rest comes first
    for nxt in rest:
        if nxt.strip():
            return _indent(nxt) > _indent(line) or (bracket_depth(line) > 0 and nxt.lstrip()[:1] in _CLOSE)
    return False


def follow_in(sources: Iterable[tuple[Sequence[str], bool]], line: str, max_lines: int = MAX_FOLLOW_LINES,
              refuse: Callable[[str], bool] = lambda _: False) -> list[str]:
    """The block after the first source line equal to `line` (stripped), re-indented to `line`.
    `sources`: (lines, nearest_last): the document above the cursor is read from its end (the
    nearest earlier block), other sources from their start. A block with a line `refuse` holds
    (a secret) is passed over."""
    want = line.strip()
    for lines, nearest_last in sources:
        order = range(len(lines) - 1, -1, -1) if nearest_last else range(len(lines))
        for i in order:
            if lines[i].strip() == want:
                block = block_after(lines, i, max_lines)
                if block and not any(refuse(b) for b in block):
                    return reindent(block, _indent(lines[i]), _indent(line))
    return []
