"""`dlm-lsp eval --repo DIR`: rest-of-line completion in a real project, through the real server.

Some of the repository's files are held out (by a hash of the path,
drivers.evaluation.repo_cases); the rest are copied into a temporary
workspace that the server indexes (its repository memory) from `initialize`
(kept in the temp dir by content, so the ablation rows share one persisted index).
The held-out files never enter the index. A case is one line of a held-out
file, typed up to a word boundary or not at all, with the rest of the file
after it; the answer is the rest of the line. The replay opens the file as it
was before the last keystrokes, types them (or Enter and the indentation when
nothing of the line was typed), and asks for the inline completion at the
pause, as an editor does; only that last answer is judged.

`--extensions` says which files are drawn (held out and copied into the
workspace): `.py` by default, e.g. `.js,.ts,.mjs,.tsx` for a
JavaScript/TypeScript project; each file is opened with the languageId of
its extension (coder_model.languages), and a suffix the server has no
language for is refused, since its index would never hold those files.

`--config` picks what the server runs (the ablation rows of BENCHMARKS.md):
- `model`: no repository memory (the index off): the model alone;
- `memory`: the memory's best proposal in its own order, with its own score,
  no model pass;
- `trees`: the memory's proposals ranked by the line ranker's trees
  (coder_model.memory.line_ranker), their probability the confidence, no model pass;
- `verify`: the memory proposes in its own order, the denoiser scores each
  proposal with the suffix in view and the mix of both picks one or vetoes all
  (the server's defaults);
- `all`: the trees rank, then the denoiser checks;
- `drafts`: the trees rank, and a model trained with a drafts section (`--model`, layout 3)
  writes the answer with the drafts in its context; a model without one answers as `trees`.

Syntax, on Python files only (`judge_case`; a run with no Python case says that
syntax was not checked):
- broken when accepted: the file with the shown suggestion accepted (the document
  at the pause with the suggestion's text replacing what its range covers, as
  `dlm.drivers.evaluation.eval_typing.judge` applies it) is given to `ast.parse`; a case is broken when
  the real file (the case's target: the line whole) parses and the edited one does
  not. A file that does not parse as it is never counts. Reported per threshold:
  Python cases shown, and broken among them;
- right answers the check would hold back: the server's syntax check
  (`dlm.lsp.syntax_check`) run on the true rest of the line at the pause, as the
  server runs it on a suggestion; a case counts when the check holds the true rest
  back, over the Python cases whose true rest is not empty. A right suggestion in
  such a case is never shown: this is how many right answers the check costs. It is
  measured this way rather than from the server's held-back texts because the
  server exposes those only in its log (a line per held-back answer, cut at 80
  characters and not tied to a request), and its `held_back_syntax` counter counts
  every keystroke's request, not the judged one; that counter, over the whole
  replay, is printed beside it.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import hashlib
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from dlm.coder_model.languages import language_for_path
from dlm.drivers.evaluation.eval_typing import Answer, EvalReplay, TypingCase, _offset, visible
from dlm.drivers.evaluation.repo_cases import EXTENSIONS_EXAMPLE, SOURCE_EXTENSIONS

CONFIGS = ("model", "memory", "trees", "verify", "all", "drafts")
CHECK_PASSES = 2  # the denoiser's passes per proposal in the rows that check (verify, all)
TYPE_LAST = 3  # characters of the line typed through the server before the judged pause
LENGTH_BINS = ((1, 2), (3, 10), (11, 30), (31, None))  # length of the answer, characters
IN_TIME_MS = 300.0
PYTHON_SUFFIXES = (".py", ".pyi")


@dataclass
class RepoCase:
    typing: TypingCase
    answer: str
    typed: bool
    before: str = ""  # the document at the pause, up to the cursor
    after: str = ""  # the document at the pause, from the cursor on (the line's break, the rest of the file)


@dataclass
class Shown:
    """The suggestion answered at the pause: `insert` replaces text[cursor:replace_to]."""

    text: str
    cursor: int
    insert: str
    replace_to: int


@dataclass
class Judged:
    """A case's syntax judgement (None: not judged: not Python, nothing shown, or the file does not
    parse as it is)."""

    python: bool = False
    broken: bool | None = None  # the shown suggestion, accepted, makes the file fail ast.parse
    truth_held_back: bool | None = None  # the server's check holds back the true rest of the line


def parses(source: str) -> bool:
    """Does `ast.parse` accept the source? (its warnings, e.g. invalid escapes, silenced)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


