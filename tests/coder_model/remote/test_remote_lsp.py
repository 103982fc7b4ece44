"""The real LSP server over `--remote` gives the same suggestions as over `--model`.

Both language servers are subprocesses driven by an LSP client; the remote
one talks to a model server on 127.0.0.1 that serves the same tiny
checkpoint (weights scaled so the output depends on the prompt).
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from dlm.coder_model.remote.tcp_server import ServerOptions, ServerThread
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio]

URI = "file:///work/proj/demo.py"
TEXT = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x):\n        self.x = \n"
POSITIONS = [(9, 17), (4, 10), (8, 10)]


async def _session(args: list[str]) -> list:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DLM_ENGINE_FACTORY", None)
    env.pop("DLM_TOKEN", None)
    client = LanguageClient()
    await client.start_io(sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--device", "cpu", *args, env=env)
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            workspace_folders=[types.WorkspaceFolder(uri="file:///work/proj", name="proj")],
            # local and remote must decode the same tokens: no deadline planning (it depends
            # on the measured step time) and no confidence gate (the random model is unsure)
            initialization_options={"deadlineMs": 600_000, "minConfidence": 0, "minConfidenceRewriteRecent": 0},
        ))
        for _ in range(1200):
            st = await client.protocol.send_request_async("dlm/stats", {})
            if st.state == "ready":
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the LSP engine never became ready ({args})")
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=URI, language_id="python", version=1, text=TEXT)))
        out = []
        for line, ch in POSITIONS:
            res = await client.text_document_inline_completion_async(types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=URI),
                position=types.Position(line=line, character=ch),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            ))
            out.append([(i.insert_text, i.range) for i in res.items] if res else [])
        st = await client.protocol.send_request_async("dlm/stats", {})
        out.append({"completed": st.completed, "tokens": st.tokens, "steps": st.steps})
        await client.shutdown_session()
    finally:
        await client.stop()
    return out


async def test_lsp_over_remote_matches_local(sharp_checkpoint):
    from dlm.coder_model.remote.backend import load_scheduler

    local = await _session(["--model", sharp_checkpoint])
    scheduler, name, device = load_scheduler(sharp_checkpoint, "cpu")
    srv = ServerThread(scheduler, ServerOptions(port=0, model_name=name, device=device)).start()
    try:
        remote = await _session(["--remote", f"127.0.0.1:{srv.port}"])
        served = srv.stats.completed
    finally:
        srv.stop()
    assert local[-1]["completed"] == len(POSITIONS) and local[-1]["tokens"] > 0
    assert served == len(POSITIONS)  # the remote LSP really used the model server
    assert remote == local
