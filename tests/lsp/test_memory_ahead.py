"""lsp.memory_ahead: a document is counted for the repository memory when it opens and when typing
pauses, on the pool; never for a closed document or a file outside the indexed roots."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from dlm.coder_model.memory.index import RepoMemory
from dlm.lsp import memory_ahead
from dlm.lsp.documents import Document
from dlm.lsp.memory_ahead import MemoryAhead

TEXT = "def f(x):\n    return x + 1\n\n\ndef g(y):\n    return y + 1\n"


class _Index:
    """The one call MemoryAhead makes of the workspace index: the memory of a path's root."""

    def __init__(self, memory) -> None:
        self.memory = memory

    def memory_for(self, path: str):
        return (self.memory, "pkg/m.py") if path.startswith("/w/") else (None, "")


def test_a_document_is_counted_when_it_opens_and_again_when_typing_pauses(monkeypatch):
    monkeypatch.setattr(memory_ahead, "AHEAD_IDLE_S", 0.05)
    memory = RepoMemory()
    pool = ThreadPoolExecutor(2)
    ahead = MemoryAhead(pool, _Index(memory))

    async def scenario() -> None:
        doc = Document("file:///w/pkg/m.py", TEXT, 1, "python")
        ahead.changed(doc, opened=True)
        assert doc.syntax is None or doc.syntax.reparses == 1  # parsed when it opened
        await asyncio.sleep(0.2)
        assert memory._bases["pkg/m.py"].text == TEXT
        doc.apply((5, 16), (5, 16), " * 2", 2)
        ahead.changed(doc)
        assert memory._bases["pkg/m.py"].text == TEXT  # not while typing
        await asyncio.sleep(0.3)
        assert memory._bases["pkg/m.py"].text == doc.text  # once it paused
        # closed before the pause: nothing counted
        doc.apply((0, 0), (0, 0), "# x\n", 3)
        ahead.changed(doc)
        ahead.forget(doc.uri)
        await asyncio.sleep(0.3)
        assert memory._bases["pkg/m.py"].text != doc.text
        # a file in no indexed root
        outside = Document("file:///elsewhere/m.py", TEXT, 1, "python")
        ahead.changed(outside, opened=True)
        await asyncio.sleep(0.1)
        assert list(memory._bases) == ["pkg/m.py"]

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown()


def test_a_failed_count_is_logged_and_costs_nothing_else(caplog):
    class Broken:
        def prepare_document(self, rel, text):
            raise RuntimeError("boom")

    pool = ThreadPoolExecutor(1)
    try:
        MemoryAhead(pool, _Index(Broken())).changed(Document("file:///w/pkg/m.py", TEXT, 1, "python"), opened=True)
        pool.shutdown(wait=True)
    finally:
        pool.shutdown()
    assert "counting pkg/m.py ahead for the repository memory failed" in caplog.text
