"""The index's work-done progress and watching registration (lsp.index_progress), against a
recording protocol on a real event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
from dlm.lsp.index_progress import (
    IndexProgress,
    client_supports_progress,
    client_supports_watching,
    watch_files,
)
from dlm.lsp.workspace_index import ProgressEvent
from lsprotocol import types
from pytest_lsp import client_capabilities


class RecordingProtocol:
    def __init__(self) -> None:
        self.requests: list[tuple[str, object, Future]] = []
        self.notes: list[types.ProgressParams] = []

    def send_request(self, method, params, callback=None) -> Future:
        fut: Future = Future()
        self.requests.append((method, params, fut))
        return fut

    def notify(self, method, params) -> None:
        assert method == types.PROGRESS
        self.notes.append(params)


def events(key: str = "/p") -> list[ProgressEvent]:
    return [
        ProgressEvent(key, "begin", "dlm: indexing p", "looking for files", 0),
        ProgressEvent(key, "report", "", "indexing 10% (1/10 files)", 10),
        ProgressEvent(key, "report", "", "indexing 40% (4/10 files)", 40),
        ProgressEvent(key, "end", "", "10 files indexed"),
    ]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_begin_waits_for_create_and_keeps_the_latest_report():
    proto = RecordingProtocol()
    progress = IndexProgress(proto, asyncio.get_running_loop(), enabled=True)
    for ev in events():
        progress(ev)  # as the indexer thread does
    await settle()
    ((method, params, fut),) = proto.requests
    assert method == types.WINDOW_WORK_DONE_PROGRESS_CREATE and proto.notes == []
    fut.set_result(None)  # the client accepts the token
    kinds = [type(n.value).__name__ for n in proto.notes]
    assert kinds == ["WorkDoneProgressBegin", "WorkDoneProgressReport", "WorkDoneProgressEnd"]
    assert {n.token for n in proto.notes} == {params.token}
    assert proto.notes[1].value.percentage == 40  # the 10% report was superseded while waiting
    assert proto.notes[0].value.title == "dlm: indexing p"
    # a second run gets a new token, and once created, reports go out as they come
    progress(ProgressEvent("/p", "begin", "dlm: indexing p", "", 0))
    await settle()
    proto.requests[-1][2].set_result(None)
    progress(ProgressEvent("/p", "report", "", "indexing 50%", 50))
    await settle()
    assert proto.notes[-1].value.percentage == 50 and proto.notes[-1].token != params.token


@pytest.mark.asyncio
async def test_no_progress_without_the_capability_or_when_refused():
    proto = RecordingProtocol()
    progress = IndexProgress(proto, asyncio.get_running_loop(), enabled=False)
    for ev in events():
        progress(ev)
    await settle()
    assert proto.requests == [] and proto.notes == []
    progress = IndexProgress(proto, asyncio.get_running_loop(), enabled=True)
    for ev in events():
        progress(ev)
    await settle()
    proto.requests[0][2].set_exception(RuntimeError("no"))  # the client refuses the token
    await settle()
    progress(ProgressEvent("/p", "report", "", "late", 90))
    await settle()
    assert proto.notes == []


def test_watch_registration_and_capabilities():
    proto = RecordingProtocol()
    results: list[bool] = []
    watch_files(proto, results.append)
    ((method, params, fut),) = proto.requests
    assert method == types.CLIENT_REGISTER_CAPABILITY
    assert params.registrations[0].method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES
    fut.set_exception(RuntimeError("method not found"))
    assert results == [False]  # the index then rescans by mtime
    assert client_supports_watching(client_capabilities("visual-studio-code"))
    assert not client_supports_watching(client_capabilities("neovim"))
    assert client_supports_progress(client_capabilities("neovim"))
    assert not client_supports_progress(types.ClientCapabilities())
