"""The repository memory counts a document ahead of the first query on one of its lines.

The memory's first query on a new line used to count the text around the cursor (its
current-file level, about 40 ms of a 50 ms first query on a 30k-character file): that is the
first keystroke after Enter, the one a user waits on most. Counted ahead, when the document opens
and whenever typing pauses for AHEAD_IDLE_S (coder_model.memory.RepoMemory.prepare_document, on a
pool thread), the query takes that count less the cursor's line, as long as only that line
changed since. So the first keystroke after a pause or after opening a file costs what the next
ones do. A document over the memory's BASE_MAX_CHARS is counted around the cursor as before.
When a document opens, its syntax tree is parsed too (lsp.syntax parses lazily, and the first
query's syntax check reads the tree: 80-130 ms for an 80k-character file), on the event loop
where the tree lives, as the first query would have.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from dlm.lsp.documents import Document
from dlm.lsp.workspace_index import WorkspaceIndex, file_path

log = logging.getLogger(__name__)

AHEAD_IDLE_S = 0.5  # typing paused this long: the document is counted again


class MemoryAhead:
    """Per open document, the pending count (a timer on the event loop); the counting runs on `pool`."""

    def __init__(self, pool: Executor, workspace_index: WorkspaceIndex) -> None:
        self.pool = pool
        self.workspace_index = workspace_index
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def changed(self, doc: Document, opened: bool = False) -> None:
        """didOpen (counted now) or didChange (counted once typing pauses); on the event loop."""
        self.forget(doc.uri)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if opened or loop is None:
            self._submit(doc.uri, doc.text)
            if opened and doc.syntax is not None:
                try:
                    doc.syntax.tree()
                except Exception:  # a grammar edge case: the first query parses, or reads the lines
                    log.exception("parsing %s when it opened failed", doc.uri)
            return
        self._timers[doc.uri] = loop.call_later(AHEAD_IDLE_S, self._paused, doc)

    def forget(self, uri: str) -> None:
        """The document closed, or changed again: no count pending."""
        handle = self._timers.pop(uri, None)
        if handle is not None:
            handle.cancel()

    def _paused(self, doc: Document) -> None:
        self._timers.pop(doc.uri, None)
        self._submit(doc.uri, doc.text)

    def _submit(self, uri: str, text: str) -> None:
        path = file_path(uri)
        if path is None:
            return
        memory, rel = self.workspace_index.memory_for(path)
        prepare = getattr(memory, "prepare_document", None)
        if prepare is None:
            return
        self.pool.submit(_prepare, prepare, rel, text)


def _prepare(prepare, rel: str, text: str) -> None:
    try:
        prepare(rel, text)
    except Exception:  # a failed count costs the first query its speed, never an answer
        log.exception("counting %s ahead for the repository memory failed; its queries count it themselves", rel)
