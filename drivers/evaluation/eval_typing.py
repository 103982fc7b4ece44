"""`dlm-lsp eval`: acceptance of suggestions through the real server, per confidence threshold.

It starts `dlm-lsp --stdio` like `dlm-lsp bench` (the same client code:
`EvalReplay` is a `Bench` with its own replay) and types held-out material
as an editor would, sending `textDocument/inlineCompletion` after every
keystroke without waiting for the previous answer; at a pause it waits for
the answer. A request's answer counts when it arrived before the next
keystroke (later ones are what the editor drops).

Material (deterministic given --seed; each source skipped with a note when
its data is missing):
- corpus: the corpus test split (--corpus, data/corpus by default): in each
  file a random line, cut at a random column, is typed back to its end;
- edits: the edit-histories test split (--edit-histories or DLM_EDIT_HISTORIES): for a commit's file with >= 2 hunks the
  earlier hunks are applied as edits (the server's edit history), then
  `dlm/editPrediction` is asked at the end of the last one (is the next
  hunk predicted exactly?), then the last hunk's old lines are deleted and
  its new text typed;
- safim: SAFIM Python block and control completion (--safim-dir or DLM_SAFIM): the hole's ground truth is typed into the program.
Each case types at most --max-keys characters.

The server runs with its confidence gate at 0 and edit predictions on; each
answer carries its calibrated confidence and whether it rewrites recently
typed text (docs/protocol.md), so the thresholds are applied here, offline,
to one replay. For each threshold the table gives, over all keystrokes:
the share that showed a suggestion; precision (of what is shown: exact, and
"accepted in full", i.e. a correct prefix of what the user types next);
the characters a user would accept (longest correct prefix) per shown
suggestion; wrong suggestions shown per 100 keystrokes; and latency. A
suggestion that rewrites recent typing must pass the higher of the threshold
and --rewrite-recent (the server's minConfidenceRewriteRecent).

Exact: applying the suggestion gives the document the user ends up with
(the case's text fully typed). Accepted in full: the document after the
suggestion is on the way there (what it inserts is a prefix of what is
still to be typed, and it leaves the rest of the document alone).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.hosted.settings import add_engine_arguments
from dlm.drivers.bench.typing_latency import Bench, _plain
from dlm.drivers.evaluation.repo_cases import EXTENSIONS_HELP, SOURCE_EXTENSIONS, parse_extensions
from dlm.lsp.stats import percentile

DEFAULT_THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
SOURCES = ("corpus", "edits", "safim")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", help="checkpoint directory (default: the embedded model)")
    add_device_argument(parser)
    parser.add_argument("--remote", metavar="HOST:PORT", help="replay through a `dlm-lsp serve` model server")
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help=f"comma-separated material: {', '.join(SOURCES)} (default: all)")
    parser.add_argument("--corpus", metavar="DIR", help="corpus with test.jsonl.gz (default data/corpus)")
    parser.add_argument("--edit-histories", metavar="DIR", help="edit-histories records, *.jsonl.gz "
                        "(default: $DLM_EDIT_HISTORIES)")
    parser.add_argument("--safim-dir", metavar="DIR", help="SAFIM's block/control_completion.jsonl.gz "
                        "(default: $DLM_SAFIM)")
    parser.add_argument("--repo", metavar="DIR", help="evaluate rest-of-line completion in this repository: "
                        "held-out files against an index of the rest (see --cases, --extensions, --config)")
    parser.add_argument("--cases", type=int, default=None, help="--repo: held-out lines to evaluate (default 400); "
                        "--next-edits: next-edit opportunities per split and per --git (default 100)")
    parser.add_argument("--extensions", type=parse_extensions, default=",".join(SOURCE_EXTENSIONS),
                        metavar="SUFFIXES", help=f"--repo: {EXTENSIONS_HELP}")
    nxt = parser.add_argument_group("next edits (--next-edits; docs/evaluation.md, \"Next edits\")")
    nxt.add_argument("--next-edits", action="store_true", help="replay real edit histories hunk by hunk and ask "
                     "dlm/editPrediction for the next edit after each: shown share, location and exact precision, "
                     "kept lines deleted, characters saved, latency, per threshold")
    nxt.add_argument("--split", metavar="SPLIT", help="edit-histories split(s): valid (the default, for tuning), test "
                     "(the held-out figure: never tune on it) or valid,test")
    nxt.add_argument("--git", metavar="REPO", help="also (or, without --split, only) replay REPO's own history: its "
                     "last --git-commits first-parent commits, oldest first, the workspace at each commit's parent")
    nxt.add_argument("--git-commits", type=int, default=200, metavar="N", help="--git: commits to walk back from HEAD (default 200)")
    nxt.add_argument("--edit-gap-s", type=float, default=None, metavar="S", help="seconds between two replayed hunks (default 1.2: "
                     "just over the server's history idleS, so each hunk is its own edit event)")
    nxt.add_argument("--session", default="repository", help="what one server process replays, so that what it "
                     "learns from edits stays in one project: repository (default: its commits oldest first) or commit")
    nxt.add_argument("--jobs", type=int, default=1, metavar="N", help="sessions replayed side by side, one server "
                     "each (default 1). A replay mostly waits --edit-gap-s between hunks, so N > 1 makes a whole split "
                     "feasible; the figures are the same, only the latencies share the CPU")
    nxt.add_argument("--records", metavar="FILE", help="write one JSON line per opportunity (the proposal, the truth, "
                     "the judgement) to FILE")
    nxt.add_argument("--from-records", metavar="FILE", help="report from a --records file without a replay (other "
                     "--thresholds or --rewrite-recent on the same proposals)")
    nxt.add_argument("--progress", action="store_true", help="print the running count of opportunities to stderr")
    parser.add_argument("--config", default="trees", help="--repo: model (no memory), memory (its own order, no "
                        "model pass), trees (the line ranker orders, no model pass: the shipped configuration, "
                        "default), verify (the memory proposes in its order, the denoiser checks), all (the "
                        "trees order, the denoiser checks) or drafts (the trees order, a --model trained with "
                        "drafts writes from them)")
    parser.add_argument("--limit", type=int, default=10, help="cases per source (default 10)")
    parser.add_argument("--max-keys", type=int, default=40, help="characters typed per case at most (default 40)")
    parser.add_argument("--cps", type=float, default=8.0, help="typing speed, characters per second")
    parser.add_argument("--pause-ms", type=int, default=0, metavar="MS",
                        help="ask for the judged answer MS ms after the last keystroke (default 0: at once); "
                        "500 measures what a user sees after a pause")
    parser.add_argument("--open-ms", type=int, default=0, metavar="MS",
                        help="open each file MS ms before its first keystroke (default 0: type at once), as an "
                        "editor holds a file open before the user types in it; the server counts it meanwhile "
                        "(lsp.memory_ahead)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thresholds", default=",".join(str(t) for t in DEFAULT_THRESHOLDS),
                        help="comma-separated confidence thresholds to report")
    parser.add_argument("--rewrite-recent", type=float, default=0.98,
                        help="threshold for suggestions that rewrite recent typing (default 0.98)")
    parser.add_argument("--deadline-ms", type=int, default=250, help="the server's deadline (default 250)")
    parser.add_argument("--out", metavar="DIR", default="eval-out",
                        help="where eval.md, eval.png and eval.json go (default ./eval-out)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--load-timeout", type=float, default=600.0, help="seconds to wait for the model")
    parser.add_argument("--server-log", metavar="F", help="server log file (default: a temp file)")
    parser.add_argument("--engine-factory", help=argparse.SUPPRESS)  # tests: see lsp/server_cli.py
    add_engine_arguments(parser)  # --engine KIND ...: replay through a hosted engine (docs/engines.md)


# ---- material ---------------------------------------------------------------------------------------


@dataclass
class TypingCase:
    """Type `typed` at (row, col) of `text` (which does not contain it yet).

    `edits` are (start_line, end_line, new_text) line-range replacements applied first,
    one change each (the edit history); `edit_target` is the document the next edit
    should produce (None: no edit-prediction request for this case).
    """

    source: str
    name: str
    text: str
    row: int
    col: int
    typed: str
    language_id: str = "python"
    edits: list[tuple[int, int, str]] = field(default_factory=list)
    edit_target: str | None = None
    delete_lines: int = 0  # edit cases: lines at `row` (the old side of the hunk) replaced by an empty one
    final_target: str | None = None  # the document the user ends up with (None: text with `typed` typed)


def _ascii(*texts: str) -> bool:
    return all(t.isascii() for t in texts)


def corpus_cases(corpus: str | None, limit: int, seed: int, max_keys: int) -> tuple[list[TypingCase], str]:
    path = Path(corpus) if corpus else Path("data/corpus")
    if not (path / "test.jsonl.gz").is_file():
        return [], f"corpus: no {path / 'test.jsonl.gz'} (build one with python -m dlm.drivers.training.corpus)"
    out: list[TypingCase] = []
    with gzip.open(path / "test.jsonl.gz", "rt", encoding="utf-8") as f:
        records = sorted((json.loads(line) for line in f), key=lambda r: r["path"])
    for rec in records:
        if len(out) >= limit:
            break
        rng = random.Random(f"{seed}:corpus:{rec['path']}")
        lines = rec["text"].split("\n")
        cands = [i for i, x in enumerate(lines) if len(x.strip()) >= 8 and x.isascii()]
        if not cands:
            continue
        row = rng.choice(cands)
        line = lines[row]
        indent = len(line) - len(line.lstrip())
        col = rng.randint(indent, len(line) - 2)
        typed = line[col:][:max_keys]
        text = "\n".join(lines[:row] + [line[:col] + line[col + len(typed):]] + lines[row + 1 :])
        out.append(TypingCase("corpus", rec["path"], text, row, col, typed,
                              language_id=rec.get("language", "python")))
    return out, ""


def edit_cases(data_dir: str | None, limit: int, seed: int, max_keys: int) -> tuple[list[TypingCase], str]:
    try:
        from dlm.drivers.training.commit_edits import edit_histories_dir, iter_edit_records, record_hunks
    except ImportError as exc:  # the training package moved: say so rather than skip silently
        return [], f"edits: cannot import the edit-histories reader ({exc})"
    try:
        edit_histories_dir(data_dir)
    except FileNotFoundError as exc:
        return [], f"edits: {exc}"
    out: list[TypingCase] = []
    for rec in iter_edit_records("test", data_dir, allow_test=True):
        if len(out) >= limit:
            break
        hunks = record_hunks(rec)
        if len(hunks) < 2 or not rec["before"].isascii():
            continue
        *history, last = hunks
        add = "".join(last.add)
        if not add.strip() or not add.isascii():
            continue
        lines = rec["before"].split("\n")
        edits, delta = [], 0
        for h in history:  # file order; each lands where the hunks above it moved it
            edits.append((h.start + delta, h.start + delta + h.n_del, "".join(h.add)))
            delta += len(h.add) - h.n_del
        cur = _apply_line_edits(lines, edits)
        start = last.start + delta
        target = cur[:start] + "".join(last.add).split("\n")[: len(last.add)] + cur[start + last.n_del :]
        typed = add.rstrip("\n")
        indent = len(typed) - len(typed.lstrip(" \t"))
        out.append(TypingCase(
            "edits", f"{rec['repo']}@{rec['commit'][:10]}:{rec['path']}", "\n".join(cur), start, 0,
            typed[:max_keys] if len(typed) > indent else typed, edits=edits, edit_target="\n".join(target),
            delete_lines=last.n_del,
        ))  # fmt: skip
    return out, ""


def _apply_line_edits(lines: list[str], edits: list[tuple[int, int, str]]) -> list[str]:
    out = list(lines)
    for a, b, new in edits:
        new_lines = new.split("\n")
        if new_lines and new_lines[-1] == "":  # whole lines: "x\ny\n" is two lines
            new_lines.pop()
        out[a:b] = new_lines
    return out


def safim_cases(directory: str | None, limit: int, seed: int, max_keys: int) -> tuple[list[TypingCase], str]:
    from dlm.drivers.evaluation.safim import HOLE, SAFIM_TASKS, safim_dir

    try:
        d = safim_dir(directory)
    except FileNotFoundError as exc:
        return [], f"safim: {exc}"
    out: list[TypingCase] = []
    per_task = max(1, math.ceil(limit / len(SAFIM_TASKS)))
    for task, fname in sorted(SAFIM_TASKS.items()):
        n = 0
        with gzip.open(d / fname, "rt", encoding="utf-8") as f:
            for line in f:
                if n >= per_task or len(out) >= limit:
                    break
                rec = json.loads(line)
                src = rec.get("eval_prompt", "").replace("\r\n", "\n")
                gt = rec.get("ground_truth", "").replace("\r\n", "\n")
                if rec.get("lang") != "python" or HOLE not in src or not gt.strip() or not _ascii(src, gt):
                    continue
                i = src.find(HOLE)
                row = src.count("\n", 0, i)
                col = i - (src.rfind("\n", 0, i) + 1)
                out.append(TypingCase("safim", f"{task}:{rec['task_id']}", src.replace(HOLE, "", 1), row, col,
                                      gt[:max_keys]))
                n += 1
    return out, ""


# ---- scoring -----------------------------------------------------------------------------------------


def _offset(text: str, row: int, col: int) -> int:
    pos = 0
    for _ in range(row):
        nl = text.find("\n", pos)
        if nl < 0:
            return len(text)
        pos = nl + 1
    return pos + col


def judge(current: str, cursor: int, insert: str, replace_to: int, target: str) -> tuple[bool, bool, int]:
    """(exact, accepted in full, accepted characters) of an inline suggestion that replaces
    current[cursor:replace_to] by `insert`, when the user ends up with `target`."""
    after = current[:cursor] + insert + current[replace_to:]
    exact = after == target or after.rstrip() == target.rstrip()
    head, tail = after[: cursor + len(insert)], after[cursor + len(insert) :]
    on_the_way = len(target) >= len(after) and target.startswith(head) and target.endswith(tail)
    return exact, exact or on_the_way, len(os.path.commonprefix([insert, target[cursor:]]))


@dataclass
class Answer:
    """One keystroke's request and what came back."""

    source: str
    latency_ms: float | None = None  # None: superseded by the next keystroke (never seen)
    shown: bool = False  # the server answered an item (gate at 0: every on-time suggestion)
    confidence: float | None = None
    rewrites_recent: bool = False
    exact: bool = False
    correct: bool = False
    accepted_chars: int = 0
    kind: str = "inline"  # or "edit" (dlm/editPrediction)
    superseded: bool = False
    final: bool = False  # the answer at the case's last keystroke (the pause)
    case_index: int = -1


