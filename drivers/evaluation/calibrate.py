"""Fit a checkpoint's confidence calibration on held-out examples.

    python -m dlm.drivers.evaluation.calibrate --model DIR [--limit N] [--corpus DIR]
        [--edit-histories DIR] [--bins 10] [--min-positives 10] [--out FILE] [--dry-run]

Examples come from the *valid* splits (never trained on; the test splits stay
for `evaluate` and `dlm-lsp eval`): completion and FIM examples of the corpus
valid split, when a corpus is built, and next edits of the edit-histories
valid split. Each is decoded in-process with the default sampler and no
deadline. An answer counts only when the server could show it (it changes
the region and does not erase it); it is *right* when it is exact, or when it
is an insertion at the cursor that is a prefix of the true insertion (a user
would accept all of it).

For every raw score kind (sampler.CONFIDENCE_KINDS: geometric mean, minimum,
product of the committed slots' probabilities with <eom>) it reports how well
the score ranks right answers above wrong ones (AUROC), keeps the best, fits
an isotonic map on it (coder_model.confidence_calibration) and writes calibration.json
next to the checkpoint. With fewer than --min-positives right answers there
is nothing to fit a probability to: it says so and writes nothing (the engine
then uses the raw score of the default kind).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dlm.coder_model.confidence_calibration import DEFAULT_KIND, FILE_NAME, KINDS, auroc, isotonic_fit
from dlm.coder_model.devices import DEVICE_HELP, device_choice
from dlm.coder_model.types import Prompt, SamplerParams
from dlm.drivers.command import run_command


def acceptable(prompt: Prompt, pred: str, target: str) -> bool:
    """Exact, or an insertion at the cursor that is a prefix of the true insertion."""
    if pred == target:
        return True
    region, c = prompt.region, prompt.cursor
    before, after = region[:c], region[c:]
    if not (pred.startswith(before) and pred.endswith(after) and target.startswith(before)
            and target.endswith(after)):
        return False
    shown = pred[c : len(pred) - len(after)]
    true = target[c : len(target) - len(after)]
    return bool(shown.strip()) and true.startswith(shown)


def showable(prompt: Prompt, pred: str) -> bool:
    """Would the server show anything for this answer (lsp.postprocess: no change or an erased
    region show nothing)?"""
    return pred != prompt.region and (bool(pred.strip()) or not prompt.region.strip())


def corpus_examples(corpus: Path, limit: int, seed: int) -> Iterator[tuple[str, Prompt, str]]:
    from dlm.drivers.training.corpus import read_split
    from dlm.drivers.training.examples import completion_example, fim_example

    files = sorted(read_split(corpus, "valid"), key=lambda r: r["path"])
    n = 0
    for rec in files:
        for kind, build in (("completion", completion_example), ("fim", fim_example)):
            if n >= limit:
                return
            rng = random.Random(f"{seed}:calibrate:{kind}:{rec['path']}")
            ex = build(rec["text"], rng, path=Path(rec["path"]).name, language=rec.get("language", "python"))
            if ex is not None:
                n += 1
                yield kind, ex.prompt, ex.target


def edit_examples(data_dir: str | None, limit: int, seed: int) -> Iterator[tuple[str, Prompt, str]]:
    from dlm.drivers.training.commit_edits import iter_edit_records, real_edit_from_record

    n = 0
    for rec in iter_edit_records("valid", data_dir):
        if n >= limit:
            return
        if len(rec["hunks"]) < 2:
            continue
        rng = random.Random(f"{seed}:calibrate:{rec['commit']}:{rec['path']}")
        got = real_edit_from_record(rec, rng, k=len(rec["hunks"]) - 1)
        if got is not None:
            n += 1
            yield "real_edit", got.example.prompt, got.example.target


def collect(model, tok, examples, params: SamplerParams, log=print) -> list[dict]:
    """Decode every example; one record per showable answer: its raw scores and whether it is right."""
    from dlm.coder_model.budget import model_budget
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.sampler import generate

    budget = model_budget(model.config)
    out = []
    t0 = time.monotonic()
    for i, (kind, prompt, target) in enumerate(examples, 1):
        dec = generate(model, tok, encode_prompt(tok, prompt, budget), params, prompt=prompt)
        text = dec.text()
        if showable(prompt, text):
            out.append({"kind": kind, "right": acceptable(prompt, text, target), **dec.raw_confidences()})
        if i % 20 == 0:
            log(f"  {i} examples decoded, {len(out)} showable, {time.monotonic() - t0:.0f} s")
    return out


def fit(records: list[dict], bins: int, min_positives: int, meta: dict) -> tuple[dict, object | None]:
    """(report, Calibration or None): AUROC per kind, the best kind, the fitted map if enough positives."""
    labels = [r["right"] for r in records]
    positives = sum(labels)
    scores = {k: auroc([r[k] for r in records], labels) for k in KINDS}
    ranked = [k for k in KINDS if scores[k] is not None]
    best = max(ranked, key=lambda k: (scores[k], k == DEFAULT_KIND)) if ranked else DEFAULT_KIND
    report = {"answers": len(records), "right": positives, "auroc": scores, "kind": best}
    if positives < min_positives or positives == len(records):
        report["fitted"] = False
        report["why"] = (f"{positives} right answers of {len(records)}: too few of one class to fit a probability "
                         f"(--min-positives {min_positives}); the engine keeps the raw {DEFAULT_KIND} score")
        return report, None
    cal = isotonic_fit([r[best] for r in records], labels, bins=bins, kind=best,
                       meta={**meta, "answers": len(records), "right": positives, "auroc": scores})
    report["fitted"] = True
    report["map"] = {"x": [round(x, 4) for x in cal.xs], "y": [round(y, 4) for y in cal.ys]}
    return report, cal


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded one)")
    ap.add_argument("--device", type=device_choice, default="cpu", help=DEVICE_HELP)
    ap.add_argument("--limit", type=int, default=40, help="examples per source (default 40)")
    ap.add_argument("--corpus", default=None, help="corpus with valid.jsonl.gz (default data/corpus, if built)")
    ap.add_argument("--edit-histories", default=None, help="edit-histories directory (default: the finder's)")
    ap.add_argument("--bins", type=int, default=10, help="isotonic bins (default 10)")
    ap.add_argument("--min-positives", type=int, default=10, help="right answers needed to fit (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help=f"where to write (default: MODEL/{FILE_NAME})")
    ap.add_argument("--dry-run", action="store_true", help="report only, write nothing")


def run(args: argparse.Namespace) -> int:
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model, resolve_device

    if args.limit < 1 or args.bins < 1 or args.min_positives < 0:
        print("calibrate: --limit and --bins must be >= 1, --min-positives >= 0", file=sys.stderr)
        return 2
    d = Path(args.model) if args.model else embedded_checkpoint_dir()
    if not (d / "config.json").is_file():
        print(f"calibrate: {d} is not a checkpoint directory (no config.json); pass --model DIR", file=sys.stderr)
        return 2
    sources = []
    corpus = Path(args.corpus) if args.corpus else Path("data/corpus")
    if (corpus / "valid.jsonl.gz").is_file():
        sources.append(corpus_examples(corpus, args.limit, args.seed))
    else:
        print(f"calibrate: no {corpus / 'valid.jsonl.gz'}: corpus examples skipped", file=sys.stderr)
    try:
        from dlm.drivers.training.commit_edits import edit_histories_dir

        edit_histories_dir(args.edit_histories)
        sources.append(edit_examples(args.edit_histories, args.limit, args.seed))
    except FileNotFoundError as exc:
        print(f"calibrate: {exc}: edit examples skipped", file=sys.stderr)
    if not sources:
        print("calibrate: no held-out examples; pass --corpus or --edit-histories", file=sys.stderr)
        return 2
    model, tok = load_model(d, device=str(resolve_device(args.device)))
    params = SamplerParams()
    records = []
    for src in sources:
        records += collect(model, tok, src, params, log=lambda m: print(m, file=sys.stderr))
    if not records:
        print("calibrate: the model proposed no showable change on any example; nothing to calibrate",
              file=sys.stderr)
        return 1
    meta = {"model": d.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "split": "valid",
            "sampler": "default SamplerParams, no deadline"}
    report, cal = fit(records, args.bins, args.min_positives, meta)
    print(json.dumps(report, indent=1))
    if cal is not None and not args.dry_run:
        out = Path(args.out) if args.out else d / FILE_NAME
        cal.save(out)
        print(f"calibrate: wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command("dlm.drivers.evaluation.calibrate", __doc__.split("\n\n")[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
