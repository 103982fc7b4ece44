"""The language server end to end on the GPU: pytest-lsp drives `dlm-lsp --stdio --device cuda`
(the real server as a subprocess) with the embedded model."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("pytest_lsp")

from cuda_helpers import subprocess_env
from dlm.drivers.bench.typing_latency import plain, request
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

SERVER = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--device", "cuda"]
TEXT = "import os\n\n\ndef list_files(path):\n    return [name for name in os.listdir(path)]\n\n\ndef main():\n    \n"


async def _stats(client) -> dict:
    return await request(client, "dlm/stats", {})


@pytest.mark.asyncio
async def test_inline_completion_on_cuda(cuda_ops):
    client = await ClientServerConfig(server_command=SERVER, server_env=subprocess_env()).start()
    statuses: list[dict] = []

    @client.feature("dlm/status")
    def _status(params):
        statuses.append(plain(params))

    try:
        await client.initialize_session(types.InitializeParams(capabilities=client_capabilities("neovim")))
        for _ in range(1200):  # loading + the first kernel compilations: up to 2 minutes
            st = await _stats(client)
            if st["state"] in ("ready", "failed"):
                break
            await asyncio.sleep(0.1)
        assert st["state"] == "ready", statuses
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri="file:///w/m.py", language_id="python", version=1, text=TEXT)))
        for attempt in range(2):  # the second request runs on warm kernels and a warm prefix cache
            res = await client.text_document_inline_completion_async(types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri="file:///w/m.py"),
                position=types.Position(line=8, character=4),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            ))
            for item in res.items:
                assert isinstance(item.insert_text, str) and item.insert_text
        st = await _stats(client)
        assert st["model_runs"] >= 1 and st["completed"] >= 1 and st["failed"] == 0 and st["steps"] >= 1, st
        for _ in range(50):
            if any(s.get("state") == "ready" for s in statuses):
                break
            await asyncio.sleep(0.1)
        ready = [s for s in statuses if s.get("state") == "ready"]
        assert ready and ready[-1]["device"].startswith("cuda"), statuses
    finally:
        await client.shutdown_session()
        await client.stop()