def visible(a: Answer, threshold: float, rewrite_recent: float) -> bool:
    """Would the server's gate at `threshold` show this answer (lsp.gate.decide, offline)?"""
    from dlm.lsp.gate import decide

    return a.latency_ms is not None and a.shown and decide(
        a.confidence, a.rewrites_recent, False, threshold, max(threshold, rewrite_recent)).show


def summarize(answers: list[Answer], thresholds: list[float], rewrite_recent: float) -> dict:
    inline = [a for a in answers if a.kind == "inline"]
    edits = [a for a in answers if a.kind == "edit"]
    lat = [a.latency_ms for a in inline if a.latency_ms is not None]
    rows = []
    for t in thresholds:
        shown = [a for a in inline if visible(a, t, rewrite_recent)]
        n, keys = len(shown), max(len(inline), 1)
        wrong = sum(1 for a in shown if not a.correct)
        e_shown = [a for a in edits if visible(a, t, rewrite_recent)]
        rows.append({
            "threshold": t,
            "keystrokes": len(inline),
            "shown": n,
            "shown_share": n / keys,
            "precision_exact": (sum(a.exact for a in shown) / n) if n else None,
            "precision_accepted": (sum(a.correct for a in shown) / n) if n else None,
            "accepted_chars_per_shown": (sum(a.accepted_chars for a in shown) / n) if n else None,
            "accepted_chars_per_100_keys": 100 * sum(a.accepted_chars for a in shown) / keys,
            "wrong_per_100_keys": 100 * wrong / keys,
            "edit_requests": len(edits),
            "edits_shown": len(e_shown),
            "edit_precision_exact": (sum(a.exact for a in e_shown) / len(e_shown)) if e_shown else None,
        })  # fmt: skip
    by_source = {}
    for src in sorted({a.source for a in inline}):
        mine = [a for a in inline if a.source == src]
        shown = [a for a in mine if visible(a, 0.0, rewrite_recent)]
        by_source[src] = {"keystrokes": len(mine), "shown_at_0": len(shown),
                          "accepted_at_0": sum(a.correct for a in shown)}
    return {
        "rows": rows,
        "by_source": by_source,
        "latency": {
            "answered": len(lat),
            "p50_ms": round(percentile(lat, 50), 1) if lat else None,
            "p99_ms": round(percentile(lat, 99), 1) if lat else None,
        },
        "rewrite_recent": rewrite_recent,
    }


