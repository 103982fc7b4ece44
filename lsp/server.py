"""The language server: pygls wiring and thin handlers, one per LSP method.

Protocol surface (README "Protocol"): textDocument/inlineCompletion,
textDocument/completion (fallback), dlm/editPrediction, dlm/stats,
textDocument/didShowCompletion, textDocument/didPartiallyAcceptCompletion,
workspace/executeCommand dlm.acceptCompletion, Copilot's next-edit methods
textDocument/copilotInlineEdit and textDocument/didShowInlineEdit
(lsp.copilot_nes), and the dlm/status notification. The server answers `initialize` at once; the model loads in a
background thread (lsp.engine_holder) and, until it is ready (or when it
failed to load), every request returns an empty result, never an error.

Handlers read params, call plain functions (lsp.context builds the prompt,
the engine predicts, lsp.postprocess makes the suggestion) and translate the
result with lsp.convert.

The workspace index (lsp.workspace_index: the repository memory of each workspace
folder) starts at `initialized` and follows didOpen/didChange/didSave/didClose,
workspace/didChangeWatchedFiles and workspace/didChangeWorkspaceFolders.

Documents are kept by lsp.documents (not by pygls' workspace: ours keeps a
tree-sitter tree and the edit history, and does not re-split the text on
each change).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlparse

from dlm.coder_model import limits, secrets
from dlm.coder_model.languages import language_name
from dlm.coder_model.types import Engine, LayoutBudget, MemoryProposal, Prediction, SamplerParams
from dlm.lsp import (
    context,
    convert,
    copilot_nes,
    framing,
    gate,
    next_edits,
    positions,
    postprocess,
    syntax_check,
)
from dlm.lsp.convert import ACCEPT_COMMAND
from dlm.lsp.documents import Document, Documents
from dlm.lsp.engine_holder import EngineHolder
from dlm.lsp.history import History
from dlm.lsp.index_progress import (
    IndexProgress,
    client_supports_progress,
    client_supports_watching,
    watch_files,
)
from dlm.lsp.latest_wins import LatestWins
from dlm.lsp.options import Options, parse_options
from dlm.lsp.pygls_protocol import DlmProtocol
from dlm.lsp.stats import Stats
from dlm.lsp.workspace_index import WorkspaceIndex, file_path
from lsprotocol import types
from pygls.lsp.server import LanguageServer

log = logging.getLogger(__name__)

EDIT_PREDICTION = "dlm/editPrediction"
STATS = "dlm/stats"
STATUS = "dlm/status"
DID_SHOW = "textDocument/didShowCompletion"
DID_PARTIALLY_ACCEPT = "textDocument/didPartiallyAcceptCompletion"
MAX_REMEMBERED_ITEMS = 256


INDEX_BUSY = ("loading", "indexing")  # index states in which the status is not "ready"
# Why an explicit trigger showed nothing, from what the request counted, most telling first.
TRIGGER_REASONS = {
    "binary": "a binary document (it holds NUL bytes): no suggestions",
    "held_back_syntax": "held back: accepting it would break the syntax",
    "held_back_degenerate": "held back: a degenerate answer (repeats, blank lines)",
    "gated_low_confidence": "nothing over the confidence gate (minConfidence)",
    "gated_rewrites_recent": "nothing over the gate for text that rewrites what you just typed",
    "gated_late": "the answer came after its deadline",
    "no_steps": "no time for a model step (deadlineMs)",
    "no_change": "nothing to propose here: the memory has no continuation and the model proposes no change",
    "failed": "the model failed on this request (see the server log)",
    "refused": "the model refused this request (see the server log)",
}


def status_text(state: str, message: str, index: dict) -> str:
    """The status line: "ready" only when the model answers and the index is done; while it is
    built, "indexing 38/77 files"; the model's state and why it is not ready otherwise, with the
    index's line after it ("model loading · indexing 38/77 files")."""
    if state == "ready":
        return index["text"] if index["state"] in INDEX_BUSY else f"ready · {index['text']}"
    why = f": {message}" if message else ""
    return f"model {state}{why} · {index['text']}"


