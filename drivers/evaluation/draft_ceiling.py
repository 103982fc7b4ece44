"""How much a model could win over the repository memory: the memory's drafts, sorted by what
it would take to reach the right line, and the memory re-ranked by boosted trees.

    python -m dlm.drivers.evaluation.draft_ceiling --repo DIR [--repo DIR ...] --cases 400

No model is trained or run. On each repository's frozen cases (repo_cases.make_cases: held-out
files chosen by a hash of their path, lines by a fixed seed), the memory's beam of K whole-line
continuations is sorted into four groups:

- top1: its first draft is the rest of the line;
- topK: a later draft is (a ranker could choose it);
- swap: a draft becomes the line by replacing at most MAX_SWAPS names with names visible in the
  window (the WINDOW_BEFORE lines above and WINDOW_AFTER below): a model that adapts drafts could
  write it;
- unreachable: none of these (a model would have to invent the line).

Then boosted trees (coder_model.edit_memory.boosting, the edit memory's own) re-rank each case's
drafts from the memory's own facts (rank, probability, support, the margin to the next draft,
length, whether the line parses, whether the draft is a line of the same file, the cursor), fitted
leave-one-repository-out: the trees that rank a repository's drafts never saw its cases. What the
model can still win is what the trees miss inside the beam plus the swap group.
"""

from __future__ import annotations

import argparse
import json
import keyword
import math
import os
import re
import sys
import time
from collections.abc import Sequence

K = 8  # the memory's beam (the server's MEMORY_BEAM)
MAX_SWAPS = 2
WINDOW_BEFORE = 60
WINDOW_AFTER = 20
GROUPS = ("top1", "topK", "swap", "unreachable")
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
_NAME = re.compile(r"[^\W\d]\w*")
FEATURES = ("rank", "score", "log_support", "score_ratio", "margin", "length", "drafts", "parses",
            "in_file", "typed", "typed_chars", "indent", "opens")


def names_in_window(before: str, after: str) -> set[str]:
    above = before.split("\n")[-WINDOW_BEFORE:]
    below = after.split("\n")[:WINDOW_AFTER]
    return set(_NAME.findall("\n".join(above + below)))


def swap_reachable(draft: str, answer: str, visible: set[str], max_swaps: int = MAX_SWAPS) -> bool:
    """Does `draft` become `answer` by renaming at most `max_swaps` distinct names, each new name
    visible in the window? (same tokens otherwise, in the same order)"""
    a, b = _TOKEN.findall(draft), _TOKEN.findall(answer)
    if len(a) != len(b) or a == b:
        return False
    swaps: dict[str, str] = {}
    for x, y in zip(a, b):
        if x == y:
            continue
        if not (_NAME.fullmatch(x) and _NAME.fullmatch(y)) or keyword.iskeyword(x) or keyword.iskeyword(y):
            return False
        if swaps.setdefault(x, y) != y or y not in visible:
            return False
    return 0 < len(swaps) <= max_swaps


def group_of(texts: Sequence[str], answer: str, visible: set[str]) -> str:
    if texts and texts[0] == answer:
        return "top1"
    if answer in texts[:K]:
        return "topK"
    if any(swap_reachable(t, answer, visible) for t in texts[:K]):
        return "swap"
    return "unreachable"


def features(case, cands, rank: int, parses: bool) -> list[float]:
    c = cands[rank]
    top = cands[0].score or 1e-9
    nxt = cands[rank + 1].score if rank + 1 < len(cands) else 0.0
    line_start = case.before.rfind("\n") + 1
    typed_line = case.before[line_start:]
    line = typed_line + c.text
    in_file = line.strip() and (("\n" + line.strip() + "\n") in
                                ("\n" + "\n".join(s.strip() for s in (case.before[:line_start] + case.after).split("\n")) + "\n"))
    opens = line.count("(") + line.count("[") + line.count("{") - line.count(")") - line.count("]") - line.count("}")
    return [float(rank), c.score, math.log1p(c.support), c.score / top, c.score - nxt, float(len(c.text)),
            float(len(cands)), float(parses), float(bool(in_file)), float(case.typed),
            float(len(typed_line.strip())), float(len(typed_line) - len(typed_line.lstrip())), float(opens)]


