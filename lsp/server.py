"""The language server: pygls wiring and thin handlers, one per LSP method (docs/protocol.md).

The server answers `initialize` at once; the engine loads in a background thread
(lsp.engine_holder; which engine: lsp.engine_choice) and, until it is ready (or when it failed
to load), every request returns an empty result, never an error. Handlers read params and call
the modules that do the work: the inline pipeline (lsp.inline) and its list (lsp.inline_items),
dlm/editPrediction (lsp.edit_prediction, lsp.next_edits), the suggestion ids
(lsp.suggestion_ids), dlm/status and dlm/stats (lsp.status_report), Copilot's next-edit methods
(lsp.copilot_nes). Each gets a narrow view of this server (InlineContext, EditContext).

The workspace index (lsp.workspace_index) starts at `initialized` and follows the documents and
workspace/didChangeWatchedFiles and didChangeWorkspaceFolders. Documents are kept by
lsp.documents, not by pygls' workspace: ours keeps a tree-sitter tree and the edit history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlparse

from dlm.coder_model import limits
from dlm.coder_model.types import Engine, LayoutBudget, SamplerParams, traits_of
from dlm.lsp import context, convert, copilot_nes, framing, next_edits, positions, status_report
from dlm.lsp.convert import ACCEPT_COMMAND
from dlm.lsp.documents import Document, Documents
from dlm.lsp.edit_prediction import edit_prediction
from dlm.lsp.engine_choice import choose_engine
from dlm.lsp.engine_holder import EngineHolder
from dlm.lsp.history import History
from dlm.lsp.index_progress import connect as connect_index
from dlm.lsp.inline import InlineContext, InlinePredictor
from dlm.lsp.inline_items import InlineList
from dlm.lsp.latest_wins import LatestWins
from dlm.lsp.memory_ahead import MemoryAhead
from dlm.lsp.options import Options, parse_options
from dlm.lsp.pygls_protocol import DlmProtocol
from dlm.lsp.server_context import ServerContext
from dlm.lsp.stats import Stats
from dlm.lsp.suggestion_ids import SuggestionIds
from dlm.lsp.workspace_index import WorkspaceIndex, file_path
from dlm.lsp.workspace_roots import WorkspaceRoots
from lsprotocol import types
from pygls.lsp.server import LanguageServer

log = logging.getLogger(__name__)

EDIT_PREDICTION = "dlm/editPrediction"
STATS = "dlm/stats"
STATUS = "dlm/status"
DID_SHOW = "textDocument/didShowCompletion"
DID_PARTIALLY_ACCEPT = "textDocument/didPartiallyAcceptCompletion"


class DlmServer(LanguageServer):
    def __init__(self, engine_factory: Callable[[], Engine], max_workers: int = 8,
                 command_line_engine: bool = True) -> None:
        super().__init__("dlm-lsp", "0.1.0", protocol_cls=DlmProtocol, max_workers=max_workers)
        # the command line chose the engine (and the holder started at launch); else `initialize`
        # takes a user-scoped engine from initializationOptions, or the embedded default
        self.command_line_engine = command_line_engine
        self.engine_notes: list[str] = []  # what dlm/status says about the engine's settings
        self.options = Options()
        self.documents = Documents()
        self.stats = Stats()
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dlm-predict")
        self.scheduler = LatestWins(self.pool, self.stats, self.options.scheduler.throttle_ms)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.holder = EngineHolder(engine_factory, self._status_changed)
        self.roots = WorkspaceRoots()  # the workspace folders documents are named by (path_of)
        self.ids = SuggestionIds(self.stats)  # inline items' and edit predictions' ids (acceptance counters)
        self.workspace_index = WorkspaceIndex(on_status=self._status_changed)  # the repository memory
        self.memory_ahead = MemoryAhead(self.pool, self.workspace_index)  # its count of each open document
        self.next_edits = next_edits.NextEdits()  # the edit memory (dlm/editPrediction)
        self.last_trigger: dict | None = None  # the last explicit trigger: {shown, reason} (dlm/status)
        self._last_status_at = 0.0
        self._initialized = False
        # The text windows for the engine's budget (context.windows_for), kept until the budget
        # changes: a remote engine may reconnect to a server whose model takes another context.
        self._windows: tuple[LayoutBudget, context.Windows] | None = None
        # What the keystroke paths use of this server; the settings and the documents through
        # getters, since `initialize` replaces both.
        shared = ServerContext(
            self.holder, self.stats, self.pool, self.workspace_index, lambda: self.options, lambda: self.documents,
            self.roots.path_of, self.ids.next_id, self.windows, self.sampler_params).shared()
        self.edit_context = next_edits.EditContext(**shared, next_edits=self.next_edits)
        self.inline = InlinePredictor(InlineContext(**shared, scheduler=self.scheduler, answered=self.maybe_send_status))
        self.inline_list = InlineList(self.inline, self.ids.next_id)

    # ---- transport: our framing (lsp.framing) resynchronises after a bad frame --------------------
    def start_io(self, stdin=None, stdout=None) -> None:
        framing.serve_stdio(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> None:
        framing.serve_tcp(self, host, port)

    # ---- status (lsp.status_report) ---------------------------------------------------------------
    def _status_changed(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.send_status)

    def status_payload(self) -> dict:
        if traits_of(self.holder.engine).hosted:
            self.holder.refresh()  # the backend's latency as of now
        return status_report.status_payload(self.holder.status, self.stats, self.workspace_index.status(),
                                            self.last_trigger, self.engine_notes)

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
        self.roots.set(roots)

    def windows(self, budget: LayoutBudget) -> context.Windows:
        """The text windows that fill the engine's layout (local and remote engines alike)."""
        if self._windows is None or self._windows[0] != budget:
            win = context.windows_for(budget, self.options.context)
            self._windows = (budget, win)
            log.info("model context %d tokens: windows of %d prefix, %d suffix, %d history characters",
                     budget.max_context, win.prefix_chars, win.suffix_chars, win.history_chars)
        return self._windows[1]

    def sampler_params(self) -> SamplerParams:
        try:
            return SamplerParams(**self.options.sampler)
        except (TypeError, ValueError) as exc:
            log.warning("bad sampler options %s (%s); using defaults", self.options.sampler, exc)
            return SamplerParams()


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
    roots = [f.uri for f in params.workspace_folders or []]  # WorkspaceRoots keeps each once
    if params.root_uri:
        roots.append(params.root_uri)
    ls.configure(options, enc, [unquote(urlparse(r).path) for r in roots])
    client = params.client_info.name if params.client_info is not None else ""
    ls.engine_notes = choose_engine(ls.holder, ls.command_line_engine, params.initialization_options, client)
    ls.holder.start()  # once only: a holder the command line started goes on as it is


