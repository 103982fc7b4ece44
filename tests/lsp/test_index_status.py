"""What dlm/status says of the workspace index: "ready" only once the model answers and the index
is built; "indexing N/M files" while it is; why an index failed, is off or lacks something.

The status parts are checked on `WorkspaceIndex` (with the index tests' stand-in memory) and through
the real server (`dlm-lsp --stdio` as a subprocess, pytest-lsp as the client, the slow fake
engine), with an indexer slowed per file (tests/lsp/slow_index_server.py) so that the build is
seen on any machine."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from dlm.lsp import discovery, index_store
from dlm.lsp.options import IndexOptions
from dlm.lsp.status_report import status_text
from dlm.lsp.workspace_index import WorkspaceIndex
from lsp_helpers import server_env
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities
from test_workspace_e2e import as_dict, wait_for
from workspace_fakes import (
    FakeMemory,  # tests/lsp is on the path, as for lsp_helpers
    cache_home,  # noqa: F401  (autouse: a private cache and HOME)
    wait_until,
    write,
)

SLOW_SERVER = [sys.executable, "-m", "slow_index_server", "--stdio"]




def many_files(root: Path, n: int) -> Path:
    for i in range(n):
        write(root, f"pkg/m{i:03d}.py", f"def f{i}(x):\n    return x + {i}\n")
    return root




# ---- WorkspaceIndex.status --------------------------------------------------------------------------


def test_the_status_counts_the_files_while_the_index_is_built(tmp_path: Path):
    root = many_files(tmp_path / "proj", 12)

    class SlowMemory(FakeMemory):
        def update_file(self, path: str, text: str) -> int:
            time.sleep(0.1)
            return super().update_file(path, text)

    seen: list[dict] = []
    lock = threading.Lock()
    ws = WorkspaceIndex(IndexOptions(), memory_class=lambda: SlowMemory)

    def on_status() -> None:
        with lock:
            seen.append(ws.status())

    ws._on_status = on_status
    ws.set_roots([str(root)])
    try:
        wait_until(lambda: ws.status()["state"] == "ready", what="the index to be ready")
        with lock:
            statuses = list(seen)
        building = [s for s in statuses if s["state"] in ("loading", "indexing")]
        assert building[0]["text"] == "indexing: starting"
        counted = [s for s in building if s["total"] is not None]
        assert counted[0]["text"] == "indexing 0/12 files"  # the walk is over: the count is known
        # a status at least every STATUS_EVERY_S while the files are read, the count going up
        assert len({s["done"] for s in counted}) >= 3, counted
        assert [s["done"] for s in counted] == sorted(s["done"] for s in counted)
        assert all(s["text"] == f"indexing {s['done']}/12 files" and s["reason"] == "" for s in counted)
        st = ws.status()
        assert st == {**st, "files": 12, "done": 12, "total": 12, "reason": "", "message": ""}
        assert st["text"] == "index: ready (12 files)"
    finally:
        ws.close()


def test_why_an_index_is_off_failed_or_partial(tmp_path: Path, cache_home: Path, monkeypatch):  # noqa: F811 (the imported fixture)
    root = many_files(tmp_path / "proj", 3)
    off = WorkspaceIndex(IndexOptions(enabled=False), memory_class=lambda: FakeMemory)
    off.set_roots([str(root)])
    st = off.status()
    assert st["state"] == "off" and st["text"].startswith("index off: the repository memory is off")
    assert "set index.enabled to true" in st["reason"]
    off.close()

    missing = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    missing.set_roots([str(tmp_path / "gone")])
    try:
        wait_until(lambda: missing.status()["state"] == "failed")
        st = missing.status()
        assert st["text"].startswith(f"index failed: the workspace folder {tmp_path / 'gone'} does not exist")
        assert st["reason"] == st["message"] and "it is indexed when it comes back" in st["reason"]
    finally:
        missing.close()

    home = tmp_path / "home"
    write(home, "a.py", "x = 1\n")
    refused = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    refused.set_roots([str(home)])
    try:
        wait_until(lambda: refused.status()["message"] != "")
        st = refused.status()
        assert st["state"] == "off" and st["text"].startswith("index off: the workspace root is the home directory")
        assert "open a project folder" in st["text"]
    finally:
        refused.close()

    # a ready index that lacks something says what: files past maxFiles, the patterns after an
    # oversized .gitignore's first part, a cache it cannot write
    write(root, ".gitignore", "a.py\nb.py\nc.py\n")
    cache_home.write_text("not a folder")  # XDG_CACHE_HOME is a file: nothing can be saved
    monkeypatch.setattr(discovery, "MAX_IGNORE_FILE_BYTES", 8)
    ws = WorkspaceIndex(IndexOptions(max_files=2), memory_class=lambda: FakeMemory)
    ws.set_roots([str(root)])
    try:
        wait_until(lambda: ws.status()["state"] == "ready")
        st = ws.status()
        assert st["files"] == 2 and st["reason"] == ""
        assert st["text"].startswith("index: ready (2 files; reached maxFiles (2 files) under ")
        assert f"only the first 0 KB of {root / '.gitignore'} was read" in st["text"]
        assert "cannot use the cache folder" in st["text"] and "XDG_CACHE_HOME" in st["text"]
    finally:
        ws.close()


def test_an_index_that_could_not_be_saved_says_so(tmp_path: Path, monkeypatch):
    root = many_files(tmp_path / "proj", 2)
    monkeypatch.setattr(index_store.IndexStore, "save", lambda self, write, header: False)  # a full disk
    ws = WorkspaceIndex(IndexOptions(), memory_class=lambda: FakeMemory)
    ws.set_roots([str(root)])
    try:
        wait_until(lambda: ws.status()["state"] == "ready")
        st = ws.status()
        assert st["text"].startswith("index: ready (2 files; could not save the index to ")
        assert "check the free disk space" in st["text"] and "served from memory" in st["text"]
    finally:
        ws.close()


def test_the_status_line_says_ready_only_when_the_model_and_the_index_are():
    indexing = {"state": "indexing", "text": "indexing 38/77 files"}
    ready = {"state": "ready", "text": "index: ready (77 files)"}
    assert status_text("ready", "", indexing) == "indexing 38/77 files"
    assert status_text("ready", "", {"state": "loading", "text": "indexing: starting"}) == "indexing: starting"
    assert status_text("ready", "", ready) == "ready · index: ready (77 files)"
    assert status_text("loading", "", indexing) == "model loading · indexing 38/77 files"
    assert (status_text("failed", "the model failed to load: no config.json", ready)
            == "model failed: the model failed to load: no config.json · index: ready (77 files)")  # fmt: skip


# ---- through the server ------------------------------------------------------------------------


async def start(tmp_path: Path, folders: list[Path], options: dict | None = None, **env: str):
    env = server_env(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.01",
                     XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"), **env)  # fmt: skip
    client = await ClientServerConfig(server_command=SLOW_SERVER, server_env=env).start()
    statuses: list[dict] = []

    @client.feature("dlm/status")
    def _status(params):
        statuses.append(as_dict(params))

    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("neovim"),  # no $/progress: the status is all it shows
            root_uri=folders[0].as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=f.as_uri(), name=f.name) for f in folders],
            initialization_options=options,
        )
    )
    return client, statuses


async def stop(client) -> None:
    await client.shutdown_session()
    await client.stop()


@pytest.mark.asyncio
async def test_ready_only_after_the_model_and_the_index(tmp_path: Path):
    root = many_files(tmp_path / "proj", 40)
    client, statuses = await start(tmp_path, [root], SLOW_INDEX_S="0.05")  # about 2 s of indexing
    try:
        done = await wait_for(lambda: next((s for s in statuses if s["ready"]), None), "dlm/status ready", 120)
        before = statuses[: statuses.index(done)]
        # the model answered long before the index was built, and the status said so
        building = [s for s in before if s["state"] == "ready" and s["index"]["state"] == "indexing"]
        counted = [s for s in building if s["index"]["total"] == 40]
        assert counted, [s["text"] for s in before]
        assert any(0 < s["index"]["done"] < 40 for s in counted), [s["text"] for s in counted]
        for s in counted:
            assert s["text"] == s["index"]["text"] == f"indexing {s['index']['done']}/40 files"
        assert not any("ready" in s["text"] for s in before), [s["text"] for s in before]
        assert done["state"] == "ready" and done["index"]["state"] == "ready" and done["index"]["files"] == 40
        assert done["text"] == "ready · index: ready (40 files)"
        for key in ("device", "model", "message", "p50_ms", "requests", "accepted", "shown", "offered"):
            assert key in done  # the model's fields are all still there
    finally:
        await stop(client)


@pytest.mark.asyncio
async def test_a_failed_index_says_why_and_an_index_off_is_not_indexing(tmp_path: Path):
    gone = tmp_path / "gone"
    client, statuses = await start(tmp_path, [gone])
    try:
        st = await wait_for(lambda: next((s for s in statuses if s["index"]["state"] == "failed"), None),
                            "dlm/status with the index failed", 60)  # fmt: skip
        assert st["index"]["reason"].startswith(f"the workspace folder {gone} does not exist")
        assert f"index failed: the workspace folder {gone} does not exist" in st["text"]
        await wait_for(lambda: statuses[-1]["ready"], "ready with the index failed", 60)
        assert statuses[-1]["text"].startswith(f"ready · index failed: the workspace folder {gone} does not exist")
    finally:
        await stop(client)

    root = many_files(tmp_path / "proj", 5)
    client, statuses = await start(tmp_path, [root], {"index": {"enabled": False}})
    try:
        await wait_for(lambda: statuses and statuses[-1]["ready"], "ready with the index off", 60)
        assert {s["index"]["state"] for s in statuses} == {"off"}  # never "indexing"
        assert not any("indexing" in s["text"] for s in statuses)
        assert statuses[-1]["text"] == (
            "ready · index off: the repository memory is off (initializationOptions index.enabled is "
            "false); set index.enabled to true to index the workspace"
        )
    finally:
        await stop(client)