def accepted(text: str, cursor: int, insert: str, replace_to: int) -> str:
    """The document with an inline suggestion accepted: text[cursor:replace_to] replaced by `insert`
    (what `dlm.drivers.evaluation.eval_typing.judge` compares with the case's target). At the pause the cursor line ends at
    the cursor, so this is the real file with the rest of the cursor line replaced by the inserted
    text; a multi-line insertion goes in as it is, followed by the document after its range."""
    return text[:cursor] + insert + text[replace_to:]


def broken_by(original: str, edited: str, original_parses: bool | None = None) -> bool | None:
    """Is `edited` broken where `original` was not? None: the original does not parse, so nothing
    can be said (`original_parses`: that answer, when already known)."""
    if not (parses(original) if original_parses is None else original_parses):
        return None
    return not parses(edited)


def truth_held_back(before: str, after: str, answer: str) -> bool | None:
    """Would the server's syntax check hold back the true rest of the line, typed at the pause
    (`before`|`after`)? None: an empty rest (nothing to check)."""
    if not answer:
        return None
    from dlm.lsp import syntax_check

    return syntax_check.check_text("python", before, after, answer) is not None


def is_python(path: str) -> bool:
    return path.endswith(PYTHON_SUFFIXES)


def judge_case(case: RepoCase, shown: Shown | None, original_parses: bool | None = None) -> Judged:
    """The syntax judgement of one case (module docstring): `shown` is the suggestion answered at the
    pause (None: nothing shown); the real file is the case's target."""
    if not is_python(case.typing.name):
        return Judged()
    original = case.typing.final_target or case.before + case.answer + case.after
    broken = None
    if shown is not None:
        edited = accepted(shown.text, shown.cursor, shown.insert, shown.replace_to)
        broken = broken_by(original, edited, original_parses)
    return Judged(True, broken, truth_held_back(case.before, case.after, case.answer))


def config_options(config: str, sampler: dict | None = None) -> dict:
    """initializationOptions for an ablation row (the gate at 0: every answer comes back with its
    confidence, and the thresholds are applied offline)."""
    if config not in CONFIGS:
        raise SystemExit(f"dlm-lsp eval: --config {config!r}: use one of {', '.join(CONFIGS)}")
    opts: dict = {"minConfidence": 0, "minConfidenceRewriteRecent": 0, "editPredictions": False,
                  "sampler": dict(sampler or {})}
    if config == "model":
        opts["index"] = {"enabled": False}
        return opts
    # every row says both of its settings, so a row measures the same whatever the defaults are
    opts["index"] = {"rankDrafts": config in ("trees", "all", "drafts")}
    opts["sampler"].setdefault("verifyPasses", CHECK_PASSES if config in ("verify", "all") else 0)
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
        tc = TypingCase("repo", c.path, text, row, col, typed, language_for_path(c.path), final_target=target)
        out.append(RepoCase(tc, c.answer, c.typed, c.before, c.after))
    return out


class RepoReplay(EvalReplay):
    def __init__(self, args: argparse.Namespace, cases: list[TypingCase], root: Path, options: dict) -> None:
        super().__init__(args, cases)
        self.root = root
        self.options = options
        self.shown: dict[int, Shown] = {}  # case index -> the suggestion answered at the pause

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

    async def _type(self, client, types, uri: str, case: TypingCase, change, current, target: str) -> None:
        # the replay keeps a verdict per answer, not its text: the requests are seen here, and the
        # pause's answer (the last request) is kept for the syntax judgement
        seen = _SeenRequests(client, current)
        n = getattr(self, "case_index", -1)
        await super()._type(seen, types, uri, case, change, current, target)
        if not seen.requests:
            return
        snapshot, position, task = seen.requests[-1]
        if not task.done() or task.cancelled() or task.exception() is not None:
            return
        items = getattr(task.result(), "items", None) or []
        if not items or not isinstance(items[0].insert_text, str):
            return
        item = items[0]
        cursor = _offset(snapshot, position.line, position.character)
        end = cursor if item.range is None else _offset(snapshot, item.range.end.line,
                                                         item.range.end.character)
        self.shown[n] = Shown(snapshot, cursor, item.insert_text, end)


class _SeenRequests:
    """The client, keeping each inline completion request: (document text, position, task)."""

    def __init__(self, client, current) -> None:
        self._client = client
        self._current = current
        self.requests: list[tuple[str, object, asyncio.Future]] = []

    def text_document_inline_completion_async(self, params):
        task = asyncio.ensure_future(self._client.text_document_inline_completion_async(params))
        self.requests.append((self._current(), params.position, task))
        return task

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def judge_cases(finals: list[tuple[RepoCase, Answer]], shown: dict[int, Shown]) -> list[Judged]:
    """`judge_case` for each case (`shown`: case index -> the suggestion answered at the pause), each
    real file parsed once."""
    original_parses: dict[str, bool] = {}
    out = []
    for i, (c, _) in enumerate(finals):
        name = c.typing.name
        if is_python(name) and i in shown and name not in original_parses:
            original_parses[name] = parses(c.typing.final_target or "")
        out.append(judge_case(c, shown.get(i), original_parses.get(name)))
    return out


