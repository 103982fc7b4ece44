"""Edit history: changes coalesced into events, rendered as git -U0 hunks.

An event is a run of changes to one area: a change joins the open event
when it touches lines within `gap_lines` of it and comes less than `idle_s`
after the previous change; otherwise (a pause, or a jump elsewhere) the open
event is closed and rendered by coder_model.edit_history.render_event (the
renderer training uses, so the model sees the same bytes), and a new one
starts. Only closed events are rendered (docs/architecture.md §4): the open event is
visible in the editable region, and keeping it out means that typing does
not change the tokens before the region, so the model's prefix KV cache
stays valid while the user types.

The event keeps the original text of its line range; lines that join the
range later are unchanged by the event so far, so their original text is
read from the document at that moment.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dlm.coder_model.budget import CHARS_PER_TOKEN
from dlm.coder_model.edit_history import render_event
from dlm.lsp.options import HistoryOptions


@dataclass
class _Event:
    start: int  # first line, in current document coordinates
    end: int  # last line (inclusive), in current document coordinates
    old_lines: list[str]  # the original text of lines start..end
    last_at: float


@dataclass
class History:
    path: str = ""
    options: HistoryOptions = field(default_factory=HistoryOptions)

    def __post_init__(self) -> None:
        self._closed: deque[str] = deque(maxlen=self.options.max_events)
        self._open: _Event | None = None
        self.generation = 0  # bumps when the rendered history changes

    # ---- fed by lsp.documents ------------------------------------------------------------------------
    def before_change(self, sl: int, el: int, now: float, lines: list[str]) -> None:
        ev = self._open
        if ev is None:
            return
        far = sl > ev.end + self.options.gap_lines or el < ev.start - self.options.gap_lines
        if far or now - ev.last_at > self.options.idle_s:
            self._close(lines)

    def after_change(self, change, lines: list[str]) -> None:
        sl, el = change.start_line, change.old_end_line
        delta = change.new_end_line - el
        ev = self._open
        if ev is None:
            self._open = _Event(sl, change.new_end_line, list(change.old_lines), change.at)
            return
        start, end_pre = min(ev.start, sl), max(ev.end, el)

        def original(i: int) -> str:  # a pre-change line outside the event: the event left it alone
            if sl <= i <= el:
                return change.old_lines[i - sl]
            j = i if i < sl else i + delta
            return lines[j] if 0 <= j < len(lines) else ""

        old = [original(i) for i in range(start, ev.start)]
        old += ev.old_lines  # the event's lines map to its original block as a whole
        old += [original(i) for i in range(ev.end + 1, end_pre + 1)]
        ev.start, ev.end, ev.old_lines, ev.last_at = start, end_pre + delta, old, change.at

    # ---- read by lsp.context -------------------------------------------------------------------------
    def close_if_idle(self, now: float, lines: list[str], cursor_line: int | None = None) -> None:
        """Close the open event after a pause, or when the cursor jumped away from it."""
        ev = self._open
        if ev is None:
            return
        jumped = cursor_line is not None and not (
            ev.start - self.options.gap_lines <= cursor_line <= ev.end + self.options.gap_lines
        )
        if jumped or now - ev.last_at > self.options.idle_s:
            self._close(lines)

    def rendered(self, max_chars: int | None = None) -> tuple[str, ...]:
        """Closed events, oldest first (newest kept), within the option's `max_tokens` and
        `max_chars`: the model's history window (coder_model.budget.Plan.history_chars);
        the layout then cuts it exactly in tokens."""
        budget = self.options.max_tokens * CHARS_PER_TOKEN
        if max_chars is not None:
            budget = min(budget, max_chars)
        out: list[str] = []
        used = 0
        for diff in reversed(self._closed):
            if used + len(diff) > budget:
                break
            out.append(diff)
            used += len(diff)
        return tuple(reversed(out))

    def _close(self, lines: list[str]) -> None:
        ev, self._open = self._open, None
        if ev is None:
            return
        new = lines[ev.start : ev.end + 1]
        diff = render_event(self.path, ev.start, ev.old_lines, new)
        if diff:
            self._closed.append(diff)
            self.generation += 1

