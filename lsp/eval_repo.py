"""`dlm-lsp eval --repo DIR`: rest-of-line completion in a real project, through the real server.

Some of the repository's files are held out (by a hash of the path,
coder_model.evaluation.repo_cases); the rest are copied into a temporary
workspace that the server indexes (its repository memory) from `initialize`
(kept in the temp dir by content, so the ablation rows share one persisted index).
The held-out files never enter the index. A case is one line of a held-out
file, typed up to a word boundary or not at all, with the rest of the file
after it; the answer is the rest of the line. The replay opens the file as it
was before the last keystrokes, types them (or Enter and the indentation when
nothing of the line was typed), and asks for the inline completion at the
pause, as an editor does; only that last answer is judged.

`--config` picks what the server runs (the ablation rows of BENCHMARKS.md):
- `model`: no repository memory (the index off): the model alone;
- `memory`: the memory's best proposal, no model pass (a diagnostic: the
  product never shows a suggestion the denoiser did not check);
- `verify`: the memory proposes, the denoiser scores each proposal with the
  suffix in view and the mix of both picks one or vetoes all (the default).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dlm.lsp.eval import Answer, EvalReplay, TypingCase, visible

CONFIGS = ("model", "memory", "verify")
TYPE_LAST = 3  # characters of the line typed through the server before the judged pause
LENGTH_BINS = ((1, 2), (3, 10), (11, 30), (31, None))  # length of the answer, characters
IN_TIME_MS = 300.0


@dataclass
class RepoCase:
    typing: TypingCase
    answer: str
    typed: bool


def config_options(config: str, sampler: dict | None = None) -> dict:
    """initializationOptions for an ablation row (the gate at 0: every answer comes back with its
    confidence, and the thresholds are applied offline)."""
    if config not in CONFIGS:
        raise SystemExit(f"dlm-lsp eval: --config {config!r}: use one of {', '.join(CONFIGS)}")
    opts: dict = {"minConfidence": 0, "minConfidenceRewriteRecent": 0, "editPredictions": False,
                  "sampler": dict(sampler or {})}
    if config == "model":
        opts["index"] = {"enabled": False}
    elif config == "memory":
        opts["sampler"]["verifyPasses"] = 0
    return opts


def typing_cases(cases) -> list[RepoCase]:
    """TypingCases of repo_cases.Case: the last few characters of the typed part (or Enter and
    the indentation) are typed; the target is the file with the whole line."""
    out = []
    for c in cases:
        line_start = c.before.rfind("\n") + 1
        typed_part = c.before[line_start:]
        if c.typed:
            k = min(TYPE_LAST, len(typed_part.rstrip()) or len(typed_part))
            k = max(1, k)
            text = c.before[:-k] + c.after
            row = c.before.count("\n")
            col = len(typed_part) - k
            typed = c.before[-k:]
        else:  # nothing of the line typed: Enter at the end of the line above, and the indentation
            if line_start == 0:
                continue
            text = c.before[: line_start - 1] + c.after
            row = c.before.count("\n") - 1
            prev = c.before[: line_start - 1]
            col = len(prev) - (prev.rfind("\n") + 1)
            typed = "\n" + typed_part
        target = c.before + c.answer + c.after
        tc = TypingCase("repo", c.path, text, row, col, typed, final_target=target)
        out.append(RepoCase(tc, c.answer, c.typed))
    return out


class RepoReplay(EvalReplay):
    def __init__(self, args: argparse.Namespace, cases: list[TypingCase], root: Path, options: dict) -> None:
        super().__init__(args, cases)
        self.root = root
        self.options = options

    def initialization_options(self) -> dict:
        return {**self.options, "deadlineMs": self.args.deadline_ms}

    def root_uri(self) -> str | None:
        return self.root.resolve().as_uri()

    def case_uri(self, n: int, case: TypingCase) -> str:
        # the held-out file at its own path in the workspace (the index never saw it)
        return (self.root / case.name).resolve().as_uri()

    async def _wait_ready(self, client, log_file: str) -> None:
        await super()._wait_ready(client, log_file)
        if self.options.get("index", {}).get("enabled", True) is False:
            return
        self.index_status = await self.wait_index(client, log_file, time.monotonic() + self.args.load_timeout)


def summarize_repo(finals: list[tuple[RepoCase, Answer]], thresholds: list[float]) -> dict:
    from dlm.coder_model.evaluation.repo_cases import wilson  # the one interval of the repository figures

    n = len(finals)
    rows = []
    for t in thresholds:
        shown = [(c, a) for c, a in finals if visible(a, t, t)]
        exact = sum(1 for _, a in shown if a.exact)
        rows.append({
            "threshold": t, "cases": n, "shown": len(shown), "shown_share": len(shown) / n if n else 0.0,
            "exact": exact, "exact_share": exact / n if n else 0.0, "exact_ci": wilson(exact, n),
            "precision": exact / len(shown) if shown else None,
            "accepted_chars_per_case": sum(a.accepted_chars for _, a in shown) / n if n else 0.0,
        })  # fmt: skip
    by_len = {}
    for lo, hi in LENGTH_BINS:
        mine = [(c, a) for c, a in finals if len(c.answer) >= lo and (hi is None or len(c.answer) <= hi)]
        k = sum(1 for _, a in mine if visible(a, 0.0, 0.0) and a.exact)
        by_len[f"{lo}-{hi}" if hi else f">{lo - 1}"] = {"cases": len(mine), "exact": k,
                                                        "exact_share": k / len(mine) if mine else None}
    lat = sorted(a.latency_ms for _, a in finals if a.latency_ms is not None)
    in_time = sum(1 for _, a in finals if a.latency_ms is not None and a.latency_ms <= IN_TIME_MS)
    from dlm.coder_model.quantiles import percentile

    return {
        "rows": rows, "by_answer_length": by_len,
        "latency": {"answered": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                    "in_time_share": in_time / n if n else 0.0},
        "typed_share": sum(1 for c, _ in finals if c.typed) / n if n else 0.0,
    }  # fmt: skip


def render_repo(name: str, config: str, s: dict, meta: dict) -> str:
    lat = s["latency"]
    pause = f" --pause-ms {meta['pause_ms']}" if meta.get("pause_ms") else ""
    head = (f"`dlm-lsp eval --repo {name} --config {config}{pause}` — {meta.get('model')} on {meta.get('device')}, "
            f"{meta.get('date')}; {s['rows'][0]['cases'] if s['rows'] else 0} cases "
            f"({100 * s['typed_share']:.0f}% typed up to a word boundary); latency at the pause p50 / p99 "
            f"{_ms(lat['p50_ms'])} / {_ms(lat['p99_ms'])} ms, {100 * lat['in_time_share']:.1f}% answered within "
            f"{IN_TIME_MS:.0f} ms")
    out = [head, "",
           "| min confidence | shown | exact (of all cases) | 95% CI | precision | chars accepted / case |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in s["rows"]:
        lo, hi = r["exact_ci"]
        prec = "-" if r["precision"] is None else f"{100 * r['precision']:.1f}%"
        out.append(f"| {r['threshold']:g} | {r['shown']} ({100 * r['shown_share']:.1f}%) | {r['exact']} "
                   f"({100 * r['exact_share']:.1f}%) | {100 * lo:.1f}-{100 * hi:.1f}% | {prec} | "
                   f"{r['accepted_chars_per_case']:.2f} |")
    out += ["", "| answer length (chars) | cases | exact at 0 |", "| --- | --- | --- |"]
    for k, v in s["by_answer_length"].items():
        share = "-" if v["exact_share"] is None else f"{100 * v['exact_share']:.1f}%"
        out.append(f"| {k} | {v['cases']} | {v['exact']} ({share}) |")
    return "\n".join(out) + "\n"


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def workspace_copy(repo: Path, workspace: dict[str, str]) -> Path:
    """The workspace (every file but the held-out ones) in a folder of the temp dir named by its
    content, so that the ablation rows reuse one persisted index: files keep a fixed mtime, and the
    index finds nothing changed. Held-out files are never written there."""
    digest = hashlib.sha256()
    for rel in sorted(workspace):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(workspace[rel].encode()).digest())
    root = Path(tempfile.gettempdir()) / "dlm-eval-repo" / f"{repo.resolve().name}-{digest.hexdigest()[:12]}"
    done = root.parent / (root.name + ".complete")
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        for rel, text in workspace.items():
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            os.utime(dest, (1_000_000_000, 1_000_000_000))
        done.touch()
    return root


def run_repo(args: argparse.Namespace, thresholds: list[float]) -> int:
    import json

    from dlm.coder_model.evaluation.repo_cases import make_cases

    repo = Path(args.repo)
    if not repo.is_dir():
        raise SystemExit(f"dlm-lsp eval: --repo {repo} is not a folder; pass a source repository")
    workspace, cases = make_cases(str(repo), args.cases, args.seed)
    if not cases:
        raise SystemExit(f"dlm-lsp eval: --repo {repo} has no held-out source lines to evaluate "
                         "(it needs Python or other source files)")
    rcases = typing_cases(cases)
    root = workspace_copy(repo, workspace)
    options = config_options(args.config)
    t0 = time.monotonic()
    replay = RepoReplay(args, [c.typing for c in rcases], root, options)
    res = asyncio.run(replay.run())
    finals_by_case: dict[int, Answer] = {}
    for a in replay.answers:
        if a.final:
            finals_by_case[a.case_index] = a
    finals = [(c, finals_by_case.get(i, Answer("repo"))) for i, c in enumerate(rcases)]
    summary = summarize_repo(finals, thresholds)
    meta = {"model": res.status.get("model", ""), "device": res.status.get("device", ""),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repo": str(repo), "config": args.config,
            "cases": len(rcases), "wall_s": round(time.monotonic() - t0, 1), "seed": args.seed,
            "index": getattr(replay, "index_status", None), "server": res.server, "pause_ms": getattr(args, "pause_ms", 0)}
    md = render_repo(repo.resolve().name, args.config, summary, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval-repo.md").write_text(md, encoding="utf-8")
    (out / "eval-repo.json").write_text(json.dumps({"meta": meta, "summary": summary, "cases": [
        {"path": c.typing.name, "answer": c.answer, "typed": c.typed, "exact": a.exact, "shown": a.shown,
         "confidence": a.confidence, "latency_ms": a.latency_ms} for c, a in finals]}, indent=1, default=str))
    print(md)
    print(f"wrote {out / 'eval-repo.md'}, {out / 'eval-repo.json'}")
    return 0
