"""The workspace index: the repository memory of each workspace root, built and kept
current in the background.

From `initialize` (rootUri, workspaceFolders) and workspace/didChangeWorkspaceFolders
the server gives `WorkspaceIndex` its roots. One low-priority thread (`dlm-index`, nice
19) then, per root:

1. loads the persisted index from the user's cache (lsp.index_store), if there is
   one it can trust (state `loading`);
2. walks the root (lsp.discovery: .gitignore, vendored folders, secrets, special
   files and caps) and reads what is new or changed since, by size and mtime, into
   the memory (`RepoMemory.update_file`), dropping what is gone (state `indexing`,
   with LSP work-done progress);
3. saves the index (only the server holding the root's lock writes), and stays
   current (state `ready`): open buffers (didOpen/didChange, debounced; didSave;
   didClose falls back to the disk), watched-file events, or, where the client does
   not watch files for us, an mtime rescan every `index.rescanS`.

Predictions come first: `WorkspaceIndex.prediction()` wraps a prediction; while one
runs the indexer starts no new step (a file, a directory), and it runs at nice
19. RepoMemory is thread-safe (readers and the one writer take its own short
locks); its `save` holds the memory for its whole length, so a save waits for
a quiet spell (no prediction for QUIET_S).

The rest of the server reads `memory_for(path)` (the memory of the root holding
a file, and the file's path in it), `memory` (the first root's), `open_files()`
(the open buffers' text, filtered like the index) and `status()` (for dlm/status:
`{state, files, tokens, message, done, total, reason, text}`, state one of off,
loading, indexing, ready, failed; `text` is what an editor shows: "indexing 38/77
files", "index: ready (77 files)", "index failed: <why>", "index off: <why>").
Bad input (docs/repository-memory.md) never stops the thread: a root of `/` or
the home directory is refused, a root that disappears is reported and served as
it was, and a file that cannot be read is skipped with a debug log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from dlm.coder_model.layout import display_path
from dlm.lsp import discovery, heap
from dlm.lsp.index_store import IndexStore, cache_base
from dlm.lsp.options import IndexOptions

log = logging.getLogger(__name__)

STATES = ("off", "loading", "indexing", "ready", "failed")
DEBOUNCE_S = 1.0  # an open buffer's text goes into the index after this long without a change
SAVE_AFTER_S = 30.0  # changes are persisted once the index has been quiet this long
PROGRESS_EVERY_S = 0.5  # at most one $/progress report per root per interval
RETRY_S = 10.0  # how often a root that disappeared is looked for
QUIET_S = 2.0  # save only after this long without a prediction (a save holds the memory)
BUFFER_SIG = (-1, -1)  # manifest entry of a file whose indexed text is an open buffer's
# Read this many new files before the state says "indexing" on a rescan (a branch switch).
RESCAN_PROGRESS_FILES = 50
STATUS_EVERY_S = 0.5  # at most one dlm/status per interval with the count of files indexed
OFF_MESSAGE = ("the repository memory is off (initializationOptions index.enabled is false); "
               "set index.enabled to true to index the workspace")  # fmt: skip


@dataclass(frozen=True)
class ProgressEvent:
    key: str  # the root (one progress per root at a time)
    kind: str  # "begin" | "report" | "end"
    title: str
    message: str
    percentage: int | None = None


def file_path(uri: str) -> str | None:
    """The local path of a file: URI (None for other schemes: untitled buffers, remote ones).
    Percent-escaped bytes that are not UTF-8 (a file name in another encoding) decode as
    `os.fsdecode` decodes them (surrogate escapes), so the path names the file on disk and the
    walk's path for it; `dlm.coder_model.layout.display_path` renders it for the model and
    for messages."""
    try:
        parsed = urlparse(uri)
    except ValueError:
        return None
    if parsed.scheme != "file" or not parsed.path:
        return None
    return unquote(parsed.path, errors="surrogateescape")


def _status(
    state: str, files: int, tokens: int, done: int, total: int | None, message: str
) -> dict[str, Any]:
    """The index's part of dlm/status, with the line an editor shows for it."""
    if state == "loading":
        text = "indexing: starting"
    elif state == "indexing" and total is None:
        text = "indexing: looking for files"
    elif state == "indexing":
        text = f"indexing {min(done, total)}/{total} files"
    elif state == "ready":
        text = f"index: ready ({files} file{'' if files == 1 else 's'}{'; ' + message if message else ''})"
    else:
        text = f"index {state}: {message or 'see the server log'}"
    reason = message if state in ("off", "failed") else ""
    return {"state": state, "files": files, "tokens": tokens, "message": message,
            "done": done, "total": total, "reason": reason, "text": text}  # fmt: skip


