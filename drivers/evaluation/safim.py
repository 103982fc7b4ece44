"""SAFIM's Python block and control completion tasks: cases, tests and pass@1.

The hole's line is the region (cursor at the hole); the model's region is
spliced back into the program, and every stdin/stdout test runs in the sandbox
(`evaluation.sandbox`); a task passes when all its tests pass.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from dlm.drivers.evaluation.metrics import edit_similarity, output_matches
from dlm.drivers.evaluation.sandbox import run_sandboxed
from dlm.drivers.training.examples import window

SAFIM_TASKS = {"block": "block_completion.jsonl.gz", "control": "control_completion.jsonl.gz"}
HOLE = "{{completion}}"


def safim_dir(path: str | None = None) -> Path:
    cands = [path, os.environ.get("DLM_SAFIM")]
    for c in cands:
        if c and (Path(c) / SAFIM_TASKS["block"]).is_file():
            return Path(c)
    raise FileNotFoundError(
        "SAFIM data not found: pass --safim-dir DIR (a folder with SAFIM's block_completion.jsonl.gz and "
        "control_completion.jsonl.gz) or set DLM_SAFIM"
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