class DlmServer(LanguageServer):
    def __init__(self, engine_factory: Callable[[], Engine], max_workers: int = 8) -> None:
        super().__init__("dlm-lsp", "0.1.0", protocol_cls=DlmProtocol, max_workers=max_workers)
        self.options = Options()
        self.documents = Documents()
        self.stats = Stats()
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dlm-predict")
        self.scheduler = LatestWins(self.pool, self.stats, self.options.scheduler.throttle_ms)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.holder = EngineHolder(engine_factory, self._status_changed)
        self.roots: list[str] = []  # workspace folders, once each, longest first (path_of)
        # Ids this server gave out (inline items, edit predictions), newest last, bounded: the
        # acceptance counters count only these, each once (a client bug cannot inflate them).
        self.issued: OrderedDict[str, set[str]] = OrderedDict()  # id -> the events counted for it
        self._refused_messages: set[str] = set()  # engine refusals already logged (once each)
        self.workspace_index = WorkspaceIndex(on_status=self._status_changed)  # the repository memory
        self.next_edits = next_edits.NextEdits()  # the edit memory (dlm/editPrediction)
        self.last: dict[str, dict] = {}  # uri -> last suggestion (for editPrediction reuse + prefix cache)
        self.type_through: dict[str, dict] = {}  # uri -> the shown insertion (typing through it)
        self.recent: dict[str, gate.RecentEdits] = {}  # uri -> lines typed recently (confidence gate)
        self._ids = itertools.count(1)
        self._last_status_at = 0.0
        self.last_trigger: dict | None = None  # the last explicit trigger: {shown, reason} (dlm/status)
        self.last_confidence: float | None = None  # of the last answer the gate judged
        self._initialized = False
        # The text windows for the engine's budget (context.windows_for), kept until the budget
        # changes: a remote engine may reconnect to a server whose model takes another context.
        self._windows: tuple[LayoutBudget, context.Windows] | None = None

    # ---- transport: our framing (lsp.framing) resynchronises after a bad frame --------------------
    def start_io(self, stdin=None, stdout=None) -> None:
        framing.serve_stdio(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> None:
        framing.serve_tcp(self, host, port)

    # ---- status -----------------------------------------------------------------------------------
    def _status_changed(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.send_status)

    def status_payload(self) -> dict:
        """dlm/status: `state` is the model's; `index` the workspace index's (lsp.workspace_index);
        `ready` is true once both are done (the model answers, the index is built or loaded, or
        it failed or is off: `index` says which) and `text` is the line an editor shows."""
        st = self.holder.status
        c = self.stats.counts
        index = self.workspace_index.status()
        return {
            "ready": st.state == "ready" and index["state"] not in INDEX_BUSY,
            "text": status_text(st.state, st.message, index),
            "state": st.state,
            "device": st.device,
            "model": st.model,
            "message": st.message,
            "p50_ms": self.stats.p(50),
            "p95_ms": self.stats.p(95),
            "requests": c["requests"],
            "accepted": c["accepted"],
            "shown": c["shown"],
            **self.stats.held_back(),
            "index": index,
            "trigger": self.last_trigger,
        }

    def send_status(self) -> None:
        # after `shutdown` the client takes nothing but the `exit` reply's silence: a status sent then
        # would meet a closed pipe once `exit` has closed it, and pygls reports that as an error
        if not self._initialized or self.protocol._shutdown:
            return
        self._last_status_at = time.monotonic()
        try:
            self.protocol.notify(STATUS, self.status_payload())
        except Exception:  # a client that went away must not take the loader thread down
            log.debug("could not send dlm/status", exc_info=True)

    def maybe_send_status(self) -> None:
        if time.monotonic() - self._last_status_at >= self.options.status_interval_s:
            self.send_status()

    # ---- configuration ----------------------------------------------------------------------------
    def configure(self, options: Options, position_encoding: str, roots: list[str]) -> None:
        self.options = options
        self._windows = None
        self.documents = Documents(position_encoding, options.max_syntax_chars)
        self.scheduler.throttle_s = options.scheduler.throttle_ms / 1000.0
        self.next_edits.configure(options.next_edits)
        self.set_roots(roots)

    def set_roots(self, roots: list[str]) -> None:
        """Keep each workspace folder once, longest first: a client may add the same folder any
        number of times, and path_of runs on every request."""
        self.roots = sorted({r.rstrip("/") or "/" for r in roots if r}, key=len, reverse=True)

    def windows(self, budget: LayoutBudget) -> context.Windows:
        """The text windows that fill the engine's layout (local and remote engines alike)."""
        if self._windows is None or self._windows[0] != budget:
            win = context.windows_for(budget, self.options.context)
            self._windows = (budget, win)
            log.info("model context %d tokens: windows of %d prefix, %d suffix, %d history characters",
                     budget.max_context, win.prefix_chars, win.suffix_chars, win.history_chars)
        return self._windows[1]

    # ---- helpers ----------------------------------------------------------------------------------
    def path_of(self, uri: str) -> str:
        parsed = urlparse(uri)
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        for root in self.roots:  # longest first: the innermost folder names the path
            if path.startswith(root.rstrip("/") + "/"):
                return limits.bound_path(path[len(root.rstrip("/")) + 1 :])
        return limits.bound_path(path.rsplit("/", 1)[-1])

    def sampler_params(self) -> SamplerParams:
        try:
            return SamplerParams(**self.options.sampler)
        except (TypeError, ValueError) as exc:
            log.warning("bad sampler options %s (%s); using defaults", self.options.sampler, exc)
            return SamplerParams()

    def next_id(self) -> str:
        """A fresh id for a suggestion the client may show and accept (remembered: `counts`)."""
        item_id = str(next(self._ids))
        self.issued[item_id] = set()
        while len(self.issued) > MAX_REMEMBERED_ITEMS:
            self.issued.popitem(last=False)
        return item_id

    def counts(self, event: str, item_id: Any) -> bool:
        """Count `event` (shown, accepted, partially_accepted) for a suggestion id, when this
        server issued the id and the event was not counted for it yet; else log and ignore."""
        key = str(item_id) if isinstance(item_id, (str, int)) and not isinstance(item_id, bool) else None
        seen = self.issued.get(key) if key is not None else None
        if seen is None:
            log.debug("%s for an id this server did not issue (%.40r); not counted", event, item_id)
            return False
        if event in seen:
            return False
        seen.add(event)
        self.stats.add(event)
        return True

    async def predict(self, doc: Document, row: int, col: int, mode: str) -> dict | None:
        """Run the model (latest wins) and post-process; None when there is nothing to show."""
        t0 = time.monotonic()
        self.stats.add("requests")
        if not self.holder.ready():
            self.stats.add("empty")
            return None
        engine = self.holder.engine
        windows = self.windows(engine.budget)
        version, uri, params, path = doc.version, doc.uri, self.sampler_params(), self.path_of(doc.uri)
        deadline = gate.deadline_at(doc.last_change_at, t0, self.options.deadline_ms)
        opts = self.options.context

        def start(cancel) -> Future | None:
            # Runs when the job starts, after latest-wins: a superseded or joining request
            # builds no context.
            t_start = time.monotonic()
            built = context.build(doc, row, col, mode, opts, windows, path)
            if built is None:
                return None
            # path, language and history entries are cut to coder_model.limits before any tokenizer
            built = replace(built, prompt=limits.bound_fields(built.prompt))
            memory, rel = self.memory_for(doc, built)
            ctx_ms = (time.monotonic() - t_start) * 1000
            if memory is None:
                return engine_future(engine, self.pool, built, ctx_ms, params, cancel, deadline, self.refused)
            # The memory's proposals are computed on a pool thread (a first query can take tens of
            # ms), then the engine's denoiser checks them (coder_model.verify).
            out: Future = Future()
            opened = self.workspace_index.open_files(file_path(uri) or "")
            opened.pop(rel, None)  # this document is the memory's first level, from the text below
            before, after = text_around(doc, row, col)

            def propose() -> None:
                # The indexer waits from here until the model's step ends too: its Python work
                # would otherwise take the GIL between the step's torch calls, each time for a
                # whole switch interval.
                end = self.workspace_index.begin_prediction()
                out.add_done_callback(lambda _: end())
                try:
                    t_memory = time.monotonic()
                    proposals = memory_proposals(memory, before, after, rel, opened)
                    self.stats.stage("memory_ms", (time.monotonic() - t_memory) * 1000)
                    if cancel.cancelled:
                        out.set_result(None)
                        return
                    # typing: snippets of other files in the layout's snippet sections too
                    with_memory = context.with_snippets(built, memory, rel)
                    with_memory = replace(with_memory, prompt=replace(with_memory.prompt, proposals=proposals))
                    inner = engine_future(engine, self.pool, with_memory, ctx_ms, params, cancel, deadline,
                                          self.refused)
                    chain(inner, out)
                except Exception as exc:  # a memory failure costs this keystroke, never the server
                    if not out.done():
                        out.set_exception(exc)

            self.pool.submit(propose)
            return out

        def valid() -> bool:
            return self.documents.get(uri) is doc and doc.version == version

        ran = await self.scheduler.submit(
            uri, (version, row, col), None, valid, self.options.scheduler.timeout_ms / 1000.0, start=start
        )
        if ran is None or ran.prediction.cancelled:
            self.stats.add("empty")
            return None
        built, pred, t_ctx_ms = ran.built, ran.prediction, ran.context_ms
        prompt = built.prompt
        if not valid():  # finished, but the document moved on: never show it
            self.stats.add("outdated")
            return None
        t_model = time.monotonic()
        sugg = postprocess.suggest(prompt.region, prompt.cursor, pred.text, prompt.suffix, prompt.prefix)
        broken = self.breaks_syntax(doc, row, col, sugg)
        t_post = time.monotonic()
        late = pred.late or t_post > deadline  # the engine's word, or the time it took to get here
        if late:
            self.stats.add("late")
        self.stats.add("completed")
        self.stats.add("steps", pred.steps)
        self.stats.add("tokens", pred.tokens)
        if pred.steps == 0:
            # No model work (no time left for a step): a latency for it would be a lie.
            self.stats.add("no_steps")
        else:
            self.stats.latency((t_post - t0) * 1000)
            self.stats.stage("context_ms", t_ctx_ms)
            self.stats.stage("queue_ms", pred.queue_ms)
            self.stats.stage("prefill_ms", pred.prefill_ms)
            self.stats.stage("denoise_ms", pred.denoise_ms)
            # the model's part of the answer (the latency Target's quantity): queue, prefill, denoising
            self.stats.stage("model_ms", pred.queue_ms + pred.prefill_ms + pred.denoise_ms)
            self.stats.stage("wait_ms", (t_model - t0) * 1000 - t_ctx_ms - pred.total_ms)
            self.stats.stage("postprocess_ms", (t_post - t_model) * 1000)
            # the server's own time on the request: all but the model's queue, prefill and denoising
            self.stats.stage("overhead_ms", (t_post - t0) * 1000 - pred.total_ms)
        log.debug(
            "run %s v%d %s: %.1f ms (ctx %.1f, prefill %.1f, denoise %.1f) steps %d tokens %d "
            "context %d cached %d region %d chars",
            doc.uri.rsplit("/", 1)[-1], version, built.mode, (t_post - t0) * 1000, t_ctx_ms,
            pred.prefill_ms, pred.denoise_ms, pred.steps, pred.tokens, pred.context_tokens,
            pred.cached_tokens, len(prompt.region),
        )  # fmt: skip
        if broken:  # accepting it would break the code (lsp.syntax_check): never shown
            self.stats.add("held_back_syntax")
            log.info("held back an insertion that %s: %.80r", broken, sugg.insert_text)
            sugg.insert_text, sugg.replace_end = "", None
        self.maybe_send_status()
        if sugg.empty:
            self.stats.add("empty")
        if sugg.held_back:  # degenerate filler (coder_model.degenerate): never shown
            self.stats.add("held_back_degenerate")
            log.info("held back a degenerate answer (%s)", sugg.held_back)
        recent = self.recent.get(uri)

        def rewrites_recent(spans: list[tuple[int, int]]) -> bool:
            lines = gate.replaced_lines(prompt.region, built.start_line, spans)
            return recent is not None and recent.touches(lines, t_post)

        inline_spans = [(prompt.cursor, sugg.replace_end)] if sugg.replace_end is not None else []
        result = {
            "version": version, "row": row, "col": col, "built": built, "sugg": sugg,
            "confidence": pred.confidence, "late": late,
            # the memory's proposals the check let through, best first (inline_alternatives)
            "proposal_confidences": getattr(pred, "proposal_confidences", ()),
            "inline_rewrites_recent": rewrites_recent(inline_spans),
            "edits_rewrite_recent": rewrites_recent([(e.start, e.end) for e in sugg.edits]),
        }  # fmt: skip
        self.last[uri] = result
        return result

    def breaks_syntax(self, doc: Document, row: int, col: int, sugg: postprocess.Suggestion) -> str | None:
        """Why accepting the inline insertion would break the document's syntax, or None
        (lsp.syntax_check; on the event loop, the document as the request saw it: a window of
        it is parsed, well under the model's time). A failure of the check shows the insertion."""
        if not sugg.insert_text:
            return None
        t0 = time.monotonic()
        try:
            return syntax_problem(doc, row, col, sugg)
        finally:
            self.stats.stage("syntax_ms", (time.monotonic() - t0) * 1000)

    def report_trigger(self, uri: str, got: types.InlineCompletionList, before: dict) -> None:
        """After an explicit trigger: dlm/status `trigger` {shown, reason}, sent now (the editor
        may say why nothing came). The reason is what this request counted (lsp.stats)."""
        if got.items:
            self.last_trigger = {"shown": True, "reason": ""}
        else:
            counted = {k for k, v in self.stats.counts.items() if v > before.get(k, 0)}
            if self.documents.get(uri) is None:
                reason = ("this document is not open in the server (never opened, or over "
                          "maxDocumentChars): reopen it, or raise maxDocumentChars")
            else:
                reason = next((TRIGGER_REASONS[k] for k in TRIGGER_REASONS if k in counted),
                              "no answer: the request was superseded, or the model is not ready (see dlm/status)")
                if any(k.startswith("gated_") for k in counted) and self.last_confidence is not None:
                    reason += f" (confidence {self.last_confidence:.2f}, gate {self.options.min_confidence:.2f})"
            self.last_trigger = {"shown": False, "reason": reason}
        self.send_status()

    def proposes(self, res: dict | None, what: str) -> bool:
        """Did a completed run propose something of this kind (an insertion, edits)? A run that
        proposed nothing is counted as `no_change`, so every completed run has an outcome."""
        if res is None:
            return False
        if not getattr(res["sugg"], what):
            self.stats.add("no_change")
            return False
        return True

    def memory_for(self, doc: Document, built: context.BuiltContext):
        """(the repository memory, the file's path in it) for an inline request while typing, or
        (None, ""): no index yet, the file is in no indexed root, or a wide (edit) request."""
        if built.mode != "typing" or not self.options.index.enabled:
            return None, ""
        path = file_path(doc.uri)
        if path is None:
            return None, ""
        return self.workspace_index.memory_for(path)

    def refused(self, exc: ValueError) -> None:
        """An engine refused a request: one warning per distinct reason (no traceback: it is a
        setting, not a crash), then the keystrokes go on with no suggestion."""
        self.stats.add("refused")
        message = str(exc)
        if message not in self._refused_messages and len(self._refused_messages) < 64:
            self._refused_messages.add(message)
            log.warning("the model refused a request: %s; check the sampler options "
                        "(initializationOptions.sampler)", message)

    def gate(self, res: dict, rewrites_recent: bool) -> bool:
        """Show this result? (lsp.gate); counts what it holds back by reason."""
        self.last_confidence = res["confidence"]
        verdict = gate.decide(res["confidence"], rewrites_recent, res["late"], self.options.min_confidence,
                              self.options.min_confidence_rewrite_recent)
        self.stats.add("offered" if verdict.show else f"gated_{verdict.reason}")
        return verdict.show

    def remember_item(self, doc: Document, row: int, col: int, text: str, insertion: bool) -> str:
        """Keep a shown inline item (for the accept command) and, for a pure insertion, what
        the user may type through without a model call; returns the item's id."""
        item_id = self.next_id()
        if insertion:
            line = doc.line(row)
            self.type_through[doc.uri] = {
                "row": row, "before": line[:col], "after": line[col:], "text": text,
            }  # fmt: skip
        return item_id

    def from_type_through(self, doc: Document, row: int, col: int) -> str | None:
        """The rest of a shown suggestion the user is typing through, or None."""
        if not self.options.scheduler.type_through:
            return None
        entry = self.type_through.get(doc.uri)
        if entry is None or entry["row"] != row:
            return None
        line = doc.line(row)
        before, after, text = entry["before"], entry["after"], entry["text"]
        if not line[:col].startswith(before) or line[col:] != after:
            return None
        typed = line[len(before) : col]
        if not typed or not text.startswith(typed) or len(typed) >= len(text):
            return None
        return text[len(typed) :]

    def alternatives_through(self, doc: Document, row: int, col: int) -> list[tuple[str, dict | None]]:
        """While typing through the first item (`from_type_through`): the rest of each
        alternative listed with it that starts with what is typed, in their order."""
        entry = self.type_through.get(doc.uri)
        if entry is None:
            return []
        typed = doc.line(row)[len(entry["before"]) : col]
        return [(t[len(typed) :], d) for t, d in entry.get("alternatives", ())
                if t.startswith(typed) and len(t) > len(typed)]

    def inline_item(
        self, doc: Document, row: int, col: int, text: str, end: types.Position | None, data: dict | None = None
    ) -> types.InlineCompletionItem:
        item_id = self.remember_item(doc, row, col, text, insertion=end is None)
        if end is None:  # typing through it shows the rest with the same data
            self.type_through[doc.uri]["data"] = data
        return convert.inline_item(doc, row, col, text, end, item_id, data)

    def inline_items(
        self, doc: Document, row: int, col: int, text: str, end: types.Position | None, data: dict | None,
        alternatives: list[tuple[str, dict | None]],
    ) -> list[types.InlineCompletionItem]:
        """The inline list: the first item (`inline_item`), then the alternatives to it (pure
        insertions at the cursor, each with its own id and data). Typing through the first item
        keeps the alternatives that start with what is typed (`from_type_through`)."""
        first = self.inline_item(doc, row, col, text, end, data)
        if end is not None or not alternatives:
            return [first]
        self.type_through[doc.uri]["alternatives"] = alternatives
        return [first, *(convert.inline_item(doc, row, col, t, None, self.next_id(), d) for t, d in alternatives)]

    def inline_alternatives(self, doc: Document, row: int, col: int, res: dict) -> list[tuple[str, dict]]:
        """The alternatives to the first inline item (module `inline_alternatives`), each with
        its data (its own confidence); their time is the `alternatives_ms` stage."""
        t0 = time.monotonic()
        found = inline_alternatives(doc, row, col, res, self.options)
        if res.get("proposal_confidences"):
            self.stats.stage("alternatives_ms", (time.monotonic() - t0) * 1000)
        return [(text, convert.suggestion_data(confidence, False)) for text, confidence in found]


@dataclass(frozen=True)
class Ran:
    """A model run's context and its prediction (one per job, shared by the requests that joined it)."""

    built: context.BuiltContext
    prediction: Prediction
    context_ms: float


def engine_future(engine: Engine, pool: ThreadPoolExecutor, built: context.BuiltContext, context_ms: float,
                  params: SamplerParams, cancel, deadline: float, refused: Callable[[ValueError], None]) -> Future:
    """A Future of the Ran for `built` (None when the engine refused the request: `refused` is
    told why): queued straight on an engine that has its own inference queue (`submit`:
    LocalEngine, FamilyEngine), else run on a pool thread (RemoteEngine, whose predict watches
    its own deadline and cancel while the server works)."""
    submit = getattr(engine, "submit", None)
    inner = (submit(built.prompt, params, cancel, deadline) if submit is not None
             else pool.submit(engine.predict, built.prompt, params, cancel, deadline))
    out: Future = Future()

    def done(f: Future) -> None:
        exc = f.exception()
        if isinstance(exc, ValueError):  # the model cannot take this request (e.g. blocks past its length)
            refused(exc)
            out.set_result(None)
        elif exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(Ran(built, f.result(), context_ms))

    inner.add_done_callback(done)
    return out


MAX_INLINE_ITEMS = 3  # the inline list: the answer and up to two alternatives (inline_alternatives)


def syntax_problem(doc: Document, row: int, col: int, sugg: postprocess.Suggestion) -> str | None:
    """Why accepting `sugg`'s inline text would break the document's syntax (lsp.syntax_check),
    or None; a failure of the check (a grammar edge case) lets the text through."""
    try:
        language = language_name(doc.language_id, doc.uri)
        root = doc.syntax.tree().root_node if doc.syntax is not None else None  # the context parsed it
        replaces = sugg.replace_end is not None
        return syntax_check.check(language, doc.lines, row, col, sugg.insert_text, replaces, root)
    except Exception:  # a grammar edge case must not cost the suggestion
        log.exception("syntax check failed at row %d, column %d", row, col)
        return None


def inline_alternatives(doc: Document, row: int, col: int, res: dict,
                        options: Options) -> list[tuple[str, float]]:
    """The other proposals of the repository memory the model's check let through, as
    (insertion, confidence), best first, at most MAX_INLINE_ITEMS - 1, for the result `res` of
    DlmServer.predict whose first item is shown. They cost no model pass of their own: the check
    scored every proposal in the passes that chose the first (Prediction.proposal_confidences).

    Each passes the first item's filters: the inline post-processing (degenerate answers held
    back), the gate with its own confidence, no secret put on the cursor's line, the syntax
    check. None repeats the text of an item listed before it, or only its beginning (accepting
    a part of that item gives as much). Only a pure insertion at the cursor has alternatives;
    the shown/held-back counters stay the first item's."""
    ranked = res.get("proposal_confidences") or ()
    sugg, prompt = res["sugg"], res["built"].prompt
    if len(ranked) < 2 or sugg.replace_end is not None or not sugg.insert_text:
        return []
    proposed = {p.text for p in prompt.proposals}  # only what the memory proposed for this prompt
    line = doc.line(row)
    listed, out = [sugg.insert_text], []
    for text, confidence in ranked:
        if len(out) >= MAX_INLINE_ITEMS - 1:
            break
        if text not in proposed:
            continue
        if not gate.decide(confidence, False, res["late"], options.min_confidence,
                           options.min_confidence_rewrite_recent).show:
            continue
        new = prompt.region[: prompt.cursor] + text + prompt.region[prompt.cursor :]
        alt = postprocess.suggest(prompt.region, prompt.cursor, new, prompt.suffix, prompt.prefix)
        ins = alt.insert_text
        if alt.held_back or not ins or alt.replace_end is not None or alt.edits:
            continue
        if any(item.startswith(ins) for item in listed):
            continue
        if secrets.inserted_secret(line[:col], ins, line[col:]):
            continue
        problem = syntax_problem(doc, row, col, alt)
        if problem:
            log.debug("held back an alternative that %s: %.80r", problem, ins)
            continue
        listed.append(ins)
        out.append((ins, confidence))
    return out


MEMORY_BEAM = 8  # the memory's beam (DESIGN §10: a beam of 8 held the answer 26.5%, its first 19.0%)
VERIFIED = 4  # proposals the denoiser checks per request: each costs its slots in every pass


MEMORY_LINES = 4000  # lines of the document on each side of the cursor the memory reads as this file


def text_around(doc: Document, row: int, col: int) -> tuple[str, str]:
    """The document before and after the cursor, up to MEMORY_LINES lines each way (taken on the
    event loop: the document changes there)."""
    lines = doc.lines
    line = lines[row]
    before = "".join(lines[max(0, row - MEMORY_LINES) : row]) + line[:col]
    after = line[col:] + "".join(lines[row + 1 : row + 1 + MEMORY_LINES])
    return before, after


def memory_proposals(memory, before: str, after: str, rel_path: str,
                     open_files: dict[str, str]) -> tuple[MemoryProposal, ...]:
    """The memory's whole-line insertions at the cursor (coder_model.memory.RepoMemory.complete)."""
    found = memory.complete(before, after, path=rel_path, beam=MEMORY_BEAM, open_files=open_files,
                            exclude_path=rel_path)
    return tuple(MemoryProposal(c.text, c.score) for c in found if c.text)[:VERIFIED]


def chain(inner: Future, out: Future) -> None:
    """Resolve `out` with `inner`'s outcome."""

    def done(f: Future) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result())

    inner.add_done_callback(done)


