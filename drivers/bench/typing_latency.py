"""`dlm-lsp bench`: replay realistic typing through the real server over stdio.

The bench starts `dlm-lsp --stdio` as a subprocess and acts as an editor
would: it opens real source files with a few lines cut out at a random
place, then types those lines back character by character (inter-key gaps
around 1/cps, pauses after some words and at line ends, typos fixed with
backspace, Enter with auto-indent), jumps to another file and place, and
sends `textDocument/inlineCompletion` after every keystroke without waiting
for the previous answer, like VS Code.

Latency = keystroke (didChange sent) -> the answer to that keystroke's
request, measured by the client, so it includes JSON-RPC both ways. A
request counts as measured when its answer arrived before the next
keystroke was sent; at a pause the bench waits for the answer, so every
pause is measured (those are the suggestions a user actually sees). The
rest were superseded by the next keystroke. Server-side counters come from
`dlm/stats`: model runs, cancelled, superseded, cache hits, tokens per step,
and the median time per stage (context, queue, prefill, denoise, post).

The replay runs as the server runs in an editor, with the repository memory on:
the server indexes a workspace folder (`--workspace DIR`; by default the project
the typed files come from: the git root of the first `--files` file, else its
folder, and for dlm's own files the folder holding them) and the replay starts
once the index is ready. A typed file is opened at its own path (`document_uri`),
so the server treats a file of the workspace as it treats any open document: its
buffer (the file with the lines still to type cut out) replaces the file's indexed
copy, and every memory query leaves the document's indexed copy out
(`exclude_path`), so the lines being typed are never copied from the file on
disk. `--no-index` replays with no workspace: the model alone. A root the server
refuses (`/`, the home folder and the folders above it) is not offered; the run
says so and replays with the model alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.hosted.settings import add_engine_arguments, engine_argv
from dlm.lsp.stats import percentile

# Replays run on several threads at once (eval --next-edits); creating their LSP clients at the same
# time races inside lsprotocol ("dictionary changed size during iteration").
_CLIENT_LOCK = threading.Lock()

LOOPBACK = "loopback"  # `--remote` without an address: the loopback comparison


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay typing through the real server, as an editor does, and print keystroke -> suggestion "
        "latency and the server's counters. The server indexes a workspace (the repository memory on, "
        "the replay waiting for the index): --workspace DIR, by default the typed files' project; "
        "--no-index replays with the model alone."
    )
    parser.add_argument("--model", metavar="DIR", help="checkpoint directory (default: the embedded model)")
    add_device_argument(parser)
    parser.add_argument(
        "--remote", nargs="?", const=LOOPBACK, metavar="HOST:PORT",
        help="with HOST:PORT: replay through a server started with --remote HOST:PORT; "
        "alone: compare local and remote (dlm-lsp serve on 127.0.0.1) latency and batched "
        "throughput with --clients 1,4,16,32 (use --keystrokes 40 for a short run)",
    )
    parser.add_argument(
        "--files", nargs="*", metavar="FILE",
        help="source files to type (default: the --workspace's Python files, else dlm's own in lsp/ and "
        "coder_model/)",
    )
    parser.add_argument(
        "--workspace", metavar="DIR",
        help="the workspace folder the server indexes (the repository memory), ready before the replay "
        "starts (default: the typed files' project: the git root of the first --files file, else its "
        "folder; for dlm's own files the folder holding them)",
    )
    parser.add_argument(
        "--no-index", action="store_true",
        help="replay with no workspace: no repository memory, the model alone",
    )
    parser.add_argument("--keystrokes", type=int, default=400, help="keystrokes to replay (default 400)")
    parser.add_argument("--cps", type=float, default=8.0, help="typing speed, characters per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--load-timeout", type=float, default=600.0, help="seconds to wait for the model")
    parser.add_argument("--server-log", metavar="F", help="server log file (default: a temp file)")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        metavar="LEVEL", help="level of the server log: DEBUG, INFO, WARNING or ERROR, any case "
                        "(default INFO)")
    parser.add_argument("--engine-factory", help=argparse.SUPPRESS)  # tests: see lsp/server_cli.py
    add_engine_arguments(parser)
    from dlm.drivers.bench.remote_serving import add_remote_arguments  # no torch at import

    add_remote_arguments(parser)  # --clients, --requests, sampler overrides (skips the ones above)


@dataclass
class Sample:
    sent: float
    answered: float | None = None
    shown: bool = False
    pause: bool = False
    superseded: bool = False


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    server: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    jumps: int = 0
    typos: int = 0
    log_file: str = ""
    log_messages: list[tuple[int, str]] = field(default_factory=list)  # window/logMessage (type, text)


def default_files(workspace: str | None = None) -> list[Path]:
    """The Python files of the workspace (at most 200, in path order), else dlm's own."""
    if workspace:
        root = Path(workspace).resolve()
        files = sorted(p for p in root.rglob("*.py") if p.is_file() and not p.is_symlink()
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
        return [f for f in files if f.stat().st_size > 2000][:200]
    root = own_root()
    files = sorted(root.glob("lsp/*.py")) + sorted(root.glob("coder_model/*.py"))
    return [f for f in files if f.stat().st_size > 2000]


def own_root() -> Path:
    """The folder holding dlm's own packages (lsp/, coder_model/): the repository in a checkout."""
    import dlm.lsp

    return Path(dlm.lsp.__file__).resolve().parent.parent


def default_workspace(files: list[Path], own: bool) -> tuple[str | None, str]:
    """(the workspace folder a replay of `files` indexes, or None; why there is none): for dlm's
    own files (`own`) the folder holding them, else the first file's project (its git root, else
    its folder, as `dlm-lsp predict` finds it). A root the server refuses gives None."""
    from dlm.lsp import discovery
    from dlm.lsp.predict_cli import project_root

    if not files:
        return None, ""  # the replay says there is nothing to type
    root = own_root() if own else project_root(Path(files[0]))
    refused = discovery.refusal(str(root))
    if refused:
        return None, (f"not indexing {root}: {refused}, which the language server refuses too; replaying "
                      "with the model alone. Pass --workspace DIR (the project folder of the typed files) "
                      "to use the repository memory, or --no-index to skip this message")
    return str(root), ""


def document_uri(path: Path, n: int) -> str:
    """The URI the replay opens a file at: its own path (the server's index sees it as the open
    buffer of that file), with a query that makes each opening a new document."""
    return f"{path.resolve().as_uri()}?bench={n}"


def _chunk(text: str, rng: random.Random) -> tuple[int, int]:
    """Line range [a, b) to cut out and type back: a few non-blank lines inside the file."""
    lines = text.split("\n")
    for _ in range(50):
        a = rng.randrange(5, max(6, len(lines) - 8))
        b = a + rng.randint(1, 3)
        body = lines[a:b]
        if all(x.strip() for x in body) and sum(len(x) for x in body) > 30:
            return a, b
    return 1, 2


class Bench:
    PROGRAM = "dlm-lsp bench"  # in the messages that end a run

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.res = Result()

    def server_command(self, log_file: str) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "dlm.lsp.cli",
            "--stdio",
            "--device",
            self.args.device,
            "--log-file",
            log_file,
            "--log-level",
            getattr(self.args, "log_level", "INFO"),
        ]
        for opt in ("model", "remote", "engine_factory"):
            value = getattr(self.args, opt, None)
            if value:
                cmd += ["--" + opt.replace("_", "-"), value]
        return cmd + engine_argv(self.args)  # --engine KIND ...: a hosted engine (docs/engines.md)

    async def run(self) -> Result:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        with _CLIENT_LOCK:  # lsprotocol builds its converter's hooks in a shared dict: one at a time
            client = LanguageClient("dlm-bench", "0.1")

        @client.feature("dlm/status")
        def _status(params) -> None:
            self.res.status = params if isinstance(params, dict) else getattr(params, "_asdict", dict)()

        @client.feature("window/logMessage")
        def _log_message(params) -> None:  # kept for the report; an editor shows these in its log
            level = getattr(params, "type", None)
            self.res.log_messages.append((int(getattr(level, "value", level) or 4), str(getattr(params, "message", ""))))

        log_file = self.args.server_log or tempfile.mkstemp(prefix="dlm-bench-", suffix=".log")[1]
        self.res.log_file = log_file
        cmd = self.server_command(log_file)
        env = dict(os.environ)
        await client.start_io(*cmd, env=env)
        try:
            await initialize_for_inline(client, self.root_uri(), self.initialization_options())
            await self._wait_ready(client, log_file)
            await self._replay(client, types)
            self.res.server = await request(client, "dlm/stats", {})
        finally:
            try:
                await asyncio.wait_for(client.shutdown_async(None), 10)
                client.exit(None)
            except Exception as exc:  # noqa: BLE001 - the server is going away either way
                print(f"dlm-lsp bench: shutdown was not clean ({exc})", file=sys.stderr)
            await client.stop()
        return self.res

    def root_uri(self) -> str | None:
        """The workspace root the server indexes (None: no workspace): --workspace here, the held-in copy
        of the repository for `dlm-lsp eval --repo`."""
        ws = getattr(self.args, "workspace", None)
        return Path(ws).resolve().as_uri() if ws else None

    def initialization_options(self) -> dict | None:
        """The server's initializationOptions (None: its defaults); `dlm-lsp eval` sets the gate."""
        return None

    async def _wait_ready(self, client, log_file: str) -> None:
        deadline = time.monotonic() + self.args.load_timeout
        while time.monotonic() < deadline:
            st = await request(client, "dlm/stats", {})
            if st["state"] == "ready":
                break
            if st["state"] == "failed":
                raise SystemExit(
                    f"dlm-lsp bench: the model failed to load: {self.res.status.get('message')} "
                    f"(server log: {log_file})"
                )
            await asyncio.sleep(0.2)
        else:
            raise SystemExit(
                f"dlm-lsp bench: the model was not ready after {self.args.load_timeout:.0f} s; "
                f"raise --load-timeout (server log: {log_file})"
            )
        if getattr(self.args, "workspace", None):
            await self.wait_index(client, log_file, deadline)

    async def wait_index(self, client, log_file: str, deadline: float, refuse_off: bool = True) -> dict:
        """Wait for the workspace index to be ready (replay only then, as a user who waits for it) and
        return its status; an index that is `failed` or `off` ends the run with why (`refuse_off`) or is
        returned as it is; past `deadline`, the run ends."""
        while time.monotonic() < deadline:
            index = (await request(client, "dlm/stats", {})).get("index") or {}
            if index.get("state") == "ready":
                return index
            if index.get("state") in ("failed", "off"):
                if not refuse_off:
                    return index
                raise SystemExit(f"{self.PROGRAM}: the workspace index is {index.get('state')}: "
                                 f"{index.get('message', '')} (server log: {log_file})")
            await asyncio.sleep(0.5)
        raise SystemExit(f"{self.PROGRAM}: the workspace index was not ready after {self.args.load_timeout:.0f} s; "
                         f"raise --load-timeout (server log: {log_file})")

    async def _replay(self, client, types) -> None:
        files = [Path(f) for f in (self.args.files or [])] or default_files(getattr(self.args, "workspace", None))
        if not files:
            raise SystemExit("dlm-lsp bench: no source files to type; pass --files")
        left = self.args.keystrokes
        doc_no = 0
        while left > 0:
            path = self.rng.choice(files)
            text = path.read_text(encoding="utf-8", errors="replace")
            a, b = _chunk(text, self.rng)
            lines = text.split("\n")
            target = "\n".join(lines[a:b])
            doc_no += 1
            uri = document_uri(path, doc_no)
            opened = "\n".join(lines[:a] + [""] + lines[b:])
            client.text_document_did_open(
                types.DidOpenTextDocumentParams(
                    types.TextDocumentItem(
                        uri=uri,
                        language_id="python" if path.suffix == ".py" else path.suffix.lstrip("."),
                        version=1,
                        text=opened,
                    )
                )
            )
            self.res.jumps += 1
            left = await self._type(client, types, uri, a, target, left)
            client.text_document_did_close(
                types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri))
            )

    async def _type(self, client, types, uri: str, row: int, target: str, left: int) -> int:
        col, version, i = 0, 1, 0
        pending: list[tuple[Sample, asyncio.Future]] = []
        while i < len(target) and left > 0:
            ch = target[i]
            if ch == "\n":  # Enter + auto-indent in one change, like editors do
                j = i + 1
                while j < len(target) and target[j] in " \t":
                    j += 1
                piece = target[i:j]
            elif ch.isalpha() and self.rng.random() < 0.02:  # a typo, fixed right away
                piece = "#"
                self.res.typos += 1
            else:
                piece = ch
            version += 1
            pos = types.Position(row, col)
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[
                        types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text=piece)
                    ],
                )
            )
            if piece == "#" and ch != "#":  # undo the typo: backspace
                await asyncio.sleep(self._gap())
                version += 1
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(
                        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                        content_changes=[
                            types.TextDocumentContentChangePartial(
                                range=types.Range(pos, types.Position(row, col + 1)), text=""
                            )
                        ],
                    )
                )
                left -= 1
                continue
            if "\n" in piece:
                row, col = row + 1, len(piece) - 1
            else:
                col += len(piece)
            i += len(piece)
            left -= 1
            sample = Sample(sent=time.monotonic())
            fut = asyncio.ensure_future(
                client.text_document_inline_completion_async(
                    types.InlineCompletionParams(
                        text_document=types.TextDocumentIdentifier(uri=uri),
                        position=types.Position(row, col),
                        context=types.InlineCompletionContext(
                            trigger_kind=types.InlineCompletionTriggerKind.Automatic
                        ),
                    )
                )
            )

            def done(f, s=sample):
                s.answered = time.monotonic()
                try:
                    s.shown = bool(f.result().items)
                except Exception:  # noqa: BLE001 - an error answer counts as nothing shown
                    s.shown = False

            fut.add_done_callback(done)
            self.res.samples.append(sample)
            pending.append((sample, fut))
            pause = (ch in " \n" and self.rng.random() < 0.25) or i >= len(target)
            if pause:
                sample.pause = True
                await asyncio.wait([fut], timeout=60)
                await asyncio.sleep(self.rng.uniform(0.4, 1.2))
            else:
                await asyncio.sleep(self._gap())
            for s, _ in pending:  # anything unanswered when the next key comes was superseded
                if s.answered is None:
                    s.superseded = True
            pending = [(s, f) for s, f in pending if not f.done()]
        if pending:
            await asyncio.wait([f for _, f in pending], timeout=60)
        return left

    def _gap(self) -> float:
        return min(0.4, max(0.03, self.rng.gauss(1.0 / self.args.cps, 0.4 / self.args.cps)))


