"""Bad input, tried on the real server process: each is survived, and the next request works."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest
from lsp_helpers import (
    SERVER,
    change,
    edit_prediction,
    fake_server_client,
    inline_params,
    open_document,
    request,
    rss_kb,
    server_env,
)
from lsprotocol import types
from pytest_lsp import LanguageClient

client = fake_server_client("0.002", capabilities="neovim")


async def _inline(client, uri, line, ch):
    return await client.text_document_inline_completion_async(inline_params(uri, line, ch))


@pytest.mark.asyncio(loop_scope="module")
async def test_unknown_uri_change_and_requests(client: LanguageClient):
    change(client, "file:///never/opened.py", 2, (0, 0), (0, 0), "x")
    assert not (await _inline(client, "file:///never/opened.py", 0, 0)).items
    assert await edit_prediction(client, "file:///never.py", 0, 0) is None
    # the server is fine
    open_document(client, "file:///ok.py", "x = \n")
    assert (await _inline(client, "file:///ok.py", 0, 4)).items[0].insert_text == "FAKE"


@pytest.mark.asyncio(loop_scope="module")
async def test_surrogate_positions(client: LanguageClient):
    uri = "file:///emoji.py"
    open_document(client, uri, "s = '😀😀'\n")
    # character 6 is between the two UTF-16 halves of the first emoji: snapped to its start
    change(client, uri, 2, (0, 6), (0, 6), "x")
    res = await _inline(client, uri, 0, 7)
    assert res.items and res.items[0].insert_text == "FAKE"
    # a change whose range splits both emoji; the server stays consistent and answers
    change(client, uri, 3, (0, 7), (0, 10), "")
    res = await _inline(client, uri, 0, 9)
    assert res.items and res.items[0].insert_text == "FAKE"


@pytest.mark.asyncio(loop_scope="module")
async def test_positions_past_the_end(client: LanguageClient):
    uri = "file:///past.py"
    open_document(client, uri, "a\nb")
    change(client, uri, 2, (50, 3), (70, 1), "c")  # clamped to the end of the document
    res = await _inline(client, uri, 1000, 1000)
    assert res.items and res.items[0].insert_text == "FAKE"
    res = await edit_prediction(client, uri, 10**6, 10**6)
    assert res is None  # the fake proposes no edit away from the cursor


@pytest.mark.asyncio(loop_scope="module")
async def test_ten_megabyte_document(client: LanguageClient):
    uri = "file:///big.py"
    line = "value_%07d = compute(%d)  # padding padding padding padding\n"
    text = "".join(line % (i, i) for i in range(160_000))
    assert len(text) > 10_000_000
    open_document(client, uri, text)
    change(client, uri, 2, (80_000, 0), (80_000, 0), "x = ")
    res = await _inline(client, uri, 80_000, 4)
    assert res.items and res.items[0].insert_text == "FAKE"
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


@pytest.mark.asyncio(loop_scope="module")
async def test_thousand_changes_per_second_for_five_seconds(client: LanguageClient):
    uri = "file:///storm.py"
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(300))
    open_document(client, uri, text)
    pid = client._server.pid
    await request(client, "dlm/stats", {})
    rss0 = rss_kb(pid)
    version, t0 = 1, time.monotonic()
    for burst in range(50):  # 50 x 100 changes, one burst every 0.1 s = 1,000 per second
        for k in range(100):
            version += 1
            row = 3 * ((burst * 100 + k) % 300) + 1
            if k % 2 == 0:
                change(client, uri, version, (row, 4), (row, 4), "yy")
            else:
                change(client, uri, version, (row, 4), (row, 6), "")
        await asyncio.sleep(max(0.0, t0 + 0.1 * (burst + 1) - time.monotonic()))
    stats = await request(client, "dlm/stats", {})  # answered after all 5,000 changes
    rss1 = rss_kb(pid)
    assert stats["documents"] >= 1
    assert rss1 - rss0 < 60_000, f"server memory grew by {rss1 - rss0} kB over 5,000 changes"
    # the text is what the changes say (every "yy" was removed again): a completion lands where expected
    res = await _inline(client, uri, 1, 4)
    assert res.items and res.items[0].insert_text == "FAKE"


def _frame(obj) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read_message(stream) -> dict:
    length = None
    while True:
        line = stream.readline()
        if not line:
            raise AssertionError("server closed stdout")
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        elif line == b"\r\n" and length is not None:
            return json.loads(stream.read(length))


def test_malformed_jsonrpc_bytes_on_stdin():
    proc = subprocess.Popen(
        SERVER,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow"),
    )
    try:
        junk = [
            b"this is not a header\r\n\r\n",
            _frame(b"{not json at all"),
            _frame(b"\xff\xfe\x00garbage bytes"),
            _frame(b"[1, 2, 3]"),
            _frame({"jsonrpc": "2.0", "method": "no/such/notification", "params": {}}),
            _frame({"jsonrpc": "1.0", "id": 99, "method": "initialize"}),
        ]
        for chunk in junk:
            proc.stdin.write(chunk)
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "no/such/request", "params": {}}))
        proc.stdin.write(
            _frame(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "initialize",
                    "params": {"processId": None, "rootUri": None, "capabilities": {}},
                }
            )
        )
        # a request whose params do not match the method: an error reply, not silence
        proc.stdin.write(
            _frame(
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "textDocument/inlineCompletion",
                    "params": {"textDocument": {"uri": 5}, "position": "here"},
                }
            )
        )
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 4, "method": "dlm/stats", "params": {}}))
        proc.stdin.flush()
        replies = {}
        deadline = time.monotonic() + 60
        while 4 not in replies and time.monotonic() < deadline:
            msg = _read_message(proc.stdout)
            if "id" in msg:
                replies[msg["id"]] = msg
        assert replies[1]["error"]["code"] == -32601  # method not found
        assert "inlineCompletionProvider" in replies[2]["result"]["capabilities"]
        assert replies[3]["error"]["code"] == -32602 and "invalid params" in replies[3]["error"]["message"]
        assert replies[4]["result"]["state"] in ("loading", "ready")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
