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
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlparse

from dlm.coder_model.types import Engine, LayoutBudget, Prediction, SamplerParams
from dlm.lsp import context, convert, copilot_nes, framing, gate, postprocess
from dlm.lsp.convert import ACCEPT_COMMAND
from dlm.lsp.documents import Document, Documents
from dlm.lsp.engine_holder import EngineHolder
from dlm.lsp.history import History
from dlm.lsp.options import ContextOptions, Options, parse_options
from dlm.lsp.protocol import DlmProtocol
from dlm.lsp.scheduler import Scheduler
from dlm.lsp.stats import Stats
from lsprotocol import types
from pygls.lsp.server import LanguageServer

log = logging.getLogger(__name__)

EDIT_PREDICTION = "dlm/editPrediction"
STATS = "dlm/stats"
STATUS = "dlm/status"
DID_SHOW = "textDocument/didShowCompletion"
DID_PARTIALLY_ACCEPT = "textDocument/didPartiallyAcceptCompletion"
MAX_REMEMBERED_ITEMS = 256


class DlmServer(LanguageServer):
    def __init__(self, engine_factory: Callable[[], Engine], max_workers: int = 8) -> None:
        super().__init__("dlm-lsp", "0.1.0", protocol_cls=DlmProtocol, max_workers=max_workers)
        self.options = Options()
        self.documents = Documents()
        self.stats = Stats()
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dlm-predict")
        self.scheduler = Scheduler(self.pool, self.stats, self.options.scheduler.throttle_ms)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.holder = EngineHolder(engine_factory, self._status_changed)
        self.roots: list[str] = []
        self.items: OrderedDict[str, dict] = OrderedDict()  # shown inline items by id (bounded)
        self.last: dict[str, dict] = {}  # uri -> last suggestion (for editPrediction reuse + prefix cache)
        self.prefix_cache: dict[str, dict] = {}  # uri -> the shown insertion (typing through it)
        self.recent: dict[str, gate.RecentEdits] = {}  # uri -> lines typed recently (confidence gate)
        self._ids = itertools.count(1)
        self._last_status_at = 0.0
        self._initialized = False
        # The windows as configured, and the engine budget they were last fitted to: a remote
        # engine may reconnect to a server whose model takes a different context.
        self._configured_context: ContextOptions = self.options.context
        self._fitted_budget: LayoutBudget | None = None

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
        st = self.holder.status
        c = self.stats.counts
        return {
            "state": st.state,
            "device": st.device,
            "model": st.model,
            "message": st.message,
            "p50_ms": self.stats.p(50),
            "p95_ms": self.stats.p(95),
            "requests": c["requests"],
            "accepted": c["accepted"],
            "shown": c["shown"],
        }

    def send_status(self) -> None:
        if not self._initialized:
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
        self._configured_context = options.context
        self._fitted_budget = None
        self.documents = Documents(position_encoding, options.max_syntax_chars)
        self.scheduler.throttle_s = options.scheduler.throttle_ms / 1000.0
        self.roots = roots

    def fit_windows(self, budget: LayoutBudget) -> None:
        """Keep the windows inside the model's context (local and remote engines alike)."""
        if budget == self._fitted_budget:
            return
        self._fitted_budget = budget
        before = self._configured_context
        self.options.context = context.fit_to_window(
            before, budget.max_context, budget.max_history, budget.max_suffix
        )
        log.info(
            "model context %d tokens: prefix window %d -> %d, suffix %d -> %d (estimated tokens)",
            budget.max_context, before.prefix_tokens, self.options.context.prefix_tokens,
            before.suffix_tokens, self.options.context.suffix_tokens,
        )  # fmt: skip

    # ---- helpers ----------------------------------------------------------------------------------
    def path_of(self, uri: str) -> str:
        parsed = urlparse(uri)
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        for root in sorted(self.roots, key=len, reverse=True):
            if path.startswith(root.rstrip("/") + "/"):
                return path[len(root.rstrip("/")) + 1 :]
        return path.rsplit("/", 1)[-1]

    def sampler_params(self) -> SamplerParams:
        try:
            return SamplerParams(**self.options.sampler)
        except (TypeError, ValueError) as exc:
            log.warning("bad sampler options %s (%s); using defaults", self.options.sampler, exc)
            return SamplerParams()

    def next_id(self) -> str:
        return str(next(self._ids))

    async def predict(self, doc: Document, row: int, col: int, mode: str) -> dict | None:
        """Run the model (latest wins) and post-process; None when there is nothing to show."""
        t0 = time.monotonic()
        self.stats.add("requests")
        if not self.holder.ready():
            self.stats.add("empty")
            return None
        engine = self.holder.engine
        self.fit_windows(engine.budget)
        built = context.build(doc, row, col, mode, self.options.context, self.path_of(doc.uri))
        t_ctx = time.monotonic()
        if built is None:
            self.stats.add("empty")
            return None
        version, uri, params = doc.version, doc.uri, self.sampler_params()
        prompt = built.prompt
        deadline = gate.deadline_at(doc.last_change_at, t0, self.options.deadline_ms)

        def work(cancel) -> Prediction:
            return engine.predict(prompt, params, cancel, deadline)

        def valid() -> bool:
            return self.documents.get(uri) is doc and doc.version == version

        pred = await self.scheduler.submit(
            uri, (version, row, col), work, valid, self.options.scheduler.timeout_ms / 1000.0
        )
        if pred is None or pred.cancelled:
            self.stats.add("empty")
            return None
        if not valid():  # finished, but the document moved on: never show it
            self.stats.add("outdated")
            return None
        t_model = time.monotonic()
        sugg = postprocess.suggest(prompt.region, prompt.cursor, pred.text, prompt.suffix, prompt.prefix)
        t_post = time.monotonic()
        late = pred.late or t_post > deadline  # the engine's word, or the time it took to get here
        if late:
            self.stats.add("late")
        self.stats.add("completed")
        self.stats.add("steps", pred.steps)
        self.stats.add("tokens", pred.tokens)
        self.stats.latency((t_post - t0) * 1000)
        self.stats.stage("context_ms", (t_ctx - t0) * 1000)
        self.stats.stage("queue_ms", pred.queue_ms)
        self.stats.stage("prefill_ms", pred.prefill_ms)
        self.stats.stage("denoise_ms", pred.denoise_ms)
        self.stats.stage("wait_ms", (t_model - t_ctx) * 1000 - pred.total_ms)
        self.stats.stage("postprocess_ms", (t_post - t_model) * 1000)
        log.info(
            "run %s v%d %s: %.1f ms (ctx %.1f, prefill %.1f, denoise %.1f, wait %.1f) steps %d tokens %d "
            "context %d cached %d region %d chars",
            doc.uri.rsplit("/", 1)[-1], version, built.mode, (t_post - t0) * 1000, (t_ctx - t0) * 1000,
            pred.prefill_ms, pred.denoise_ms, (t_model - t_ctx) * 1000 - pred.total_ms, pred.steps,
            pred.tokens, pred.context_tokens, pred.cached_tokens, len(prompt.region),
        )  # fmt: skip
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
            "inline_rewrites_recent": rewrites_recent(inline_spans),
            "edits_rewrite_recent": rewrites_recent([(e.start, e.end) for e in sugg.edits]),
        }  # fmt: skip
        self.last[uri] = result
        return result

    def gate(self, res: dict, rewrites_recent: bool) -> bool:
        """Show this result? (lsp.gate); counts what it holds back by reason."""
        verdict = gate.decide(res["confidence"], rewrites_recent, res["late"], self.options.min_confidence,
                              self.options.min_confidence_rewrite_recent)
        if not verdict.show:
            self.stats.add(f"gated_{verdict.reason}")
        return verdict.show

    def remember_item(self, doc: Document, row: int, col: int, text: str, insertion: bool) -> str:
        """Keep a shown inline item (for the accept command) and, for a pure insertion, what
        the user may type through without a model call; returns the item's id."""
        item_id = self.next_id()
        self.items[item_id] = {"uri": doc.uri, "text": text, "row": row, "col": col}
        while len(self.items) > MAX_REMEMBERED_ITEMS:
            self.items.popitem(last=False)
        if insertion:
            line = doc.line(row)
            self.prefix_cache[doc.uri] = {
                "row": row, "before": line[:col], "after": line[col:], "text": text,
            }  # fmt: skip
        return item_id

    def from_prefix_cache(self, doc: Document, row: int, col: int) -> str | None:
        """The rest of a shown suggestion the user is typing through, or None."""
        if not self.options.scheduler.prefix_cache:
            return None
        entry = self.prefix_cache.get(doc.uri)
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

    def inline_item(
        self, doc: Document, row: int, col: int, text: str, end: types.Position | None, data: dict | None = None
    ) -> types.InlineCompletionItem:
        item_id = self.remember_item(doc, row, col, text, insertion=end is None)
        if end is None:  # typing through it shows the rest with the same data
            self.prefix_cache[doc.uri]["data"] = data
        return convert.inline_item(doc, row, col, text, end, item_id, data)


