"""Copilot's next-edit methods (textDocument/copilotInlineEdit, textDocument/didShowInlineEdit)
answered by the real server: a scripted client speaks them as copilot.el and copilot-lsp do.

The engine is the slow fake (tests/lsp/fake_engine.py: it rewrites "TODO" in the region to
"DONE"), so this checks the scheduling and the translation to Copilot's shape, not what a
model would suggest. The translation's merging of several edits is checked on its own below.
"""

from __future__ import annotations

import pytest
from dlm.lsp import copilot_nes, positions
from dlm.lsp.documents import Document
from lsp_helpers import fake_server_client, open_document, request
from lsprotocol import types
from pytest_lsp import LanguageClient

URI = "file:///work/proj/todo.py"
TEXT = "def g():\n    # TODO\n    return 1\n"


client = fake_server_client(
    "0.01",
    workspace_folders=[types.WorkspaceFolder(uri="file:///work/proj", name="proj")],
    # edit predictions are off by default; a deadline far beyond the fake's run time keeps
    # this about the protocol, not timing
    initialization_options={"editPredictions": True, "deadlineMs": 60_000, "nextEdits": {"modelFallback": True}},
)


def _apply(text: str, rng: dict, new_text: str) -> str:
    """Apply an LSP range edit (ASCII text: UTF-16 columns are characters)."""
    lines = text.split("\n")

    def offset(p):
        return sum(len(x) + 1 for x in lines[: p["line"]]) + p["character"]

    return text[: offset(rng["start"])] + new_text + text[offset(rng["end"]) :]


@pytest.mark.asyncio(loop_scope="module")
async def test_copilot_client_gets_the_next_edit_shows_and_accepts_it(client: LanguageClient):
    open_document(client, URI, TEXT)
    # copilot.el: (list :textDocument (list :uri uri :version version) :position pos)
    res = await request(client, "textDocument/copilotInlineEdit",
                        {"textDocument": {"uri": URI, "version": 1}, "position": {"line": 2, "character": 12}})
    assert len(res["edits"]) == 1
    edit = res["edits"][0]
    assert set(edit) >= {"text", "range", "textDocument", "command"}
    assert edit["textDocument"] == {"uri": URI, "version": 1}  # copilot.el drops an edit of another version
    assert edit["newText"] == edit["text"]
    assert _apply(TEXT, edit["range"], edit["text"]) == TEXT.replace("TODO", "DONE")
    command = edit["command"]
    assert command["command"] == "dlm.acceptCompletion"
    assert len(command["arguments"]) == 1 and isinstance(command["arguments"][0], str)

    before = await request(client, "dlm/stats", {})
    # copilot-lsp sends only the command; copilot.el the same under :item
    client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": command}})
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command["command"], arguments=command["arguments"])
    )
    after = await request(client, "dlm/stats", {})
    assert after["shown"] == before["shown"] + 1
    assert after["accepted"] == before["accepted"] + 1


@pytest.mark.asyncio(loop_scope="module")
async def test_no_edits_for_another_version_or_an_unknown_document(client: LanguageClient):
    uri = "file:///work/proj/stale.py"
    open_document(client, uri, TEXT, version=7)
    res = await request(client, "textDocument/copilotInlineEdit",
                        {"textDocument": {"uri": uri, "version": 6}, "position": {"line": 2, "character": 0}})
    assert res == {"edits": []}
    res = await request(client, "textDocument/copilotInlineEdit",
                        {"textDocument": {"uri": "file:///never/opened.py", "version": 1},
                         "position": {"line": 0, "character": 0}})
    assert res == {"edits": []}
    # a region with nothing to change (the fake inserts at the cursor): no next edit either
    open_document(client, "file:///work/proj/plain.py", "x = 1\n")
    res = await request(client, "textDocument/copilotInlineEdit",
                        {"textDocument": {"uri": "file:///work/proj/plain.py", "version": 1},
                         "position": {"line": 0, "character": 5}})
    assert res == {"edits": []}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_request_without_a_position_is_an_invalid_params_error(client: LanguageClient):
    open_document(client, "file:///work/proj/bad.py", TEXT)
    with pytest.raises(Exception, match="position must be"):
        await request(client, "textDocument/copilotInlineEdit",
                      {"textDocument": {"uri": "file:///work/proj/bad.py", "version": 1}})
    # and the server goes on
    res = await request(client, "textDocument/copilotInlineEdit",
                        {"textDocument": {"uri": "file:///work/proj/bad.py", "version": 1},
                         "position": {"line": 2, "character": 12}})
    assert len(res["edits"]) == 1


# -- the translation on its own --------------------------------------------------------------------


def test_several_region_edits_become_one_copilot_edit_keeping_the_text_between():
    text = "a = 'x😀'\nb = 2\nc = 3\n"
    doc = Document("file:///m.py", text, version=4, encoding=positions.UTF16)
    # 'x😀' is 4 UTF-16 units wide: the second edit starts after the emoji's surrogate pair
    prediction = {"id": "9", "version": 4, "edits": [
        {"range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 5}}, "newText": "20"},
        {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}, "newText": "A"},
    ]}  # fmt: skip
    res = copilot_nes.inline_edits(doc, prediction, 4)
    (edit,) = res["edits"]
    assert edit["range"] == {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 5}}
    assert edit["text"] == "A = 'x😀'\nb = 20"
    assert edit["textDocument"] == {"uri": "file:///m.py", "version": 4}
    assert edit["command"]["arguments"] == ["9"]
    assert copilot_nes.inline_edits(doc, prediction, 3) == {"edits": []}  # the client has another version
    assert copilot_nes.inline_edits(doc, None, 4) == {"edits": []}
    assert copilot_nes.inline_edits(doc, prediction | {"version": 3}, None) == {"edits": []}


def test_requested_version():
    assert copilot_nes.requested_version({"textDocument": {"uri": "u", "version": 3}}) == 3
    assert copilot_nes.requested_version({"textDocument": {"uri": "u"}}) is None