def initialized(ls: DlmServer, params: types.InitializedParams) -> None:
    ls._initialized = True
    # The index starts now, not at initialize: its progress is a request to the client.
    caps, index = ls.client_capabilities, ls.workspace_index
    index.configure(ls.options.index)
    connect_index(index, ls.protocol, ls.loop, caps, ls.options.index.enabled)
    index.set_roots(index_roots(ls))
    next_edits.start(ls.edit_context, index_roots(ls))
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
    ls.roots.set([r for r in ls.roots.folders if r not in removed] + added)
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
    doc.history = History(ls.roots.path_of(td.uri), ls.options.history)
    index_buffer(ls, doc, opened=True)


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
    recent = ls.inline.recent_edits(uri)
    for change in params.content_changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            r = change.range
            applied = doc.apply((r.start.line, r.start.character), (r.end.line, r.end.character), change.text, version)
        else:
            applied = doc.replace_all(change.text, version)
        recent.record(applied)
        next_edits.record(ls.edit_context, doc, applied)  # the edit memory (lsp.next_edits)
    ls.scheduler.invalidate(uri)
    ls.inline.changed(uri)  # its last answer is for the text before this change
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


def index_buffer(ls: DlmServer, doc: Document, opened: bool = False) -> None:
    """An open buffer's text goes into the workspace index (debounced there), and the memory
    counts it ahead of its first query (lsp.memory_ahead: at once when it opens, else at a pause)."""
    if (path := file_path(doc.uri)) is not None:
        ls.workspace_index.buffer_changed(path, doc.size, lambda: doc.text)
        ls.memory_ahead.changed(doc, opened)


