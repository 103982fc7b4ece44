"""Does the denoiser earn its place beside the repository memory? Measure, and fit the mix.

For held-out lines of a repository (drivers.evaluation.repo_cases), the memory proposes
its beam; the embedded model scores the first VERIFIED proposals with the suffix in view, as the
server does (coder_model.verify). Per case this records, for each proposal, the memory's
probability, the model's score and whether it is the answer. Then:

- the fixed baseline: the memory's own top-1;
- for each model weight on a grid, the mixed top-1 (the weight is chosen on the fitting half of
  the cases and reported on the other half, so the choice is not tuned on what it is judged on);
- the paired difference against the baseline with a 95% interval (bootstrap over cases), how often
  the model changed the memory's pick, and how often the change helped;
- the calibration of the chosen mix: a logistic fit of "the shown proposal is right" on the
  mixed score, so the confidence the gate reads is a probability; `--write` prints the
  SamplerParams to use.

    python -m dlm.drivers.evaluation.memory_mix --repo DIR [--repo DIR ...] --cases 300
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

VERIFIED = 4
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def collect(repo: str, n: int, seed: int, engine, order: str = "interleaved") -> list[dict]:
    """Per case: the proposals with their memory and model scores, and which one is the answer."""
    import torch
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.types import MemoryProposal, Prompt
    from dlm.coder_model.verify import score_proposals
    from dlm.drivers.evaluation.repo_cases import build_memory, make_cases

    workspace, cases = make_cases(repo, n, seed)
    memory, _cost = build_memory(workspace)
    model, tok, budget = engine.model, engine.tok, engine.budget
    out = []
    for c in cases:
        found = memory.complete(c.before, c.after, path=c.path, beam=8, exclude_path=c.path)
        proposals = tuple(MemoryProposal(x.text, x.score) for x in found if x.text)[:VERIFIED]
        rec = {"repo": repo, "answer": c.answer, "typed": c.typed, "in_beam": c.answer in [x.text for x in found],
               "proposals": []}
        if proposals:
            line_start = c.before.rfind("\n") + 1
            prompt = Prompt(prefix=c.before[:line_start], region=c.before[line_start:], cursor=len(c.before) - line_start,
                            suffix=c.after, path=c.path, language="python", proposals=proposals, insert=True)
            from dlm.coder_model.cache import PrefixCache

            cache = PrefixCache()
            with torch.inference_mode():
                model.prefill(encode_prompt(tok, prompt, budget), cache)
            scores, _ = score_proposals(model, tok, cache, prompt.region, prompt.cursor, proposals, 32, 2, order,
                                        insert=prompt.insert)
            rec["proposals"] = [{"text": p.text, "memory": p.score, "model": s, "right": p.text == c.answer}
                                for p, s in zip(proposals, scores)]
        out.append(rec)
    return out


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def mixed(p: dict, w: float) -> float:
    return logit(p["memory"]) + w * math.log(max(p["model"] or 1e-9, 1e-9))


def pick(rec: dict, w: float) -> dict | None:
    props = [p for p in rec["proposals"] if p["model"] is not None or w == 0]
    return max(props, key=lambda p: mixed(p, w)) if props else None


def top1(recs: list[dict], w: float) -> list[int]:
    return [1 if (p := pick(r, w)) is not None and p["right"] else 0 for r in recs]


def bootstrap_diff(a: list[int], b: list[int], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    rng = random.Random(seed)
    k = len(a)
    diffs = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        diffs.append(sum(a[i] - b[i] for i in idx) / k)
    diffs.sort()
    return diffs[int(0.025 * n)], diffs[int(0.975 * n)]


def fit_calibration(recs: list[dict], w: float) -> tuple[float, float]:
    """(scale, bias) of P(right) = sigmoid(bias + scale * mixed score) by logistic regression
    (Newton's method on two parameters) over the proposal each case would show."""
    xs, ys = [], []
    for r in recs:
        p = pick(r, w)
        if p is not None:
            xs.append(mixed(p, w))
            ys.append(1.0 if p["right"] else 0.0)
    a, b = 1.0, 0.0
    for _ in range(50):
        ga = gb = haa = hab = hbb = 0.0
        for x, y in zip(xs, ys):
            q = 1 / (1 + math.exp(-max(-30.0, min(30.0, b + a * x))))
            ga += (q - y) * x
            gb += q - y
            s = q * (1 - q)
            haa += s * x * x
            hab += s * x
            hbb += s
        det = haa * hbb - hab * hab + 1e-9
        a -= max(-1.0, min(1.0, (hbb * ga - hab * gb) / det))  # damped Newton steps: no overshoot
        b -= max(-1.0, min(1.0, (haa * gb - hab * ga) / det))
    return a, b


def report(recs: list[dict], seed: int = 0) -> dict:
    rng = random.Random(seed)
    order = list(range(len(recs)))
    rng.shuffle(order)
    fit = [recs[i] for i in order[: len(order) // 2]]
    test = [recs[i] for i in order[len(order) // 2 :]]
    best_w = max(WEIGHTS, key=lambda w: (sum(top1(fit, w)), -w))
    base, chosen = top1(test, 0.0), top1(test, best_w)
    changed = helped = hurt = 0
    for r in test:
        p0, p1 = pick(r, 0.0), pick(r, best_w)
        if p0 is not None and p1 is not None and p0["text"] != p1["text"]:
            changed += 1
            helped += p1["right"] and not p0["right"]
            hurt += p0["right"] and not p1["right"]
    lo, hi = bootstrap_diff(chosen, base, seed)
    scale, bias = fit_calibration(fit, best_w)
    n = len(test)
    return {
        "cases": len(recs), "fit_cases": len(fit), "test_cases": n,
        "in_beam": sum(r["in_beam"] for r in test) / n,
        "in_verified": sum(any(p["right"] for p in r["proposals"]) for r in test) / n,
        "memory_top1": sum(base) / n,
        "weights": {str(w): sum(top1(test, w)) / n for w in WEIGHTS},
        "chosen_weight": best_w, "chosen_top1": sum(chosen) / n, "diff_ci": (lo, hi),
        "changed_pick": changed, "change_helped": int(helped), "change_hurt": int(hurt),
        "calibration": {"memory_weight": scale, "model_weight": scale * best_w, "memory_bias": bias},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.evaluation.memory_mix", description=__doc__)
    ap.add_argument("--repo", action="append", default=[], help="a development repository (repeatable)")
    ap.add_argument("--cases", type=int, default=300, help="held-out lines per repository")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="memory_mix.json")
    ap.add_argument("--records", help="report from the records of an earlier run (no model, no index)")
    ap.add_argument("--order", default="interleaved", choices=("interleaved", "left_to_right"),
                    help="how the model scores a proposal (coder_model.verify.score_proposals)")
    args = ap.parse_args(argv)
    recs: list[dict] = []
    if args.records:
        with open(args.records) as fh:
            recs = json.load(fh)["records"]
        args.repo = sorted({r["repo"] for r in recs})
    from dlm.coder_model.engine import load_engine

    engine = load_engine(None, "cpu") if not recs else None
    t0 = time.perf_counter()
    try:
        for repo in args.repo if engine is not None else []:
            got = collect(repo, args.cases, args.seed, engine, args.order)
            print(f"{repo}: {len(got)} cases ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            recs += got
    finally:
        if engine is not None:
            engine.close()
    with open(args.out, "w") as fh:  # the records first: the report is cheap to redo from them
        json.dump({"records": recs}, fh)
    out = {"all": report(recs, args.seed)}
    for repo in args.repo:
        out[repo] = report([r for r in recs if r["repo"] == repo], args.seed)
    with open(args.out, "w") as fh:
        json.dump({"report": out, "records": recs}, fh, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
