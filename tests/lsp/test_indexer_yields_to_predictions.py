"""The indexer yields to predictions: the WorkspaceIndex gives its RepoMemory a `pause` that waits
while a prediction runs (begin_prediction() until its end() is called, or `with prediction():`),
so that the indexer's Python work never holds the GIL against a suggestion.

Tests build a WorkspaceIndex over a tmp folder with the real RepoMemory (as test_workspace_index's
test_real_memory_round_trip does). A call that must block is run in a thread and checked to be
still alive after 0.3 s; one that must return is given seconds (liveness, not speed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory import index as index_mod
from dlm.lsp.options import IndexOptions
from dlm.lsp.workspace_index import WorkspaceIndex
from workspace_fakes import cache_home, ready, wait_until, write  # noqa: F401  (cache_home: autouse)

BLOCKED_S = 0.3  # a pause still running after this long is waiting
RETURN_S = 10.0  # a released pause returns well within this


def make_project(root: Path) -> Path:
    write(root, "app/main.py", "def main():\n    return helper()\n")
    write(root, "app/util.py", "def helper():\n    return 42\n")
    write(root, "web/index.ts", "export const answer = 42;\n")
    return root


def built(tmp_path: Path) -> WorkspaceIndex:
    """A WorkspaceIndex of make_project's tree, once built; the caller closes it."""
    w = WorkspaceIndex(IndexOptions())
    w.set_roots([str(make_project(tmp_path / "proj"))])
    try:
        ready(w)
    except BaseException:
        w.close()
        raise
    return w


def the_root(ws: WorkspaceIndex):
    (ri,) = list(ws._roots.values())
    return ri


def is_workspace_pause(fn, ws: WorkspaceIndex) -> bool:
    return (
        getattr(fn, "__self__", None) is ws
        and getattr(fn, "__func__", None) is WorkspaceIndex._pause_for_predictions
    )


