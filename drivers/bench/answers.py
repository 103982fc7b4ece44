"""How the model ends its answers: <eom> rate, non-empty and degenerate answers.

    python -m dlm.drivers.bench.answers [--model DIR] [--typing 60] [--safim 30] [--json out.json]
        [--corpus data/corpus --corpus-cases 60 --kinds completion,fim]
        [--corpus-typing 200 [--snippets] [--mode insert|rewrite --any-layout]]

Fixed prompts that need no corpus:
- `typing`: lines of the Python standard library (this interpreter's, files in
  sorted order, a seeded choice of line and of the point typed so far), the cursor
  line typed up to a word boundary and the rest of it missing, as while typing;
  the region is the typed part, ending where the server's does (the line break
  starts the suffix); an insertion
  prompt with `--mode insert` (the default), a region rewrite with `--mode rewrite`;
- `safim`: SAFIM's block-completion holes (`evaluation.safim`, the dev data);
- with `--corpus`, the evaluator's cases of the corpus test split
  (`evaluation.evaluate.corpus_cases`), one row per kind;
- with `--corpus --corpus-typing N`, rest-of-line cases of the corpus test split as the
  server sends them while typing (`corpus_typing_cases`: an insertion prompt, or with
  `--mode rewrite` the region rewrite a layout-1 checkpoint was trained on), optionally
  with the snippets of the test file's project (`--snippets`).
Each is decoded greedily, without a deadline, by the default sampler (or with
`--params` overrides, e.g. `--params repeat_penalty=0`), and counted:
- `eom_first_block`: the answer ends with <eom> inside the first block;
- `ended`: it ends with <eom> at all (else the blocks ran out: unterminated);
- `ended_by`: how the end was committed: the model wrote <eom>, or <pad> (the
  sampler turns it into the end), or length-aware decoding placed it;
- `ends_clean`: it ends in the first block and not after a blank line (the
  blank-line filler of degenerate answers ends "in the first block" too);
- `changes`: the answer proposes a change that is not an erasure of the region
  (what postprocess could show, before its filters); `nonblank_insertion`: it inserts
  text that is not blank at the cursor (the inline item of a typing request);
- `model_wrote_eom`: the model itself committed `<eom>` (not `<pad>`, not the
  sampler's length-aware end);
- `degenerate`: `coder_model.degenerate` names the answer (before any filter),
  by reason;
- `exact`: the region equals the true one (typing: the true line); `edit_similarity`:
  1 - Levenshtein / max length against it (`evaluation.metrics`).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

import torch
from dlm.coder_model.budget import model_budget
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model
from dlm.coder_model.degenerate import degenerate_region
from dlm.coder_model.layout import LayoutBudget, encode_prompt
from dlm.coder_model.sampler import BlockDecoder, generate
from dlm.coder_model.types import Prompt, SamplerParams
from dlm.drivers.evaluation.metrics import edit_similarity
from dlm.drivers.figures import print_figures


def pick_line(rng: random.Random, lines: list[str], shortest: int, longest: int) -> int | None:
    """The index of a random line of `lines` that is no comment and whose text is `shortest` to
    `longest` characters long; None when there is none."""
    cands = [i for i, ln in enumerate(lines)
             if shortest <= len(ln.strip()) <= longest and not ln.strip().startswith("#")]
    return rng.choice(cands) if cands else None


def around_line(lines: list[str], i: int) -> tuple[str, str]:
    """The text of `lines` (joined by line breaks) before line i, with its line break, and after
    line i, from the next line on."""
    return "\n".join(lines[:i]) + ("\n" if i else ""), "\n".join(lines[i + 1 :])


def typing_cases(n: int, seed: int = 0, prefix_chars: int = 3000, suffix_chars: int = 1000, insert: bool = True):
    """(prompt, true line) pairs: a standard-library line typed up to a word boundary."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        path = rng.choice(files)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (UnicodeDecodeError, OSError):
            continue
        i = pick_line(rng, lines, 12, 80)
        if i is None:
            continue
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        cuts = [k for k in range(indent + 1, len(line) - 2) if not line[k - 1].isalnum() or not line[k].isalnum()]
        if not cuts:
            continue
        cut = rng.choice(cuts)
        before, after = around_line(lines, i)
        after = "\n" + after
        # as the server cuts it: the region ends at the line's text, its line break starts the suffix
        prompt = Prompt(prefix=before[-prefix_chars:], region=line[:cut], cursor=cut,
                        suffix=after[:suffix_chars], language="python", path=path.name, insert=insert)
        out.append((prompt, line))
    return out


