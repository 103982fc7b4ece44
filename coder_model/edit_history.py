"""The one renderer of edit-history events (docs/architecture.md §1, §4).

Serving (`dlm.lsp.history`) and training (`dlm.drivers.training`) both
write each edit event with `render_event`, so the `<history>` the model sees
while serving is byte-for-byte what it saw in training: a git `-U0` unified
diff of one hunk, its lines counted from 1 in the file at the time of the edit.
"""

from __future__ import annotations


def patch_lines(text: str) -> list[str]:
    """Lines as git and patch see them: split after every "\\n", terminators kept
    (a lone "\\r" is no break; a last line without "\\n" is kept as it is)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _line(text: str) -> str:
    """A line with exactly one "\\n" ending (any of \\r\\n, \\r, \\n normalised)."""
    return text.rstrip("\r\n") + "\n"


def render_hunk(path: str, old: list[str], new: list[str], old_start: int, new_start: int) -> str:
    """One hunk as a git `-U0` diff ('' if it changes nothing).

    `old_start`/`new_start` are 0-based indices of the first removed/added line
    (for an empty side: the index where the lines would go).
    """
    if [_line(x) for x in old] == [_line(x) for x in new]:
        return ""

    def span(start: int, count: int) -> str:
        # git: an empty side names the line before it; a count of 1 is omitted
        first = start + 1 if count else start
        return f"{first}" if count == 1 else f"{first},{count}"

    p = path or "untitled"
    parts = [f"--- a/{p}\n+++ b/{p}\n@@ -{span(old_start, len(old))} +{span(new_start, len(new))} @@\n"]
    parts.extend("-" + _line(line) for line in old)
    parts.extend("+" + _line(line) for line in new)
    return "".join(parts)


def render_event(path: str, start: int, old: list[str], new: list[str]) -> str:
    """An edit of lines `start..start+len(old)` into `new`, as one minimal `-U0` hunk.

    Unchanged lines at both ends are trimmed first, so an event given with
    surrounding context renders exactly as the minimal hunk training uses.
    """
    a, b = [_line(x) for x in old], [_line(x) for x in new]
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    a, b = a[head : len(a) - tail], b[head : len(b) - tail]
    return render_hunk(path, a, b, start + head, start + head)
