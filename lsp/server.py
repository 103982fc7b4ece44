"""The language server: pygls handlers, each a thin translation to plain functions.

Protocol surface (README "Protocol"): textDocument/inlineCompletion,
textDocument/completion (fallback), dlm/editPrediction, dlm/stats,
textDocument/didShowCompletion, textDocument/didPartiallyAcceptCompletion,
workspace/executeCommand dlm.acceptCompletion, and the dlm/status
notification. The server answers `initialize` at once; the model loads in a
background thread and, until it is ready (or when it failed to load), every
request returns an empty result, never an error.

Documents are kept by lsp.documents (not by pygls' workspace: ours keeps a
tree-sitter tree and the edit history, and does not re-split the text on
each change).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlparse

from dlm.coder_model.types import EngineStatus, Prediction, SamplerParams
from dlm.lsp import context, postprocess
from dlm.lsp.documents import Document, Documents
from dlm.lsp.history import History
from dlm.lsp.options import Options, parse_options
from dlm.lsp.scheduler import Scheduler
from dlm.lsp.stats import Stats
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

log = logging.getLogger(__name__)

ACCEPT_COMMAND = "dlm.acceptCompletion"
EDIT_PREDICTION = "dlm/editPrediction"
STATS = "dlm/stats"
STATUS = "dlm/status"
DID_SHOW = "textDocument/didShowCompletion"
DID_PARTIALLY_ACCEPT = "textDocument/didPartiallyAcceptCompletion"


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    """Read a field of params given as an lsprotocol object or a plain dict (custom methods)."""
    for name in path:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


class DlmProtocol(LanguageServerProtocol):
    """pygls' protocol with our document store and a reply for requests that fail to parse."""

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except Exception as exc:
            if isinstance(data, dict) and "id" in data and "method" in data:
                # pygls would log and drop it, leaving the client waiting forever.
                err = JsonRpcInvalidParams(
                    f"invalid params for {data.get('method')!r}: {exc.__cause__ or exc}; "
                    "check the request against the LSP specification"
                )
                self._send_response(data["id"], None, err.to_response_error())
            raise

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield handler, (params,), None