# ---- handlers: one per LSP method -----------------------------------------------------------------


def initialize(ls: DlmServer, params: types.InitializeParams) -> None:
    ls.loop = asyncio.get_running_loop()
    options, problems = parse_options(params.initialization_options)
    for p in problems:
        log.warning("initializationOptions: %s", p)
    enc = str(getattr(ls.workspace.position_encoding, "value", ls.workspace.position_encoding))
    general = params.capabilities.general if params.capabilities else None
    ours = positions.choose_encoding(general.position_encodings if general else None)
    if ours != enc:  # pygls announces its choice; the documents must count in the announced one
        log.warning("position encoding: pygls announced %s where lsp.positions chooses %s; using %s", enc, ours, enc)
    roots = [f.uri for f in params.workspace_folders or []]  # set_roots keeps each once
    if params.root_uri:
        roots.append(params.root_uri)
    ls.configure(options, enc, [unquote(urlparse(r).path) for r in roots])


def initialized(ls: DlmServer, params: types.InitializedParams) -> None:
    ls._initialized = True
    # The index starts now, not at initialize: its progress is a request to the client.
    caps, index = ls.client_capabilities, ls.workspace_index
    index.configure(ls.options.index)
    index.on_progress = IndexProgress(ls.protocol, ls.loop, client_supports_progress(caps))
    if ls.options.index.enabled and client_supports_watching(caps):
        index.watching = True  # until the client says otherwise: no rescans to race the registration
        watch_files(ls.protocol, index.set_watching)
    index.set_roots(index_roots(ls))
    next_edits.start(ls, index_roots(ls))
    ls.send_status()


