"""An engine whose rewrite is a next edit (mercury-edit) beside the edit memory in dlm/editPrediction
(lsp.edit_prediction).

Protocol tests: the local server answers in Inception's documented shape (choices[0].message.content,
the rewritten editable region); its answers are the test's, and no test claims a model's quality.
What is checked is the server's choice between the two proposers and its filters: the engine's
edits are shown when the edit memory has none, the edit memory's proposal wins when both
propose, and a rewrite that drops lines or adds a syntax error is held back and counted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import pytest
from lsp_helpers import HERE, SERVER, change, edit_prediction, open_document, request, start_in_workspace

sys.path.insert(0, str(HERE.parent / "coder_model" / "hosted"))
from hosted_protocol_server import ProtocolServer, Record, Response, chat_content

pytestmark = [pytest.mark.timeout(120)]

TEXT = ("def total(rows):\n    n = count(rows)\n    m = count(rows) * 2\n    return n + m\n\n\n"
        + "".join(f"# filler {i}\n" for i in range(15))
        + "def mean(rows):\n    return sum(rows) / count(rows)\n")
EDIT_START, EDIT_END, CURSOR = "<|code_to_edit|>\n", "<|/code_to_edit|>", "<|cursor|>"


def region(rec: Record) -> str:
    """The editable region the request carries, without its cursor mark."""
    content = rec.body["messages"][0]["content"]
    return content.split(EDIT_START, 1)[1].split(EDIT_END, 1)[0].replace(CURSOR, "")


def rewriting(change_region: Callable[[str], str]) -> Callable[[Record], Response]:
    return lambda rec: Response(body=chat_content(change_region(region(rec))))


@contextlib.asynccontextmanager
async def session(tmp_path, srv: ProtocolServer):
    root = tmp_path / "ws"
    root.mkdir()
    init = {"editPredictions": True, "index": {"enabled": False}, "history": {"idleS": 30},
            "nextEdits": {"minConfidence": 0.5, "modelFallback": False, "gitCommits": 0, "checkWithModel": False}}
    command = [*SERVER, "--engine", "mercury-edit", "--engine-url", srv.url, "--engine-key-host", "127.0.0.1"]
    client = await start_in_workspace(tmp_path, root, init, command=command, indexed=False,
                                      INCEPTION_API_KEY="test-key-0123456789")
    try:
        uri = (root / "rows.py").as_uri()
        open_document(client, uri, TEXT)
        yield client, uri
    finally:
        await client.shutdown_session()


async def held_back(client, counter: str) -> int:
    return (await request(client, "dlm/stats", {}))[counter]


@pytest.mark.asyncio
async def test_the_engines_rewrite_is_the_next_edit_when_the_edit_memory_has_none(tmp_path):
    with ProtocolServer() as srv:
        srv.respond = rewriting(lambda r: r.replace("count(rows) * 2", "count(rows) * 3"))
        async with session(tmp_path, srv) as (client, uri):
            res = await edit_prediction(client, uri, 1, 4)
            assert res is not None and res["source"] == "engine"
            assert [e["newText"] for e in res["edits"]] == ["3"]
            assert res["edits"][0]["range"]["start"] == {"line": 2, "character": 22}
            assert len(srv.records) == 1


@pytest.mark.asyncio
async def test_the_edit_memory_wins_when_both_propose(tmp_path):
    with ProtocolServer() as srv:
        srv.respond = rewriting(lambda r: r.replace("return n + m", "return n - m"))
        async with session(tmp_path, srv) as (client, uri):
            change(client, uri, 2, (1, 8), (1, 13), "tally")  # the user renames count -> tally once
            res = await edit_prediction(client, uri, 1, 13)
            assert res is not None and res["source"] == "editMemory"
            assert res["label"] == "rename count → tally"
            srv.wait_records(1)  # the engine was asked beside it


@pytest.mark.asyncio
@pytest.mark.parametrize("rewrite, reason", [
    (lambda r: r.replace("    m = count(rows) * 2\n    return n + m\n", ""), "held_back_deletes_lines"),
    (lambda r: r.replace("count(rows) * 2", "count(rows * 2"), "held_back_syntax"),
])
async def test_a_rewrite_that_drops_lines_or_breaks_the_syntax_is_held_back(tmp_path, rewrite, reason):
    with ProtocolServer() as srv:
        srv.respond = rewriting(rewrite)
        async with session(tmp_path, srv) as (client, uri):
            before = await held_back(client, reason)
            assert await edit_prediction(client, uri, 1, 4) is None
            assert len(srv.records) == 1
            assert await held_back(client, reason) == before + 1