# ---- handlers: one per LSP method -----------------------------------------------------------------


def initialize(ls: DlmServer, params: types.InitializeParams) -> None:
    ls.loop = asyncio.get_running_loop()
    options, problems = parse_options(params.initialization_options)
    for p in problems:
        log.warning("initializationOptions: %s", p)
    enc = ls.workspace.position_encoding
    roots = [f.uri for f in params.workspace_folders or []]
    if params.root_uri:
        roots.append(params.root_uri)
    ls.configure(options, str(getattr(enc, "value", enc)), [unquote(urlparse(r).path) for r in roots])


def initialized(ls: DlmServer, params: types.InitializedParams) -> None:
    ls._initialized = True
    ls.send_status()


def shutdown(ls: DlmServer, params: Any) -> None:
    # Stop running predictions so that exit does not wait for a model run to finish.
    for doc in list(ls.documents):
        ls.scheduler.forget(doc.uri)
    try:
        ls.holder.close()
    except Exception:  # the client is waiting for the shutdown reply: log, don't fail it
        log.exception("engine.close() failed")
    ls.pool.shutdown(wait=False, cancel_futures=True)


def workspace_did_change_workspace_folders(ls: DlmServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    removed = {unquote(urlparse(f.uri).path) for f in params.event.removed}
    ls.roots = [r for r in ls.roots if r not in removed]
    ls.roots += [unquote(urlparse(f.uri).path) for f in params.event.added]


def text_document_did_open(ls: DlmServer, params: types.DidOpenTextDocumentParams) -> None:
    td = params.text_document
    if len(td.text) > ls.options.max_document_chars:
        log.warning("%s has %d characters, over max_document_chars; not tracked", td.uri, len(td.text))
        return
    forget_results(ls, td.uri)  # a re-open may reuse a version number: nothing from before counts
    doc = ls.documents.open(td.uri, td.text, td.version, td.language_id)
    doc.history = History(ls.path_of(td.uri), ls.options.history)


def text_document_did_change(ls: DlmServer, params: types.DidChangeTextDocumentParams) -> None:
    uri, version = params.text_document.uri, params.text_document.version
    doc = ls.documents.get(uri)
    if doc is None:
        log.warning("didChange for %s, which is not open; send didOpen first (ignored)", uri)
        return
    recent = ls.recent.setdefault(uri, gate.RecentEdits(ls.options.recent_edit_s))
    for change in params.content_changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            r = change.range
            recent.record(
                doc.apply((r.start.line, r.start.character), (r.end.line, r.end.character), change.text, version)
            )
        else:
            recent.record(doc.replace_all(change.text, version))
    ls.scheduler.invalidate(uri)
    ls.last.pop(uri, None)  # results are for the text before this change
    if doc.size > ls.options.max_document_chars:
        log.warning("%s grew over max_document_chars; no longer tracked", uri)
        ls.documents.close(uri)
        ls.scheduler.forget(uri)


def text_document_did_close(ls: DlmServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.documents.close(uri)
    forget_results(ls, uri)


def forget_results(ls: DlmServer, uri: str) -> None:
    """Drop the running prediction and the kept results of a document (closed, or re-opened)."""
    ls.scheduler.forget(uri)
    ls.last.pop(uri, None)
    ls.prefix_cache.pop(uri, None)
    ls.recent.pop(uri, None)


async def text_document_inline_completion(ls: DlmServer, params: types.InlineCompletionParams):
    empty = types.InlineCompletionList(items=[])
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return empty
    row, col = doc.clamp(params.position.line, params.position.character)
    rest = ls.from_prefix_cache(doc, row, col)
    if rest is not None:
        ls.stats.add("cache_hits")
        ls.stats.add("requests")
        data = ls.prefix_cache[doc.uri].get("data")
        return types.InlineCompletionList(items=[ls.inline_item(doc, row, col, rest, None, data)])
    res = await ls.predict(doc, row, col, context.choose_mode(doc, row, ls.options.context))
    if res is None or not res["sugg"].insert_text or not ls.gate(res, res["inline_rewrites_recent"]):
        return empty
    sugg, built = res["sugg"], res["built"]
    end = convert.replace_end(doc, built, sugg)
    data = convert.suggestion_data(res["confidence"], res["inline_rewrites_recent"])
    return types.InlineCompletionList(items=[ls.inline_item(doc, row, col, sugg.insert_text, end, data)])


async def text_document_completion(ls: DlmServer, params: types.CompletionParams):
    empty = types.CompletionList(is_incomplete=True, items=[])
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return empty
    row, col = doc.clamp(params.position.line, params.position.character)
    res = await ls.predict(doc, row, col, "typing")
    if res is None or not res["sugg"].insert_text or not ls.gate(res, res["inline_rewrites_recent"]):
        return empty
    data = convert.suggestion_data(res["confidence"], res["inline_rewrites_recent"])
    return convert.completion_list(doc, row, col, res["built"], res["sugg"], data)


async def dlm_edit_prediction(ls: DlmServer, params: Any):
    uri = convert.document_uri(params)
    doc = ls.documents.get(uri) if uri is not None else None
    if doc is None or not ls.options.edit_predictions:  # off until the model earns them (README)
        return None
    row, col = doc.clamp(*convert.position_of(params))
    last = ls.last.get(uri)
    if last is not None and (last["version"], last["row"], last["col"]) == (doc.version, row, col):
        res = last  # the inline request at this position already ran the model
    else:
        res = await ls.predict(doc, row, col, "wide")
    if res is None or not res["sugg"].edits or not ls.gate(res, res["edits_rewrite_recent"]):
        return None
    out = convert.edit_prediction(doc, res["built"], res["sugg"], res["version"], ls.next_id())
    out.update(convert.suggestion_data(res["confidence"], res["edits_rewrite_recent"]))
    return out


def dlm_stats(ls: DlmServer, params: Any) -> dict:
    out = ls.stats.snapshot()
    out["documents"] = len(ls.documents)
    out["pending_futures"] = ls.protocol.pending_futures  # pygls' request table (bounded: lsp.protocol)
    out["state"] = ls.holder.status.state
    return out


def text_document_did_show_completion(ls: DlmServer, params: Any) -> None:
    ls.stats.add("shown")


def text_document_did_partially_accept_completion(ls: DlmServer, params: Any) -> None:
    ls.stats.add("partially_accepted")


def workspace_execute_command_accept(ls: DlmServer, *args: Any) -> None:
    ls.stats.add("accepted")
    for item_id in args:
        if isinstance(item_id, (str, int)):  # the item's other argument is its data (confidence)
            ls.items.pop(str(item_id), None)
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
    ls.stats.add("shown")


def create_server(engine_factory: Callable[[], Engine]) -> DlmServer:
    server = DlmServer(engine_factory)
    server.feature(types.INITIALIZE)(initialize)
    server.feature(types.INITIALIZED)(initialized)
    server.feature(types.SHUTDOWN)(shutdown)
    server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(workspace_did_change_workspace_folders)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(text_document_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(text_document_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(text_document_did_close)
    # InlineCompletionOptions(): without it pygls does not announce the capability (DESIGN §8).
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        text_document_inline_completion
    )
    server.feature(types.TEXT_DOCUMENT_COMPLETION)(text_document_completion)
    server.feature(EDIT_PREDICTION)(dlm_edit_prediction)
    server.feature(STATS)(dlm_stats)
    server.feature(DID_SHOW)(text_document_did_show_completion)
    server.feature(DID_PARTIALLY_ACCEPT)(text_document_did_partially_accept_completion)
    server.feature(copilot_nes.COPILOT_INLINE_EDIT)(copilot_inline_edit)
    server.feature(copilot_nes.DID_SHOW_INLINE_EDIT)(text_document_did_show_inline_edit)
    server.command(ACCEPT_COMMAND)(workspace_execute_command_accept)
    return server
