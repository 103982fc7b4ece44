"""The real server as a subprocess, driven by pytest-lsp, with the slow fake engine
(scheduling only: it makes no claim about model behaviour)."""

from __future__ import annotations

import asyncio

import pytest
from lsp_helpers import change, edit_prediction, fake_server_client, inline_params, open_document, request
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

URI = "file:///work/proj/a.py"
TEXT = "import os\n\n\ndef main(x):\n    y = x + 1\n    return y\n"


client = fake_server_client(
    "0.03",
    workspace_folders=[
        types.WorkspaceFolder(uri="file:///work/proj", name="proj"),
        types.WorkspaceFolder(uri="file:///work/other", name="other"),
    ],
    # The fake takes 300 ms a run and queues runs of many documents: a deadline far
    # beyond that keeps these scheduling tests about scheduling. Edit predictions are
    # off by default; test_edit_prediction_away_from_cursor needs them.
    initialization_options={"deadlineMs": 60_000, "editPredictions": True, "nextEdits": {"modelFallback": True}},
)


def _insert(client: LanguageClient, uri: str, version: int, line: int, ch: int, text: str) -> None:
    change(client, uri, version, (line, ch), (line, ch), text)


def _inline(client: LanguageClient, uri: str, line: int, ch: int) -> asyncio.Future:
    # ensure_future: the request goes out now, in order with the notifications around it
    return asyncio.ensure_future(
        client.text_document_inline_completion_async(
            inline_params(uri, line, ch, types.InlineCompletionTriggerKind.Automatic)
        )
    )


async def _stats(client: LanguageClient) -> dict:
    return await request(client, "dlm/stats", {})


async def test_capabilities(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert "dlm.acceptCompletion" in caps.execute_command_provider.commands
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental


async def test_completion_after_open_and_change(client: LanguageClient):
    open_document(client, URI, TEXT)
    _insert(client, URI, 2, 4, 13, " * ")  # "    y = x + 1 * ": the fake's "FAKE" completes it
    res = await _inline(client, URI, 4, 16)
    assert len(res.items) == 1
    item = res.items[0]
    assert item.insert_text == "FAKE"
    assert item.range is None  # a pure insertion at the cursor
    assert item.command.command == "dlm.acceptCompletion"
    # The fallback completion provider offers the same text as a text edit at the cursor.
    comp = await client.text_document_completion_async(
        types.CompletionParams(types.TextDocumentIdentifier(URI), types.Position(4, 16))
    )
    assert comp.items[0].text_edit.new_text == "FAKE"
    assert comp.items[0].text_edit.range.start == types.Position(4, 16)


async def test_burst_latest_wins(client: LanguageClient):
    uri = "file:///work/proj/burst.py"
    open_document(client, uri, "x = 1\n")
    before = await _stats(client)
    futures = []
    for i in range(20):
        _insert(client, uri, 2 + i, 0, 5 + i, "a")
        futures.append(_inline(client, uri, 0, 6 + i))
    results = await asyncio.gather(*futures)
    after = await _stats(client)
    shown = [r for r in results if r.items]
    assert len(shown) == 1 and results[-1].items, "only the final version gets a suggestion"
    assert results[-1].items[0].insert_text == "FAKE"
    completed = after["completed"] - before["completed"]
    assert completed == 1
    runs = after["model_runs"] - before["model_runs"]
    dropped = (after["superseded"] - before["superseded"]) + (after["skipped"] - before["skipped"])
    cancelled = after["cancelled"] - before["cancelled"]
    assert runs == 1 + cancelled  # every run but the final one was cancelled mid-way
    assert dropped + runs == 20  # the others never reached the model


async def test_cancel_request(client: LanguageClient):
    uri = "file:///work/proj/cancel.py"
    open_document(client, uri, "def f():\n    pass\n")
    before = await _stats(client)
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=1, character=8),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )
    fut = asyncio.ensure_future(
        client.protocol.send_request_async("textDocument/inlineCompletion", params, msg_id="cancel-me")
    )
    for _ in range(100):  # wait until the run has started (it takes 0.3 s)
        if (await _stats(client))["model_runs"] > before["model_runs"]:
            break
        await asyncio.sleep(0.01)
    client.protocol.notify("$/cancelRequest", types.CancelParams(id="cancel-me"))
    with pytest.raises(JsonRpcRequestCancelled):
        await fut
    await asyncio.sleep(0.2)
    after = await _stats(client)
    assert after["cancelled"] - before["cancelled"] == 1
    assert after["completed"] == before["completed"]
    # The next request works.
    res = await _inline(client, uri, 1, 8)
    assert res.items and res.items[0].insert_text == "FAKE"


