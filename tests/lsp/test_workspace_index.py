"""The workspace index (lsp.workspace_index, lsp.index_store): building, persisting, keeping
current, and every bad input (docs/repository-memory.md) with a clear log line and the index serving.

`FakeMemory` stands in for RepoMemory's storage interface (update_file, remove_file,
files, tokens, save, load) so that these tests are about the workspace service only;
the round trip through the real RepoMemory is `test_real_memory_round_trip`."""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from dlm.lsp import discovery, index_store
from dlm.lsp.options import IndexOptions
from dlm.lsp.workspace_index import WorkspaceIndex
from workspace_fakes import FakeMemory, cache_home, make_project, ready, wait_until, write  # noqa: F401  (cache_home: autouse)


def start(root: Path, **opts) -> WorkspaceIndex:
    ws = WorkspaceIndex(IndexOptions(**opts), memory_class=lambda: FakeMemory)
    ws.set_roots([str(root)])
    return ws


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and mtime: to show nothing was written there."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


# ---- building and persisting ------------------------------------------------------------------------


def test_indexes_sources_only_persists_0600_and_writes_nothing_into_the_project(
    tmp_path: Path, cache_home: Path  # noqa: F811 (the imported fixture)
):
    root = make_project(tmp_path / "proj")
    before = tree(root)
    ws = start(root)
    try:
        st = ready(ws)
        assert st["files"] == 3 and st["tokens"] > 0 and st["message"] == ""
        assert sorted(ws.memory.texts) == ["app/main.py", "app/util.py", "web/index.ts"]
        mem, rel = ws.memory_for(str(root / "app" / "main.py"))
        assert mem is ws.memory and rel == "app/main.py"
        assert ws.memory_for(str(tmp_path / "elsewhere.py")) == (None, "")
    finally:
        ws.close()
    assert tree(root) == before  # nothing written into the project
    cache_dir = index_store.cache_dir_for(str(root))
    assert cache_dir.parent.parent == cache_home and cache_dir.name == index_store.root_key(str(root))
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache_dir.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache_dir / "index.bin").st_mode) == 0o600
    assert not list(cache_dir.glob("*.tmp"))


def test_restart_loads_the_persisted_index_and_reads_only_what_changed(tmp_path: Path, monkeypatch):
    root = make_project(tmp_path / "proj")
    ws = start(root)
    ready(ws)
    ws.close()
    time.sleep(0.01)
    write(root, "app/util.py", "def helper():\n    return 43\n")  # changed while the server was off
    (root / "web" / "index.ts").unlink()  # deleted
    write(root, "app/new.py", "NEW = 1\n")  # added
    reads: list[str] = []
    real = discovery.read_workspace_file
    monkeypatch.setattr(discovery, "read_workspace_file", lambda r, p, n, *more: reads.append(p) or real(r, p, n, *more))
    ws = start(root)
    try:
        ready(ws)
        assert sorted(ws.memory.texts) == ["app/main.py", "app/new.py", "app/util.py"]
        assert "43" in ws.memory.texts["app/util.py"]
        assert sorted(Path(p).name for p in reads) == ["new.py", "util.py"]  # main.py came from the cache
    finally:
        ws.close()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "other_root"])
def test_a_corrupt_or_truncated_persisted_index_is_rebuilt(tmp_path: Path, damage: str, caplog):
    root = make_project(tmp_path / "proj")
    ws = start(root)
    ready(ws)
    ws.close()
    path = index_store.cache_dir_for(str(root)) / "index.bin"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:])
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid index of another root copied over this one
        other = make_project(tmp_path / "other")
        ws2 = start(other)
        ready(ws2)
        ws2.close()
        path.write_bytes((index_store.cache_dir_for(str(other)) / "index.bin").read_bytes())
    caplog.set_level(logging.WARNING, logger="dlm.lsp.index_store")
    ws = start(root)
    try:
        assert ready(ws)["files"] == 3
        assert any("unusable" in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)
    finally:
        ws.close()
    assert index_store.IndexStore(str(root)).load(FakeMemory.load) is not None  # rewritten whole


def test_two_servers_on_one_root_only_the_first_writes(tmp_path: Path):
    root = make_project(tmp_path / "proj")
    first = start(root)
    ready(first)
    path = index_store.cache_dir_for(str(root)) / "index.bin"
    before = path.stat().st_mtime_ns
    second = start(root)
    try:
        st = ready(second)
        assert st["files"] == 3
        assert "another dlm-lsp holds the index" in st["message"]
        second.buffer_saved(str(root / "app" / "main.py"), lambda: "def main():\n    return 0\n")
        wait_until(lambda: "return 0" in second.memory.texts["app/main.py"])
        second.close()
        assert path.stat().st_mtime_ns == before  # the second server never wrote
        assert not list(path.parent.glob("*.tmp"))
    finally:
        first.close()


