"""Evaluate a checkpoint on held-out data.

    python -m dlm.drivers.evaluation.evaluate --model DIR [--limit N] [--kinds completion,fim,...]
        [--safim] [--no-ar] [--no-oracle] [--dtype auto|fp32|bf16] [--json out.json]

What it measures (greedy decoding, the engine's own layout and sampler):

- For each example kind (`completion`, `fim`, `synthetic_edit`, `noop` from the
  corpus *test* split; `real_edit` from the edit-histories *test* split): exact
  match of the new region, edit similarity (1 - Levenshtein / max length;
  `evaluation.metrics`), and for `real_edit` the next-edit location: the
  prediction changes exactly the lines the real next hunk changes.
- Oracle length (`oracle` row, native checkpoints): the same cases decoded with
  the true target length given (`evaluation.oracle`: the slots after it are
  fixed to <eom>/<pad>, the model fills only the content), so length errors
  and content errors are told apart. `--no-oracle` skips it.
- `--safim`: execution-based pass@1 on SAFIM's Python block and control
  completion tasks (`evaluation.safim`, programs run in `evaluation.sandbox`).
- Diffusion vs autoregressive on the same network: every case is decoded with
  the default SamplerParams and with threshold=1.0, order="left_to_right"
  (one slot per forward pass, left to right); both report quality, forward
  passes (Prediction.steps) and time. `--no-ar` skips the second decode.
- `--dtype auto` (default) runs a native model in bf16 only where a
  measurement at start finds it faster than fp32 on this machine.

Cases are deterministic given --seed. Nothing here trains or reads the
training splits.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.languages import language_name
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from dlm.drivers.command import run_command
from dlm.drivers.evaluation.metrics import edit_similarity, location_correct
from dlm.drivers.evaluation.safim import iter_safim, score_safim
from dlm.drivers.figures import print_figures
from dlm.drivers.training.examples import KINDS, completion_example, fim_example, typing_example

AR_PARAMS = {"threshold": 1.0, "order": "left_to_right"}

# ---------------------------------------------------------------------------
# cases


@dataclass(frozen=True)
class Case:
    kind: str
    prompt: Prompt
    target: str
    source: str = ""


def corpus_dir(path: str | None) -> Path | None:
    p = Path(path) if path else Path("data/corpus")
    return p if (p / "test.jsonl.gz").is_file() else None


def corpus_cases(corpus: Path, kind: str, limit: int, seed: int = 0) -> list[Case]:
    """One case of `kind` per corpus test file (files in path order), up to `limit`."""
    from dlm.drivers.training.corpus import read_split
    from dlm.drivers.training.synthetic_edits import noop_example, synthetic_edit_example

    builders: dict[str, Callable] = {
        "typing": typing_example,
        "completion": completion_example,
        "fim": fim_example,
        "synthetic_edit": synthetic_edit_example,
        "noop": noop_example,
    }
    build = builders[kind]
    files = sorted(read_split(corpus, "test"), key=lambda r: r["path"])
    out: list[Case] = []
    for rec in files:
        if len(out) >= limit:
            break
        rng = random.Random(f"{seed}:{kind}:{rec['path']}")
        ex = None
        for _ in range(4):  # a few tries: synthetic edits do not fit every spot
            language = language_name(rec.get("language", ""), rec["path"])
            ex = build(rec["text"], rng, path=Path(rec["path"]).name, language=language)
            if ex is not None:
                break
        if ex is not None:
            out.append(Case(kind, ex.prompt, ex.target, rec["path"]))
    return out


def real_edit_cases(limit: int, data_dir: str | None = None, seed: int = 0) -> list[Case]:
    """Next-edit cases from the edit-histories test split (last hunk of each commit's file)."""
    from dlm.drivers.training.commit_edits import next_edit_eval_cases

    return [
        Case("real_edit", ne.example.prompt, ne.example.target, ne.example.source)
        for ne in next_edit_eval_cases(limit, data_dir, seed=seed)
    ]


# ---------------------------------------------------------------------------
# scoring


@dataclass
class Scores:
    n: int = 0
    exact: int = 0
    edit_sim: float = 0.0
    location: int = 0
    steps: int = 0
    tokens: int = 0
    denoise_ms: float = 0.0
    total_ms: float = 0.0
    wall_s: float = 0.0
    examples: list = field(default_factory=list)

    def summary(self, kind: str) -> dict:
        n = max(self.n, 1)
        out = {
            "n": self.n,
            "exact_match": self.exact / n,
            "edit_similarity": self.edit_sim / n,
            "forward_passes_mean": self.steps / n,
            "tokens_mean": self.tokens / n,
            "tokens_per_pass": self.tokens / self.steps if self.steps else 0.0,
            "denoise_ms_mean": self.denoise_ms / n,
            "total_ms_mean": self.total_ms / n,
            "wall_s": self.wall_s,
        }
        if kind == "real_edit":
            out["location_correct"] = self.location / n
        return out


def score_oracle(engine, cases: Iterable[Case], params: SamplerParams) -> Scores:
    """Cases decoded with the true target length given (evaluation.oracle); native engines only.

    `location` counts outputs with exactly the target's token count: 1.0 by
    construction (a self-check of the oracle, reported as `length_exact`).
    """
    from dlm.drivers.evaluation.oracle import oracle_decode

    s = Scores()
    t0 = time.perf_counter()
    for case in cases:
        r = oracle_decode(engine.model, engine.tok, engine.budget, case.prompt, case.target, params)
        s.n += 1
        s.exact += r.text == case.target
        s.edit_sim += edit_similarity(r.text, case.target)
        s.location += len(r.tokens) == r.target_tokens
        s.steps += r.steps
        s.tokens += len(r.tokens)
    s.wall_s = time.perf_counter() - t0
    return s


def score_cases(engine, cases: Iterable[Case], params: SamplerParams, keep: int = 0) -> Scores:
    s = Scores()
    t0 = time.perf_counter()
    for case in cases:
        pred = engine.predict(case.prompt, params, CancelToken())
        s.n += 1
        s.exact += pred.text == case.target
        s.edit_sim += edit_similarity(pred.text, case.target)
        if case.kind == "real_edit":
            s.location += location_correct(case.prompt.region, pred.text, case.target)
        s.steps += pred.steps
        s.tokens += pred.tokens
        s.denoise_ms += pred.denoise_ms
        s.total_ms += pred.total_ms
        if len(s.examples) < keep:
            s.examples.append({"source": case.source, "region": case.prompt.region, "target": case.target,
                               "prediction": pred.text})
    s.wall_s = time.perf_counter() - t0
    return s


# ---------------------------------------------------------------------------
# CLI


@dataclass
class EvalOptions:
    model: str | None = None
    device: str = "auto"
    limit: int = 200
    kinds: tuple[str, ...] = KINDS
    corpus: str | None = None
    edit_histories: str | None = None
    safim: bool = False
    safim_dir: str | None = None
    safim_tasks: tuple[str, ...] = ("block", "control")
    safim_max_blocks: int = 8
    safim_limit: int = 0  # 0 = --limit
    timeout_s: float = 5.0
    memory_mb: int = 1024
    ar: bool = True
    oracle: bool = True
    dtype: str = "auto"  # native models: auto (measured), fp32 or bf16
    seed: int = 0
    keep_examples: int = 3


def evaluate(opts: EvalOptions, engine=None, log=print) -> dict:
    """Run the evaluation; returns the report dict (also what --json writes)."""
    from dlm.coder_model.engine import load_engine

    own = engine is None
    engine = engine or load_engine(opts.model, opts.device)
    native = hasattr(engine, "model") and hasattr(engine, "budget")
    if own and native:
        _set_dtype(engine, opts.dtype, log)
    diff_params = SamplerParams(seed=opts.seed)
    ar_params = dataclasses.replace(diff_params, **AR_PARAMS)
    report: dict = {"model": opts.model or "embedded", "limit": opts.limit, "seed": opts.seed,
                    "params": {"diffusion": dataclasses.asdict(diff_params), "ar": dataclasses.asdict(ar_params)},
                    "kinds": {}, "skipped": {}}
    if opts.oracle and not native:
        report["skipped"]["oracle"] = ("oracle-length decoding drives the native model's block decoder; "
                                       f"{type(engine).__name__} has none (evaluate a native checkpoint)")
    try:
        corpus = corpus_dir(opts.corpus)
        for kind in opts.kinds:
            if kind not in KINDS:
                raise ValueError(f"--kinds: unknown kind {kind!r}; use some of {','.join(KINDS)}")
            if kind == "real_edit":
                try:
                    cases = real_edit_cases(opts.limit, opts.edit_histories, opts.seed)
                except FileNotFoundError as exc:
                    report["skipped"][kind] = str(exc)
                    log(f"[eval] skip {kind}: {exc}")
                    continue
            else:
                if corpus is None:
                    msg = (f"corpus test split not found at {opts.corpus or 'data/corpus'}; build it with "
                           "python -m dlm.drivers.training.corpus or pass --corpus DIR")
                    report["skipped"][kind] = msg
                    log(f"[eval] skip {kind}: {msg}")
                    continue
                cases = corpus_cases(corpus, kind, opts.limit, opts.seed)
            entry = {}
            d = score_cases(engine, cases, diff_params, opts.keep_examples)
            entry["diffusion"] = d.summary(kind)
            entry["examples"] = d.examples
            if opts.ar:
                entry["ar"] = score_cases(engine, cases, ar_params).summary(kind)
            if opts.oracle and native:
                o = score_oracle(engine, cases, diff_params)
                entry["oracle"] = {**o.summary(""), "length_exact": o.location / max(o.n, 1)}
            report["kinds"][kind] = entry
            log(f"[eval] {kind}: " + _line(entry))
        if opts.safim:
            report["safim"] = {}
            for task in opts.safim_tasks:
                cases = list(_take(iter_safim(task, opts.safim_dir), opts.safim_limit or opts.limit))
                entry = {}
                for name, p in (("diffusion", diff_params), ("ar", ar_params)):
                    if name == "ar" and not opts.ar:
                        continue
                    p = dataclasses.replace(p, max_blocks=opts.safim_max_blocks)
                    entry[name] = score_safim(engine, cases, p, opts.timeout_s, opts.memory_mb)
                report["safim"][task] = entry
                log(f"[eval] safim {task}: " + _line(entry))
    finally:
        if own:
            engine.close()
    return report


def _set_dtype(engine, requested: str, log) -> None:
    """Run a native engine's model in bf16 where that is measured faster (or requested)."""
    import torch
    from dlm.drivers.training.precision import choose_dtype

    model = engine.model
    dev = next(model.parameters()).device
    cfg = model.config
    dtype = choose_dtype(requested, cfg.dim, cfg.ffn_dim, 256, dev, backward=False, log=log)
    if dtype == "bf16":
        model.to(torch.bfloat16)


def _take(it: Iterable, n: int) -> Iterator:
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


def _line(entry: dict) -> str:
    parts = []
    for name in ("diffusion", "ar", "oracle"):
        m = entry.get(name)
        if not m:
            continue
        q = [f"n={m['n']}"]
        if "pass@1" in m:
            q.append(f"pass@1={m['pass@1']:.3f}")
        q += [f"exact={m['exact_match']:.3f}", f"edit_sim={m['edit_similarity']:.3f}"]
        if "location_correct" in m:
            q.append(f"location={m['location_correct']:.3f}")
        q += [f"passes={m['forward_passes_mean']:.1f}", f"wall={m['wall_s']:.1f}s"]
        parts.append(f"{name}[" + " ".join(q) + "]")
    return "  ".join(parts)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded checkpoint)")
    add_device_argument(ap)
    ap.add_argument("--limit", type=int, default=200, help="cases per kind / SAFIM task")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {','.join(KINDS)} ('' = none)")
    ap.add_argument("--corpus", default=None, help="corpus directory with test.jsonl.gz (default data/corpus)")
    ap.add_argument("--edit-histories", default=None, help="edit-histories directory")
    ap.add_argument("--safim", action="store_true", help="also run SAFIM Python block/control pass@1")
    ap.add_argument("--safim-dir", default=None)
    ap.add_argument("--safim-limit", type=int, default=0, help="tasks per SAFIM task type (default: --limit)")
    ap.add_argument("--safim-tasks", default="block,control")
    ap.add_argument("--safim-max-blocks", type=int, default=8, help="blocks of L slots for a SAFIM hole")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per SAFIM test run")
    ap.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per SAFIM test run")
    ap.add_argument("--no-ar", action="store_true", help="skip the autoregressive decode of every case")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle-length decode of every case")
    ap.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                    help="native model dtype (auto: the faster one, measured at start)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the report here")


def run(args: argparse.Namespace) -> int:
    kinds = tuple(k for k in args.kinds.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        print(f"--kinds: unknown {','.join(bad)}; use some of {','.join(KINDS)}", file=sys.stderr)
        return 2
    opts = EvalOptions(
        model=args.model, device=args.device, limit=args.limit, kinds=kinds, corpus=args.corpus,
        edit_histories=args.edit_histories, safim=args.safim, safim_dir=args.safim_dir,
        safim_tasks=tuple(t for t in args.safim_tasks.split(",") if t), timeout_s=args.timeout,
        safim_max_blocks=args.safim_max_blocks, safim_limit=args.safim_limit,
        memory_mb=args.memory_mb, ar=not args.no_ar, oracle=not args.no_oracle, dtype=args.dtype,
        seed=args.seed,
    )
    try:
        report = evaluate(opts, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (FileNotFoundError, ValueError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
    return print_figures(report, args.json)


def main(argv: list[str] | None = None) -> int:
    return run_command("dlm.drivers.evaluation.evaluate", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