async def test_accept_and_partial_accept_counters(client: LanguageClient):
    uri = "file:///work/proj/acc.py"
    open_document(client, uri, "value = \n")
    res = await _inline(client, uri, 0, 8)
    item = res.items[0]
    before = await _stats(client)
    client.protocol.notify(
        "textDocument/didShowCompletion", {"item": client.protocol._converter.unstructure(item)}
    )
    client.protocol.notify(
        "textDocument/didPartiallyAcceptCompletion",
        {"item": client.protocol._converter.unstructure(item), "acceptedLength": 2},
    )
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=item.command.command, arguments=item.command.arguments)
    )
    after = await _stats(client)
    assert after["shown"] - before["shown"] == 1
    assert after["partially_accepted"] - before["partially_accepted"] == 1
    assert after["accepted"] - before["accepted"] == 1


async def test_typing_through_a_shown_insertion_needs_no_model_run(client: LanguageClient):
    uri = "file:///work/proj/cache.py"
    open_document(client, uri, "name = \n")
    res = await _inline(client, uri, 0, 7)
    assert res.items[0].insert_text == "FAKE"
    before = await _stats(client)
    _insert(client, uri, 2, 0, 7, "FA")  # the user types the first two characters of the ghost text
    res = await _inline(client, uri, 0, 9)
    after = await _stats(client)
    assert res.items[0].insert_text == "KE"
    assert after["cache_hits"] - before["cache_hits"] == 1
    assert after["model_runs"] == before["model_runs"]


async def test_edit_prediction_away_from_cursor(client: LanguageClient):
    uri = "file:///work/other/todo.py"
    text = "def g():\n    # TODO\n    return 1\n"
    open_document(client, uri, text)
    res = await edit_prediction(client, uri, 2, 12)
    assert res is not None and res["version"] == 1
    assert res["edits"] == [
        {
            "range": {"start": {"line": 1, "character": 6}, "end": {"line": 1, "character": 10}},
            "newText": "DONE",
        }
    ]
    # An inline request mid-line (the region rewrite there) shows nothing: the edit is not at the cursor.
    inline = await _inline(client, uri, 2, 4)
    assert not inline.items


async def test_many_documents_independent(client: LanguageClient):
    uris = [f"file:///work/{'proj' if i % 2 else 'other'}/m{i}.py" for i in range(12)]
    for u in uris:
        open_document(client, u, "a = \n")
    results = await asyncio.gather(*[_inline(client, u, 0, 4) for u in uris])
    assert all(r.items and r.items[0].insert_text == "FAKE" for r in results)


async def test_unknown_uri_and_positions_past_end(client: LanguageClient):
    res = await _inline(client, "file:///nowhere/never-opened.py", 0, 0)
    assert not res.items
    uri = "file:///work/proj/past.py"
    open_document(client, uri, "ab\ncd\n")
    res = await _inline(client, uri, 99, 99)  # clamped to the end of the document
    assert res.items and res.items[0].insert_text == "FAKE"
    res = await _inline(client, uri, 0, 500)  # clamped to the end of line 0
    assert res.items and res.items[0].insert_text == "FAKE"