def corpus_typing_cases(corpus: Path, n: int, insert: bool, snippets: bool, seed: int = 0,
                        prefix_chars: int = 3000, suffix_chars: int = 1000):
    """(prompt, true line) pairs from the corpus test split, as the server sends them while typing:
    a line typed up to a word boundary (or not at all, 30%), the rest of the line missing; the
    region is the typed part (its line break starts the suffix). `insert`: the typing layout
    (layout 2, Prompt.insert); else the region rewrite of layout 1, for a checkpoint of that
    layout. `snippets`: with snippets retrieved from the other files of the test file's project
    (every split: the project as a workspace, the test file itself excluded)."""
    from dlm.drivers.training.corpus import SPLITS, read_split
    from dlm.drivers.training.project_snippets import ProjectSnippets

    records = {split: list(read_split(corpus, split)) for split in SPLITS}
    tests = sorted((r for r in records["test"] if r.get("language", "python") == "python"), key=lambda r: r["path"])
    projects = None
    if snippets:
        projects = ProjectSnippets((r["path"], r["text"], r.get("source", ""))
                                   for split in SPLITS for r in records[split])
    rng = random.Random(seed)
    out = []
    for _ in range(n * 20):
        if len(out) >= n or not tests:
            break
        rec = rng.choice(tests)
        lines = rec["text"].split("\n")
        i = pick_line(rng, lines, 4, 100)
        if i is None:
            continue
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if rng.random() < 0.3:
            cut = indent  # not typed at all
        else:
            cuts = [k for k in range(indent + 1, len(line)) if not line[k - 1].isalnum() or not line[k].isalnum()]
            if not cuts:
                continue
            cut = rng.choice(cuts)
        before, after = around_line(lines, i)
        after = "\n" + after
        prompt = Prompt(prefix=before[-prefix_chars:], region=line[:cut], cursor=cut, suffix=after[:suffix_chars],
                        language="python", path=Path(rec["path"]).name, insert=insert)
        if projects is not None:
            found = projects.snippets(rec.get("source", ""), rec["path"], prompt.prefix)
            prompt = dataclasses.replace(prompt, snippets=found)
        out.append((prompt, line))
    return out


def safim_cases(n: int):
    from dlm.drivers.evaluation.safim import iter_safim

    out = []
    for case in iter_safim("block"):
        out.append((case.prompt, case.target))
        if len(out) >= n:
            break
    return out


def _inserted(prompt: Prompt, text: str) -> str:
    """What a new region `text` inserts at the cursor ("" when it is not an insertion there)."""
    before, after = prompt.region[: prompt.cursor], prompt.region[prompt.cursor :]
    if text.startswith(before) and text.endswith(after) and len(text) >= len(prompt.region):
        return text[len(before) : len(text) - len(after)]
    return ""


def measure(model, tok, cases, params: SamplerParams, budget: LayoutBudget, keep: int = 6) -> dict:
    c: Counter = Counter()
    reasons: Counter = Counter()
    ended_by: Counter = Counter()
    steps = tokens = 0
    sim = 0.0
    t0 = time.perf_counter()
    examples = []
    for prompt, target in cases:
        ids = encode_prompt(tok, prompt, budget)
        dec: BlockDecoder = generate(model, tok, ids, params, cache=PrefixCache(), prompt=prompt)
        text, _conf = dec.answer()
        c["n"] += 1
        c["eom_first_block"] += dec.ended and dec.stats.blocks == 1
        c["ended"] += dec.ended
        c["ends_clean"] += dec.ended and dec.stats.blocks == 1 and not text.rstrip(" \t").endswith("\n\n")
        ended_by[dec.stats.ended_by or "none"] += 1
        tokens += len(dec.output)
        c["changes"] += text != prompt.region and bool(text.strip())
        c["nonblank_insertion"] += bool(_inserted(prompt, text).strip())
        c["exact"] += text.rstrip() == target.rstrip()
        sim += edit_similarity(text, target)
        why = degenerate_region(prompt.region, text, prompt.prefix, prompt.suffix)
        if why:
            c["degenerate"] += 1
            reasons[why] += 1
        steps += dec.stats.steps
        if len(examples) < keep:
            examples.append({"region": prompt.region, "answer": text, "target": target})
    n = max(c["n"], 1)
    out = {k: round(c[k] / n, 3) for k in ("eom_first_block", "ended", "ends_clean", "changes", "nonblank_insertion",
                                           "degenerate", "exact")}
    out["model_wrote_eom"] = round(ended_by.get("eom", 0) / n, 3)
    out["edit_similarity"] = round(sim / n, 3)
    out.update(n=c["n"], degenerate_reasons=dict(reasons), ended_by=dict(ended_by),
               answer_tokens_mean=round(tokens / n, 1), steps_mean=round(steps / n, 1),
               ms_mean=round((time.perf_counter() - t0) / n * 1000, 1), examples=examples)
    return out