def choose_threshold(summary: dict, min_precision: float = 0.6, max_wrong: float = 2.0) -> float | None:
    """The lowest threshold whose shown suggestions are >= min_precision accepted in full with at
    most max_wrong wrong per 100 keystrokes (None: no threshold reaches it)."""
    for r in summary["rows"]:
        p = r["precision_accepted"]
        if r["shown"] and p is not None and p >= min_precision and r["wrong_per_100_keys"] <= max_wrong:
            return r["threshold"]
    return None


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else (f"{v:.2f}" if isinstance(v, float) else str(v))


def render_markdown(summary: dict, meta: dict) -> str:
    lat = summary["latency"]
    out = [
        (f"`dlm-lsp eval` — {meta.get('model') or 'model'} on {meta.get('device') or '?'}, {meta.get('date', '')}; "
        f"{summary['rows'][0]['keystrokes'] if summary['rows'] else 0} keystrokes, {lat['answered']} answered "
        f"before the next keystroke; latency p50 / p99 {lat['p50_ms']} / {lat['p99_ms']} ms; rewrite-recent "
        f"threshold {summary['rewrite_recent']}"),
        "",
        ("| min confidence | shown | precision exact | accepted in full | chars accepted / shown "
         "| chars accepted / 100 keys | wrong / 100 keys | edit predictions shown (exact) |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary["rows"]:
        out.append(
            f"| {r['threshold']:g} | {r['shown']} ({_fmt(r['shown_share'], True)}) | "
            f"{_fmt(r['precision_exact'], True)} | {_fmt(r['precision_accepted'], True)} | "
            f"{_fmt(r['accepted_chars_per_shown'])} | {_fmt(r['accepted_chars_per_100_keys'])} | "
            f"{_fmt(r['wrong_per_100_keys'])} | {r['edits_shown']} of {r['edit_requests']} "
            f"({_fmt(r['edit_precision_exact'], True)}) |"
        )
    out.append("")
    out.append("| source | keystrokes | shown at 0 | accepted in full at 0 |")
    out.append("| --- | --- | --- | --- |")
    for src, s in summary["by_source"].items():
        out.append(f"| {src} | {s['keystrokes']} | {s['shown_at_0']} | {s['accepted_at_0']} |")
    return "\n".join(out) + "\n"


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only), or exit saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"dlm-lsp eval: the plot needs matplotlib ({exc}); install it with "
                         "`pip install 'dlm-edit-lsp[eval]'`, or pass --no-plot") from None
    return plt


