"""Which requests the model's check would not change: the memory's answer where its own confidence
is high, the checked answer elsewhere, scored offline from two `eval --repo` runs on the same cases.

    dlm-lsp eval --repo DIR --config verify --out V ; dlm-lsp eval --repo DIR --config memory --out M
    python -m dlm.drivers.evaluation.fast_path --verify V --memory M [--verify V2 --memory M2 ...]

For each threshold T, a case whose memory-alone answer has confidence >= T takes that answer (no
model pass: its latency is the memory's); every other case takes the checked one. The rows give the
share of cases on the fast path, how often its answer is the checked one, exact at gate 0, shown
and precision at the default gate, and the latency percentiles, pooled over the runs given. The
two runs must be of the same cases (same repository, --cases and --seed): they are paired by index.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlm.coder_model.quantiles import percentile

DEFAULT_GATE = 0.5  # lsp.options' minConfidence default, the gate the shown/precision columns use
NEVER = 2.0  # a threshold no confidence reaches: the checked configuration itself


def load(path: str) -> list[dict]:
    p = Path(path)
    data = json.loads((p / "eval-repo.json" if p.is_dir() else p).read_text(encoding="utf-8"))
    return data["cases"]


def answered(c: dict) -> bool:
    return c.get("latency_ms") is not None and bool(c.get("shown"))


def row(pairs: list[tuple[dict, dict]], threshold: float, gate: float = DEFAULT_GATE) -> dict:
    """The mixed configuration at `threshold` over paired (checked, memory-alone) cases."""
    chosen, fast, same = [], 0, 0
    for v, m in pairs:
        if answered(m) and (m.get("confidence") or 0.0) >= threshold:
            fast += 1
            same += int(m.get("suggestion") == v.get("suggestion"))
            chosen.append(m)
        else:
            chosen.append(v)
    n = len(chosen)
    shown = [c for c in chosen if answered(c) and (c.get("confidence") or 0.0) >= gate]
    lat = [c["latency_ms"] for c in chosen if c.get("latency_ms") is not None]
    return {
        "threshold": threshold, "cases": n, "fast": fast, "fast_share": fast / n if n else 0.0,
        "fast_same": same / fast if fast else None,
        "exact": sum(1 for c in chosen if answered(c) and c.get("exact")) / n if n else 0.0,
        "shown": len(shown) / n if n else 0.0,
        "precision": sum(1 for c in shown if c.get("exact")) / len(shown) if shown else None,
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
    }  # fmt: skip


def render(rows: list[dict]) -> str:
    head = ("| memory alone from | fast path | its answer = the checked one | exact at gate 0 "
            "| shown / precision at 0.5 | p50 / p99 ms |")
    out = [head, "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = "never (the checked configuration)" if r["threshold"] >= NEVER else f"{r['threshold']:g}"
        same = "-" if r["fast_same"] is None else f"{100 * r['fast_same']:.1f}%"
        prec = "-" if r["precision"] is None else f"{100 * r['precision']:.1f}%"
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.0f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.0f}"
        out.append(f"| {t} | {100 * r['fast_share']:.1f}% ({r['fast']}) | {same} | {100 * r['exact']:.1f}% "
                   f"| {100 * r['shown']:.1f}% / {prec} | {p50} / {p99} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--verify", action="append", required=True, help="an eval --repo --config verify output")
    parser.add_argument("--memory", action="append", required=True, help="the memory run of the same cases")
    parser.add_argument("--thresholds", default="0.5,0.7,0.8,0.9,0.95,0.99")
    args = parser.parse_args(argv)
    if len(args.verify) != len(args.memory):
        parser.error("give one --memory run for each --verify run, in the same order")
    pairs: list[tuple[dict, dict]] = []
    for v_path, m_path in zip(args.verify, args.memory):
        v, m = load(v_path), load(m_path)
        if len(v) != len(m) or any(a["path"] != b["path"] or a["answer"] != b["answer"] for a, b in zip(v, m)):
            parser.error(f"{v_path} and {m_path} are not runs of the same cases (same --repo, --cases, --seed)")
        pairs.extend(zip(v, m))
    thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()] + [NEVER]
    print(render([row(pairs, t) for t in thresholds]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
