"""Repository memory through the real server with the embedded model: a line the workspace
already holds is proposed by the memory, checked by the denoiser and shown at the cursor.

The workspace repeats a distinctive call, so the memory's only proposal is known; the
test claims that the product answers with it when the gate lets everything through, not how
often the model agrees in general (BENCHMARKS.md measures that).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsp_helpers import SERVER, request, server_env
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

LINE = "    frobnicate_widget(registry, widget_id=42, strict=True)\n"


def _project(root: Path) -> None:
    for i in range(6):
        (root / f"mod{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / f"mod{i}.py").write_text(f"def handler_{i}(registry):\n{LINE}    return registry\n")


async def _start(tmp_path: Path, root: Path, init: dict):
    env = server_env(XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"], server_env=env).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        initialization_options=init))
    for _ in range(1200):
        stats = await request(client, "dlm/stats", {})
        if stats["state"] == "ready" and stats["index"]["state"] == "ready":
            return client
        await asyncio.sleep(0.1)
    raise AssertionError(f"model or index never ready: {stats}")


async def _type_and_ask(client, uri: str, text: str, row: int, typed: str):
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    col = 0
    for v, ch in enumerate(typed, start=2):
        pos = types.Position(row, col)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=v),
            [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text=ch)]))
        col += 1
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(row, col),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


@pytest.mark.asyncio
async def test_the_memory_proposes_a_workspace_line_and_the_denoiser_checks_it(tmp_path: Path):
    root = tmp_path / "proj"
    _project(root)
    client = await _start(tmp_path, root, {"minConfidence": 0, "deadlineMs": 5000})
    try:
        uri = (root / "new.py").as_uri()
        res = await _type_and_ask(client, uri, "def handler_9(registry):\n\n    return registry\n", 1,
                                  "    frobnicate_")
        assert [i.insert_text for i in res.items] == ["widget(registry, widget_id=42, strict=True)"]
        stats = await request(client, "dlm/stats", {})
        assert stats["offered"] == 1 and stats["steps"] >= 1  # the denoiser ran on the proposal
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_with_the_index_off_the_model_answers_alone(tmp_path: Path):
    root = tmp_path / "proj"
    _project(root)
    env = server_env(XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"], server_env=env).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        initialization_options={"minConfidence": 0, "deadlineMs": 5000, "index": {"enabled": False}}))
    try:
        for _ in range(600):
            if (await request(client, "dlm/stats", {}))["state"] == "ready":
                break
            await asyncio.sleep(0.1)
        uri = (root / "new.py").as_uri()
        res = await _type_and_ask(client, uri, "def handler_9(registry):\n\n    return registry\n", 1,
                                  "    frobnicate_")
        texts = [i.insert_text for i in res.items]
        assert texts != ["widget(registry, widget_id=42, strict=True)"]  # the model alone never saw it
        assert (await request(client, "dlm/stats", {}))["index"]["state"] == "off"
    finally:
        await client.shutdown_session()