def plain(obj):
    """pygls' client hands back custom results as namedtuples; make them dicts/lists."""
    if hasattr(obj, "_asdict"):
        return {k: plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


_plain = plain  # the name dlm.drivers.evaluation.eval_typing imports


async def initialize_for_inline(client, root_uri: str, initialization_options=None) -> None:
    """The LSP handshake of `client` (a pygls client) as an editor that asks for inline
    completions, with `root_uri` as its workspace."""
    from lsprotocol import types

    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(
                text_document=types.TextDocumentClientCapabilities(
                    inline_completion=types.InlineCompletionClientCapabilities()
                )
            ),
            process_id=os.getpid(),
            root_uri=root_uri,
            initialization_options=initialization_options,
        )
    )
    client.initialized(types.InitializedParams())


async def request(client, method: str, params):
    """A custom request (dlm/stats, ...) through a pygls client; its result as dicts/lists."""
    return plain(await client.protocol.send_request_async(method, params))


def summarize(res: Result, args: argparse.Namespace, wall_s: float) -> dict:
    measured = [s for s in res.samples if s.answered is not None and not s.superseded]
    lat = [(s.answered - s.sent) * 1000 for s in measured]
    at_pause = [(s.answered - s.sent) * 1000 for s in measured if s.pause]

    def pct(v):
        return {f"p{q}_ms": (round(percentile(v, q), 1) if v else None) for q in (50, 95, 99)}

    srv = res.server
    return {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": res.status.get("model", ""),
        "device": res.status.get("device", ""),
        "keystrokes": len(res.samples),
        "measured": len(measured),
        "latency": pct(lat),
        "latency_at_pauses": pct(at_pause) | {"n": len(at_pause)},
        "shown": sum(1 for s in measured if s.shown),
        "superseded_client": sum(1 for s in res.samples if s.superseded),
        "jumps": res.jumps,
        "typos": res.typos,
        "server": {
            k: srv.get(k)
            for k in (
                "model_runs",
                "completed",
                "steps",
                "tokens",
                "cancelled",
                "superseded",
                "skipped",
                "cache_hits",
                "empty",
                "outdated",
                "failed",
                "late",
                "gated_late",
                "gated_low_confidence",
                "gated_rewrites_recent",
                "offered",
                "no_change",
                "no_steps",
                "requests",
                "tokens_per_step",
                "stages_p50_ms",
                "stages_p99_ms",
                "p50_ms",
                "p95_ms",
                "p99_ms",
            )
        },
        # the repository memory the replay ran with: the workspace folder and the index's status
        "memory": {"workspace": getattr(args, "workspace", None), "note": getattr(args, "memory_note", ""),
                   **{k: (srv.get("index") or {}).get(k) for k in ("state", "files", "tokens", "message")}},
        "wall_s": round(wall_s, 1),
        "server_log": res.log_file,
        # window/logMessage the editor got: 1 error, 2 warning (nothing per keystroke is sent)
        "log_messages": {"errors": sum(1 for t, _ in res.log_messages if t == 1),
                         "warnings": sum(1 for t, _ in res.log_messages if t == 2),
                         "other": sum(1 for t, _ in res.log_messages if t > 2)},
        "cps": args.cps,
        "seed": args.seed,
    }