def collect(repo: str, n: int, seed: int, index_file: str | None) -> tuple[list[dict], dict]:
    """One row per case: its group, and each draft's features and label."""
    from dlm.drivers.evaluation.repo_cases import build_memory, load_or_build, make_cases
    from dlm.lsp.syntax_check import check_text

    workspace, cases = make_cases(repo, n, seed)
    memory, cost = load_or_build(index_file, workspace) if index_file else build_memory(workspace)
    rows = []
    t0 = time.perf_counter()
    for case in cases:
        cands = memory.complete(case.before, case.after, path=case.path, beam=K)[:K]
        texts = [c.text for c in cands]
        visible = names_in_window(case.before, case.after)
        drafts = []
        for r, c in enumerate(cands):
            parses = check_text("python", case.before, case.after, c.text) is None
            drafts.append({"x": features(case, cands, r, parses), "y": c.text == case.answer})
        rows.append({"group": group_of(texts, case.answer, visible), "len": len(case.answer), "drafts": drafts})
    cost["query_s"] = time.perf_counter() - t0
    return rows, cost


def rerank_loro(by_repo: dict[str, list[dict]], trees: int, depth: int) -> dict[str, list[int | None]]:
    """For each repository, each case's draft chosen by trees fitted on the other repositories
    (None: no drafts)."""
    from dlm.coder_model.edit_memory.boosting import fit
    from dlm.drivers.training.fit_line_ranker import labelled

    chosen: dict[str, list[int | None]] = {}
    for held in by_repo:
        X, y = labelled(by_repo, held)
        model = fit(X, y, trees=trees, depth=depth, min_leaf=20)
        picks: list[int | None] = []
        for row in by_repo[held]:
            if not row["drafts"]:
                picks.append(None)
                continue
            probs = [model(d["x"]) for d in row["drafts"]]
            picks.append(max(range(len(probs)), key=probs.__getitem__))
        chosen[held] = picks
    return chosen


def summarize(rows: list[dict], picks: list[int | None]) -> dict:
    n = len(rows)
    counts = {g: sum(1 for r in rows if r["group"] == g) for g in GROUPS}
    trees_top1 = sum(1 for r, p in zip(rows, picks) if p is not None and r["drafts"][p]["y"])
    in_beam = counts["top1"] + counts["topK"]
    long_rows = [(r, p) for r, p in zip(rows, picks) if 11 <= r["len"] <= 30]
    return {
        "cases": n,
        **{g: counts[g] / n for g in GROUPS},
        "memory_top1": counts["top1"] / n,
        "trees_top1": trees_top1 / n,
        "trees_miss_in_beam": (in_beam - trees_top1) / n,
        "model_headroom": (in_beam - trees_top1 + counts["swap"]) / n,
        "answers_11_30": len(long_rows),
        "trees_top1_11_30": (sum(1 for r, p in long_rows if p is not None and r["drafts"][p]["y"]) / len(long_rows)
                             if long_rows else None),
    }


def render(results: dict[str, dict]) -> str:
    head = ("| repository | cases | top 1 | in top 8 | ≤2 name swaps | unreachable | trees top 1 (LORO) | "
            "trees miss in the beam | model headroom (miss + swaps) |")
    out = [head, "| --- " * 9 + "|"]

    def pct(v):
        return f"{100 * v:.1f}%"

    for name, s in results.items():
        out.append(f"| {name} | {s['cases']} | {pct(s['top1'])} | {pct(s['top1'] + s['topK'])} | {pct(s['swap'])} | "
                   f"{pct(s['unreachable'])} | {pct(s['trees_top1'])} | {pct(s['trees_miss_in_beam'])} | "
                   f"{pct(s['model_headroom'])} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.evaluation.draft_ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", action="append", required=True, help="repository directory (at least two: leave-one-out)")
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--index-file", default=None, help="as repo_cases --index-file ({repo} is the repository's name)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if len(args.repo) < 2:
        print("draft_ceiling: pass at least two --repo (the trees are fitted leave-one-repository-out)", file=sys.stderr)
        return 2
    by_repo: dict[str, list[dict]] = {}
    for repo in args.repo:
        if not os.path.isdir(repo):
            print(f"draft_ceiling: {repo} is not a directory", file=sys.stderr)
            return 2
        name = os.path.basename(os.path.normpath(repo))
        index_file = args.index_file.replace("{repo}", name) if args.index_file else None
        rows, cost = collect(repo, args.cases, args.seed, index_file)
        by_repo[name] = rows
        print(f"{name}: {len(rows)} cases, memory queries {cost['query_s']:.0f} s", file=sys.stderr, flush=True)
    picks = rerank_loro(by_repo, args.trees, args.depth)
    results = {name: summarize(rows, picks[name]) for name, rows in by_repo.items()}
    allrows = [r for rows in by_repo.values() for r in rows]
    allpicks = [p for name in by_repo for p in picks[name]]
    results["all"] = summarize(allrows, allpicks)
    print(render(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "args": vars(args)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
