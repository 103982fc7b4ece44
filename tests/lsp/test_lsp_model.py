"""The server with real engines: a model that fails to load, and the tiny random checkpoint."""

from __future__ import annotations

import asyncio
import sys

import pytest
from lsp_helpers import (
    SERVER,
    edit_prediction,
    inline_params,
    open_document,
    request,
    run_cli,
    server_env,
    wait_state,
)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities


async def _start(extra_args, **env):
    cfg = ClientServerConfig(server_command=SERVER + extra_args, server_env=server_env(**env))
    client = await cfg.start()
    statuses: list[dict] = []

    @client.feature("dlm/status")
    def _status(params):
        statuses.append(params if isinstance(params, dict) else params._asdict())

    result = await client.initialize_session(
        types.InitializeParams(capabilities=client_capabilities("neovim"))
    )
    return client, statuses, result


def _open_and_ask(client, uri="file:///m.py", text="def add(a, b):\n    return \n", line=1, ch=11):
    open_document(client, uri, text)
    return client.text_document_inline_completion_async(inline_params(uri, line, ch))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "args, env",
    [
        ([], {"DLM_ENGINE_FACTORY": "fake_engine:failing"}),
        (["--model", "/nonexistent/checkpoint-dir", "--device", "cpu"], {}),  # the real loader fails
    ],
    ids=["factory-raises", "missing-checkpoint"],
)
async def test_model_that_fails_to_load(args, env):
    client, statuses, result = await _start(args, **env)
    try:
        assert result.capabilities.inline_completion_provider is not None  # initialize answered anyway
        await wait_state(client, ("failed",), timeout_s=120.0, poll_s=0.1)
        res = await _open_and_ask(client)
        assert not res.items  # empty, not an error
        assert await edit_prediction(client, "file:///m.py", 0, 0) is None
        for _ in range(50):
            if any(s["state"] == "failed" for s in statuses):
                break
            await asyncio.sleep(0.1)
        failed = [s for s in statuses if s["state"] == "failed"]
        assert failed and "failed to load" in failed[-1]["message"]
        assert (await request(client, "dlm/stats", {}))["state"] == "failed"  # still running, still answering
    finally:
        await client.shutdown_session()
        await client.stop()


@pytest.mark.asyncio
async def test_tiny_real_checkpoint(tiny_checkpoint):
    client, statuses, _ = await _start(["--model", tiny_checkpoint, "--device", "cpu"])
    try:
        await wait_state(client, ("ready", "failed"), timeout_s=120.0, poll_s=0.1)
        st = await request(client, "dlm/stats", {})
        assert st["state"] == "ready", statuses
        res = await _open_and_ask(client)
        # A random model proposes anything (or nothing): the answer is well-formed either way,
        # and the model did run (the counters), so an empty list is an answer, not a skip.
        st = await request(client, "dlm/stats", {})
        assert st["model_runs"] == 1 and st["completed"] == 1 and st["steps"] >= 1
        assert len(res.items) <= 1
        if res.items:
            assert isinstance(res.items[0].insert_text, str) and res.items[0].insert_text
        edits = await edit_prediction(client, "file:///m.py", 1, 11)
        if edits is not None:  # None is "no edit"; an answer holds at least one
            assert edits["edits"]
            for e in edits["edits"]:
                assert 0 <= e["range"]["start"]["line"] <= e["range"]["end"]["line"] <= 2
        assert any(s["state"] == "ready" and s["device"] for s in statuses)
    finally:
        await client.shutdown_session()
        await client.stop()


def test_server_import_does_not_import_torch():
    import subprocess

    code = "import sys, dlm.lsp.server_cli, dlm.lsp.server, dlm.drivers.bench.typing_latency; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=server_env())


@pytest.mark.asyncio
async def test_utf8_position_encoding_negotiated():
    caps = client_capabilities("neovim")
    caps.general = types.GeneralClientCapabilities(position_encodings=["utf-8", "utf-16"])
    cfg = ClientServerConfig(
        server_command=SERVER,
        server_env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001"),
    )
    client = await cfg.start()
    try:
        result = await client.initialize_session(types.InitializeParams(capabilities=caps))
        assert result.capabilities.position_encoding == "utf-8"
        await wait_state(client, ("ready",), timeout_s=120.0, poll_s=0.1)
        uri = "file:///u.py"
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text="s = 'é😀' + \n")
            )
        )
        # byte offsets: "s = 'é😀' + " is 4 + 1 + 2 + 4 + 1 + 3 = 15 bytes
        comp = await client.text_document_completion_async(
            types.CompletionParams(types.TextDocumentIdentifier(uri), types.Position(0, 15))
        )
        assert comp.items[0].text_edit.range.start == types.Position(0, 15)
        assert comp.items[0].text_edit.new_text == "FAKE"
    finally:
        await client.shutdown_session()
        await client.stop()


@pytest.mark.asyncio
async def test_tcp_mode():
    import socket

    from pygls.lsp.client import LanguageClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--tcp", f"127.0.0.1:{port}"]
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow"), stderr=asyncio.subprocess.DEVNULL
    )
    client = LanguageClient("t", "0")
    try:
        for _ in range(300):  # pygls serves one TCP client: connect (no probe) once it listens
            try:
                await client.start_tcp("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        result = await asyncio.wait_for(
            client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities())), 30
        )
        assert result.capabilities.inline_completion_provider is not None
    finally:
        proc.kill()
        await proc.wait()
        await client.stop()


def test_bad_remote_address_is_refused():
    out = run_cli("--stdio", "--remote", "nohostport")
    assert out.returncode == 2 and "HOST:PORT" in out.stderr


@pytest.mark.asyncio
async def test_remote_engine_through_dlm_lsp_serve(tiny_checkpoint, tmp_path):
    """The LSP with --remote against a real `dlm-lsp serve` on loopback (tiny random model)."""
    import socket

    token = tmp_path / "token"
    token.write_text("test-secret-token\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", f"127.0.0.1:{port}",
        "--model", tiny_checkpoint, "--device", "cpu", "--token-file", str(token),
        env=server_env(), stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    client = None
    try:
        client, statuses, _ = await _start(["--remote", f"127.0.0.1:{port}", "--token-file", str(token)])
        # the server may need a while to load the model; the client reconnects with backoff
        for i in range(600):
            res = await _open_and_ask(client, uri=f"file:///r{i}.py")
            st = await request(client, "dlm/stats", {})
            if st["completed"] >= 1:
                break
            await asyncio.sleep(0.2)
        assert st["completed"] >= 1 and st["steps"] >= 1
        assert any(s["state"] == "ready" for s in statuses)
        assert len(res.items) <= 1
        if res.items:
            assert isinstance(res.items[0].insert_text, str) and res.items[0].insert_text
    finally:
        if client is not None:
            await client.shutdown_session()
            await client.stop()
        serve.kill()
        await serve.wait()