def render(summary: dict) -> str:
    lat, lp, srv = summary["latency"], summary["latency_at_pauses"], summary["server"]
    rows = [
        ("model / device", f"{summary['model']} / {summary['device']}"),
        ("repository memory", memory_row(summary.get("memory") or {})),
        ("keystrokes (measured)", f"{summary['keystrokes']} ({summary['measured']})"),
        ("keystroke->suggestion p50 / p95 / p99", f"{lat['p50_ms']} / {lat['p95_ms']} / {lat['p99_ms']} ms"),
        (
            f"  at pauses (n={lp['n']}) p50 / p95 / p99",
            f"{lp['p50_ms']} / {lp['p95_ms']} / {lp['p99_ms']} ms",
        ),
        ("  server-side (request in -> answer out) p50 / p95", f"{srv['p50_ms']} / {srv['p95_ms']} ms"),
        ("suggestions shown", summary["shown"]),
        ("model runs / completed", f"{srv['model_runs']} / {srv['completed']}"),
        ("cancelled / superseded / skipped", f"{srv['cancelled']} / {srv['superseded']} / {srv['skipped']}"),
        ("prefix-cache hits", srv["cache_hits"]),
        ("tokens per step", srv["tokens_per_step"]),
        (
            "steps per completed run",
            round(srv["steps"] / srv["completed"], 1) if srv.get("completed") else None,
        ),
        (
            "server stage p50 (ms)",
            ", ".join(f"{k[:-3]} {v}" for k, v in (srv["stages_p50_ms"] or {}).items()),
        ),
        (
            "  model's part (queue + prefill + denoise) p50 / p99",
            " / ".join(f"{(srv.get(k) or {}).get('model_ms')}" for k in ("stages_p50_ms", "stages_p99_ms")) + " ms",
        ),
        ("jumps / typos", f"{summary['jumps']} / {summary['typos']}"),
        ("log messages to the editor (errors / warnings / other)",
         " / ".join(str(summary.get("log_messages", {}).get(k, 0)) for k in ("errors", "warnings", "other"))),
        ("wall", f"{summary['wall_s']} s"),
    ]
    w = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
    why = explain(summary)
    return table + ("\n\n" + why if why else "")


