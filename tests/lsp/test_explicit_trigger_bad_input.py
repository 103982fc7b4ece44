"""The explicit trigger (textDocument/inlineCompletion with triggerKind Invoked: the user asks
for a suggestion) on input the server was not built for, through the real server
(`dlm-lsp --stdio --device cpu`, the embedded model, pytest-lsp as the client, default gate):

- a file outside the workspace folder (the index has no memory for it), an untitled buffer;
- a binary file opened as a document (bytes with NULs, as an editor that opens it anyway sends);
- a 100,000-line file (over the server's tree-sitter cap: plain text there), in its middle
  and at its end.

Each request is answered within a generous timeout (a hang fails it), with no suggestion or a
valid one, and when nothing is shown dlm/stats says why: the request is counted and one of the
outcomes that explain an empty answer moves (the model proposed no change, the gate held it
back, it was late, degenerate, would break the syntax, outdated). The claims are about the
server's answer and its accounting, not about what the model writes.

Every explicit trigger that shows nothing says why: `trigger` in dlm/status and dlm/stats
(`{shown: false, reason}`), a request for a document that was never opened included.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from dlm.lsp.stats import HELD_BACK_REASONS
from lsp_helpers import SERVER, inline_params, open_document, request, server_env
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

ANSWER_S = 60.0  # each request is answered within this (it must not hang)
# dlm/stats counters that say why a completed request showed nothing (lsp.stats)
REASONS = (*HELD_BACK_REASONS, "no_change", "outdated", "binary")
LINES = 100_000
HUGE = "".join(f"value_{i} = compute(value_{i - 1}, {i})\n" for i in range(1, LINES + 1))
# an ELF header and a few bytes of code, as a binary opened by mistake arrives: NULs and all
BINARY = ("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00>\x00\x01\x00\x00\x00\n"
          "\x00\x00\x00def handler(\x00\x00\x10\x00\n" + "\x00" * 64 + "\n")  # fmt: skip


@dataclass
class Server:
    client: object
    root: Path
    tmp: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explicit")
    root = tmp / "proj"
    root.mkdir()
    (tmp / "home").mkdir()
    (tmp / "elsewhere").mkdir()
    for i in range(5):
        (root / f"mod{i}.py").write_text(f"def handler_{i}(registry):\n    frobnicate(registry, {i})\n")
    env = server_env(XDG_CACHE_HOME=str(tmp / "cache"), HOME=str(tmp / "home"))
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"], server_env=env).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]))  # fmt: skip
    stats: dict = {}
    for _ in range(1200):
        stats = await request(client, "dlm/stats", {})
        if stats["state"] == "ready" and stats["index"]["state"] == "ready":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"model or index never ready: {stats}")
    assert stats["index"]["files"] == 5, stats
    yield Server(client, root, tmp)
    await client.shutdown_session()


async def explicit(server: Server, uri: str, line: int, character: int) -> tuple[list, dict, dict]:
    """An explicit trigger at (line, character): (its items, dlm/stats before, after)."""
    before = await request(server.client, "dlm/stats", {})
    res = await asyncio.wait_for(
        server.client.text_document_inline_completion_async(
            inline_params(uri, line, character, types.InlineCompletionTriggerKind.Invoked)
        ),
        ANSWER_S,
    )
    after = await request(server.client, "dlm/stats", {})
    items = [] if res is None else list(res.items if isinstance(res, types.InlineCompletionList) else res)
    return items, before, after


def moved(before: dict, after: dict, keys) -> dict:
    """The counters among `keys` that changed, by how much."""
    return {
        k: after[k] - before[k]
        for k in keys
        if isinstance(before.get(k), int) and isinstance(after.get(k), int) and after[k] != before[k]
    }


def assert_valid(items: list, text: str) -> None:
    """A shown suggestion inserts some text, at most the one item the server offers first plus
    its alternatives, each in the document."""
    lines = text.split("\n")
    for item in items:
        assert isinstance(item.insert_text, str) and item.insert_text, item
        if item.range is not None:
            for pos in (item.range.start, item.range.end):
                assert 0 <= pos.line < len(lines) and 0 <= pos.character <= len(lines[pos.line]) + 1, item


def cases(tmp: Path, root: Path) -> dict[str, tuple[str, str, str, int, int]]:
    """name -> (uri, text, languageId, line, character)."""
    typed = "def handler(registry):\n    frobnicate("
    return {
        "outside_the_workspace": ((tmp / "elsewhere" / "x.py").as_uri(), typed, "python", 1, 15),
        "untitled_buffer": ("untitled:Untitled-1", typed, "python", 1, 15),
        "binary_as_plaintext": ((root / "blob.bin").as_uri(), BINARY, "plaintext", 1, 15),
        "binary_as_python": ((root / "blob.py").as_uri(), BINARY, "python", 1, 15),
        "huge_middle": ((root / "huge.py").as_uri(), HUGE, "python", LINES // 2, 10),
        "huge_end": ((root / "huge_end.py").as_uri(), HUGE + "value_x = ", "python", LINES, 10),
    }


NAMES = [
    "outside_the_workspace",
    "untitled_buffer",
    "binary_as_plaintext",
    "binary_as_python",
    "huge_middle",
    "huge_end",
]


@pytest.mark.parametrize("name", NAMES)
async def test_an_explicit_trigger_answers_and_says_why_when_nothing_is_shown(server: Server, name: str):
    uri, text, language, line, character = cases(server.tmp, server.root)[name]
    open_document(server.client, uri, text, language_id=language)
    items, before, after = await explicit(server, uri, line, character)
    assert after["requests"] - before["requests"] == 1, moved(before, after, before)  # the trigger was taken
    assert after["failed"] == before["failed"], moved(before, after, before)  # no error in the run
    assert_valid(items, text)
    if items:
        assert after["offered"] - before["offered"] == 1, moved(before, after, before)
    else:
        why = moved(before, after, REASONS)
        assert why, f"nothing shown and no reason in dlm/stats: {moved(before, after, before)}"
        trigger = after["trigger"]
        assert trigger["shown"] is False and trigger["reason"], trigger
        if name.startswith("binary"):
            assert "binary" in trigger["reason"] and why == {"binary": 1}, (trigger, why)
    # the server goes on: a plain request after it is answered too
    items, _, _ = await explicit(server, uri, 0, 0)
    assert_valid(items, text)


async def test_a_document_that_was_never_opened_gets_an_empty_answer_at_once(server: Server):
    uri = (server.root / "never_opened.py").as_uri()
    (server.root / "never_opened.py").write_text("def f(registry):\n    frobnicate(\n")  # on disk, not open
    items, before, after = await explicit(server, uri, 1, 15)
    assert items == []
    assert after["failed"] == before["failed"]


async def test_a_document_that_was_never_opened_says_why_nothing_is_shown(server: Server):
    uri = (server.root / "never_opened_2.py").as_uri()
    items, before, after = await explicit(server, uri, 0, 0)
    assert items == []
    assert after["trigger"]["shown"] is False and "not open" in after["trigger"]["reason"], after["trigger"]