def coverage_latency_plot(path: Path, thresholds: list[float], shown: list[float],
                          series: list[tuple[str, str, list[float]]], latencies: list[float], *,
                          x_label: str, y_label: str, title: str, latency_label: str, latency_share: str) -> None:
    """The figure both evaluations draw (matplotlib, Agg): left, each series (label, line style,
    values) against the shown share, the points of the first labelled by their threshold; right,
    the latency CDF."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, style, values in series:
        ax1.plot(shown, values, style, label=label)
    for t, x, y in zip(thresholds, shown, series[0][2]):
        ax1.annotate(f"{t:g}", (x, y), fontsize=8)
    ax1.set_xlabel(x_label)
    ax1.set_ylabel(y_label)
    ax1.set_xlim(-0.02, 1.02)
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_title(title)
    ax1.legend()
    lat = sorted(latencies)
    if lat:
        ax2.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))])
    ax2.set_xlabel(latency_label)
    ax2.set_ylabel(latency_share)
    ax2.set_title("latency CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plot(summary: dict, latencies: list[float], path: Path) -> None:
    """precision against coverage per threshold, and the latency CDF."""
    rows = [r for r in summary["rows"] if r["precision_accepted"] is not None]
    coverage_latency_plot(
        path, [r["threshold"] for r in rows], [r["shown_share"] for r in rows],
        [("accepted in full", "o-", [r["precision_accepted"] for r in rows]),
         ("exact", "s--", [r["precision_exact"] for r in rows])], latencies,
        x_label="share of keystrokes that show a suggestion", y_label="precision of what is shown",
        title="precision vs coverage (labels: min confidence)", latency_label="keystroke -> answer (ms)",
        latency_share="share of answered requests")


# ---- the replay ---------------------------------------------------------------------------------------


class EvalReplay(Bench):
    """`dlm-lsp bench`'s client and server handling, replaying TypingCases."""

    PROGRAM = "dlm-lsp eval"

    def __init__(self, args: argparse.Namespace, cases: list[TypingCase]) -> None:
        super().__init__(args)
        self.cases = cases
        self.answers: list[Answer] = []

    def initialization_options(self) -> dict:
        # gate at 0 and edit predictions on: every on-time answer comes back with its confidence
        return {"minConfidence": 0, "minConfidenceRewriteRecent": 0, "editPredictions": True,
                "deadlineMs": self.args.deadline_ms}

    def case_uri(self, n: int, case: TypingCase) -> str:
        return f"file:///eval/{case.source}/{n}/{Path(case.name.split(':')[-1]).name or 'case.py'}"

    async def _replay(self, client, types) -> None:
        for n, case in enumerate(self.cases):
            self.case_index = n
            await self._case(client, types, self.case_uri(n, case), case)

    async def _case(self, client, types, uri: str, case: TypingCase) -> None:
        text, version = case.text, 1
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=case.language_id, version=version, text=text)))
        open_ms = getattr(self.args, "open_ms", 0) or 0
        if open_ms > 0:  # --open-ms: the file was open a while before the user typed in it
            await asyncio.sleep(open_ms / 1000)

        def change(a: tuple[int, int], b: tuple[int, int], new: str) -> None:
            nonlocal text, version
            version += 1
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(*a), types.Position(*b)), text=new)]))
            text = text[: _offset(text, *a)] + new + text[_offset(text, *b) :]

        for a, b, new in case.edits:  # the edit history, as quick successive edits
            change((a, 0), (b, 0), new)
            await asyncio.sleep(0.01)
        if case.edit_target is not None:
            # the user just made the last history edit: its last line is where the cursor is
            a, _, new = case.edits[-1] if case.edits else (0, 0, "")
            lines = text.split("\n")
            row = min(a + max(0, new.count("\n") - 1), len(lines) - 1)
            await self._edit_request(client, uri, row, len(lines[row]), text, case)
            # then the next hunk: its old lines go, and its new text is typed on a fresh line
            change((case.row, 0), (case.row + case.delete_lines, 0), "\n")
        at = _offset(text, case.row, case.col)
        target = case.final_target if case.final_target is not None else text[:at] + case.typed + text[at:]
        await self._type(client, types, uri, case, change, lambda: text, target)
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))

    async def _edit_request(self, client, uri: str, row: int, col: int, text: str, case: TypingCase) -> None:
        t0 = time.monotonic()
        try:
            res = _plain(await client.protocol.send_request_async(
                "dlm/editPrediction", {"textDocument": {"uri": uri}, "position": {"line": row, "character": col}}))
        except Exception as exc:  # noqa: BLE001 - an error answer is an answer with nothing shown
            print(f"dlm-lsp eval: dlm/editPrediction failed ({exc})", file=sys.stderr)
            res = None
        ans = Answer(case.source, latency_ms=(time.monotonic() - t0) * 1000, kind="edit")
        if res and res.get("edits"):
            after = text
            for e in sorted(res["edits"], key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]),
                            reverse=True):
                s = _offset(after, e["range"]["start"]["line"], e["range"]["start"]["character"])
                t = _offset(after, e["range"]["end"]["line"], e["range"]["end"]["character"])
                after = after[:s] + e["newText"] + after[t:]
            ans.shown, ans.confidence = True, res.get("confidence")
            ans.rewrites_recent = bool(res.get("rewritesRecent"))
            ans.exact = ans.correct = after.rstrip() == (case.edit_target or "").rstrip()
        self.answers.append(ans)

    async def _type(self, client, types, uri: str, case: TypingCase, change, current, target: str) -> None:
        row, col = case.row, case.col
        pending: list[tuple[Answer, asyncio.Future]] = []
        i = 0
        typed = case.typed
        while i < len(typed):
            ch = typed[i]
            piece = ch
            if ch == "\n":  # Enter + the indentation of the next line in one change, like editors do
                j = i + 1
                while j < len(typed) and typed[j] in " \t":
                    j += 1
                piece = typed[i:j]
            change((row, col), (row, col), piece)
            if "\n" in piece:
                row, col = row + 1, len(piece) - 1
            else:
                col += len(piece)
            i += len(piece)
            ans = Answer(case.source, final=i >= len(typed), case_index=getattr(self, "case_index", -1))
            pause_ms = getattr(self.args, "pause_ms", 0) or 0
            if ans.final and pause_ms > 0:
                # --pause-ms: the judged request comes after a pause (past the server's idle time), as
                # when a user stops and waits, or asks explicitly, rather than right after the keystroke
                await asyncio.sleep(pause_ms / 1000)
            sent = time.monotonic()
            text_now, cursor = current(), _offset(current(), row, col)
            fut = asyncio.ensure_future(client.text_document_inline_completion_async(types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(row, col),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))))

            def done(f, a=ans, t0=sent, snapshot=text_now, at=cursor) -> None:
                if a.superseded:  # the editor dropped it when the next key came
                    return
                a.latency_ms = (time.monotonic() - t0) * 1000
                try:
                    items = f.result().items
                except Exception:  # noqa: BLE001 - an error answer counts as nothing shown
                    items = []
                if not items:
                    return
                item = items[0]
                end = at
                if item.range is not None:
                    end = _offset(snapshot, item.range.end.line, item.range.end.character)
                args = list(item.command.arguments or []) if item.command else []
                data = next((x for x in args if isinstance(x, dict)), {})
                a.shown = True
                a.confidence = data.get("confidence")
                a.rewrites_recent = bool(data.get("rewritesRecent"))
                a.exact, a.correct, a.accepted_chars = judge(snapshot, at, item.insert_text, end, target)

            fut.add_done_callback(done)
            self.answers.append(ans)
            pending.append((ans, fut))
            pause = (ch in " \n" and self.rng.random() < 0.25) or i >= len(typed)
            if pause:
                await asyncio.wait([fut], timeout=60)
            else:
                await asyncio.sleep(self._gap())
            for a, f in pending:  # unanswered when the next key comes: the editor never shows it
                if not f.done():
                    a.superseded = True
            pending = [(a, f) for a, f in pending if not f.done()]
        if pending:
            await asyncio.wait([f for _, f in pending], timeout=60)