def memory_row(memory: dict) -> str:
    """The repository memory a run had: its folder and index, or why it had none."""
    if memory.get("state") == "ready":
        return f"on: {memory.get('workspace')} ({memory.get('files')} files, {memory.get('tokens')} tokens)"
    why = memory.get("note") or memory.get("message") or "no workspace"
    return f"off ({why})" if memory.get("state") in (None, "off") else f"{memory.get('state')} ({why})"


def explain(summary: dict) -> str:
    """Why a run measured no latency or showed no suggestion, and what to try ('' when it did)."""
    srv = summary["server"]

    def n(key: str) -> int:  # counters an older server may not report count as 0
        return srv.get(key) or 0

    log = f" (server log: {summary['server_log']})" if summary.get("server_log") else ""
    if summary["keystrokes"] == 0:
        return "No keystroke was replayed: the files given to --files had nothing to type; pass other files."
    if summary["measured"] == 0 or not n("completed"):
        if n("failed"):
            return (f"No request completed: all {n('failed')} model runs failed{log}. "
                    "Read the error there; `dlm-lsp predict FILE --line N --col M` shows it for one position.")
        if n("model_runs") == 0:
            return (f"No request completed: the model never ran ({n('requests')} requests, "
                    f"{n('empty')} answered empty, {n('superseded') + n('skipped')} superseded){log}. "
                    "The server answers empty while the model is not ready; check dlm/status in the log.")
        return (f"No request completed: every one of the {n('model_runs')} model runs was cancelled or "
                f"superseded by the next keystroke ({n('cancelled')} cancelled, {n('superseded')} superseded): "
                "the model is slower than the typing. Try a lower --cps, fewer --steps, a smaller --model, "
                "or --device cuda.")
    if summary["shown"] == 0:
        return "No suggestion was shown. " + outcomes(srv)
    return ""