class Call:
    """`fn()` on a thread of its own."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def blocked(self) -> bool:
        self.thread.join(BLOCKED_S)
        return self.thread.is_alive()

    def returned(self) -> bool:
        self.thread.join(RETURN_S)
        assert self.error is None, self.error
        return not self.thread.is_alive()


@pytest.fixture
def ws(tmp_path: Path):
    w = built(tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_the_real_memory_gets_the_workspaces_pause(ws: WorkspaceIndex):
    mem = the_root(ws).memory
    assert isinstance(mem, RepoMemory)
    assert is_workspace_pause(mem.pause, ws)
    assert mem.pause is not index_mod._no_pause


def test_a_persisted_memory_gets_the_workspaces_pause_when_loaded(tmp_path: Path):
    loads = []

    class Recording(RepoMemory):
        @classmethod
        def load(cls, fh):
            loads.append(1)
            return super().load(fh)

    root = make_project(tmp_path / "proj")
    first = WorkspaceIndex(IndexOptions())
    first.set_roots([str(root)])
    try:
        ready(first)
    finally:
        first.close()
    again = WorkspaceIndex(IndexOptions(), memory_class=lambda: Recording)
    again.set_roots([str(root)])
    try:
        ready(again)
        assert loads, "the persisted index was not loaded (rebuilt instead): the loaded path is untested"
        mem = the_root(again).memory
        assert isinstance(mem, RepoMemory)
        assert is_workspace_pause(mem.pause, again)
    finally:
        again.close()


def test_pause_returns_at_once_without_a_prediction(ws: WorkspaceIndex):
    assert Call(the_root(ws).memory.pause).returned()


def test_pause_waits_until_the_prediction_ends(ws: WorkspaceIndex):
    pause = the_root(ws).memory.pause
    end = ws.begin_prediction()
    try:
        call = Call(pause)
        assert call.blocked(), "the indexer's pause returned while a prediction ran"
    finally:
        end()
    assert call.returned(), "the pause did not return once the prediction ended"


def test_ending_twice_does_not_end_another_prediction(ws: WorkspaceIndex):
    pause = the_root(ws).memory.pause
    end = ws.begin_prediction()
    end()
    end()  # a second call does nothing
    assert ws._predicting == 0
    assert Call(pause).returned()

    # a second begin/end pair still blocks and unblocks
    end2 = ws.begin_prediction()
    call = Call(pause)
    assert call.blocked()
    end2()
    assert call.returned()
    assert ws._predicting == 0

    # two predictions overlapping: ending one of them twice leaves the other one running
    end_a = ws.begin_prediction()
    end_b = ws.begin_prediction()
    end_a()
    end_a()
    call = Call(pause)
    assert call.blocked(), "ending one prediction twice released the pause while another ran"
    end_b()
    assert call.returned()
    assert ws._predicting == 0


def test_end_may_be_called_on_another_thread(ws: WorkspaceIndex):
    pause = the_root(ws).memory.pause
    end = ws.begin_prediction()
    call = Call(pause)
    assert call.blocked()
    ender = threading.Thread(target=end)
    ender.start()
    ender.join(RETURN_S)
    assert call.returned()


def test_with_prediction_still_holds_the_pause(ws: WorkspaceIndex):
    pause = the_root(ws).memory.pause
    with ws.prediction():
        call = Call(pause)
        assert call.blocked()
    assert call.returned()
    assert ws._predicting == 0
    with pytest.raises(RuntimeError), ws.prediction():
        call = Call(pause)
        assert call.blocked()
        raise RuntimeError("the prediction failed")
    assert call.returned()
    assert ws._predicting == 0


def test_close_releases_a_waiting_pause(tmp_path: Path):
    w = built(tmp_path)
    try:
        end = w.begin_prediction()
        call = Call(the_root(w).memory.pause)
        assert call.blocked()
    finally:
        w.close()
    assert call.returned(), "a pause waiting for a prediction kept the indexer from stopping"
    end()


def test_the_indexer_waits_inside_a_file_while_a_prediction_runs(tmp_path: Path):
    """End to end: the indexer thread, in the middle of a long file (RepoMemory.update_file's
    first pause), waits for a prediction begun there, and finishes the file once it ends."""
    ws_box: list[WorkspaceIndex] = []
    started = threading.Event()
    state: dict = {"calls": 0, "end": None}

    class Gated(RepoMemory):
        @property
        def pause(self):
            return self._gated_pause

        @pause.setter
        def pause(self, fn):
            self._inner_pause = fn

        def update_file(self, path, text):
            self._indexing = path
            try:
                return super().update_file(path, text)
            finally:
                self._indexing = None

        def _gated_pause(self):
            if not str(getattr(self, "_indexing", None)).endswith("big.py"):
                return self._inner_pause()
            state["calls"] += 1
            if state["end"] is None:
                state["end"] = ws_box[0].begin_prediction()  # a suggestion arrives now
                started.set()
            self._inner_pause()

    root = make_project(tmp_path / "proj")
    lines = [f"def function_{i}(argument_{i}):\n    return argument_{i} + {i}\n" for i in range(4000)]
    write(root, "app/big.py", "".join(lines))
    assert len("".join(lines)) > index_mod.LEX_CHUNK_CHARS
    w = WorkspaceIndex(IndexOptions(), memory_class=lambda: Gated)
    ws_box.append(w)
    w.set_roots([str(root)])
    try:
        assert started.wait(30), "the indexer never paused"
        time.sleep(BLOCKED_S)
        mem = the_root(w).memory
        assert is_workspace_pause(mem._inner_pause, w)
        assert state["calls"] == 1, "the indexer went on while the prediction ran"
        assert "app/big.py" not in mem.paths()
        assert w.status()["state"] != "ready"
        state["end"]()
        st = ready(w)
        assert state["calls"] > 1
        assert "app/big.py" in mem.paths()
        assert st["files"] == 4
    finally:
        w.close()


def test_reading_a_long_file_pauses_between_pieces_of_its_secret_scan(tmp_path: Path, monkeypatch):
    """The secret scan of a file read for the index runs a piece at a time with the workspace's
    pause between pieces: one scan of a megabyte holds the GIL for hundreds of milliseconds."""
    from dlm.coder_model import secrets
    from dlm.lsp import discovery

    scans: list[tuple[int, object]] = []
    real = secrets.mask_in_pieces

    def spy(text, between):
        scans.append((len(text), between))
        return real(text, between)

    monkeypatch.setattr(discovery.secrets, "mask_in_pieces", spy)
    root = make_project(tmp_path / "proj")
    write(root, "app/big.py", "".join(f"value_{i} = {i}\n" for i in range(8000)))
    w = WorkspaceIndex(IndexOptions())
    w.set_roots([str(root)])
    try:
        ready(w)
        long_reads = [b for n, b in scans if n > secrets.MASK_PIECE_CHARS]
        assert long_reads, "the long file was not scanned for secrets in pieces"
        assert all(is_workspace_pause(b, w) for b in long_reads)
    finally:
        w.close()