def index_roots(ls: DlmServer) -> list[str]:
    """The folders to index: the workspace folders (else the root) as pygls tracks them, file:
    URIs only (a folder of another scheme is not on this disk)."""
    folders = [f.uri for f in ls.workspace.folders.values()]
    uris = folders or ([ls.workspace.root_uri] if ls.workspace.root_uri else [])
    return [p for uri in uris if (p := file_path(uri)) is not None]


def shutdown(ls: DlmServer, params: Any) -> None:
    # Stop running predictions so that exit does not wait for a model run to finish.
    for doc in list(ls.documents):
        ls.scheduler.forget(doc.uri)
    try:
        ls.holder.close()
    except Exception:  # the client is waiting for the shutdown reply: log, don't fail it
        log.exception("engine.close() failed")
    ls.pool.shutdown(wait=False, cancel_futures=True)
    ls.next_edits.close()  # the git miners' process groups
    ls.workspace_index.close()  # saves the index if it changed, releases its lock


def workspace_did_change_workspace_folders(ls: DlmServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    removed = {unquote(urlparse(f.uri).path).rstrip("/") or "/" for f in params.event.removed}
    added = [unquote(urlparse(f.uri).path) for f in params.event.added]
    ls.set_roots([r for r in ls.roots if r not in removed] + added)
    ls.workspace_index.set_roots(index_roots(ls))


def workspace_did_change_watched_files(ls: DlmServer, params: types.DidChangeWatchedFilesParams) -> None:
    changes = [(path, int(c.type)) for c in params.changes if (path := file_path(c.uri))]
    ls.workspace_index.files_changed(changes)


def text_document_did_open(ls: DlmServer, params: types.DidOpenTextDocumentParams) -> None:
    td = params.text_document
    if len(td.text) > ls.options.max_document_chars:
        log.warning("%s has %d characters, over max_document_chars; not tracked", td.uri, len(td.text))
        return
    forget_results(ls, td.uri)  # a re-open may reuse a version number: nothing from before counts
    doc = ls.documents.open(td.uri, td.text, td.version, limits.bound_language(td.language_id))
    doc.history = History(ls.path_of(td.uri), ls.options.history)
    index_buffer(ls, doc)


def text_document_did_change(ls: DlmServer, params: types.DidChangeTextDocumentParams) -> None:
    t0 = time.perf_counter()
    apply_changes(ls, params)
    ls.stats.stage("did_change_ms", (time.perf_counter() - t0) * 1000)  # the server's own work per keystroke


def apply_changes(ls: DlmServer, params: types.DidChangeTextDocumentParams) -> None:
    uri, version = params.text_document.uri, params.text_document.version
    doc = ls.documents.get(uri)
    if doc is None:
        log.warning("didChange for %s, which is not open; send didOpen first (ignored)", uri)
        return
    recent = ls.recent.setdefault(uri, gate.RecentEdits(ls.options.recent_edit_s))
    for change in params.content_changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            r = change.range
            applied = doc.apply((r.start.line, r.start.character), (r.end.line, r.end.character), change.text, version)
        else:
            applied = doc.replace_all(change.text, version)
        recent.record(applied)
        next_edits.record(ls, doc, applied)  # the edit memory (lsp.next_edits)
    ls.scheduler.invalidate(uri)
    ls.last.pop(uri, None)  # results are for the text before this change
    index_buffer(ls, doc)
    if doc.size > ls.options.max_document_chars:
        log.warning("%s grew over max_document_chars; no longer tracked", uri)
        ls.documents.close(uri)
        ls.scheduler.forget(uri)


def text_document_did_close(ls: DlmServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.documents.close(uri)
    forget_results(ls, uri)
    if (path := file_path(uri)) is not None:
        ls.workspace_index.buffer_closed(path)


def text_document_did_save(ls: DlmServer, params: types.DidSaveTextDocumentParams) -> None:
    doc = ls.documents.get(params.text_document.uri)
    if doc is not None and (path := file_path(doc.uri)) is not None:
        ls.workspace_index.buffer_saved(path, lambda: doc.text)


def index_buffer(ls: DlmServer, doc: Document) -> None:
    """An open buffer's text goes into the workspace index (debounced there)."""
    if (path := file_path(doc.uri)) is not None:
        ls.workspace_index.buffer_changed(path, doc.size, lambda: doc.text)


def forget_results(ls: DlmServer, uri: str) -> None:
    """Drop the running prediction and the kept results of a document (closed, or re-opened)."""
    ls.scheduler.forget(uri)
    ls.last.pop(uri, None)
    ls.type_through.pop(uri, None)
    ls.recent.pop(uri, None)
    ls.next_edits.forget(uri)  # its open edit (lsp.next_edits); the patterns stay, for other buffers


async def text_document_inline_completion(ls: DlmServer, params: types.InlineCompletionParams):
    context_ = getattr(params, "context", None)
    if getattr(context_, "trigger_kind", None) == types.InlineCompletionTriggerKind.Invoked:
        # The explicit trigger answers or says why not: dlm/status `trigger` (sent at once)
        before = dict(ls.stats.counts)
        got = await inline_completion(ls, params)
        ls.report_trigger(params.text_document.uri, got, before)
        return got
    return await inline_completion(ls, params)


async def inline_completion(ls: DlmServer, params: types.InlineCompletionParams):
    empty = types.InlineCompletionList(items=[])
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return empty
    if doc.binary:  # a binary file opened as text: nothing to complete (the index skips them too)
        ls.stats.add("requests")
        ls.stats.add("binary")
        return empty
    row, col = doc.clamp(params.position.line, params.position.character)
    rest = ls.from_type_through(doc, row, col)
    if rest is not None:
        ls.stats.add("cache_hits")
        ls.stats.add("requests")
        data = ls.type_through[doc.uri].get("data")
        items = ls.inline_items(doc, row, col, rest, None, data, ls.alternatives_through(doc, row, col))
        return types.InlineCompletionList(items=items)
    res = await ls.predict(doc, row, col, context.choose_mode(doc, row, ls.options.context, col=col))
    if not ls.proposes(res, "insert_text") or not ls.gate(res, res["inline_rewrites_recent"]):
        return empty
    sugg, built = res["sugg"], res["built"]
    end = convert.replace_end(doc, built, sugg)
    data = convert.suggestion_data(res["confidence"], res["inline_rewrites_recent"])
    alternatives = ls.inline_alternatives(doc, row, col, res)
    return types.InlineCompletionList(items=ls.inline_items(doc, row, col, sugg.insert_text, end, data,
                                                            alternatives))


async def text_document_completion(ls: DlmServer, params: types.CompletionParams):
    empty = types.CompletionList(is_incomplete=True, items=[])
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return empty
    row, col = doc.clamp(params.position.line, params.position.character)
    res = await ls.predict(doc, row, col, "typing")
    if not ls.proposes(res, "insert_text") or not ls.gate(res, res["inline_rewrites_recent"]):
        return empty
    data = convert.suggestion_data(res["confidence"], res["inline_rewrites_recent"])
    return convert.completion_list(doc, row, col, res["built"], res["sugg"], data)


async def dlm_edit_prediction(ls: DlmServer, params: Any):
    uri = convert.document_uri(params)
    doc = ls.documents.get(uri) if uri is not None else None
    if doc is None or not ls.options.edit_predictions:  # off until the model earns them (README)
        return None
    row, col = doc.clamp(*convert.position_of(params))
    if ls.options.next_edits.enabled:
        try:
            found = await next_edits.propose(ls, doc, row, col)
        except Exception:  # the edit memory costs this request, never the server
            log.exception("edit memory: no proposal for %s", uri)
            found = None
        if found is not None:
            ls.stats.add("offered")
            return found
        if not ls.options.next_edits.model_fallback:
            return None
    return await model_edit_prediction(ls, doc, row, col)


async def model_edit_prediction(ls: DlmServer, doc: Document, row: int, col: int):
    """The model's wide rewrite of the region around the cursor as edits (nextEdits.modelFallback)."""
    uri = doc.uri
    last = ls.last.get(uri)
    if last is not None and (last["version"], last["row"], last["col"]) == (doc.version, row, col):
        res = last  # the inline request at this position already ran the model
    else:
        res = await ls.predict(doc, row, col, "wide")
    if not ls.proposes(res, "edits") or not ls.gate(res, res["edits_rewrite_recent"]):
        return None
    out = convert.edit_prediction(doc, res["built"], res["sugg"], res["version"], ls.next_id())
    out.update(convert.suggestion_data(res["confidence"], res["edits_rewrite_recent"]))
    return out


def dlm_stats(ls: DlmServer, params: Any) -> dict:
    out = ls.stats.snapshot()
    out["documents"] = len(ls.documents)
    out["pending_futures"] = ls.protocol.pending_futures  # pygls' request table (bounded: lsp.pygls_protocol)
    out["state"] = ls.holder.status.state
    out["workspace_folders"] = len(ls.roots)
    out["index"] = ls.workspace_index.status()
    out["trigger"] = ls.last_trigger  # the last explicit trigger: {shown, reason} (also in dlm/status)
    return out


def text_document_did_show_completion(ls: DlmServer, params: Any) -> None:
    ls.counts("shown", convert.command_item_id(params))


def text_document_did_partially_accept_completion(ls: DlmServer, params: Any) -> None:
    ls.counts("partially_accepted", convert.command_item_id(params))


def workspace_execute_command_accept(ls: DlmServer, *args: Any) -> None:
    # arguments: [item id, data?] (convert.inline_item, copilot_nes); anything else is not ours
    if ls.counts("accepted", args[0] if args else None):
        ls.maybe_send_status()


# ---- Copilot's next-edit methods (lsp.copilot_nes): dlm/editPrediction in Copilot's shape -------


async def copilot_inline_edit(ls: DlmServer, params: Any) -> dict:
    uri = convert.document_uri(params)
    doc = ls.documents.get(uri) if uri is not None else None
    asked = copilot_nes.requested_version(params)
    if doc is None or (asked is not None and asked != doc.version):
        return copilot_nes.no_edits()
    return copilot_nes.inline_edits(doc, await dlm_edit_prediction(ls, params), asked)


def text_document_did_show_inline_edit(ls: DlmServer, params: Any) -> None:
    ls.counts("shown", convert.command_item_id(params))


def create_server(engine_factory: Callable[[], Engine]) -> DlmServer:
    server = DlmServer(engine_factory)
    server.feature(types.INITIALIZE)(initialize)
    server.feature(types.INITIALIZED)(initialized)
    server.feature(types.SHUTDOWN)(shutdown)
    server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(workspace_did_change_workspace_folders)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(text_document_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(text_document_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(text_document_did_close)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE)(text_document_did_save)
    server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)(workspace_did_change_watched_files)
    # InlineCompletionOptions(): without it pygls does not announce the capability (DESIGN §8).
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        text_document_inline_completion
    )
    server.feature(types.TEXT_DOCUMENT_COMPLETION)(text_document_completion)
    server.feature(EDIT_PREDICTION)(dlm_edit_prediction)
    server.feature(next_edits.ACCEPTED_EDIT)(next_edits.accepted_edit)
    server.feature(STATS)(dlm_stats)
    server.feature(DID_SHOW)(text_document_did_show_completion)
    server.feature(DID_PARTIALLY_ACCEPT)(text_document_did_partially_accept_completion)
    server.feature(copilot_nes.COPILOT_INLINE_EDIT)(copilot_inline_edit)
    server.feature(copilot_nes.DID_SHOW_INLINE_EDIT)(text_document_did_show_inline_edit)
    server.command(ACCEPT_COMMAND)(workspace_execute_command_accept)
    return server