def summarize_syntax(judged: list[Judged], server: dict | None = None) -> dict:
    """The right answers the server's check would hold back, over the Python cases with a true rest;
    `server`: dlm/stats at the end of the replay (its held_back_syntax counts every request)."""
    from dlm.coder_model import regions

    checked = [j for j in judged if j.python and j.truth_held_back is not None]
    k = sum(1 for j in checked if j.truth_held_back)
    return {"python_cases": sum(1 for j in judged if j.python), "checked": len(checked), "truth_held_back": k,
            "truth_held_back_share": k / len(checked) if checked else None,
            "grammar": regions.grammar("python") is not None,
            "server_held_back_syntax": (server or {}).get("held_back_syntax")}  # fmt: skip


def summarize_repo(finals: list[tuple[RepoCase, Answer]], thresholds: list[float],
                   judged: list[Judged] | None = None, server: dict | None = None) -> dict:
    """The rows per threshold, by answer length, latency; with `judged` (judge_cases), the syntax
    figures: broken among the shown Python cases per threshold, and `summarize_syntax`."""
    from dlm.drivers.evaluation.repo_cases import wilson  # the one interval of the repository figures

    n = len(finals)
    rows = []
    for t in thresholds:
        shown = [(i, c, a) for i, (c, a) in enumerate(finals) if visible(a, t, t)]
        exact = sum(1 for _, _, a in shown if a.exact)
        row = {
            "threshold": t, "cases": n, "shown": len(shown), "shown_share": len(shown) / n if n else 0.0,
            "exact": exact, "exact_share": exact / n if n else 0.0, "exact_ci": wilson(exact, n),
            "precision": exact / len(shown) if shown else None,
            "accepted_chars_per_case": sum(a.accepted_chars for _, _, a in shown) / n if n else 0.0,
        }  # fmt: skip
        if judged is not None and any(j.python for j in judged):  # no Python case: nothing was parsed
            judgeable = [judged[i] for i, _, _ in shown if judged[i].broken is not None]
            broken = sum(1 for j in judgeable if j.broken)
            row.update({"python_shown": len(judgeable), "broken": broken,
                        "broken_share": broken / len(judgeable) if judgeable else None})
        rows.append(row)
    by_len = {}
    for lo, hi in LENGTH_BINS:
        mine = [(c, a) for c, a in finals if len(c.answer) >= lo and (hi is None or len(c.answer) <= hi)]
        k = sum(1 for _, a in mine if visible(a, 0.0, 0.0) and a.exact)
        by_len[f"{lo}-{hi}" if hi else f">{lo - 1}"] = {"cases": len(mine), "exact": k,
                                                        "exact_share": k / len(mine) if mine else None}
    lat = sorted(a.latency_ms for _, a in finals if a.latency_ms is not None)
    in_time = sum(1 for _, a in finals if a.latency_ms is not None and a.latency_ms <= IN_TIME_MS)
    from dlm.coder_model.quantiles import percentile

    out = {
        "rows": rows, "by_answer_length": by_len,
        "latency": {"answered": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                    "in_time_share": in_time / n if n else 0.0},
        "typed_share": sum(1 for c, _ in finals if c.typed) / n if n else 0.0,
    }  # fmt: skip
    if judged is not None:
        out["syntax"] = summarize_syntax(judged, server)
    return out


def render_repo(name: str, config: str, s: dict, meta: dict) -> str:
    lat = s["latency"]
    extensions = tuple(meta.get("extensions") or SOURCE_EXTENSIONS)
    pause = f" --extensions {','.join(extensions)}" if extensions != SOURCE_EXTENSIONS else ""
    pause += f" --pause-ms {meta['pause_ms']}" if meta.get("pause_ms") else ""
    pause += f" --open-ms {meta['open_ms']}" if meta.get("open_ms") else ""
    head = (f"`dlm-lsp eval --repo {name} --config {config}{pause}` — {meta.get('model')} on {meta.get('device')}, "
            f"{meta.get('date')}; {s['rows'][0]['cases'] if s['rows'] else 0} cases "
            f"({100 * s['typed_share']:.0f}% typed up to a word boundary); latency at the pause p50 / p99 "
            f"{_ms(lat['p50_ms'])} / {_ms(lat['p99_ms'])} ms, {100 * lat['in_time_share']:.1f}% answered within "
            f"{IN_TIME_MS:.0f} ms")
    server = meta.get("server") or {}
    if server.get("steps"):  # the model's denoising steps over all requests (a run from a draft counts
        # the slots it rewrote, not the ones it kept)
        head += (f"; the model committed {server['tokens_per_step']:g} tokens per denoising step "
                 f"({server['steps']} steps)")
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
    if "syntax" in s:
        out += ["", render_syntax(name, s)]
    return "\n".join(out) + "\n"


