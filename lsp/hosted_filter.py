"""Which documents a hosted engine may be sent (docs/engines.md, "What leaves the machine").

A hosted engine (coder_model.hosted) sends the text around the cursor to another machine. Lines
holding a secret are emptied by the engine itself (coder_model.remote.wire.without_secrets, in
every field, edit-history diffs included); this is the rule for whole files: the index's own
filters decide (lsp.workspace_index.WorkspaceIndex.accepts: .gitignore and index.exclude rules,
secret file names and folders, vendored folders, links out of the root), so a file the index
would never read is never sent either, whatever its language. A file outside every workspace
folder is sent unless its name or folder is a secret's; a buffer with no file (untitled) is sent.

The check reads .gitignore files, so it runs on a pool thread (`guarded`), never on the event
loop, and its verdict is kept per file for REMEMBER_S seconds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

from dlm.lsp import discovery
from dlm.lsp.engine_runs import chain

log = logging.getLogger(__name__)

REMEMBER_S = 10.0
MAX_REMEMBERED = 1024
# Reasons of WorkspaceIndex.accepts for a file in no workspace folder the index reads.
OUTSIDE = ("outside_root", "refused_root")


class SendFilter:
    """The file-level rule, with its verdicts remembered (module docstring)."""

    def __init__(self, workspace_index) -> None:
        self.workspace_index = workspace_index
        self._lock = threading.Lock()
        self._verdicts: dict[str, tuple[str, float]] = {}
        self._said: set[str] = set()

    def refusal(self, path: str | None) -> str:
        """Why the file at `path` may not be sent ('' when it may; None: no file, an untitled buffer)."""
        if not path:
            return ""
        now = time.monotonic()
        with self._lock:
            got = self._verdicts.get(path)
        if got is not None and now - got[1] < REMEMBER_S:
            return got[0]
        try:
            why = self.workspace_index.accepts(path, sources_only=False)
        except Exception:
            log.debug("could not check %s", path, exc_info=True)
            why = "unchecked"
        if why in OUTSIDE:
            tail = "/".join(path.replace(os.sep, "/").split("/")[-3:])
            why = "secret" if discovery.is_secret_path(tail) else ""
        with self._lock:
            if len(self._verdicts) >= MAX_REMEMBERED:
                self._verdicts.clear()
            self._verdicts[path] = (why, now)
            if why and path not in self._said and len(self._said) < 256:
                self._said.add(path)
                log.info("not sent to the hosted engine (%s): %s", why, os.path.basename(path))
        return why

    def guarded(self, path: str | None, run: Callable[[], Future], pool: Executor) -> Future:
        """A Future of `run()` when the file may be sent; of None (no run, no suggestion) when not.
        The check runs on `pool`."""
        out: Future = Future()

        def check() -> None:
            try:
                if self.refusal(path):
                    out.set_result(None)
                    return
                chain(run(), out)
            except Exception as exc:  # noqa: BLE001 - it costs this keystroke, never the server
                if not out.done():
                    out.set_exception(exc)

        pool.submit(check)
        return out
