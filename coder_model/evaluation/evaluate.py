"""Evaluate a checkpoint on held-out data.

    python -m dlm.coder_model.evaluation.evaluate --model DIR [--limit N] [--kinds completion,fim,...]
        [--safim] [--no-ar] [--json out.json]

What it measures (greedy decoding, the engine's own layout and sampler):

- For each example kind (`completion`, `fim`, `synthetic_edit`, `noop` from the
  corpus *test* split; `real_edit` from the edit-histories *test* split): exact
  match of the new region, edit similarity (1 - Levenshtein / max length), and
  for `real_edit` the next-edit location: the prediction changes exactly the
  lines the real next hunk changes (given the file and the earlier hunks).
- `--safim`: execution-based pass@1 on SAFIM's Python block and control
  completion tasks: the hole's line is the region, the model's region is
  spliced back into the program, and every stdin/stdout test runs in a
  sandboxed subprocess (timeout, memory/CPU/file-size limits, temp dir cwd);
  a task passes when all its tests pass.
- Diffusion vs autoregressive on the same network: every case is decoded with
  the default SamplerParams and with threshold=1.0, order="left_to_right"
  (one slot per forward pass, left to right); both report quality, forward
  passes (Prediction.steps) and time. `--no-ar` skips the second decode.

Cases are deterministic given --seed. Nothing here trains or reads the
training splits.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import gzip
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlm.coder_model.training.examples import KINDS, completion_example, fim_example, window
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

AR_PARAMS = {"threshold": 1.0, "order": "left_to_right"}

# ---------------------------------------------------------------------------
# metrics


def levenshtein(a: str, b: str) -> int:
    """Character edit distance (insert, delete, substitute), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(pred: str, target: str, max_cells: int = 4_000_000) -> float:
    """1 - normalized Levenshtein distance, in [0, 1] (1 = identical).

    Above `max_cells` (len * len) the exact DP is too slow in Python and
    difflib's matching-blocks ratio is used instead (same range, 1 = identical).
    """
    if pred == target:
        return 1.0
    n = max(len(pred), len(target))
    if len(pred) * len(target) > max_cells:
        return difflib.SequenceMatcher(None, pred, target, autojunk=False).ratio()
    return 1.0 - levenshtein(pred, target) / n


