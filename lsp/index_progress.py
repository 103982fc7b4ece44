"""The workspace index's LSP side: work-done progress and file watching.

`IndexProgress` turns the indexer's `ProgressEvent`s (from its thread) into
`window/workDoneProgress/create` + `$/progress` begin / report ("indexing 40%")
/ end on the event loop, only for a client that declared
`window.workDoneProgress`. One token per indexing run of a root; reports sent
before the client answered `create` are held (the latest only) and go out after
`begin`; a client that refuses the token gets no progress for that run.

`watch_files(server, on_result)` registers `workspace/didChangeWatchedFiles`
dynamically (`client/registerCapability`) when the client declared
`workspace.didChangeWatchedFiles.dynamicRegistration`; `on_result(True)` once
the client accepted, `on_result(False)` otherwise (the index then rescans by
mtime).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from dlm.lsp.workspace_index import ProgressEvent
from lsprotocol import types

log = logging.getLogger(__name__)

WATCH_REGISTRATION_ID = "dlm-index-watch"


def client_supports_progress(capabilities: types.ClientCapabilities | None) -> bool:
    window = getattr(capabilities, "window", None)
    return bool(getattr(window, "work_done_progress", False))


def client_supports_watching(capabilities: types.ClientCapabilities | None) -> bool:
    ws = getattr(capabilities, "workspace", None)
    watched = getattr(ws, "did_change_watched_files", None)
    return bool(getattr(watched, "dynamic_registration", False))


class IndexProgress:
    def __init__(self, protocol: Any, loop: asyncio.AbstractEventLoop, enabled: bool) -> None:
        self.protocol = protocol
        self.loop = loop
        self.enabled = enabled
        self._ids = itertools.count(1)
        self._runs: dict[str, dict[str, Any]] = {}  # root -> {token, created, pending}

    def __call__(self, ev: ProgressEvent) -> None:
        """From any thread: hand the event to the event loop."""
        if not self.enabled or self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self._on_loop, ev)
        except RuntimeError:  # the loop closed under us (shutdown)
            pass

    def _on_loop(self, ev: ProgressEvent) -> None:
        run = self._runs.get(ev.key)
        if ev.kind == "begin":
            if run is not None and run["created"] is True:
                self._send(run["token"], types.WorkDoneProgressEnd(message="restarted"))
            token = f"dlm-index-{next(self._ids)}"
            run = {"token": token, "created": None, "pending": [ev]}
            self._runs[ev.key] = run
            try:
                fut = self.protocol.send_request(
                    types.WINDOW_WORK_DONE_PROGRESS_CREATE, types.WorkDoneProgressCreateParams(token=token)
                )
            except Exception:
                log.debug("index: could not create a progress token", exc_info=True)
                run["created"] = False
                return
            fut.add_done_callback(lambda f, key=ev.key, token=token: self._created(key, token, f))
            return
        if run is None or run["created"] is False:
            return
        if run["created"] is None:  # waiting for the client's answer: keep begin + the latest
            pending = run["pending"]
            if ev.kind == "report" and pending[-1].kind == "report":
                pending[-1] = ev
            else:
                pending.append(ev)
            return
        self._emit(run["token"], ev)
        if ev.kind == "end":
            self._runs.pop(ev.key, None)

    def _created(self, key: str, token: str, fut: Any) -> None:
        run = self._runs.get(key)
        if run is None or run["token"] != token:
            return
        if fut.cancelled() or fut.exception() is not None:
            log.debug("index: the client refused progress token %s: %s", token,
                      None if fut.cancelled() else fut.exception())  # fmt: skip
            run["created"] = False
            return
        run["created"] = True
        pending, run["pending"] = run["pending"], []
        for ev in pending:
            self._emit(token, ev)
        if pending and pending[-1].kind == "end":
            self._runs.pop(key, None)

    def _emit(self, token: str, ev: ProgressEvent) -> None:
        if ev.kind == "begin":
            value: Any = types.WorkDoneProgressBegin(
                title=ev.title, message=ev.message or None, percentage=ev.percentage, cancellable=False
            )
        elif ev.kind == "report":
            value = types.WorkDoneProgressReport(message=ev.message or None, percentage=ev.percentage)
        else:
            value = types.WorkDoneProgressEnd(message=ev.message or None)
        self._send(token, value)

    def _send(self, token: str, value: Any) -> None:
        if getattr(self.protocol, "_shutdown", False):  # after `shutdown` nothing goes to the client
            return
        try:
            self.protocol.notify(types.PROGRESS, types.ProgressParams(token=token, value=value))
        except Exception:
            log.debug("index: could not send $/progress", exc_info=True)


def watch_files(protocol: Any, on_result: Callable[[bool], None]) -> None:
    """Ask the client to report file changes under the workspace (on the event loop)."""
    params = types.RegistrationParams(
        registrations=[
            types.Registration(
                id=WATCH_REGISTRATION_ID,
                method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=types.DidChangeWatchedFilesRegistrationOptions(
                    watchers=[types.FileSystemWatcher(glob_pattern="**/*")]
                ),
            )
        ]
    )

    def done(fut: Any) -> None:
        ok = not fut.cancelled() and fut.exception() is None
        if not ok:
            log.info("index: the client did not accept watching files (%s); rescanning by mtime instead",
                     None if fut.cancelled() else fut.exception())  # fmt: skip
        on_result(ok)

    try:
        protocol.send_request(types.CLIENT_REGISTER_CAPABILITY, params).add_done_callback(done)
    except Exception:
        log.debug("index: could not register file watching", exc_info=True)
        on_result(False)


def connect(index: Any, protocol: Any, loop: Any, capabilities: types.ClientCapabilities | None,
            watch: bool) -> None:
    """The workspace index reports its progress to the client (`$/progress` where the client
    supports it), and, when `watch` and the client can, the client reports file changes to it:
    the index then does not rescan, so no rescan races the registration."""
    index.on_progress = IndexProgress(protocol, loop, client_supports_progress(capabilities))
    if watch and client_supports_watching(capabilities):
        index.watching = True
        watch_files(protocol, index.set_watching)
