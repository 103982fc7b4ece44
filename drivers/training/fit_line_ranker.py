"""Fit the line ranker (coder_model.memory.line_ranker): boosted trees over the repository memory's
drafts, on repositories' own lines, with no model.

    python -m dlm.drivers.training.fit_line_ranker --repo DIR [--repo DIR ...] --cases 600 \\
        --out coder_model/memory/line_ranker.json

The cases come from the training split of each repository: files whose path hashes into
[HOLDOUT, 2 * HOLDOUT) (repo_cases.held_out), typed as `dlm-lsp eval --repo` types them, with
the files outside [0, 2 * HOLDOUT) as the indexed workspace. The evaluation's frozen cases come
from the files below HOLDOUT, which are neither indexed here nor typed: the ranker never sees
them. Each case's drafts are the memory's beam as the server asks it (MEMORY_BEAM), labelled by
whether the draft is exactly the rest of the line.

Before the fit on all repositories, each repository's drafts are re-ranked by trees fitted on the
others (leave one repository out), and the table reports top-1 exact for the memory's order and
the trees', with shown / precision at confidence cuts for both: the memory's score and the
trees' probability. `--without FEATURE` refits with that feature held constant (an ablation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

CUTS = (0.3, 0.4, 0.5, 0.6, 0.7)


def collect(repo: str, n: int, seed: int) -> list[dict]:
    """Per case: its file, and each draft's features, its label and the memory's score."""
    from dlm.coder_model.memory.line_ranker import LineFacts, features
    from dlm.drivers.evaluation.repo_cases import HOLDOUT, build_memory, held_out, make_cases
    from dlm.lsp.memory_proposals import MEMORY_BEAM, DraftSyntax

    workspace, drawn = make_cases(repo, 3 * n, seed, holdout=2 * HOLDOUT)
    cases = [c for c in drawn if not held_out(c.path, HOLDOUT)][:n]
    memory, _ = build_memory(workspace)
    rows = []
    for case in cases:
        found = [c for c in memory.complete(case.before, case.after, path=case.path, beam=MEMORY_BEAM) if c.text]
        syntax = DraftSyntax.of_text("python", case.before, case.after)  # the checks serving runs
        facts = LineFacts.of(case.before, case.after, syntax.string_swallows_code)
        scores, supports, texts = [c.score for c in found], [c.support for c in found], [c.text for c in found]
        drafts = []
        for r in range(len(found)):
            drafts.append({"x": features(facts, scores, supports, texts, r, syntax.parses(texts[r])),
                           "y": texts[r] == case.answer, "score": scores[r]})
        rows.append({"path": case.path, "drafts": drafts})
    return rows


def labelled(rows_by_repo: dict[str, list[dict]], skip: str | None, without: Sequence[int] = ()):
    """(features, labels) of every draft of every repository's rows but `skip`'s, with the
    features at `without` held at 0."""
    X, y = [], []
    for name, rows in rows_by_repo.items():
        if name == skip:
            continue
        for row in rows:
            for d in row["drafts"]:
                X.append(_masked(d["x"], without))
                y.append(1.0 if d["y"] else 0.0)
    return X, y


def _masked(x: list[float], without: Sequence[int]) -> list[float]:
    return [0.0 if j in without else v for j, v in enumerate(x)]


def summarize(rows: list[dict], probs: list[list[float]]) -> dict:
    """Top-1 exact and shown / precision per cut, for the memory (its first draft, its score) and
    the trees (their best draft, its probability)."""
    n = len(rows)
    memory = [(r["drafts"][0]["score"], r["drafts"][0]["y"]) if r["drafts"] else (0.0, False) for r in rows]
    trees = []
    for r, p in zip(rows, probs):
        if not r["drafts"]:
            trees.append((0.0, False))
            continue
        best = max(range(len(p)), key=p.__getitem__)
        trees.append((p[best], r["drafts"][best]["y"]))
    out = {"cases": n}
    for name, picks in (("memory", memory), ("trees", trees)):
        out[name] = {"top1": sum(y for _, y in picks) / n if n else 0.0}
        for cut in CUTS:
            shown = [y for s, y in picks if s >= cut]
            out[name][str(cut)] = (len(shown) / n if n else 0.0, sum(shown) / len(shown) if shown else 0.0)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from dlm.coder_model.edit_memory.boosting import fit
    from dlm.coder_model.memory.line_ranker import FEATURES, LineRanker

    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.training.fit_line_ranker",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", action="append", required=True, help="a repository directory (two or more)")
    ap.add_argument("--cases", type=int, default=600, help="training cases per repository")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--without", action="append", default=[], choices=FEATURES, help="hold a feature constant")
    ap.add_argument("--rows", default=None, help="a JSON file of collected rows: read if it exists, else written")
    ap.add_argument("--out", default=None, help="write the ranker fitted on every repository here")
    args = ap.parse_args(argv)
    if len(args.repo) < 2:
        print("line_ranker: pass two --repo or more (each is judged by trees fitted on the others)", file=sys.stderr)
        return 2
    without = [FEATURES.index(f) for f in args.without]
    by_repo: dict[str, list[dict]] = {}
    if args.rows and os.path.exists(args.rows):
        with open(args.rows, encoding="utf-8") as fh:
            by_repo = json.load(fh)
    for repo in args.repo:
        name = os.path.basename(os.path.normpath(repo))
        if name in by_repo:
            continue
        if not os.path.isdir(repo):
            print(f"line_ranker: {repo} is not a directory", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        by_repo[name] = collect(repo, args.cases, args.seed)
        print(f"{name}: {len(by_repo[name])} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if args.rows and not os.path.exists(args.rows):
        with open(args.rows, "w", encoding="utf-8") as fh:
            json.dump(by_repo, fh)
    print("| repository | cases | top 1: memory / trees | " + " | ".join(f"shown / precise at {c}: memory; trees" for c in CUTS) + " |")
    print("| --- " * (3 + len(CUTS)) + "|")
    every_rows, every_probs = [], []
    for held, rows in by_repo.items():
        X, y = labelled(by_repo, held, without)
        model = fit(X, y, trees=args.trees, depth=args.depth, min_leaf=20)
        probs = [[model(_masked(d["x"], without)) for d in r["drafts"]] for r in rows]
        every_rows += rows
        every_probs += probs
        _row(held, summarize(rows, probs))
    _row("all", summarize(every_rows, every_probs))
    if args.out:
        X, y = labelled(by_repo, None, without)
        ranker = LineRanker(fit(X, y, trees=args.trees, depth=args.depth, min_leaf=20))
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(ranker.to_json(), fh)
            fh.write("\n")
        print(f"line_ranker: wrote {args.out} ({len(y)} drafts)", file=sys.stderr)
    return 0


def _row(name: str, s: dict) -> None:
    def pct(v: float) -> str:
        return f"{100 * v:.1f}%"

    cells = [f"{pct(s['memory'][str(c)][0])} / {pct(s['memory'][str(c)][1])}; "
             f"{pct(s['trees'][str(c)][0])} / {pct(s['trees'][str(c)][1])}" for c in CUTS]
    print(f"| {name} | {s['cases']} | {pct(s['memory']['top1'])} / {pct(s['trees']['top1'])} | " + " | ".join(cells) + " |",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
