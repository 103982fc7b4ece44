"""The workspace index through the real server (`dlm-lsp --stdio` as a subprocess, pytest-lsp
as the client, the slow fake engine: no claim about the model): work-done progress, dlm/status
with the index's state and file count, file watching registered and followed, secrets and
special files never indexed, the cache outside the project."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from lsp_helpers import SERVER, open_document, request, server_env
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities
from workspace_fakes import make_project, write


def as_dict(obj: Any) -> Any:
    """pygls hands an unknown notification's params as nested named tuples."""
    if hasattr(obj, "_asdict"):
        return {k: as_dict(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    return obj


def project(root: Path) -> Path:
    """make_project's files, a package marker, and a named pipe the index must not read."""
    make_project(root)
    write(root, "app/__init__.py", "")
    os.mkfifo(root / "app" / "pipe.py")
    return root


async def start(tmp_path: Path, root: Path, capabilities: str):
    env = server_env(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.01",
                     XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))  # fmt: skip
    client = await ClientServerConfig(server_command=SERVER, server_env=env).start()
    statuses: list[dict] = []
    registrations: list[types.Registration] = []

    @client.feature("dlm/status")
    def _status(params):
        statuses.append(as_dict(params))

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def _register(params: types.RegistrationParams):
        registrations.extend(params.registrations)

    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(capabilities),
            root_uri=root.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        )
    )
    return client, statuses, registrations


async def wait_for(cond, what: str, timeout_s: float = 60.0):
    for _ in range(int(timeout_s / 0.05)):
        got = cond()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_index(client, pred, what: str, timeout_s: float = 60.0) -> dict:
    """Poll dlm/stats until its index part satisfies `pred`."""
    for _ in range(int(timeout_s / 0.05)):
        idx = (await request(client, "dlm/stats", {}))["index"]
        if pred(idx):
            return idx
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; index {idx}")


@pytest.mark.asyncio
async def test_index_progress_status_and_watching(tmp_path: Path):
    root = project(tmp_path / "proj")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    client, statuses, registrations = await start(tmp_path, root, "visual-studio-code")
    try:
        ready = await wait_for(
            lambda: next((s for s in statuses if s["index"]["state"] == "ready"), None),
            "dlm/status index ready",
        )
        assert (
            ready["index"]["files"] == 4
        )  # __init__, main, util, index.ts: no secret, ignored or vendored file
        assert ready["index"]["tokens"] > 0
        assert {s["index"]["state"] for s in statuses} <= {"loading", "indexing", "ready"}
        # work-done progress: create, begin "indexing", end
        await wait_for(lambda: any(r and isinstance(r[-1], types.WorkDoneProgressEnd)
                                   for r in client.progress_reports.values()), "the progress end")  # fmt: skip
        (reports,) = client.progress_reports.values()
        assert isinstance(reports[0], types.WorkDoneProgressBegin) and "indexing proj" in reports[0].title
        assert "4 files" in reports[-1].message
        # file watching was registered dynamically (the client allows it) and is followed
        assert [r.method for r in registrations] == [types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
        write(root, "app/extra.py", "def sub(a, b):\n    return a - b\n")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=(root / "app" / "extra.py").as_uri(), type=types.FileChangeType.Created)]
        ))  # fmt: skip

        await wait_for(lambda: statuses[-1]["index"]["files"] == 5, "dlm/status with 5 files")
        # an open secret buffer is never indexed; an open source buffer is (even unsaved to disk)
        for rel, text in ((".env.py", "TOKEN = 'hunter2'\n"), ("app/draft.py", "DRAFT = 1\n")):
            uri = (root / rel).as_uri()
            open_document(client, uri, text)
            client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri)))
        await wait_index(client, lambda idx: idx["files"] == 6, "the draft buffer indexed, not the secret")
        # workspace folders come and go (a vscode-vfs folder is not on this disk: never indexed)
        other = tmp_path / "other"
        write(other, "lib.py", "def mul(a, b):\n    return a * b\n")
        event = types.WorkspaceFoldersChangeEvent(
            added=[types.WorkspaceFolder(uri=other.as_uri(), name="other"),
                   types.WorkspaceFolder(uri="vscode-vfs://github/x/tmp", name="remote")], removed=[])  # fmt: skip
        client.workspace_did_change_workspace_folders(types.DidChangeWorkspaceFoldersParams(event=event))
        await wait_index(
            client, lambda idx: idx["files"] == 7 and idx["state"] == "ready", "the other folder"
        )
        event = types.WorkspaceFoldersChangeEvent(
            added=[], removed=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]
        )
        client.workspace_did_change_workspace_folders(types.DidChangeWorkspaceFoldersParams(event=event))
        await wait_index(client, lambda idx: idx["files"] == 1, "only the other folder")
    finally:
        await client.shutdown_session()
        await client.stop()
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert after == sorted([*before, "app/extra.py"])  # the test's file; nothing written by the server
    cache_dir = tmp_path / "cache" / "dlm-lsp" / hashlib.sha256(str(root).encode()).hexdigest()
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache_dir / "index.bin").stat().st_mode) == 0o600


@pytest.mark.asyncio
async def test_restart_loads_the_index_and_a_home_root_is_refused(tmp_path: Path):
    root = project(tmp_path / "proj")
    client, statuses, _ = await start(tmp_path, root, "neovim")  # no dynamic watching: mtime rescans
    try:
        await wait_for(lambda: any(s["index"]["state"] == "ready" for s in statuses), "index ready")
    finally:
        await client.shutdown_session()
        await client.stop()
    client, statuses, registrations = await start(tmp_path, root, "neovim")
    try:
        await wait_for(lambda: any(s["index"]["state"] == "ready" for s in statuses), "index ready again")
        assert registrations == []  # Neovim does not allow dynamic registration for it
        assert (await wait_index(client, lambda idx: idx["state"] == "ready", "ready"))["files"] == 4
        assert any("index: loaded" in m.message for m in client.log_messages)  # not rebuilt
    finally:
        await client.shutdown_session()
        await client.stop()
    home = tmp_path / "home"
    project(home)
    client, statuses, _ = await start(tmp_path, home, "neovim")
    try:
        st = await wait_for(lambda: next((s for s in statuses if s["index"]["message"]), None), "a refusal")
        assert st["index"]["state"] == "off" and "home directory" in st["index"]["message"]
        assert (await request(client, "dlm/stats", {}))["state"] == "ready"  # the server goes on
    finally:
        await client.shutdown_session()
        await client.stop()
