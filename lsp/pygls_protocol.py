"""pygls' LanguageServerProtocol, mended where a hostile or sloppy client broke it.

- didOpen/didChange/didClose skip pygls' own document store (lsp.documents
  keeps ours) and are plain functions: pygls 2.1 keeps the future of a
  *generator* notification handler in its request table under a random id
  and never removes it (~2 KB per keystroke). `_execute_handler` also drops
  any finished notification future that pygls left there (the builtin
  generator notifications: initialized, setTrace, ...).
- A request whose params do not fit the method gets -32602 (pygls logs and
  drops it, leaving the client waiting).
- A request after `shutdown` gets -32600 (pygls drops it silently), and so
  does a second `initialize` (pygls would re-create its workspace and our
  server would reset its document store).

`ClientLogHandler` sends log records to the client as `window/logMessage`
once it is initialized (editors show stderr as errors).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

log = logging.getLogger(__name__)


class DlmProtocol(LanguageServerProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_received = False

    # ---- bookkeeping ------------------------------------------------------------------------------
    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        if getattr(callback, "func", None) == self._send_handler_result:
            return  # a request: pygls removes its future when it answers
        # A notification, or a step of a generator handler: nothing ever answers these ids.
        future = self._request_futures.get(msg_id)
        if future is not None:

            def forget(done: Any, msg_id: Any = msg_id) -> None:
                if self._request_futures.get(msg_id) is done:
                    del self._request_futures[msg_id]

            future.add_done_callback(forget)

    @property
    def pending_futures(self) -> int:
        """Entries in pygls' request table (in-flight requests; stays small: dlm/stats)."""
        return len(self._request_futures)

    # ---- messages ---------------------------------------------------------------------------------
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

    def handle_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        is_request = method is not None and getattr(message, "id", None) is not None
        if is_request and self._shutdown and method != types.EXIT:
            err = JsonRpcInvalidRequest(
                f"{method!r} after shutdown: the server is shutting down and takes only 'exit'; "
                "start a new server"
            )
            self._send_response(message.id, None, err.to_response_error())
            return
        if is_request and method == types.INITIALIZE:
            if self.initialize_received:
                err = JsonRpcInvalidRequest(
                    "the server is already initialized (a second 'initialize'); the open documents "
                    "are kept; send 'shutdown' and 'exit' and start a new server to begin again"
                )
                self._send_response(message.id, None, err.to_response_error())
                return
            self.initialize_received = True
        super().handle_message(message)

    # ---- documents: ours (lsp.documents), not pygls' workspace ------------------------------------
    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> None:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            handler(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            handler(params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> None:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            handler(params)


_MESSAGE_TYPES = (
    (logging.ERROR, types.MessageType.Error),
    (logging.WARNING, types.MessageType.Warning),
    (logging.INFO, types.MessageType.Info),
)


def message_type(levelno: int) -> types.MessageType:
    for level, kind in _MESSAGE_TYPES:
        if levelno >= level:
            return kind
    return types.MessageType.Log


class ClientLogHandler(logging.Handler):
    """Log records as `window/logMessage` (INFO and above), once the client is initialized.

    Neovim's lsp.log records all of a server's stderr as [ERROR]; a logMessage carries
    the level (Error/Warning/Info). pygls' own records are not sent (it logs every
    message it sends, this one included). `connected()` says whether records go to the
    client; stderr takes them otherwise (before initialize, after shutdown, once the
    client is gone). `fallback` (the stderr handler) takes a record that was to be sent
    but could not be: the client went away between the choice and the sending.
    """

    def __init__(self, server: Any, fallback: logging.Handler | None = None) -> None:
        super().__init__(logging.INFO)
        self.server = server
        self.fallback = fallback
        self._local = threading.local()

    def connected(self) -> bool:
        server = self.server
        writer = server.protocol.writer
        return bool(
            getattr(server, "_initialized", False)
            and writer is not None
            and not getattr(writer, "lost", False)  # lsp.framing's writers: a write failed, or `exit`
            and not server.protocol._shutdown
            and server.loop is not None
            and not server.loop.is_closed()
        )

    def sends(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.INFO and not record.name.startswith("pygls") and self.connected()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._local, "busy", False):
            return
        if not self.sends(record):
            if getattr(record, "dlm_kept_from_stderr", False):  # stderr left it to us a moment ago
                self._not_sent(record)
            return
        self._local.busy = True  # a record logged while sending this one is not sent again
        try:
            self.server.loop.call_soon_threadsafe(self._send, record)
        except RuntimeError:  # the event loop closed since `sends` (the client is gone)
            self._not_sent(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
        finally:
            self._local.busy = False

    def _send(self, record: logging.LogRecord) -> None:
        if not self.connected():
            self._not_sent(record)
            return
        try:
            params = types.LogMessageParams(type=message_type(record.levelno), message=self.format(record))
            self.server.protocol.notify(types.WINDOW_LOG_MESSAGE, params)
        except Exception:  # a record that cannot be formatted or sent is not worth a crash
            logging.getLogger("pygls").debug("could not send a log record", exc_info=True)
        if getattr(self.server.protocol.writer, "lost", False):  # this very write found the client gone
            self._not_sent(record)

    def _not_sent(self, record: logging.LogRecord) -> None:
        if self.fallback is not None:
            self.fallback.handle(record)


class NotSentToClient(logging.Filter):
    """For the stderr handler: records the ClientLogHandler sends are not written twice."""

    def __init__(self, client: ClientLogHandler) -> None:
        super().__init__()
        self.client = client

    def filter(self, record: logging.LogRecord) -> bool:
        if self.client.sends(record):
            record.dlm_kept_from_stderr = True  # the client handler writes it to stderr if it cannot send it
            return False
        return True