def _load_cases(args) -> tuple[list[TypingCase], list[str]]:
    wanted = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SOURCES]
    if unknown:
        raise SystemExit(f"dlm-lsp eval: unknown --sources {', '.join(unknown)}; use {', '.join(SOURCES)}")
    cases, notes = [], []
    loaders = {
        "corpus": lambda: corpus_cases(args.corpus, args.limit, args.seed, args.max_keys),
        "edits": lambda: edit_cases(args.edit_histories, args.limit, args.seed, args.max_keys),
        "safim": lambda: safim_cases(args.safim_dir, args.limit, args.seed, args.max_keys),
    }
    for s in wanted:
        got, note = loaders[s]()
        cases += got
        if note:
            notes.append(note)
    return cases, notes


def thresholds_of(args: argparse.Namespace) -> list[float] | None:
    """The confidence thresholds of --thresholds, sorted; None (and a message) when malformed."""
    try:
        thresholds = sorted({float(t) for t in args.thresholds.split(",") if t.strip()})
    except ValueError:
        print(f"dlm-lsp eval: --thresholds {args.thresholds!r} must be numbers, e.g. 0,0.5,0.9", file=sys.stderr)
        return None
    if not thresholds or not all(0 <= t <= 1 for t in thresholds):
        print("dlm-lsp eval: --thresholds must be confidences in [0, 1]", file=sys.stderr)
        return None
    return thresholds