class EngineHolder:
    """Loads the engine in a background thread and remembers how that went."""

    def __init__(self, factory: Callable[[], Any], on_change: Callable[[], None]) -> None:
        self.engine: Any = None
        self.status = EngineStatus(state="loading")
        self._factory = factory
        self._on_change = on_change
        self._thread = threading.Thread(target=self._load, name="dlm-engine-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _load(self) -> None:
        t0 = time.monotonic()
        try:
            engine = self._factory()
            st = engine.status() if hasattr(engine, "status") else EngineStatus(state="ready")
            self.engine = engine
            self.status = replace(st, state=st.state if st.state != "loading" else "ready")
            log.info("engine ready in %.1f s: %s", time.monotonic() - t0, self.status)
        except BaseException as exc:
            log.exception("model failed to load")
            self.status = EngineStatus(
                state="failed",
                message=f"the model failed to load: {type(exc).__name__}: {exc}. "
                "Check --model (a checkpoint directory with config.json) or --remote, "
                "then restart the server; suggestions are off until then.",
            )
        self._on_change()

    def ready(self) -> bool:
        if self.engine is None:
            return False
        try:
            st = self.engine.status()
        except Exception:  # noqa: BLE001
            return False
        if st.state != self.status.state:
            self.status = st
            self._on_change()
        return st.state == "ready"


def make_engine_factory(args) -> Callable[[], Any]:
    """The engine per the command line: DLM_ENGINE_FACTORY (tests), --remote, or local."""
    spec = os.environ.get("DLM_ENGINE_FACTORY") or getattr(args, "engine_factory", None)
    model = getattr(args, "model", None)
    device = getattr(args, "device", "auto") or "auto"
    if spec:
        module_name, _, fn = spec.partition(":")

        def from_spec():
            return getattr(importlib.import_module(module_name), fn)(model, device)

        return from_spec
    if getattr(args, "remote", None):

        def remote():
            try:
                from dlm.coder_model.remote.auth import load_token
                from dlm.coder_model.remote.client import RemoteEngine, parse_host_port
            except ImportError as exc:
                raise RuntimeError(
                    f"remote mode is not available in this install ({exc}); run without --remote"
                ) from exc
            host, port = parse_host_port(args.remote)  # also [v6]:port
            token = load_token(getattr(args, "token_file", None))  # the file, else $DLM_TOKEN
            return RemoteEngine(host, port, token=token, tls=bool(getattr(args, "tls", False)))

        return remote

    def local():
        from dlm.coder_model.engine import load_engine  # torch is imported here, in the loader thread

        return load_engine(model, device)

    return local


class DlmServer(LanguageServer):
    def __init__(self, engine_factory: Callable[[], Any], max_workers: int = 8) -> None:
        super().__init__("dlm-lsp", "0.1.0", protocol_cls=DlmProtocol, max_workers=max_workers)
        self.options = Options()
        self.documents = Documents()
        self.stats = Stats()
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dlm-predict")
        self.scheduler = Scheduler(self.pool, self.stats, self.options.scheduler.throttle_ms)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine = EngineHolder(engine_factory, self._status_changed)
        self.roots: list[str] = []
        self.items: OrderedDict[str, dict] = OrderedDict()  # shown inline items by id (bounded)
        self.last: dict[str, dict] = {}  # uri -> last suggestion (for editPrediction reuse + prefix cache)
        self.prefix_cache: dict[str, dict] = {}  # uri -> the shown insertion (typing through it)
        self._ids = itertools.count(1)
        self._last_status_at = 0.0
        self._initialized = False
        self._fitted = False  # windows fitted to the engine's context window

    # ---- status -----------------------------------------------------------------------------------
    def _status_changed(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.send_status)

    def status_payload(self) -> dict:
        st = self.engine.status
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
        except Exception:
            log.debug("could not send dlm/status", exc_info=True)

    def maybe_send_status(self) -> None:
        if time.monotonic() - self._last_status_at >= self.options.status_interval_s:
            self.send_status()

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

    async def predict(self, doc: Document, row: int, col: int, mode: str) -> dict | None:
        """Run the model (latest wins) and post-process; None when there is nothing to show."""
        t0 = time.monotonic()
        self.stats.add("requests")
        if not self.engine.ready():
            self.stats.add("empty")
            return None
        if not self._fitted:
            self._fit_windows()
        built = context.build(doc, row, col, mode, self.options.context, self.path_of(doc.uri))
        t_ctx = time.monotonic()
        if built is None:
            self.stats.add("empty")
            return None
        version, uri, engine, params = doc.version, doc.uri, self.engine.engine, self.sampler_params()
        prompt = built.prompt

        def work(cancel) -> Prediction:
            return engine.predict(prompt, params, cancel)

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
        sugg = postprocess.suggest(prompt.region, prompt.cursor, pred.text, prompt.suffix)
        t_post = time.monotonic()
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
        result = {"version": version, "row": row, "col": col, "built": built, "sugg": sugg}
        self.last[uri] = result
        return result

    def _fit_windows(self) -> None:
        """Once the engine is ready: keep the windows inside the model's context (if it says)."""
        self._fitted = True
        budget = getattr(self.engine.engine, "budget", None)
        if budget is None:
            return
        before = self.options.context
        self.options.context = context.fit_to_window(
            before, budget.max_context, budget.max_history, budget.max_suffix
        )
        log.info(
            "model context %d tokens: prefix window %d -> %d, suffix %d -> %d (estimated tokens)",
            budget.max_context, before.prefix_tokens, self.options.context.prefix_tokens,
            before.suffix_tokens, self.options.context.suffix_tokens,
        )  # fmt: skip

    def region_pos(self, doc: Document, built: context.Built, offset: int) -> types.Position:
        """LSP position of a code-point offset inside the region."""
        row, rem = built.start_line, offset
        while row < built.end_line and rem >= len(doc.lines[row]):
            rem -= len(doc.lines[row])
            row += 1
        line, ch = doc.to_position(row, rem)
        return types.Position(line=line, character=ch)

    def new_item(self, doc: Document, row: int, col: int, text: str, end: types.Position | None):
        item_id = str(next(self._ids))
        start = types.Position(*doc.to_position(row, col))
        self.items[item_id] = {"uri": doc.uri, "text": text, "row": row, "col": col}
        while len(self.items) > 256:
            self.items.popitem(last=False)
        line = doc.line(row)
        if end is None:  # remembered for typing through the suggestion without a model call
            self.prefix_cache[doc.uri] = {
                "row": row, "before": line[:col], "after": line[col:], "text": text,
            }  # fmt: skip
        return types.InlineCompletionItem(
            insert_text=text,
            range=types.Range(start=start, end=end) if end is not None else None,
            command=types.Command(title="dlm: accept", command=ACCEPT_COMMAND, arguments=[item_id]),
        )

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


def _position(params) -> tuple[int, int]:
    pos = _get(params, "position")
    line, ch = _get(pos, "line"), _get(pos, "character")
    if not isinstance(line, int) or not isinstance(ch, int):
        raise JsonRpcInvalidParams(
            f"position must be {{line: int, character: int}}, got {pos!r}; send an LSP Position"
        )
    return line, ch


def create_server(engine_factory: Callable[[], Any]) -> DlmServer:
    server = DlmServer(engine_factory)

    @server.feature(types.INITIALIZE)
    def initialize(ls: DlmServer, params: types.InitializeParams) -> None:
        ls.loop = asyncio.get_running_loop()
        ls.options, problems = parse_options(params.initialization_options)
        for p in problems:
            log.warning("initializationOptions: %s", p)
        enc = ls.workspace.position_encoding
        ls.documents = Documents(str(getattr(enc, "value", enc)), ls.options.max_syntax_chars)
        ls.scheduler.throttle_s = ls.options.scheduler.throttle_ms / 1000.0
        roots = [f.uri for f in params.workspace_folders or []]
        if params.root_uri:
            roots.append(params.root_uri)
        ls.roots = [unquote(urlparse(r).path) for r in roots]

    @server.feature(types.INITIALIZED)
    def initialized(ls: DlmServer, params: types.InitializedParams) -> None:
        ls._initialized = True
        ls.send_status()

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: DlmServer, params: Any) -> None:
        # Stop running predictions so that exit does not wait for a model run to finish.
        for doc in list(ls.documents):
            ls.scheduler.forget(doc.uri)
        engine = ls.engine.engine
        if engine is not None:
            try:
                engine.close()
            except Exception:
                log.exception("engine.close() failed")
        ls.pool.shutdown(wait=False, cancel_futures=True)

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_workspace_folders(ls: DlmServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
        removed = {unquote(urlparse(f.uri).path) for f in params.event.removed}
        ls.roots = [r for r in ls.roots if r not in removed]
        ls.roots += [unquote(urlparse(f.uri).path) for f in params.event.added]

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DlmServer, params: types.DidOpenTextDocumentParams) -> None:
        td = params.text_document
        if len(td.text) > ls.options.max_document_chars:
            log.warning("%s has %d characters, over max_document_chars; not tracked", td.uri, len(td.text))
            return
        doc = ls.documents.open(td.uri, td.text, td.version, td.language_id)
        doc.history = History(ls.path_of(td.uri), ls.options.history)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DlmServer, params: types.DidChangeTextDocumentParams) -> None:
        uri, version = params.text_document.uri, params.text_document.version
        doc = ls.documents.get(uri)
        if doc is None:
            log.warning("didChange for %s, which is not open; send didOpen first (ignored)", uri)
            return
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                r = change.range
                doc.apply(
                    (r.start.line, r.start.character), (r.end.line, r.end.character), change.text, version
                )
            else:
                doc.replace_all(change.text, version)
        ls.scheduler.invalidate(uri)
        if doc.size > ls.options.max_document_chars:
            log.warning("%s grew over max_document_chars; no longer tracked", uri)
            ls.documents.close(uri)
            ls.scheduler.forget(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DlmServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.documents.close(uri)
        ls.scheduler.forget(uri)
        ls.last.pop(uri, None)
        ls.prefix_cache.pop(uri, None)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: DlmServer, params: types.InlineCompletionParams):
        empty = types.InlineCompletionList(items=[])
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return empty
        row, col = doc.clamp(params.position.line, params.position.character)
        rest = ls.from_prefix_cache(doc, row, col)
        if rest is not None:
            ls.stats.add("cache_hits")
            ls.stats.add("requests")
            return types.InlineCompletionList(items=[ls.new_item(doc, row, col, rest, None)])
        mode = context.choose_mode(doc, row, ls.options.context)
        res = await ls.predict(doc, row, col, mode)
        if res is None or not res["sugg"].insert_text:
            return empty
        sugg, built = res["sugg"], res["built"]
        end = ls.region_pos(doc, built, sugg.replace_end) if sugg.replace_end is not None else None
        return types.InlineCompletionList(items=[ls.new_item(doc, row, col, sugg.insert_text, end)])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION)
    async def completion(ls: DlmServer, params: types.CompletionParams):
        empty = types.CompletionList(is_incomplete=True, items=[])
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return empty
        row, col = doc.clamp(params.position.line, params.position.character)
        res = await ls.predict(doc, row, col, "typing")
        if res is None or not res["sugg"].insert_text:
            return empty
        sugg, built = res["sugg"], res["built"]
        start = types.Position(*doc.to_position(row, col))
        end = ls.region_pos(doc, built, sugg.replace_end) if sugg.replace_end is not None else start
        text = sugg.insert_text
        return types.CompletionList(
            is_incomplete=True,  # ask again on the next keystroke: the prediction depends on it
            items=[
                types.CompletionItem(
                    label=text.strip().split("\n", 1)[0][:60] or text,
                    kind=types.CompletionItemKind.Text,
                    detail="dlm",
                    text_edit=types.TextEdit(range=types.Range(start=start, end=end), new_text=text),
                    sort_text="0",
                    filter_text=doc.line(row)[:col].split()[-1] if doc.line(row)[:col].split() else "",
                )
            ],
        )

    @server.feature(EDIT_PREDICTION)
    async def edit_prediction(ls: DlmServer, params: Any):
        uri = _get(params, "textDocument", "uri") or _get(params, "text_document", "uri")
        doc = ls.documents.get(uri) if isinstance(uri, str) else None
        if doc is None:
            return None
        row, col = doc.clamp(*_position(params))
        last = ls.last.get(uri)
        if last is not None and (last["version"], last["row"], last["col"]) == (doc.version, row, col):
            res = last  # the inline request at this position already ran the model
        else:
            res = await ls.predict(doc, row, col, "wide")
        if res is None or not res["sugg"].edits:
            return None
        built = res["built"]
        edits = [
            {
                "range": {
                    "start": _pos_dict(ls.region_pos(doc, built, e.start)),
                    "end": _pos_dict(ls.region_pos(doc, built, e.end)),
                },
                "newText": e.text,
            }
            for e in res["sugg"].edits
        ]
        return {"id": str(next(ls._ids)), "version": res["version"], "edits": edits}

    @server.feature(STATS)
    def stats(ls: DlmServer, params: Any) -> dict:
        out = ls.stats.snapshot()
        out["documents"] = len(ls.documents)
        out["state"] = ls.engine.status.state
        return out

    @server.feature(DID_SHOW)
    def did_show(ls: DlmServer, params: Any) -> None:
        ls.stats.add("shown")

    @server.feature(DID_PARTIALLY_ACCEPT)
    def did_partially_accept(ls: DlmServer, params: Any) -> None:
        ls.stats.add("partially_accepted")

    @server.command(ACCEPT_COMMAND)
    def accept(ls: DlmServer, *args: Any) -> None:
        ls.stats.add("accepted")
        for item_id in args:
            ls.items.pop(str(item_id), None)
        ls.maybe_send_status()

    return server


def _pos_dict(p: types.Position) -> dict:
    return {"line": p.line, "character": p.character}
