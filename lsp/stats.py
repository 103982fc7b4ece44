"""Counters and rolling latency percentiles (for dlm/status, dlm/stats and the bench)."""

from __future__ import annotations

from collections import Counter, deque

from dlm.coder_model.quantiles import percentile  # the one percentile (also re-exported)

# Why an answer was not offered, in the words the status line uses (docs/protocol.md).
HELD_BACK_REASONS = {
    "gated_low_confidence": "low confidence",
    "gated_rewrites_recent": "rewrites recent typing",
    "gated_late": "late",
    "no_steps": "no time for a model step",
    "held_back_degenerate": "degenerate (repeats, blank lines)",
    "held_back_syntax": "syntax",  # accepting it would break the line's syntax (lsp.syntax_check)
    "held_back_deletes_lines": "deletes lines",  # a rewrite that drops lines it puts nothing in place of
}


class Stats:
    COUNTERS = (
        "requests", "model_runs", "completed", "cancelled", "superseded", "skipped", "outdated",
        "cache_hits", "empty", "failed", "shown", "accepted", "partially_accepted", "steps", "tokens",
        "late", "offered", "no_change", "no_steps", "memory_answers", "binary", *[k for k in HELD_BACK_REASONS if k != "no_steps"],
    )  # fmt: skip

    def __init__(self, window: int = 200) -> None:
        self.counts: Counter[str] = Counter({k: 0 for k in self.COUNTERS})
        self.latencies: deque[float] = deque(maxlen=window)  # request -> answer, ms, model runs only
        self.stage_ms: dict[str, deque[float]] = {}

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def latency(self, ms: float) -> None:
        self.latencies.append(ms)

    def stage(self, name: str, ms: float) -> None:
        self.stage_ms.setdefault(name, deque(maxlen=self.latencies.maxlen)).append(ms)

    def p(self, q: float) -> float | None:
        v = percentile(list(self.latencies), q)
        return None if v is None else round(v, 1)

    def held_back(self) -> dict:
        """What the server offered the editor and what it held back, by reason (dlm/status)."""
        by = {HELD_BACK_REASONS[k]: self.counts[k] for k in HELD_BACK_REASONS}
        return {"offered": self.counts["offered"], "held_back": sum(by.values()), "held_back_by": by}

    def snapshot(self) -> dict:
        out: dict = dict(self.counts)
        out["p50_ms"], out["p95_ms"], out["p99_ms"] = self.p(50), self.p(95), self.p(99)
        for q in (50, 99):
            out[f"stages_p{q}_ms"] = {
                k: round(percentile(list(v), q) or 0.0, 2) for k, v in sorted(self.stage_ms.items())
            }
        steps = self.counts["steps"]
        out["tokens_per_step"] = round(self.counts["tokens"] / steps, 3) if steps else None
        return out