def run(args: argparse.Namespace, thresholds: list[float]) -> int:
    """The typing replay of a corpus, edit histories or SAFIM (`dlm-lsp eval` without --repo or
    --next-edits: drivers.evaluation.eval_cli picks)."""
    if args.limit < 1 or args.max_keys < 1 or args.cps <= 0 or args.deadline_ms < 1:
        print("dlm-lsp eval: --limit, --max-keys and --deadline-ms must be >= 1 and --cps > 0", file=sys.stderr)
        return 2
    cases, notes = _load_cases(args)
    for note in notes:
        print(f"dlm-lsp eval: skipped {note}", file=sys.stderr)
    if not cases:
        print("dlm-lsp eval: no material to replay. Pass --repo DIR (any source repository: held-out lines "
              "against an index of the rest), --corpus DIR (a corpus built by python -m "
              "dlm.drivers.training.corpus), --edit-histories DIR (edit-history *.jsonl.gz records) or "
              "--safim-dir DIR (SAFIM's block/control_completion.jsonl.gz)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the server's window/logMessage notifications are for editors; pygls' client warns on each
    logging.getLogger("pygls.protocol.json_rpc").setLevel(logging.ERROR)
    t0 = time.monotonic()
    replay = EvalReplay(args, cases)
    res = asyncio.run(replay.run())
    summary = summarize(replay.answers, thresholds, args.rewrite_recent)
    meta = {
        "model": res.status.get("model", ""), "device": res.status.get("device", ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": len(cases),
        "wall_s": round(time.monotonic() - t0, 1), "seed": args.seed, "cps": args.cps,
        "deadline_ms": args.deadline_ms, "skipped": notes, "server": {k: res.server.get(k) for k in (
            "model_runs", "completed", "cancelled", "late", "superseded")},
    }  # fmt: skip
    summary["chosen_threshold"] = choose_threshold(summary)
    md = render_markdown(summary, meta)
    (out / "eval.md").write_text(md, encoding="utf-8")
    (out / "eval.json").write_text(json.dumps({"meta": meta, "summary": summary,
                                               "answers": [asdict(a) for a in replay.answers]}, indent=1))
    if not args.no_plot:
        lat = [a.latency_ms for a in replay.answers if a.kind == "inline" and a.latency_ms is not None]
        write_plot(summary, lat, out / "eval.png")
    print(md)
    print(f"lowest threshold with >= 60% accepted in full and <= 2 wrong / 100 keystrokes: "
          f"{summary['chosen_threshold']}; wrote {out / 'eval.md'}, {out / 'eval.json'}"
          + ("" if args.no_plot else f", {out / 'eval.png'}"))
    return 0