def outcomes(srv: dict) -> str:
    """Where every completed run went: offered, held back (by reason) or no change proposed;
    and what to try for the largest share."""

    def n(key: str) -> int:
        return srv.get(key) or 0

    parts = {
        "offered to the editor": n("offered"),
        "held back as late (past the deadline)": n("gated_late"),
        "held back below the confidence threshold (minConfidence)": n("gated_low_confidence"),
        "held back for rewriting recent typing": n("gated_rewrites_recent"),
        "proposed no change at the cursor": n("no_change"),
    }
    told = ", ".join(f"{v} {k}" for k, v in parts.items() if v)
    other = n("completed") - sum(parts.values())
    text = f"Of {n('completed')} completed runs: {told or 'none accounted for'}"
    if other:
        text += f", {other} answered a request that was cancelled on the client's side"
    text += "."
    if n("no_steps"):
        text += f" {n('no_steps')} of the runs that proposed nothing had no time for a single model step."
    advice = []
    if n("gated_late") or n("no_steps"):
        advice.append("a faster device (--device cuda) or a larger deadlineMs answers in time")
    if n("gated_low_confidence"):
        advice.append("minConfidence in initializationOptions (or eval's thresholds) shows weaker suggestions")
    if n("no_change") and n("no_change") >= max(parts.values()):
        advice.append("a bigger --model proposes more")
    return text + (" Try: " + "; ".join(advice) + "." if advice else "")


