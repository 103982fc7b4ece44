"""The language server with a hosted engine (coder_model.hosted, docs/engines.md), end to end from
an LSP client.

- Against a real server: `dlm-lsp http` started in the test on loopback with the real embedded
  model, and `dlm-lsp --stdio --engine openai-fim --engine-url ...` in front of it: the inline
  suggestion is the one the language server gives with the same model embedded (one fresh
  request each, the memory off), and dlm/status names the backend and its latency.
- Latest wins against a slow real server: `dlm-lsp http` with a slow test engine; a superseded
  request answers no suggestion at once and the newer one gets the answer.
- Protocol tests against a local server (hosted_protocol_server; its answers are the test's): a
  superseded request's connection is closed; an engine from initializationOptions is taken only
  when marked user-scoped (the status says when it is ignored), and then the embedded model is
  never loaded; a file the index's rules leave out (.gitignore) is never sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dlm.coder_model.remote.listening import read_listening_address
from lsp_helpers import HERE, inline_params, plain, request, server_env
from lsprotocol import types

sys.path.insert(0, str(HERE.parent / "coder_model" / "hosted"))
from hosted_protocol_server import ProtocolServer, Response, openai_text

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

SERVER = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--device", "cpu"]
# a line the embedded model completes with something the filters let through
TEXT = '''from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    show: bool
    reason: str


def decide(confidence, rewrites_recent, late, min_confidence, min_confidence_rewrite_recent):
    """Show a suggestion or not."""
    if late:
        return Verdict(False, "late")
    if rewrites_recent:
        if confidence is None or confidence < min_confidence_rewrite_recent:
            return Verdict(
'''
ROW, COL = 15, len("            return Verdict(")
# the gate open and the memory off: the claims are about the engine's path, not the gate's figures
OPTIONS = {"minConfidence": 0, "minConfidenceRewriteRecent": 0, "deadlineMs": 60_000, "index": {"enabled": False},
           "editPredictions": False}


def start_http(tmp_path: Path, **env: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "http", "--listen", "127.0.0.1:0", "--device", "cpu",
         "--deadline-ms", "600000", "--min-confidence", "0"],
        stderr=subprocess.PIPE, text=True, env=server_env(XDG_CACHE_HOME=str(tmp_path / "cache"), **env),
    )  # fmt: skip
    url = read_listening_address(proc.stderr, 120)
    assert url, "dlm-lsp http did not print its address"
    base = url.rsplit("/v1/", 1)[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/health", timeout=10) as resp:
            if json.loads(resp.read())["status"] == "ready":
                return proc, base
        time.sleep(0.1)
    raise AssertionError("dlm-lsp http never became ready")


class Session:
    """A language client on the real server (`cmd`), initialized; dlm/status notifications kept."""

    def __init__(self, cmd: list[str], options: dict, root: Path | None = None, client: str = "Neovim",
                 **env: str) -> None:
        self.cmd, self.options, self.root, self.env, self.client_name = cmd, options, root, env, client
        self.status: dict = {}

    async def __aenter__(self) -> Session:  # noqa: PYI034 - a test's own session
        from pygls.lsp.client import LanguageClient

        self.client = client = LanguageClient("hosted-test", "0.1")

        @client.feature("dlm/status")
        def _status(params) -> None:
            self.status = plain(params)

        await client.start_io(*self.cmd, env=server_env(**self.env))
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
                inline_completion=types.InlineCompletionClientCapabilities())),
            process_id=os.getpid(), root_uri=self.root.as_uri() if self.root else None,
            client_info=types.ClientInfo(name=self.client_name),  # as the editor names itself
            initialization_options=self.options))
        client.initialized(types.InitializedParams())
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
        finally:
            await self.client.stop()

    async def wait_ready(self, states=("ready",), timeout_s: float = 120) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = await request(self.client, "dlm/stats", {})
            if stats["state"] in states:
                return stats
            await asyncio.sleep(0.05)
        raise AssertionError(f"the engine never reached {states}")

    def open(self, uri: str, text: str) -> None:
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def type(self, uri: str, version: int, row: int, col: int, text: str) -> None:
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(row, col), types.Position(row, col)), text=text)]))

    def inline(self, uri: str, row: int, col: int,
               trigger: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Automatic) -> asyncio.Future:
        return asyncio.ensure_future(self.client.text_document_inline_completion_async(
            inline_params(uri, row, col, trigger)))


async def suggestion(session: Session, uri: str) -> str:
    session.open(uri, TEXT[:-len("t(\n")] + "\n")
    session.type(uri, 2, ROW, COL - 2, "t(")  # typed: the typing mode, as an editor's keystroke
    # an explicit trigger: the server sends dlm/status right after it answers
    got = await session.inline(uri, ROW, COL, types.InlineCompletionTriggerKind.Invoked)
    await asyncio.sleep(0.2)
    return got.items[0].insert_text if got.items else ""


async def test_openai_fim_through_dlm_lsp_http_suggests_what_the_embedded_model_does(tmp_path):
    proc, base = start_http(tmp_path)
    try:
        uri = (tmp_path / "proj" / "files.py").as_uri()
        hosted_cmd = [*SERVER, "--engine", "openai-fim", "--engine-url", base, "--engine-context-tokens", "384",
                      "--engine-deadline-ms", "60000"]
        async with Session(hosted_cmd, OPTIONS) as hosted:
            await hosted.wait_ready()
            through_http = await suggestion(hosted, uri)
        async with Session(list(SERVER), OPTIONS) as embedded:
            await embedded.wait_ready()
            in_process = await suggestion(embedded, uri)
        assert through_http == in_process
        assert in_process, "the embedded model proposed nothing here: pick a line it completes"
        backend = hosted.status.get("backend") or {}
        assert backend.get("kind") == "openai-fim" and backend.get("host") == "127.0.0.1"
        assert backend.get("p50_ms") is not None and "openai-fim" in hosted.status["text"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_latest_wins_against_a_slow_real_server(tmp_path):
    proc, base = start_http(tmp_path, DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.2", FAKE_STEPS="10")
    try:
        cmd = [*SERVER, "--engine", "openai-fim", "--engine-url", base, "--engine-deadline-ms", "30000"]
        async with Session(cmd, OPTIONS) as s:
            await s.wait_ready()
            uri = (tmp_path / "slow.py").as_uri()
            s.open(uri, "x = 1\ny = \n")
            first = s.inline(uri, 1, 4)
            await asyncio.sleep(0.5)  # the first request is at the slow server (2 s a run)
            s.type(uri, 2, 1, 4, "f")
            t_change = time.monotonic()
            second = s.inline(uri, 1, 5)
            got_first = await first
            first_after_s = time.monotonic() - t_change
            got_second = await second
            assert not got_first.items and first_after_s < 1.0  # superseded: no suggestion, at once
            assert [i.insert_text for i in got_second.items] == ["FAKE"]  # the slow test engine's marker
            stats = await request(s.client, "dlm/stats", {})
            assert stats["cancelled"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_a_superseded_request_closes_its_connection(tmp_path):
    """Protocol test: the local server delays its answer and watches the connection."""
    with ProtocolServer() as srv:
        srv.respond = lambda r: Response(body=openai_text("X"), delay_s=0 if r.body["prompt"].endswith("f") else 5)
        cmd = [*SERVER, "--engine", "openai-fim", "--engine-url", srv.url, "--engine-deadline-ms", "30000"]
        async with Session(cmd, OPTIONS) as s:
            await s.wait_ready()
            uri = (tmp_path / "abort.py").as_uri()
            s.open(uri, "x = 1\ny = \n")
            first = s.inline(uri, 1, 4)
            while not srv.records:  # the first request is at the server, which holds it for 5 s
                await asyncio.sleep(0.005)
            s.type(uri, 2, 1, 4, "f")
            t_change = time.monotonic()
            second = s.inline(uri, 1, 5)
            assert not (await first).items
            assert [i.insert_text for i in (await second).items] == ["X"]
            while srv.records[0].aborted_at is None and time.monotonic() - t_change < 5:
                await asyncio.sleep(0.005)
            assert srv.records[0].aborted_at is not None  # closed, long before the server's 5 s answer
            print(f"the superseded request's connection closed {1000 * (srv.records[0].aborted_at - t_change):.1f} ms "
                  "after the keystroke that superseded it")  # measured, never asserted


async def test_a_user_scoped_engine_from_initialization_options_is_used_and_torch_never_loads(tmp_path):
    """Protocol test: the local server's answer is the test's."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / ".gitignore").write_text("local_settings.py\n")
    with ProtocolServer() as srv:
        srv.respond = lambda r: Response(body=openai_text("False, \"x\")"))
        options = {**OPTIONS, "engine": {"kind": "openai-fim", "url": srv.url, "scope": "user"}}
        async with Session(list(SERVER), options, root=root) as s:
            await s.wait_ready()
            uri = (root / "files.py").as_uri()
            s.open(uri, TEXT)
            got = await s.inline(uri, ROW, COL)
            assert [i.insert_text for i in got.items] == ["False, \"x\")"]
            assert len(srv.records) == 1
            # a file the index's rules leave out is never sent
            ignored = (root / "local_settings.py").as_uri()
            s.open(ignored, TEXT)
            assert not (await s.inline(ignored, ROW, COL)).items
            assert len(srv.records) == 1
            maps = Path(f"/proc/{s.client._server.pid}/maps")
            if maps.exists():
                assert "libtorch" not in maps.read_text()


@pytest.mark.parametrize("client, scope, words", [
    ("Neovim", None, "engine settings from the workspace were ignored"),
    ("Visual Studio Code", "workspace", "engine settings from the workspace were ignored"),
    ("Zed", "user", "engine settings from initializationOptions were ignored"),
])
async def test_an_engine_the_user_did_not_set_is_ignored_and_the_status_says_so(tmp_path, client, scope, words):
    """Protocol test: the local server must get nothing."""
    with ProtocolServer() as srv:
        engine = {"kind": "openai-fim", "url": srv.url, **({"scope": scope} if scope else {})}
        async with Session(list(SERVER), {**OPTIONS, "engine": engine}, client=client,
                           DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001") as s:
            await s.wait_ready()
            uri = (tmp_path / "w.py").as_uri()
            s.open(uri, "x = 1\ny = \n")
            got = await s.inline(uri, 1, 4, types.InlineCompletionTriggerKind.Invoked)
            assert [i.insert_text for i in got.items] == ["FAKE"]  # the test engine answered
            await asyncio.sleep(0.3)
            assert srv.records == []
            assert words in s.status.get("text", "")
            assert s.status.get("notes")