def test_a_full_disk_when_persisting_serves_from_memory(tmp_path: Path, monkeypatch, caplog):
    root = make_project(tmp_path / "proj")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_store.os, "fsync", no_space)
    caplog.set_level(logging.WARNING, logger="dlm.lsp.index_store")
    ws = start(root)
    try:
        st = ready(ws)
        assert st["files"] == 3 and ws.memory.files == 3  # serving from memory
        assert any("No space left" in r.getMessage() and "serving it from memory" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    finally:
        ws.close()
    cache_dir = index_store.cache_dir_for(str(root))
    assert not (cache_dir / "index.bin").exists()  # no half-written index ...
    assert not list(cache_dir.glob(".*.tmp"))  # ... and no temp file left behind


def built_with_cache_at(root: Path, cache: Path, monkeypatch) -> dict:
    """The status of root's index once built with XDG_CACHE_HOME at `cache`."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    ws = start(root)
    try:
        return ready(ws)
    finally:
        ws.close()


def test_an_unwritable_cache_folder_keeps_the_index_in_memory(tmp_path: Path, monkeypatch):
    root = make_project(tmp_path / "proj")
    (tmp_path / "blocker").write_text("a file where the cache folder should be")
    st = built_with_cache_at(root, tmp_path / "blocker", monkeypatch)
    assert st["files"] == 3 and "cannot use the cache folder" in st["message"]


def test_a_cache_inside_the_project_is_not_written(tmp_path: Path, monkeypatch):
    root = make_project(tmp_path / "proj")
    st = built_with_cache_at(root, root / ".cache-here", monkeypatch)
    assert st["files"] == 3 and "inside the project" in st["message"]
    assert not (root / ".cache-here").exists()


# ---- bad roots -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["slash", "home", "above_home"])
def test_root_slash_or_home_is_refused_and_said(tmp_path: Path, which: str, caplog):
    home = tmp_path / "home"
    make_project(home)
    root = {"slash": "/", "home": str(home), "above_home": str(tmp_path)}[which]
    caplog.set_level(logging.WARNING, logger="dlm.lsp.workspace_index")
    ws = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    ws.set_roots([root])
    try:
        wait_until(lambda: ws.status()["message"] != "")
        st = ws.status()
        assert st["state"] == "off" and st["files"] == 0 and "not indexed" in st["message"]
        assert ws.memory is None
        assert any("not indexed" in r.getMessage() for r in caplog.records)
        ws.buffer_saved(f"{root.rstrip('/')}/x.py", lambda: "x = 1\n")  # nothing happens, nothing breaks
        assert ws.open_files() == {}
    finally:
        ws.close()
    assert not index_store.cache_base().exists()  # nothing persisted either


def test_a_root_that_does_not_exist_or_disappears(tmp_path: Path, caplog):
    root = make_project(tmp_path / "proj")
    caplog.set_level(logging.WARNING, logger="dlm.lsp.workspace_index")
    ws = start(root, rescan_s=0.05)
    try:
        ready(ws)
        memory = ws.memory
        moved = tmp_path / "moved"
        root.rename(moved)
        st = ready(ws, "failed")
        assert "does not exist" in st["message"] and st["files"] == 3  # what it had, still served
        assert ws.memory is memory
        moved.rename(root)  # it comes back: indexed again
        ws.files_changed([(str(root / ".gitignore"), 2)])
        assert ready(ws)["files"] == 3
    finally:
        ws.close()
    missing = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    missing.set_roots([str(tmp_path / "never")])
    try:
        st = ready(missing, "failed")
        assert "does not exist" in st["message"]
    finally:
        missing.close()


# ---- caps and misbehaving files -----------------------------------------------------------------------------


def test_caps_on_files_and_tokens(tmp_path: Path, caplog):
    root = tmp_path / "mono"
    for i in range(40):
        write(root, f"pkg{i // 10}/m{i:02d}.py", "a b c d e\n")  # 5 tokens each
    caplog.set_level(logging.WARNING, logger="dlm.lsp")
    ws = start(root, max_files=12)
    try:
        st = ready(ws)
        assert st["files"] == 12 and "maxFiles" in st["message"]
    finally:
        ws.close()
    ws = WorkspaceIndex(IndexOptions(max_tokens=52), memory_class=lambda: FakeMemory)
    (index_store.cache_dir_for(str(root)) / "index.bin").unlink()
    ws.set_roots([str(root)])
    try:
        st = ready(ws)
        assert st["files"] == 10 and st["tokens"] == 50 and "maxTokens" in st["message"]
        assert any("maxTokens" in r.getMessage() for r in caplog.records)
    finally:
        ws.close()


def test_a_fifo_and_files_vanishing_mid_index(tmp_path: Path, monkeypatch):
    root = make_project(tmp_path / "proj")
    os.mkfifo(root / "app" / "pipe.py")
    real = discovery.read_workspace_file

    def vanish_first(root: str, path: str, n: int, *more):
        if path.endswith("main.py"):
            os.unlink(os.path.join(root, path))  # deleted between the walk and the read
        return real(root, path, n, *more)

    monkeypatch.setattr(discovery, "read_workspace_file", vanish_first)
    ws = start(root)
    try:
        st = ready(ws)
        assert st["files"] == 2 and sorted(ws.memory.texts) == ["app/util.py", "web/index.ts"]
    finally:
        ws.close()


# ---- keeping current ---------------------------------------------------------------------------------------


def test_open_buffers_update_the_index_and_closing_falls_back_to_disk(tmp_path: Path):
    root = make_project(tmp_path / "proj")
    ws = start(root)
    try:
        ready(ws)
        main = str(root / "app" / "main.py")
        ws.buffer_changed(main, 30, lambda: "def main():\n    return edited()\n")  # no loop: at once
        wait_until(lambda: "edited" in ws.memory.texts["app/main.py"])
        assert ws.open_files(main) == {"app/main.py": "def main():\n    return edited()\n"}
        # a buffer secret by its name or ignored is never indexed, nor handed out as an open file (a secret
        # line inside an indexable buffer is masked by the memory itself: tests/lsp/test_secrets_never_leave.py)
        ws.buffer_saved(str(root / "config" / "secrets.py"), lambda: "KEY = 'x'\n")
        ws.buffer_saved(str(root / "generated" / "big.py"), lambda: "y = 2\n")
        ws.buffer_saved(str(root / "app" / "new.py"), lambda: "def fresh():\n    pass\n")  # unsaved new file
        wait_until(lambda: "app/new.py" in ws.memory.texts)
        assert sorted(ws.memory.texts) == ["app/main.py", "app/new.py", "app/util.py", "web/index.ts"]
        assert sorted(ws.open_files()) == ["app/main.py", "app/new.py"]
        ws.buffer_closed(main)
        wait_until(lambda: "helper" in ws.memory.texts["app/main.py"])  # the disk again
        util = str(root / "app" / "util.py")
        ws.buffer_saved(util, lambda: "def edited():\n    pass\n")
        wait_until(lambda: "edited" in ws.memory.texts["app/util.py"])
        ws.buffer_closed(util)  # closed without saving: the disk's text again
        wait_until(lambda: "edited" not in ws.memory.texts["app/util.py"])
        ws.buffer_closed(str(root / "app" / "new.py"))  # never saved: gone with its buffer
        wait_until(lambda: "app/new.py" not in ws.memory.texts)
        assert sorted(ws.open_files()) == []
    finally:
        ws.close()


@pytest.mark.asyncio
async def test_buffer_changes_are_debounced_on_the_event_loop(tmp_path: Path, monkeypatch):
    import asyncio

    from dlm.lsp import workspace_index

    monkeypatch.setattr(workspace_index, "DEBOUNCE_S", 0.05)
    root = make_project(tmp_path / "proj")
    ws = start(root)
    try:
        await asyncio.to_thread(ready, ws)
        calls: list[int] = []
        main = str(root / "app" / "main.py")
        for i in range(20):  # a burst of keystrokes: the text is taken once, after the last
            ws.buffer_changed(main, 10, lambda i=i: calls.append(i) or f"v = {i}\n")
        await asyncio.sleep(0.3)
        await asyncio.to_thread(wait_until, lambda: ws.memory.texts["app/main.py"] == "v = 19\n")
        assert calls == [19]
    finally:
        ws.close()


def test_watched_file_events(tmp_path: Path):
    root = make_project(tmp_path / "proj")
    ws = start(root)
    ws.set_watching(True)
    try:
        ready(ws)
        write(root, "app/added.py", "ADDED = 1\n")
        write(root, "app/util.py", "def helper():\n    return 7\n")
        (root / "web" / "index.ts").unlink()
        write(root, "generated/more.py")  # ignored
        write(root, ".env.py", "SECRET = 1\n")  # a secret
        ws.files_changed([(str(root / "app" / "added.py"), 1), (str(root / "app" / "util.py"), 2),
                          (str(root / "web" / "index.ts"), 3), (str(root / "generated" / "more.py"), 1),
                          (str(root / ".env.py"), 1), (str(tmp_path / "outside.py"), 1)])  # fmt: skip
        wait_until(lambda: "app/added.py" in ws.memory.texts and "web/index.ts" not in ws.memory.texts)
        assert sorted(ws.memory.texts) == ["app/added.py", "app/main.py", "app/util.py"]
        assert "7" in ws.memory.texts["app/util.py"]
        # a .gitignore change walks the root again
        write(root, ".gitignore", "generated/\n*.log\napp/added.py\n")
        ws.files_changed([(str(root / ".gitignore"), 2)])
        wait_until(lambda: "app/added.py" not in ws.memory.texts)
        write(root, "lib/deep/new.py", "DEEP = 1\n")  # a new folder: walked
        ws.files_changed([(str(root / "lib"), 1)])
        wait_until(lambda: "lib/deep/new.py" in ws.memory.texts)
    finally:
        ws.close()


def test_mtime_rescans_when_the_client_does_not_watch(tmp_path: Path):
    root = make_project(tmp_path / "proj")
    ws = start(root, rescan_s=0.05)
    try:
        ready(ws)
        write(root, "app/later.py", "LATER = 1\n")
        wait_until(lambda: "app/later.py" in ws.memory.texts)
    finally:
        ws.close()


def test_predictions_come_first(tmp_path: Path, monkeypatch):
    root = make_project(tmp_path / "proj")
    ws = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    reads: list[str] = []
    real = discovery.read_source
    held = threading.Event()
    monkeypatch.setattr(discovery, "read_source", lambda p, n: reads.append(p) or real(p, n))
    try:
        with ws.prediction():
            ws.set_roots([str(root)])
            held.wait(0.5)  # the indexer is running and waits for its turn
            assert reads == [] and ws.status()["state"] == "loading" and ws.memory is None
        assert ready(ws)["files"] == 3
    finally:
        ws.close()


def test_index_off_and_workspace_folder_changes(tmp_path: Path):
    root = make_project(tmp_path / "proj")
    off = WorkspaceIndex(IndexOptions(enabled=False), memory_class=lambda: FakeMemory)
    off.set_roots([str(root)])
    st = off.status()
    assert st["state"] == "off" and "index.enabled" in st["message"] and off._thread is None
    off.close()
    other = make_project(tmp_path / "other")
    write(other, "only_here.py", "X = 1\n")
    ws = start(root)
    try:
        ready(ws)
        ws.add_roots([str(other)])
        wait_until(lambda: ws.status()["state"] == "ready" and ws.status()["files"] == 7)
        mem, rel = ws.memory_for(str(other / "only_here.py"))
        assert rel == "only_here.py" and "only_here.py" in mem.texts
        ws.remove_roots([str(root)])
        wait_until(lambda: ws.status()["files"] == 4)
        assert ws.memory_for(str(root / "app" / "main.py")) == (None, "")
    finally:
        ws.close()


def test_real_memory_round_trip(tmp_path: Path):
    """The same build, save and load with the real RepoMemory (dlm.coder_model.memory)."""
    memory = pytest.importorskip("dlm.coder_model.memory")
    root = make_project(tmp_path / "proj")
    ws = WorkspaceIndex(IndexOptions())
    ws.set_roots([str(root)])
    try:
        st = ready(ws)
        assert st["files"] == 3 and st["tokens"] > 0
        assert isinstance(ws.memory, memory.RepoMemory)
        tokens = st["tokens"]
    finally:
        ws.close()
    again = WorkspaceIndex(IndexOptions())
    loaded = index_store.IndexStore(str(root)).load(memory.RepoMemory.load)
    assert loaded is not None and loaded[0].files == 3 and loaded[0].tokens == tokens
    again.close()


def test_index_options_from_initialization_options():
    from dlm.lsp.options import parse_options

    opts, problems = parse_options({"index": {"enabled": False, "maxFiles": 10, "maxFileBytes": 2048,
                                              "maxTokens": 1000, "rescanS": 0, "exclude": ["fixtures/"]}})  # fmt: skip
    assert problems == []
    assert opts.index == IndexOptions(enabled=False, max_files=10, max_file_bytes=2048, max_tokens=1000,
                                      rescan_s=0.0, exclude=["fixtures/"])  # fmt: skip
    opts, problems = parse_options({"index": {"exclude": "fixtures/", "maxFiles": -1, "enabled": "yes"}})
    assert opts.index == IndexOptions() and len(problems) == 3
    assert any("index.exclude must be a list" in p for p in problems)