def run(args: argparse.Namespace) -> int:
    if args.remote == LOOPBACK:
        from dlm.drivers.bench.remote_serving import run_remote_bench

        return run_remote_bench(args)
    if args.keystrokes < 1:
        print("dlm-lsp bench: --keystrokes must be at least 1", file=sys.stderr)
        return 2
    if args.cps <= 0:
        print("dlm-lsp bench: --cps must be > 0", file=sys.stderr)
        return 2
    for f in args.files or []:
        if not Path(f).is_file():
            print(f"dlm-lsp bench: {f} is not a file; pass readable source files to --files", file=sys.stderr)
            return 2
    if args.no_index and args.workspace:
        print("dlm-lsp bench: --no-index replays with no workspace, and --workspace names one; pass one of "
              "them (--no-index: the model alone)", file=sys.stderr)
        return 2
    if args.workspace and not Path(args.workspace).is_dir():
        print(f"dlm-lsp bench: --workspace {args.workspace} is not a folder; pass the project folder to index",
              file=sys.stderr)
        return 2
    own = not args.files and not args.workspace
    # the files are chosen before the default workspace, which follows them
    args.files = [str(f) for f in (args.files or default_files(args.workspace))]
    args.memory_note = ""
    if args.no_index:
        args.memory_note = "--no-index: the model alone"
    elif not args.workspace:
        args.workspace, why = default_workspace([Path(f) for f in args.files], own)
        if why:
            print(f"dlm-lsp bench: {why}", file=sys.stderr)
            args.memory_note = why.split(";", 1)[0]
    t0 = time.monotonic()
    res = asyncio.run(Bench(args).run())
    summary = summarize(res, args, time.monotonic() - t0)
    if args.json:
        print(json.dumps(summary | {"explanation": explain(summary)}, indent=2))
    else:
        print(render(summary))
    return 0
