"""Edit examples from line hunks: the shared machinery of synthetic and real edits.

An edit is a list of line *hunks* on a `before` text (the edit-histories
format: `at`/`del`/`add`: 1-based line, lines deleted, text added) plus the
order in which a user makes them. The first k hunks (in that order) are applied
and rendered as history events with `dlm.coder_model.edit_history.render_event`
(git `-U0` hunks, oldest first: byte-for-byte what the server sends); the
region is a few lines around hunk k+1 in the text with those k hunks applied,
and the target is the region with hunk k+1 applied. The region never contains
any other pending hunk, so the target is exactly "the next edit", nothing more.

Cursor rule (the same for training and evaluation): if the previous hunk's
new text ends inside the region, the cursor sits there (the user just made
that edit); otherwise the cursor is at the start of the target hunk's first
line (the user navigated to the place of the next edit).

Pure Python (no torch), deterministic given the `random.Random` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from dlm.coder_model.edit_history import patch_lines as split_lines  # git lines, the one splitter
from dlm.coder_model.edit_history import render_event
from dlm.coder_model.types import Prompt
from dlm.drivers.training.examples import Example, window

# ---------------------------------------------------------------------------
# options


@dataclass(frozen=True)
class EditOptions:
    """Sizes of the prompt parts built for edit examples."""

    prefix_chars: int = 1500
    suffix_chars: int = 600
    # current region and target region, each: ~240 chars of code is ~64 tokens,
    # the 2 blocks of 32 slots the trainer and sampler use by default
    max_region_chars: int = 240
    max_context_lines: int = 2  # unchanged lines on each side of the target hunk
    max_history_chars: int = 2000  # oldest events are dropped first
    max_history_events: int = 8
    chunk_chars: int = 4000  # synthetic edits: code span that is parsed and edited


DEFAULT_OPTIONS = EditOptions()

# ---------------------------------------------------------------------------
# lines and hunks


@dataclass(frozen=True)
class Hunk:
    """Replace `n_del` lines starting at 0-based line `start` with `add` lines.

    For a pure insertion (`n_del == 0`) the new lines go before line `start`.
    """

    start: int
    n_del: int
    add: tuple[str, ...]

    @classmethod
    def from_record(cls, h: dict) -> Hunk:
        start = h["at"] - 1 if h["del"] else h["at"]
        return cls(start, h["del"], tuple(split_lines(h["add"])))


def apply_hunks(lines: list[str], hunks: Iterable[Hunk]) -> list[str]:
    """Apply non-overlapping hunks given in the coordinates of `lines`."""
    out = list(lines)
    for h in sorted(hunks, key=lambda h: h.start, reverse=True):
        out[h.start : h.start + h.n_del] = list(h.add)
    return out


def _shift(h: Hunk, applied: Iterable[Hunk]) -> int:
    """Line offset of hunk `h` once the hunks `applied` (other than h) are applied.

    Hunks never share a start line (sites_to_hunks merges them; git -U0 hunks
    are separated by at least one unchanged line), so "before" is start < start.
    """
    return sum(len(g.add) - g.n_del for g in applied if g.start < h.start)


def _trim_history(events: list[str], opts: EditOptions) -> tuple[str, ...]:
    kept: list[str] = []
    total = 0
    for ev in reversed(events[-opts.max_history_events :]):
        if total + len(ev) > opts.max_history_chars:
            break
        kept.append(ev)
        total += len(ev)
    return tuple(reversed(kept))


@dataclass(frozen=True)
class NextEdit:
    """A built next-edit example plus where its target hunk sits in the region."""

    example: Example
    region_start_line: int  # line of the region in the current text
    hunk_line: int  # line of the target hunk, relative to the region's first line
    hunk_del: int


def replay(path: str, lines: list[str], applied: list[Hunk]) -> tuple[list[str], list[str]]:
    """Apply `applied` (in `lines` coordinates) one by one: (history events, the text after).

    Each event is rendered in the coordinates of the text at the time it was made."""
    events: list[str] = []
    done: list[Hunk] = []
    for h in applied:
        start = h.start + _shift(h, done)
        events.append(render_event(path, start, lines[h.start : h.start + h.n_del], list(h.add)))
        done.append(h)
    return events, apply_hunks(lines, applied)


def shrink_to(lines: list[str], a: int, b: int, max_chars: int) -> str | None:
    """Text of lines[a:b], dropping lines from the end to fit `max_chars`; None if blank or too long."""
    while b - a > 1 and len("".join(lines[a:b])) > max_chars:
        b -= 1
    region = "".join(lines[a:b])
    return region if region.strip() and len(region) <= max_chars else None


def region_prompt(cur: list[str], a: int, region: str, cursor: int, events: list[str], path: str,
                  language: str, opts: EditOptions) -> Prompt:
    """The Prompt of a region starting at line `a` of the current lines `cur`, with its history."""
    cur_text = "".join(cur)
    a_char = len("".join(cur[:a]))
    b_char = a_char + len(region)
    return Prompt(
        prefix=window(cur_text, 0, a_char, opts.prefix_chars, "before"),
        region=region,
        cursor=cursor,
        suffix=window(cur_text, b_char, len(cur_text), opts.suffix_chars, "after"),
        history=_trim_history(events, opts),
        language=language,
        path=path,
    )


def build_next_edit(
    before: str,
    hunks: list[Hunk],
    order: list[int],
    k: int,
    rng: random.Random,
    path: str,
    kind: str,
    opts: EditOptions = DEFAULT_OPTIONS,
    language: str = "python",
    source: str = "",
) -> NextEdit | None:
    """Example whose history is hunks order[:k] and whose target applies order[k].

    `hunks` are non-overlapping, in file order, in `before` coordinates.
    Returns None when the target does not fit in `opts.max_region_chars`.
    """
    lines = split_lines(before)
    applied_idx = order[:k]
    applied = [hunks[i] for i in applied_idx]
    events, cur = replay(path, lines, applied)
    target = hunks[order[k]]
    t_start = target.start + _shift(target, applied)
    t_end = t_start + target.n_del
    old_text = "".join(cur[t_start:t_end])
    new_text = "".join(target.add)
    if len(old_text) > opts.max_region_chars or len(new_text) > opts.max_region_chars:
        return None
    # room around the target: stop at any other pending hunk
    lo, hi = 0, len(cur)
    for i, g in enumerate(hunks):
        if i == order[k] or i in applied_idx:
            continue
        g_start = g.start + _shift(g, applied)
        if g_start < t_start or (g_start == t_start and g.n_del == 0 and target.n_del > 0):
            lo = max(lo, g_start + g.n_del)
        else:
            hi = min(hi, g_start)
    n_before = rng.randint(0, opts.max_context_lines)
    n_after = rng.randint(0, opts.max_context_lines)
    if target.n_del == 0 and n_before + n_after == 0:
        n_before = 1  # an empty region gives the model no anchor
    a = max(lo, t_start - n_before)
    b = min(hi, t_end + n_after)
    if a == b and a > lo:
        a -= 1  # at the end of the file: take the line before instead
    # shrink the context until both sides fit
    while True:
        region = "".join(cur[a:b])
        new_region = "".join(cur[a:t_start]) + new_text + "".join(cur[t_end:b])
        if max(len(region), len(new_region)) <= opts.max_region_chars:
            break
        if b > t_end and (b - t_end >= t_start - a):
            b -= 1
        elif a < t_start:
            a += 1
        else:
            return None
    if not region and not new_region:
        return None
    # cursor: end of the previous hunk's new text if it is in the region, else start of the change
    cursor = len("".join(cur[a:t_start]))
    if applied:
        prev = applied[-1]
        p_start = prev.start + _shift(prev, applied)
        p_end = p_start + len(prev.add)  # first line after the previous hunk's new lines
        if prev.add and a < p_end <= b:
            cursor = len("".join(cur[a:p_end]))
            if cur[p_end - 1].endswith("\n"):
                cursor -= 1  # end of the last edited line, before its newline
        elif not prev.add and a <= p_start <= b:
            cursor = len("".join(cur[a:p_start]))  # where the lines were deleted
    prompt = region_prompt(cur, a, region, cursor, events, path, language, opts)
    return NextEdit(Example(kind, prompt, new_region, source or path), a, t_start - a, target.n_del)


def build_finished_noop(
    before: str,
    hunks: list[Hunk],
    order: list[int],
    rng: random.Random,
    path: str,
    opts: EditOptions = DEFAULT_OPTIONS,
    language: str = "python",
    source: str = "",
) -> Example | None:
    """All hunks applied and in the history; region near the last one; nothing left to do."""
    lines = split_lines(before)
    applied = [hunks[i] for i in order]
    events, cur = replay(path, lines, applied)
    if not cur:
        return None
    last = applied[-1]
    l_start = last.start + _shift(last, applied[:-1])
    center = min(len(cur) - 1, max(0, l_start + rng.randint(-3, max(0, len(last.add)) + 2)))
    a = max(0, center - rng.randint(0, 2))
    b = min(len(cur), center + 1 + rng.randint(0, 2))
    region = shrink_to(cur, a, b, opts.max_region_chars)
    if region is None:
        return None
    cursor = rng.randint(0, len(region.rstrip("\n")))
    prompt = region_prompt(cur, a, region, cursor, events, path, language, opts)
    return Example("noop", prompt, region, source or path)