def changed_lines(old: str, new: str) -> tuple[int, int] | None:
    """[first, last) old-line span that a line diff old -> new touches; None if unchanged."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return None
    return ops[0][1], ops[-1][2]


def location_correct(region: str, pred: str, target: str) -> bool:
    """The prediction edits the same lines of the region as the target does."""
    want = changed_lines(region, target)
    return want is not None and changed_lines(region, pred) == want


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
    from dlm.coder_model.training import edit_examples as ee
    from dlm.coder_model.training.corpus import read_split

    builders: dict[str, Callable] = {
        "completion": completion_example,
        "fim": fim_example,
        "synthetic_edit": ee.synthetic_edit_example,
        "noop": ee.noop_example,
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
            ex = build(rec["text"], rng, path=Path(rec["path"]).name, language=rec.get("language", "python"))
            if ex is not None:
                break
        if ex is not None:
            out.append(Case(kind, ex.prompt, ex.target, rec["path"]))
    return out


def real_edit_cases(limit: int, data_dir: str | None = None, seed: int = 0) -> list[Case]:
    """Next-edit cases from the edit-histories test split (last hunk of each commit's file)."""
    from dlm.coder_model.training.edit_examples import next_edit_eval_cases

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
# sandbox


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0


# Sets the limits, then becomes the program's interpreter (exec). A launcher
# process instead of Popen(preexec_fn=...): preexec_fn is unsafe while other
# threads run (the engine's inference thread, torch's pools) and can deadlock.
_LAUNCH = (
    "import os,resource as R,sys;m,c,f=map(int,sys.argv[1:4]);"
    "R.setrlimit(R.RLIMIT_AS,(m,m));R.setrlimit(R.RLIMIT_CPU,(c,c+1));"
    "R.setrlimit(R.RLIMIT_FSIZE,(f,f));R.setrlimit(R.RLIMIT_CORE,(0,0));"
    "os.execv(sys.argv[4],[sys.argv[4],'-I',sys.argv[5]])"
)


def run_sandboxed(
    code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 1024, file_mb: int = 16,
    python: str = sys.executable, max_output: int = 1 << 20,
) -> SandboxResult:
    """Run untrusted Python `code` in a subprocess: fresh temp dir as cwd, isolated
    interpreter (-I), a minimal environment, address-space / CPU-time / file-size
    limits, its own process group (killed as a whole at `timeout_s` of wall time).
    stdout/stderr go to files in the temp dir, so a program that prints forever
    hits the file-size limit instead of filling this process's memory."""
    with tempfile.TemporaryDirectory(prefix="dlm-sandbox-") as d:
        prog = Path(d) / "main.py"
        prog.write_text(code, encoding="utf-8")
        out_p, err_p = Path(d) / "stdout", Path(d) / "stderr"
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8"}
        t0 = time.perf_counter()
        with open(out_p, "wb") as out_f, open(err_p, "wb") as err_f:
            limits = [str(memory_mb << 20), str(max(1, math.ceil(timeout_s))), str(file_mb << 20)]
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _LAUNCH, *limits, python, str(prog)], cwd=d, stdin=subprocess.PIPE,
                stdout=out_f, stderr=err_f, env=env, start_new_session=True,
            )
            timed_out = False
            try:
                proc.communicate(stdin.encode("utf-8"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with _suppress_lookup():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except BrokenPipeError:  # exited before reading its input
                proc.wait()
        wall = time.perf_counter() - t0
        rc = proc.returncode
        if rc is not None and rc < 0 and -rc in (signal.SIGXCPU, signal.SIGKILL) and not timed_out:
            timed_out = -rc == signal.SIGXCPU  # CPU limit reached: a timeout too
        read = lambda p: p.read_bytes()[:max_output].decode("utf-8", errors="replace")
        return SandboxResult(rc, read(out_p), read(err_p), timed_out, wall)


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        return typ is not None and issubclass(typ, ProcessLookupError)


# ---------------------------------------------------------------------------
# SAFIM

SAFIM_TASKS = {"block": "block_completion.jsonl.gz", "control": "control_completion.jsonl.gz"}
HOLE = "{{completion}}"


def safim_dir(path: str | None = None) -> Path:
    root = Path(__file__).resolve().parents[2]
    cands = [path, os.environ.get("DLM_SAFIM"), root.parent / "shared/eval/safim", root / "shared/eval/safim"]
    for c in cands:
        if c and (Path(c) / SAFIM_TASKS["block"]).is_file():
            return Path(c)
    raise FileNotFoundError(
        "SAFIM data not found: pass --safim-dir, set DLM_SAFIM, or put block_completion.jsonl.gz and "
        f"control_completion.jsonl.gz in {root.parent / 'shared/eval/safim'}"
    )


@dataclass(frozen=True)
class SafimCase:
    task_id: str
    prompt: Prompt
    target: str  # the hole's line(s) with the ground truth
    head: str  # program text before the region
    tail: str  # program text after the region
    tests: tuple[tuple[str, tuple[str, ...]], ...]  # (stdin, accepted outputs)
    line_ends_with_newline: bool

    def program(self, region: str) -> str:
        if self.line_ends_with_newline and not region.endswith("\n"):
            region += "\n"
        return self.head + region + self.tail


def safim_case(rec: dict, prefix_chars: int = 1500, suffix_chars: int = 600) -> SafimCase | None:
    """The hole's line is the region (cursor at the hole); None without a hole or tests."""
    src = rec["eval_prompt"].replace("\r\n", "\n")
    i = src.find(HOLE)
    if i < 0 or not rec.get("unit_tests"):
        return None
    ls = src.rfind("\n", 0, i) + 1
    le = src.find("\n", i)
    le = len(src) if le < 0 else le + 1
    line = src[ls:le]
    hole = i - ls
    region = line[:hole] + line[hole + len(HOLE) :]
    gt = rec["ground_truth"].replace("\r\n", "\n")
    tests = tuple(
        (t["input"].replace("\r\n", "\n"), tuple(o.replace("\r\n", "\n") for o in (
            t["output"] if isinstance(t["output"], list) else [t["output"]])))
        for t in rec["unit_tests"]
    )
    prompt = Prompt(
        prefix=window(src, 0, ls, prefix_chars, "before"),
        region=region,
        cursor=hole,
        suffix=window(src, le, len(src), suffix_chars, "after"),
        language="python",
        path="solution.py",
    )
    return SafimCase(rec["task_id"], prompt, line[:hole] + gt + line[hole + len(HOLE) :], src[:ls], src[le:],
                     tests, line.endswith("\n"))


def iter_safim(task: str, directory: str | None = None) -> Iterator[SafimCase]:
    if task not in SAFIM_TASKS:
        raise ValueError(f"SAFIM task {task!r}: use one of {sorted(SAFIM_TASKS)}")
    with gzip.open(safim_dir(directory) / SAFIM_TASKS[task], "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("lang") == "python":
                case = safim_case(rec)
                if case is not None:
                    yield case


def _token_equal(a: str, b: str) -> bool:
    if a == b or a.lower() == b.lower():  # Codeforces checkers accept YES/Yes/yes
        return True
    if "." in a or "." in b or "e" in a.lower():
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        return abs(x - y) <= 1e-6 * max(1.0, abs(y))  # real-valued answers: 1e-6 rel/abs error
    return False


def output_matches(got: str, expected: str) -> bool:
    """Token-wise comparison like Codeforces' standard checkers: whitespace and
    line breaks are separators only, YES/NO case does not matter, and real
    numbers may differ by 1e-6 (relative or absolute)."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(_token_equal(x, y) for x, y in zip(a, b))


def passes_tests(program: str, tests: Iterable[tuple[str, tuple[str, ...]]], timeout_s: float = 5.0,
                 memory_mb: int = 1024) -> bool:
    """All tests pass: exit 0 in time and stdout matches an accepted output (output_matches)."""
    for stdin, outputs in tests:
        r = run_sandboxed(program, stdin, timeout_s=timeout_s, memory_mb=memory_mb)
        if not r.ok or not any(output_matches(r.stdout, o) for o in outputs):
            return False
    return True


def score_safim(engine, cases: list[SafimCase], params: SamplerParams, timeout_s: float, memory_mb: int) -> dict:
    passed = exact = steps = tokens = 0
    sim = denoise = 0.0
    t0 = time.perf_counter()
    for c in cases:
        pred = engine.predict(c.prompt, params, CancelToken())
        exact += pred.text == c.target
        sim += edit_similarity(pred.text, c.target)
        steps += pred.steps
        tokens += pred.tokens
        denoise += pred.denoise_ms
        passed += passes_tests(c.program(pred.text), c.tests, timeout_s, memory_mb)
    n = max(len(cases), 1)
    return {"n": len(cases), "pass@1": passed / n, "exact_match": exact / n, "edit_similarity": sim / n,
            "forward_passes_mean": steps / n, "tokens_per_pass": tokens / steps if steps else 0.0,
            "denoise_ms_mean": denoise / n, "wall_s": time.perf_counter() - t0}


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
    seed: int = 0
    keep_examples: int = 3


def evaluate(opts: EvalOptions, engine=None, log=print) -> dict:
    """Run the evaluation; returns the report dict (also what --json writes)."""
    from dlm.coder_model.engine import load_engine

    own = engine is None
    engine = engine or load_engine(opts.model, opts.device)
    diff_params = SamplerParams(seed=opts.seed)
    ar_params = dataclasses.replace(diff_params, **AR_PARAMS)
    report: dict = {"model": opts.model or "embedded", "limit": opts.limit, "seed": opts.seed,
                    "params": {"diffusion": dataclasses.asdict(diff_params), "ar": dataclasses.asdict(ar_params)},
                    "kinds": {}, "skipped": {}}
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
                           "python -m dlm.coder_model.training.corpus or pass --corpus DIR")
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


def _take(it: Iterable, n: int) -> Iterator:
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


def _line(entry: dict) -> str:
    parts = []
    for name in ("diffusion", "ar"):
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
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
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
        memory_mb=args.memory_mb, ar=not args.no_ar, seed=args.seed,
    )
    try:
        report = evaluate(opts, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (FileNotFoundError, ValueError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.coder_model.evaluation.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