def _memory_class() -> Any:
    # Imported in the indexer thread, not by `import dlm.lsp` (which must stay light).
    from dlm.coder_model.memory import RepoMemory

    return RepoMemory


class RootIndex:
    """One workspace root: its memory, what each indexed file looked like, its store."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/") or "/"
        self.real = os.path.realpath(self.path)
        self.name = os.path.basename(self.real) or self.real
        self.memory: Any = None  # RepoMemory, once loaded or created
        self.manifest: dict[str, tuple[int, int]] = {}  # rel -> (mtime_ns, size) as indexed
        self.refused: dict[str, tuple[int, int]] = {}  # rel -> signature refused at maxTokens
        self.state = "loading"
        self.message = ""
        self.store: IndexStore | None = None
        self.ignore: discovery.IgnoreStack | None = None
        self.dirty = False
        self.changed_at = 0.0
        self.job: Iterator[None] | None = None
        self.next_rescan = float("inf")
        self.removed = False
        self.capped = False
        # What a status shows of an indexing run: files gone through (unchanged since the saved
        # index, read, or skipped) of the files the walk found (None while it looks for them).
        self.done = 0
        self.total: int | None = None
        self.save_error = ""  # why the last save failed ('' when it did not)

    def rel(self, path: str) -> str | None:
        """`path` relative to this root ('/'-separated), or None when it is not under it."""
        for base in (self.path, self.real):
            prefix = base.rstrip("/") + "/"
            if path.startswith(prefix):
                return path[len(prefix) :]
        return None


class WorkspaceIndex:
    def __init__(
        self,
        options: IndexOptions | None = None,
        on_status: Callable[[], None] | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        memory_class: Callable[[], Any] = _memory_class,
    ) -> None:
        self.options = options or IndexOptions()
        self._on_status = on_status or (lambda: None)
        self.on_progress: Callable[[ProgressEvent], None] = on_progress or (lambda ev: None)
        self._memory_class = memory_class
        self._roots: dict[str, RootIndex] = {}  # real path -> root (insertion order: the client's)
        self._cv = threading.Condition()
        self._events: dict[str, tuple[str, Any]] = {}  # abs path -> latest action for it
        self._open: dict[str, str] = {}  # abs path -> text of an open buffer (checked like the index)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._predicting = 0
        self._last_prediction = 0.0  # time.monotonic() when the last prediction ended
        self._no_prediction = threading.Event()
        self._no_prediction.set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.watching = False  # the client reports file changes: no mtime rescans

    # ---- what the rest of the server reads -------------------------------------------------------
    @property
    def memory(self) -> Any:
        """The first root's memory (None while it loads, or with no root)."""
        for ri in list(self._roots.values()):
            if ri.memory is not None:
                return ri.memory
        return None

    def memory_for(self, path: str) -> tuple[Any, str]:
        """(memory, path relative to its root) for the root holding `path` (the deepest
        one), or (None, '') when no indexed root holds it or its memory is loading."""
        best: tuple[int, RootIndex, str] | None = None
        for ri in list(self._roots.values()):
            rel = ri.rel(path)
            if rel is not None and (best is None or len(ri.real) > best[0]):
                best = (len(ri.real), ri, rel)
        if best is None or best[1].memory is None:
            return None, ""
        return best[1].memory, best[2]

    def open_files(self, path: str | None = None) -> dict[str, str]:
        """The open buffers' text by path relative to the root holding `path` (the first root
        when None): only buffers the index would take (no secrets, nothing ignored)."""
        roots = list(self._roots.values())
        target = None
        if path is not None:
            target = max(
                (ri for ri in roots if ri.rel(path) is not None), key=lambda r: len(r.real), default=None
            )
        elif roots:
            target = roots[0]
        if target is None:
            return {}
        out: dict[str, str] = {}
        for abs_path, text in list(self._open.items()):
            rel = target.rel(abs_path)
            if rel is not None:
                out[rel] = text
        return out

    def indexed_files(self) -> list[str]:
        """Absolute paths of the files the index took (no secrets, nothing ignored), root by root."""
        out: list[str] = []
        for ri in list(self._roots.values()):
            out.extend(os.path.join(ri.path, rel) for rel in list(ri.manifest))
        return out

    def accepts(self, path: str, stacks: dict[str, discovery.IgnoreStack] | None = None,
                sources_only: bool = True) -> str:
        """Why the file at `path` is not one the index takes ('' when it is): inside a root (the
        deepest), not vendored, a source file (unless `sources_only` is False), not a secret by
        name, not ignored, and no link on the way from the root. For a jump to another file
        (lsp.next_edits) and what a hosted engine is sent (lsp.hosted_filter), from any thread:
        `stacks` (root -> ignore rules, filled as needed) is the caller's, one per scan, never the
        indexer's own."""
        ri = max((r for r in list(self._roots.values()) if r.rel(path) is not None and not r.removed),
                 key=lambda r: len(r.real), default=None)  # fmt: skip
        if ri is None:
            return "outside_root"
        rel = ri.rel(path) or ""
        if stacks is None:
            stacks = {}
        ignore = stacks.get(ri.real)
        if ignore is None:
            if discovery.refusal(ri.path):  # `/` or the home directory: never indexed
                return "refused_root"
            ignore = stacks[ri.real] = discovery.ignore_stack(
                ri.real, tuple(x for x in self.options.exclude if isinstance(x, str))
            )
        return discovery.path_allowed(ri.real, rel, ignore, sources_only) or discovery.link_under(ri.real, rel)

    def read_file(self, path: str, max_bytes: int,
                  stacks: dict[str, discovery.IgnoreStack] | None = None) -> discovery.Source | str:
        """The text of a workspace file the index takes (`accepts`), read by
        `discovery.read_workspace_file` (no link at any depth, never a FIFO or a device, at most
        `max_bytes`), or why not."""
        why = self.accepts(path, stacks)
        if why:
            return why
        ri = max((r for r in list(self._roots.values()) if r.rel(path) is not None and not r.removed),
                 key=lambda r: len(r.real), default=None)  # fmt: skip
        if ri is None:
            return "outside_root"
        return discovery.read_workspace_file(ri.real, ri.rel(path) or "", max_bytes)

    @contextmanager
    def prediction(self):
        """Wrap each prediction (from any thread): the indexer starts nothing new until it
        ends, and saves the index only after a quiet spell."""
        end = self.begin_prediction()
        try:
            yield
        finally:
            end()

    def begin_prediction(self) -> Callable[[], None]:
        """`prediction()` for a prediction that ends on another thread (the model's step): the
        indexer waits until the returned function is called (once; later calls do nothing)."""
        with self._cv:
            self._predicting += 1
            self._no_prediction.clear()
        ended = threading.Lock()

        def end() -> None:
            if not ended.acquire(blocking=False):
                return
            with self._cv:
                self._predicting -= 1
                self._last_prediction = time.monotonic()
                if self._predicting == 0:
                    self._no_prediction.set()
                    self._cv.notify_all()

        return end

    def _pause_for_predictions(self) -> None:
        """The memory's pause between slices of a file's indexing: wait while a prediction runs,
        so that the indexer's Python work (lexing, tables) never holds the GIL against it."""
        while not self._stop and not self._no_prediction.wait(0.25):
            pass

    def status(self) -> dict[str, Any]:
        """The index over all roots, for dlm/status and dlm/stats: `state` (off, loading,
        indexing, ready, failed), `files` and `tokens` in the index now, `done` of `total` files
        gone through by the runs in progress (`total` None while a walk looks for files),
        `message` (every root's note: why it failed or is off, or what a ready index lacks),
        `reason` (why the index is failed or off; '' otherwise) and `text`, the line an editor
        shows."""
        roots = list(self._roots.values())  # a removed root counts until the indexer drops it
        if not self.options.enabled:
            return _status("off", 0, 0, 0, 0, OFF_MESSAGE)
        if not roots:
            why = "no workspace folder to index; open a folder to use the repository memory"
            return _status("off", 0, 0, 0, 0, why)
        states = {ri.state for ri in roots}
        state = next((s for s in ("loading", "indexing", "ready", "failed") if s in states), "off")
        files = tokens = done = 0
        total: int | None = 0
        for ri in roots:
            mem = ri.memory
            if mem is not None:
                try:
                    files += int(mem.files)
                    tokens += int(mem.tokens)
                except Exception:
                    log.debug("index: could not read the memory's size", exc_info=True)
            if ri.state == "loading":
                total = None
            elif ri.state == "indexing":
                done += ri.done
                total = None if total is None or ri.total is None else total + ri.total
            elif ri.state == "ready":
                n = len(ri.manifest)
                done += n
                total = None if total is None else total + n
        message = "; ".join(m for ri in roots for m in self._notes(ri))
        return _status(state, files, tokens, done, total, message)

    def _notes(self, ri: RootIndex) -> list[str]:
        """What the status says of one root: why it failed or is off, or what its ready index
        lacks (files past a cap, patterns of an ignore file left out, a cache it cannot use)."""
        if ri.state != "ready":
            return [ri.message] if ri.message and ri.state in ("off", "failed") else []
        store = ri.store
        notes = [ri.message, store.message if store is not None else "", self._cap_message(ri), ri.save_error]
        return [n for n in notes if n]

    # ---- what the server tells it ----------------------------------------------------------------
    def configure(self, options: IndexOptions) -> None:
        self.options = options

    def set_roots(self, roots: list[str]) -> None:
        """The workspace roots (absolute paths), in the client's order: new ones are indexed,
        ones no longer listed are saved and dropped."""
        wanted: dict[str, str] = {}
        for r in roots:
            if r:
                wanted.setdefault(os.path.realpath(r), r)
        with self._cv:
            for real, ri in self._roots.items():
                ri.removed = real not in wanted
            for real, path in wanted.items():
                if real in self._roots:
                    continue  # kept (or re-added before the indexer dropped it)
                ri = RootIndex(path)
                self._roots[real] = ri
                if self.options.enabled:
                    ri.job = self._index(ri, initial=True)
                else:
                    ri.state = "off"
            self._cv.notify_all()
        self._start()
        self._on_status()

    def add_roots(self, roots: list[str]) -> None:
        self.set_roots([ri.path for ri in self._roots.values() if not ri.removed] + roots)

    def remove_roots(self, roots: list[str]) -> None:
        gone = {os.path.realpath(r) for r in roots}
        self.set_roots([ri.path for real, ri in self._roots.items() if not ri.removed and real not in gone])

    def buffer_changed(self, path: str, size: int, text: Callable[[], str]) -> None:
        """An open buffer changed (didOpen/didChange; called on the event loop): its text
        goes into the index once it has not changed for DEBOUNCE_S. `size` (code points)
        lets a buffer over the size cap cost nothing."""
        if not self._wants(path):
            return
        if size > self.options.max_file_bytes:
            return  # too large for the index: the disk version (also too large) stays out
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        old = self._timers.pop(path, None)
        if old is not None:
            old.cancel()
        if loop is None:
            self._event(path, ("text", text()))
        else:
            self._timers[path] = loop.call_later(DEBOUNCE_S, self._snapshot, path, text)

    def buffer_saved(self, path: str, text: Callable[[], str]) -> None:
        """didSave: the buffer's text now, without waiting for the debounce."""
        if not self._wants(path):
            return
        old = self._timers.pop(path, None)
        if old is not None:
            old.cancel()
        self._event(path, ("text", text()))

    def buffer_closed(self, path: str) -> None:
        """didClose: the file on disk is the truth again (unsaved changes are gone)."""
        old = self._timers.pop(path, None)
        if old is not None:
            old.cancel()
        if self._wants(path):
            self._event(path, ("closed", None))

    def files_changed(self, changes: list[tuple[str, int]]) -> None:
        """workspace/didChangeWatchedFiles: (absolute path, FileChangeType: 1 created,
        2 changed, 3 deleted)."""
        for path, kind in changes:
            if not self._wants(path):
                continue
            if path.endswith(("/.gitignore", "/.git/info/exclude")):
                self._event(path, ("rescan", None))  # the rules changed: walk again
            elif kind == 3:
                self._event(path, ("removed", None))
            else:
                self._event(path, ("read", None))

    def set_watching(self, watching: bool) -> None:
        """The client now reports file changes (didChangeWatchedFiles registered): no more
        mtime rescans; or it does not (a failed registration): rescan."""
        self.watching = watching
        with self._cv:
            for ri in self._roots.values():
                if watching:
                    ri.next_rescan = float("inf")
                elif ri.state == "ready" and self.options.rescan_s > 0:
                    ri.next_rescan = time.monotonic() + self.options.rescan_s
            self._cv.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the indexer: it finishes the file it is in, saves what changed (when it holds
        the lock) and releases the lock. Waits up to `timeout_s`."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._no_prediction.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)
            if t.is_alive():
                log.warning("index: the indexer did not stop within %.0f s; its unsaved changes are lost "
                            "(the next start re-reads the changed files)", timeout_s)  # fmt: skip
        else:
            self._finish()

    # ---- plumbing between the event loop and the indexer -----------------------------------------
    def _wants(self, path: str) -> bool:
        return self.options.enabled and any(
            ri.rel(path) is not None and ri.state != "off" for ri in list(self._roots.values())
        )

    def _snapshot(self, path: str, text: Callable[[], str]) -> None:
        self._timers.pop(path, None)
        try:
            value = text()
        except Exception:
            log.debug("index: could not read the buffer %s", path, exc_info=True)
            return
        self._event(path, ("text", value))

    def _event(self, path: str, action: tuple[str, Any]) -> None:
        with self._cv:
            self._events[path] = action  # the latest action for a path wins
            self._cv.notify_all()

    def _start(self) -> None:
        if self._thread is not None or not self.options.enabled:
            return
        # the index's many small arrays would make the collector's automatic full passes take
        # 70-150 ms during keystrokes: the indexer runs them when no prediction waits (lsp.heap)
        heap.defer_full_collections()
        self._thread = threading.Thread(target=self._run, name="dlm-index", daemon=True)
        self._thread.start()

    def _notify_status(self) -> None:
        try:
            self._on_status()
        except Exception:
            log.debug("index: status callback failed", exc_info=True)

    def _progress(self, ev: ProgressEvent) -> None:
        try:
            self.on_progress(ev)
        except Exception:
            log.debug("index: progress callback failed", exc_info=True)

    # ---- the indexer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass
        try:
            while self._turn():
                if not self._step():
                    with self._cv:
                        if not self._stop and not self._events and not self._busy():
                            self._cv.wait(self._idle_wait())
        except Exception as exc:
            log.exception("index: the indexer stopped on an unexpected error; suggestions go on without "
                          "the repository memory (restart the server to index again)")  # fmt: skip
            for ri in list(self._roots.values()):
                if ri.state in ("loading", "indexing"):
                    ri.state = "failed"
                    ri.message = (f"the indexer stopped on an unexpected error ({type(exc).__name__}: "
                                  f"{exc}); suggestions go on without the repository memory; see the server "
                                  "log and restart the server to index again")  # fmt: skip
            self._notify_status()
        finally:
            self._finish()

    def _turn(self) -> bool:
        """Wait while a prediction runs (predictions come first); False once stopping."""
        while True:
            if self._stop:
                return False
            if self._no_prediction.wait(0.25):
                return not self._stop

    def _busy(self) -> bool:
        return any(ri.job is not None or ri.removed for ri in self._roots.values())

    def _idle_wait(self) -> float:
        now = time.monotonic()
        due = [ri.next_rescan for ri in self._roots.values()]
        due += [max(ri.changed_at + SAVE_AFTER_S, self._last_prediction + QUIET_S)
                for ri in self._roots.values() if ri.dirty]  # fmt: skip
        return min(5.0, max(0.05, min(due, default=now + 5.0) - now))

    def _step(self) -> bool:
        """Do one small thing; False when there was nothing to do."""
        now = time.monotonic()
        heap.collect_if_due(self._no_prediction.is_set() and now - self._last_prediction >= QUIET_S, now)
        with self._cv:
            events = self._events
            self._events = {}
            removed = [ri for ri in self._roots.values() if ri.removed]
            for ri in removed:
                if self._roots.get(ri.real) is ri:
                    del self._roots[ri.real]
        for ri in removed:
            self._retire(ri)
        if events:
            files = self._files()
            for path, action in events.items():
                if not self._turn():
                    return True
                self._apply(path, action)
            for ri in list(self._roots.values()):
                self._seal(ri)
            if self._files() != files:  # dlm/status follows the count, not every buffer update
                self._notify_status()
            return True
        for ri in list(self._roots.values()):
            if ri.job is not None:
                try:
                    next(ri.job)
                except StopIteration:
                    ri.job = None
                return True
        now = time.monotonic()
        for ri in list(self._roots.values()):
            if ri.next_rescan <= now:
                ri.next_rescan = float("inf")
                ri.job = self._index(ri, initial=ri.memory is None)
                return True
            if ri.dirty and now - ri.changed_at >= SAVE_AFTER_S and now - self._last_prediction >= QUIET_S:
                self._save(ri)
                return True
        return bool(removed)

    def _files(self) -> int:
        return sum(len(ri.manifest) for ri in self._roots.values())

    def _finish(self) -> None:
        for ri in list(self._roots.values()):
            self._retire(ri)

    def _retire(self, ri: RootIndex) -> None:
        """Save a root's index if it changed and let its lock go."""
        if ri.store is not None:
            if ri.dirty:
                self._save(ri)
            ri.store.close()
            ri.store = None

    # ---- one root ----------------------------------------------------------------------------------
    def _index(self, ri: RootIndex, initial: bool) -> Iterator[None]:
        """Load (first time), walk, read what changed, save: one small step per `next`."""
        if initial:
            refused = discovery.refusal(ri.path)
            if refused:
                message = (f"{refused}: not indexed (too much, and it holds other projects and your "
                           "secrets); open a project folder to use the repository memory")  # fmt: skip
                log.warning("index: %s", message)  # logged before the status says it
                ri.state, ri.message = "off", message
                self._notify_status()
                return
            if not os.path.isdir(ri.real):
                self._root_missing(ri)
                return
            ri.state, ri.message = "loading", ""
            self._notify_status()
            yield
            self._load(ri)
            self._notify_status()
            yield
        if not os.path.isdir(ri.real):
            self._root_missing(ri)
            return
        t0 = time.monotonic()
        ri.ignore = discovery.ignore_stack(
            ri.real, tuple(x for x in self.options.exclude if isinstance(x, str))
        )
        limits = discovery.Limits.for_files(self.options.max_files, self.options.max_file_bytes)
        other_roots = frozenset(r.real for r in self._roots.values() if r is not ri)
        skip = other_roots | {os.path.realpath(cache_base())}
        progress = initial
        if progress:
            ri.state, ri.done, ri.total = "indexing", 0, None
            self._notify_status()
            self._progress(
                ProgressEvent(ri.real, "begin", f"dlm: indexing {ri.name}", "looking for files", 0)
            )
        walked = discovery.walk(ri.real, limits, ri.ignore, skip, self._turn)
        if walked.stopped == "stopped":
            return
        if not os.path.isdir(ri.real):  # it went away during the walk: keep what we had
            self._root_missing(ri)
            if progress:
                self._progress(ProgressEvent(ri.real, "end", "", "the folder disappeared"))
            return
        if walked.stopped:
            log.warning("index: %s", walked.stopped)
        open_rels = {rel for p in list(self._open) if (rel := ri.rel(p)) is not None}
        present = {c.rel for c in walked.files}
        for rel in [r for r in ri.manifest if r not in present and r not in open_rels]:
            self._drop(ri, rel)
        todo = [c for c in walked.files
                if c.rel not in open_rels and ri.manifest.get(c.rel) != (c.mtime_ns, c.size)
                and ri.refused.get(c.rel) != (c.mtime_ns, c.size)]  # fmt: skip
        # the files found, of which those unchanged since the saved index are done already
        ri.total, ri.done = len(walked.files), len(walked.files) - len(todo)
        if not progress and len(todo) >= RESCAN_PROGRESS_FILES:
            progress = True
            ri.state = "indexing"
            self._progress(ProgressEvent(ri.real, "begin", f"dlm: indexing {ri.name}", "", 0))
        if progress:
            self._notify_status()  # "indexing 0/77 files": the walk is over, the count is known
        skipped: Counter[str] = Counter(walked.skipped)
        last_report, last_pct = time.monotonic(), 0
        last_status = time.monotonic()
        for i, cand in enumerate(todo):
            yield
            # from the root's descriptor down: a folder swapped for a link since the walk reads nothing
            got = discovery.read_workspace_file(ri.real, cand.rel, self.options.max_file_bytes,
                                                 self._pause_for_predictions)
            if isinstance(got, str):
                skipped[got] += 1
                self._drop(ri, cand.rel)  # vanished, or no longer something we index
            else:
                self._put(ri, cand.rel, got.text, (got.mtime_ns, got.size))
            ri.done += 1
            pct = (100 * (i + 1)) // len(todo)
            now = time.monotonic()
            if progress and now - last_status >= STATUS_EVERY_S:
                last_status = now
                self._notify_status()  # dlm/status follows the count (editors without $/progress)
            if progress and pct != last_pct and now - last_report >= PROGRESS_EVERY_S:
                last_report, last_pct = now, pct
                self._progress(
                    ProgressEvent(ri.real, "report", "", f"indexing {pct}% ({i + 1}/{len(todo)} files)", pct)
                )
        for p, text in list(self._open.items()):  # buffers opened before the memory existed
            rel = ri.rel(p)
            if rel is not None and ri.manifest.get(rel) != BUFFER_SIG:
                self._put(ri, rel, text, BUFFER_SIG)
        self._seal(ri)
        if ri.dirty and time.monotonic() - self._last_prediction >= QUIET_S:
            # Before "ready": RepoMemory.save holds the memory while it writes (else the save
            # waits for SAVE_AFTER_S and a quiet spell: _step).
            if progress:
                self._progress(ProgressEvent(ri.real, "report", "", "saving the index", 100))
            self._save(ri)
        # the walk's cap and what the ignore files left out (taken here, on the indexer's thread,
        # which alone changes the rules); the rest of what the status says is `_notes`
        ri.state, ri.message = "ready", "; ".join([m for m in (walked.stopped, *ri.ignore.warnings) if m])
        files, tokens = self._size(ri)
        if progress or todo:
            log.info(
                "index: %s: %d files, %d tokens (%d read in %.1f s; skipped %s)",
                ri.real, files, tokens, len(todo), time.monotonic() - t0, dict(skipped) or "none",
            )  # fmt: skip
        if progress:
            self._progress(ProgressEvent(ri.real, "end", "", f"{files} files indexed"))
        if not self.watching and self.options.rescan_s > 0:
            ri.next_rescan = time.monotonic() + self.options.rescan_s
        self._notify_status()

    def _load(self, ri: RootIndex) -> None:
        """The persisted index, or a new memory (the store logs why it rebuilds)."""
        mem_cls = self._memory_class()
        ri.store = IndexStore(ri.real)
        ri.store.open()
        loaded = ri.store.load(mem_cls.load)
        wanted = self._shape()
        if loaded is not None:
            memory, header = loaded
            manifest = header.get("manifest")
            if header.get("shape") != wanted or not isinstance(manifest, dict):
                log.info("index: the persisted index of %s was built with other options (%s); rebuilding it",
                         ri.real, header.get("shape"))  # fmt: skip
            else:
                ri.memory = self._yielding(memory)
                ri.manifest = {str(k): (int(v[0]), int(v[1])) for k, v in manifest.items()}
                log.info("index: loaded %s: %d files", ri.store.path, len(ri.manifest))
                return
        ri.memory = self._yielding(mem_cls(max_tokens=self.options.max_tokens))
        ri.manifest = {}

    def _seal(self, ri: RootIndex) -> None:
        """Count the memory's pending changes into a sorted table here, on the indexer's thread
        (RepoMemory.compact(full=False): milliseconds for a buffer), so that no suggestion
        pays for counting them."""
        compact = getattr(ri.memory, "compact", None)
        if compact is not None and ri.state != "off":
            compact(full=False)

    def _yielding(self, memory: Any) -> Any:
        """The memory, pausing its writes for predictions (RepoMemory.pause) where it can."""
        if hasattr(memory, "pause"):
            memory.pause = self._pause_for_predictions
        return memory

    def _shape(self) -> dict[str, Any]:
        """What a persisted index must have been built with to be reused."""
        return {"max_tokens": self.options.max_tokens}

    def _root_missing(self, ri: RootIndex) -> None:
        ri.state = "failed"
        ri.message = (f"the workspace folder {ri.path} does not exist or is not a readable folder; "
                      "suggestions go on without its repository memory (it is indexed when it comes back)")  # fmt: skip
        log.warning("index: %s", ri.message)
        ri.next_rescan = time.monotonic() + RETRY_S
        self._notify_status()

    def _cap_message(self, ri: RootIndex) -> str:
        if not ri.capped:
            return ""
        return (f"reached maxTokens ({self.options.max_tokens} tokens) in {ri.real}; "
                "further files are not indexed (raise index.maxTokens to index more)")  # fmt: skip

    def _size(self, ri: RootIndex) -> tuple[int, int]:
        try:
            return int(ri.memory.files), int(ri.memory.tokens)
        except Exception:  # noqa: BLE001
            return len(ri.manifest), 0

    def _put(self, ri: RootIndex, rel: str, text: str, sig: tuple[int, int]) -> None:
        n = ri.memory.update_file(rel, text)
        if n == 0 and text:  # refused: over maxTokens (and no longer indexed)
            ri.manifest.pop(rel, None)
            if sig != BUFFER_SIG:
                ri.refused[rel] = sig
            if not ri.capped:
                ri.capped = True
                log.warning("index: %s", self._cap_message(ri))
        else:
            ri.manifest[rel] = sig
            ri.refused.pop(rel, None)
        ri.dirty, ri.changed_at = True, time.monotonic()

    def _drop(self, ri: RootIndex, rel: str) -> None:
        if rel not in ri.manifest:
            return
        ri.memory.remove_file(rel)
        del ri.manifest[rel]
        ri.dirty, ri.changed_at = True, time.monotonic()

    def _save(self, ri: RootIndex) -> None:
        if ri.store is None or ri.memory is None or not ri.store.writable:
            ri.dirty = False  # a read-only server keeps its changes in memory (store.message says so)
            return
        manifest = {rel: list(sig) for rel, sig in ri.manifest.items() if sig != BUFFER_SIG}
        if ri.store.save(ri.memory.save, {"manifest": manifest, "shape": self._shape()}):
            ri.dirty = False
            if ri.save_error:
                ri.save_error = ""
                self._notify_status()
        else:
            ri.changed_at = time.monotonic()  # try again after another quiet spell
            if not ri.save_error and ri.store.writable:
                ri.save_error = (f"could not save the index to {ri.store.path} (the server log says "
                                 "why; check the free disk space and that the cache folder is writable); it "
                                 "is served from memory, and the next start reads the changed files again")  # fmt: skip
                self._notify_status()

    def _apply(self, path: str, action: tuple[str, Any]) -> None:
        """One event from the editor, on the indexer thread."""
        kind, value = action
        ri = max((r for r in self._roots.values() if r.rel(path) is not None and not r.removed),
                 key=lambda r: len(r.real), default=None)  # fmt: skip
        if ri is None or ri.state == "off":
            return
        rel = ri.rel(path) or ""
        if kind == "rescan":
            ri.next_rescan = 0.0
            return
        if kind == "closed":
            self._open.pop(path, None)
            kind = "read"
        if ri.memory is None or ri.ignore is None:
            if kind == "text" and not discovery.path_allowed(ri.real, rel, discovery.ignore_stack(ri.real)) \
                    and not discovery.link_under(ri.real, rel) \
                    and not discovery.check_text(value, self.options.max_file_bytes):  # fmt: skip
                self._open[path] = value  # the first walk puts it in
            return  # the first walk reads the disk
        why = discovery.path_allowed(ri.real, rel, ri.ignore)
        if kind == "removed":
            prefix = rel + "/"
            for r in [r for r in ri.manifest if r == rel or r.startswith(prefix)]:
                if os.path.join(ri.real, r) not in self._open:
                    self._drop(ri, r)
            return
        if kind == "text":
            # a buffer of a file reached through a linked folder is not the workspace's
            why = why or discovery.link_under(ri.real, rel)
            why = why or discovery.check_text(value, self.options.max_file_bytes)
            if why:
                log.debug("index: not indexing the buffer %s: %s", rel, why)
                self._open.pop(path, None)
                self._drop(ri, rel)  # what the file holds now must not stay in the index either
                return
            self._open[path] = value
            self._put(ri, rel, value, BUFFER_SIG)
            return
        # "read": the disk changed (a watched-file event) or a buffer was closed
        if path in self._open:
            return  # the open buffer is the truth
        if os.path.isdir(path):
            ri.next_rescan = 0.0  # a new folder: walk again
            return
        if why:
            self._drop(ri, rel)
            return
        got = discovery.read_workspace_file(ri.real, rel, self.options.max_file_bytes)
        if isinstance(got, str):
            log.debug("index: not indexing %s: %s", display_path(rel), got)
            self._drop(ri, rel)
        else:
            self._put(ri, rel, got.text, (got.mtime_ns, got.size))