def _override(params: SamplerParams, items: list[str]) -> SamplerParams:
    kw = {}
    fields = {f.name: f for f in dataclasses.fields(SamplerParams)}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--params {item!r}: {key!r} is not a SamplerParams field ({', '.join(fields)})")
        kind = type(getattr(params, key))
        kw[key] = value if kind is str else kind(float(value)) if kind is int else kind(value)
    return dataclasses.replace(params, **kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: embedded)")
    ap.add_argument("--typing", type=int, default=60, help="standard-library typing cases")
    ap.add_argument("--safim", type=int, default=30, help="SAFIM block cases (0: none)")
    ap.add_argument("--corpus", default=None, help="corpus directory: add its test split's cases")
    ap.add_argument("--corpus-cases", type=int, default=60, help="cases per kind from --corpus")
    ap.add_argument("--kinds", default="completion,fim", help="example kinds from --corpus")
    ap.add_argument("--corpus-typing", type=int, default=0,
                    help="rest-of-line cases of --corpus's test split, typed as in the editor")
    ap.add_argument("--mode", choices=("insert", "rewrite"), default="insert",
                    help="typing prompts (--typing, --corpus-typing): insertion at the cursor (layout 2) or "
                         "region rewrite (layout 1)")
    ap.add_argument("--snippets", action="store_true",
                    help="--corpus-typing cases with snippets of the test file's project")
    ap.add_argument("--any-layout", action="store_true",
                    help="load a checkpoint of another layout (e.g. layout 1 with --mode rewrite, whose "
                         "prompts have the same tokens in this layout)")
    ap.add_argument("--params", nargs="*", default=[], help="SamplerParams overrides, e.g. repeat_penalty=0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--examples", type=int, default=6, help="answers kept in the output per case kind")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    d = Path(args.model) if args.model else embedded_checkpoint_dir()
    model, tok = load_model(d, device="cpu", any_layout=args.any_layout)
    budget = model_budget(model.config)
    params = _override(SamplerParams(), args.params)
    res: dict = {"model": str(d), "params": dataclasses.asdict(params)}
    if args.typing:
        res["typing"] = measure(model, tok, typing_cases(args.typing, insert=args.mode == "insert"), params, budget,
                               args.examples)
    if args.safim:
        res["safim"] = measure(model, tok, safim_cases(args.safim), params, budget)
    if args.corpus and args.corpus_typing:
        cases = corpus_typing_cases(Path(args.corpus), args.corpus_typing, args.mode == "insert", args.snippets)
        res["corpus_typing"] = measure(model, tok, cases, params, budget, args.examples)
        res["corpus_typing"].update(mode=args.mode, snippets=args.snippets,
                                    with_snippets=sum(bool(p.snippets) for p, _ in cases))
    if args.corpus and args.kinds:
        from dlm.drivers.evaluation.evaluate import corpus_cases

        for kind in args.kinds.split(","):
            cases = [(c.prompt, c.target) for c in corpus_cases(Path(args.corpus), kind, args.corpus_cases)]
            res[f"corpus_{kind}"] = measure(model, tok, cases, params, budget)
    return print_figures(res, args.json)


if __name__ == "__main__":
    sys.exit(main())