def render_syntax(name: str, s: dict) -> str:
    """The syntax figures of a summary (summarize_repo with `judged`) as markdown: the checks parse
    Python only, so a run without a Python case says so instead of a table of zeros."""
    syn = s["syntax"]
    held = syn.get("server_held_back_syntax")
    cases = s["rows"][0]["cases"] if s["rows"] else 0
    if not syn["python_cases"]:
        line = (f"Syntax in {name}: not checked. The broken-when-accepted and held-back figures parse Python "
                f"(ast.parse, the Python grammar), and none of the {cases} cases is in a Python file")
        if held is not None:
            line += f"; the server held back {held} answers for syntax over all requests (every keystroke)"
        return line + "."
    out = [(f"Syntax in {name} (Python files, {syn['python_cases']} of {cases} cases; ast.parse of the file "
            "with the shown suggestion accepted, counted only where the real file parses):"), "",
           "| min confidence | Python cases shown | broken when accepted |", "| --- | --- | --- |"]
    for r in s["rows"]:
        share = "-" if r.get("broken_share") is None else f"{100 * r['broken_share']:.1f}%"
        out.append(f"| {r['threshold']:g} | {r.get('python_shown', 0)} | {r.get('broken', 0)} ({share}) |")
    share = "-" if syn["truth_held_back_share"] is None else f"{100 * syn['truth_held_back_share']:.1f}%"
    line = (f"Right answers the check would hold back (the server's syntax check on the true rest of the "
            f"line): {syn['truth_held_back']} of {syn['checked']} ({share})")
    if not syn["grammar"]:
        line += "; no Python grammar installed, so the check holds nothing back"
    if held is not None:
        line += f"; the server held back {held} answers for syntax over all requests (every keystroke)"
    return "\n".join([*out, "", line + "."])


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

    from dlm.drivers.evaluation.repo_cases import make_cases

    extensions = tuple(getattr(args, "extensions", None) or SOURCE_EXTENSIONS)
    unknown = [e for e in extensions if not language_for_path("file" + e)]
    if unknown:
        raise SystemExit(f"dlm-lsp eval: --extensions {','.join(unknown)}: the server has no language for "
                         "these files, so its index would never hold them; pass suffixes of "
                         f"coder_model/languages.py, e.g. --extensions {EXTENSIONS_EXAMPLE}")
    repo = Path(args.repo)
    if not repo.is_dir():
        raise SystemExit(f"dlm-lsp eval: --repo {repo} is not a folder; pass a source repository")
    workspace, cases = make_cases(str(repo), args.cases, args.seed, extensions=extensions)
    if not cases:
        raise SystemExit(f"dlm-lsp eval: --repo {repo} has no held-out lines in files ending in "
                         f"{', '.join(extensions)}; for another language pass --extensions, "
                         f"e.g. --extensions {EXTENSIONS_EXAMPLE}")
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
    judged = judge_cases(finals, replay.shown)
    summary = summarize_repo(finals, thresholds, judged, res.server)
    meta = {"model": res.status.get("model", ""), "device": res.status.get("device", ""),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repo": str(repo), "config": args.config,
            "extensions": list(extensions),
            "cases": len(rcases), "wall_s": round(time.monotonic() - t0, 1), "seed": args.seed,
            "index": getattr(replay, "index_status", None), "server": res.server, "pause_ms": getattr(args, "pause_ms", 0),
            "open_ms": getattr(args, "open_ms", 0)}
    md = render_repo(repo.resolve().name, args.config, summary, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval-repo.md").write_text(md, encoding="utf-8")
    (out / "eval-repo.json").write_text(json.dumps({"meta": meta, "summary": summary, "cases": [
        {"path": c.typing.name, "answer": c.answer, "typed": c.typed, "exact": a.exact, "shown": a.shown,
         "confidence": a.confidence, "latency_ms": a.latency_ms,
         "suggestion": replay.shown[i].insert if i in replay.shown else None,
         "broken": j.broken, "truth_held_back": j.truth_held_back}
        for i, ((c, a), j) in enumerate(zip(finals, judged))]}, indent=1, default=str))
    print(md)
    print(f"wrote {out / 'eval-repo.md'}, {out / 'eval-repo.json'}")
    return 0