def forget_results(ls: DlmServer, uri: str) -> None:
    """Drop the running prediction and the kept results of a document (closed, or re-opened)."""
    ls.scheduler.forget(uri)
    ls.memory_ahead.forget(uri)  # its pending count
    ls.inline.forget(uri)  # its last answer and recent lines
    ls.inline_list.forget(uri)  # the insertion shown in it
    ls.next_edits.forget(uri)  # its open edit (lsp.next_edits); the patterns stay, for other buffers


async def text_document_inline_completion(ls: DlmServer, params: types.InlineCompletionParams):
    context_ = getattr(params, "context", None)
    if getattr(context_, "trigger_kind", None) == types.InlineCompletionTriggerKind.Invoked:
        # The explicit trigger answers or says why not: dlm/status `trigger` (sent at once)
        before = dict(ls.stats.counts)
        got = await inline_completion(ls, params)
        ls.last_trigger = status_report.trigger_outcome(
            bool(got.items), ls.stats.counts, before, ls.documents.get(params.text_document.uri) is not None,
            ls.inline.last_confidence, ls.options.min_confidence)
        ls.send_status()
        return got
    return await inline_completion(ls, params)


async def inline_completion(ls: DlmServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return types.InlineCompletionList(items=[])
    items = await ls.inline_list.complete(doc, params.position.line, params.position.character)
    return types.InlineCompletionList(items=items)


async def text_document_completion(ls: DlmServer, params: types.CompletionParams) -> types.CompletionList:
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return types.CompletionList(is_incomplete=True, items=[])
    return await ls.inline_list.completion(doc, params.position.line, params.position.character)


async def dlm_edit_prediction(ls: DlmServer, params: Any):
    uri = convert.document_uri(params)
    doc = ls.documents.get(uri) if uri is not None else None
    # editPredictions off: the user asked for inline suggestions only
    if doc is None or not ls.options.edit_predictions:
        return None
    row, col = doc.clamp(*convert.position_of(params))
    return await edit_prediction(ls.edit_context, ls.inline, doc, row, col)


def dlm_accepted_edit(ls: DlmServer, params: Any) -> None:
    next_edits.accepted_edit(ls.edit_context, params)


def dlm_stats(ls: DlmServer, params: Any) -> dict:
    return status_report.stats_payload(ls.stats, len(ls.documents), ls.protocol.pending_futures,
                                       ls.holder.status.state, len(ls.roots), ls.workspace_index.status(),
                                       ls.last_trigger)


def text_document_did_show_completion(ls: DlmServer, params: Any) -> None:
    ls.ids.count("shown", convert.command_item_id(params))


def text_document_did_partially_accept_completion(ls: DlmServer, params: Any) -> None:
    ls.ids.count("partially_accepted", convert.command_item_id(params))


def workspace_execute_command_accept(ls: DlmServer, *args: Any) -> None:
    # arguments: [item id, data?] (convert.inline_item, copilot_nes); anything else is not ours
    if ls.ids.count("accepted", args[0] if args else None):
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
    ls.ids.count("shown", convert.command_item_id(params))


def create_server(engine_factory: Callable[[], Engine], command_line_engine: bool = True) -> DlmServer:
    server = DlmServer(engine_factory, command_line_engine=command_line_engine)
    server.feature(types.INITIALIZE)(initialize)
    server.feature(types.INITIALIZED)(initialized)
    server.feature(types.SHUTDOWN)(shutdown)
    server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(workspace_did_change_workspace_folders)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(text_document_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(text_document_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(text_document_did_close)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE)(text_document_did_save)
    server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)(workspace_did_change_watched_files)
    # InlineCompletionOptions(): without it pygls does not announce the capability (docs/architecture.md §8).
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        text_document_inline_completion
    )
    server.feature(types.TEXT_DOCUMENT_COMPLETION)(text_document_completion)
    server.feature(EDIT_PREDICTION)(dlm_edit_prediction)
    server.feature(next_edits.ACCEPTED_EDIT)(dlm_accepted_edit)
    server.feature(STATS)(dlm_stats)
    server.feature(DID_SHOW)(text_document_did_show_completion)
    server.feature(DID_PARTIALLY_ACCEPT)(text_document_did_partially_accept_completion)
    server.feature(copilot_nes.COPILOT_INLINE_EDIT)(copilot_inline_edit)
    server.feature(copilot_nes.DID_SHOW_INLINE_EDIT)(text_document_did_show_inline_edit)
    server.command(ACCEPT_COMMAND)(workspace_execute_command_accept)
    return server
