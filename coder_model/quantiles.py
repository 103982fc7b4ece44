"""Percentiles: serving (lsp.stats), the benches and `dlm-lsp eval` report with this one."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of `values`; None when empty.

    The one percentile of the project: the server's dlm/stats, `dlm-lsp bench`,
    `dlm-lsp eval` and the remote bench all report with it, so their p50/p99 agree.
    """
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100.0 * len(s) + 0.5) - 1))
    return s[k]
