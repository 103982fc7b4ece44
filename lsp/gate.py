"""The show / don't-show decision for a suggestion, and the request's deadline (docs/architecture.md §3).

Pure functions and one small per-document record; the server (lsp.server) and
the HTTP endpoint call them, `dlm-lsp eval` applies the same rule offline.

- Deadline: a request must be answered `deadline_ms` after the keystroke that
  caused it (the document's last change), or after its own arrival when it
  came later than that deadline (a request not caused by a keystroke: a pause,
  a manual trigger, a cursor move). The engine plans its steps to it; an
  answer that is late is never shown.
- Confidence gate: a suggestion is shown when its calibrated confidence is at
  least `min_confidence`. One that deletes or rewrites text typed in the last
  `recent_edit_s` seconds needs `min_confidence_rewrite_recent`: proposing to
  undo what the user just typed is the most irritating mistake an editor can
  make. An engine that computes no confidence (None: open families, remote
  servers that send none) is not gated, except that it may not rewrite recent
  text.
- Edit predictions away from the cursor (dlm/editPrediction) are answered
  only with `edit_predictions` on (the default: they come from the edit memory,
  whose own gate is `nextEdits.minConfidence`); the model's own rewrite of the
  region (`nextEdits.modelFallback`) stays off: it has not earned it
  (docs/next-edits.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlm.lsp.documents import Change


@dataclass(frozen=True)
class Verdict:
    show: bool
    reason: str  # "shown", "late", "low_confidence", "rewrites_recent"


def deadline_at(last_change_at: float, arrived_at: float, deadline_ms: float) -> float:
    """Absolute time.monotonic() deadline of a request that arrived at `arrived_at`.

    Counted from the keystroke (the document's last change) when the request came
    within that keystroke's deadline; else from the request's arrival.
    """
    budget = deadline_ms / 1000.0
    start = last_change_at if 0 < last_change_at <= arrived_at < last_change_at + budget else arrived_at
    return start + budget


def decide(confidence: float | None, rewrites_recent: bool, late: bool, min_confidence: float,
           min_confidence_rewrite_recent: float) -> Verdict:
    """Show a suggestion or not (see the module docstring)."""
    if late:
        return Verdict(False, "late")
    if rewrites_recent:
        if confidence is None or confidence < min_confidence_rewrite_recent:
            return Verdict(False, "rewrites_recent")
        return Verdict(True, "shown")
    if confidence is not None and confidence < min_confidence:
        return Verdict(False, "low_confidence")
    return Verdict(True, "shown")


def replaced_lines(region: str, start_line: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Document line ranges (first, last) of the region text that `spans` (region offsets
    [start, end), end > start) delete or replace; insertions (start == end) replace nothing."""
    out = []
    for start, end in spans:
        if end <= start:
            continue
        first = start_line + region.count("\n", 0, start)
        last = start_line + region.count("\n", 0, max(start, end - 1))
        out.append((first, last))
    return out


@dataclass
class RecentEdits:
    """The document lines changed in the last `window_s` seconds, following later edits.

    Fed with every applied `Change`; spans are in current document lines, at most
    `max_spans` (the oldest are dropped first), and spans older than the window are
    pruned as new changes arrive.
    """

    window_s: float = 5.0
    max_spans: int = 64
    spans: list[tuple[int, int, float]] = field(default_factory=list)  # (first, last, at)

    def record(self, change: Change) -> None:
        delta = change.new_end_line - change.old_end_line
        kept: list[tuple[int, int, float]] = []
        for first, last, at in self.spans:
            if at < change.at - self.window_s:
                continue
            if last < change.start_line:  # above the change: unmoved
                kept.append((first, last, at))
            elif first > change.old_end_line:  # below it: shifted by the lines it added/removed
                kept.append((first + delta, last + delta, at))
            else:  # overlapping lines now belong to the change's span (a new time)
                if first < change.start_line:
                    kept.append((first, change.start_line - 1, at))
                if last > change.old_end_line:
                    kept.append((change.new_end_line + 1, last + delta, at))
        kept.append((change.start_line, change.new_end_line, change.at))
        self.spans = kept[-self.max_spans :]

    def touches(self, lines: list[tuple[int, int]], now: float) -> bool:
        """Do any of these (first, last) line ranges include a line changed within the window?"""
        recent = [(f, la) for f, la, at in self.spans if at >= now - self.window_s]
        return any(f <= b and a <= la for a, b in lines for f, la in recent)
