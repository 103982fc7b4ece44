"""Helpers for the LSP end-to-end tests: the real server as a subprocess, the fixture that
starts it with the slow fake engine, and the client messages the tests send.

A plain module (imported as `lsp_helpers`: pytest puts this folder on sys.path
for the tests in it), not a conftest, so that no test imports a conftest by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest_lsp
from dlm.drivers.bench.typing_latency import plain, request  # noqa: F401  (the tests' names for them)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

HERE = Path(__file__).resolve().parent


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


SERVER = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]


async def wait_state(client, states=("ready",), timeout_s: float = 10.0, poll_s: float = 0.05,
                     indexed: bool = False) -> dict:
    """Poll dlm/stats until the engine's state is one of `states` (and, with `indexed`, the
    workspace index is ready too); the stats then."""
    for _ in range(int(timeout_s / poll_s)):
        stats = await request(client, "dlm/stats", {})
        if stats["state"] in states and (not indexed or stats["index"]["state"] == "ready"):
            return stats
        await asyncio.sleep(poll_s)
    raise AssertionError(f"the engine's state never reached {states} (indexed: {indexed}) "
                         f"in {timeout_s:.0f} s: {stats}")


async def start_in_workspace(tmp_path: Path, root: Path, init: dict, command=SERVER, folders: bool = True,
                             indexed: bool = True, **env: str):
    """The real server (`command`) with its cache and HOME under `tmp_path`, as VS Code starts it on
    the workspace `root` (its one workspace folder too, with `folders`), initialized with `init`
    (initializationOptions) and `env` added to its environment; once the model is ready, and the
    index too with `indexed`."""
    env = server_env(XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path / "home"), **env)
    client = await ClientServerConfig(server_command=list(command), server_env=env).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)] if folders else None,
        initialization_options=init))
    try:
        await wait_state(client, timeout_s=120.0, poll_s=0.1, indexed=indexed)
    except BaseException:
        await client.shutdown_session()
        raise
    return client


@contextlib.asynccontextmanager
async def inline_session(env: dict[str, str], init: dict, name: str = "inline-test", on_status=None):
    """The real server (started with `env`) under a pygls client that asks for inline completions,
    initialized with `init` (initializationOptions), once its engine is ready; `on_status` gets
    each dlm/status. Shut down and stopped after."""
    from pygls.lsp.client import LanguageClient as PyglsClient

    client = PyglsClient(name, "1")
    if on_status is not None:

        @client.feature("dlm/status")
        def _status(params) -> None:  # pygls marks the handler it registers: a plain function
            on_status(params)

    await client.start_io(*SERVER, env=env)
    caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities()))
    await client.initialize_async(types.InitializeParams(capabilities=caps, initialization_options=init))
    client.initialized(types.InitializedParams())
    try:
        for _ in range(400):
            if (await client.protocol.send_request_async("dlm/stats", {})).state == "ready":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the engine never became ready")
        yield client
    finally:
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()


def fake_server_client(step_s: str, capabilities: str = "visual-studio-code", **initialize):
    """A module-scoped pytest-lsp `client` fixture (assign it to a module's `client`): the real
    server over stdio with the slow fake engine (tests/lsp/fake_engine.py; FAKE_STEP_S=step_s a
    step), initialized with `initialize` (InitializeParams fields) and ready. The
    InitializeResult is kept as `client.init_result`."""

    @pytest_lsp.fixture(
        scope="module",
        loop_scope="module",
        config=ClientServerConfig(
            server_command=SERVER,
            server_env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S=step_s),
        ),
    )
    async def client(lsp_client: LanguageClient):  # pytest-lsp hands its client by this annotation
        params = types.InitializeParams(capabilities=client_capabilities(capabilities), **initialize)
        lsp_client.init_result = await lsp_client.initialize_session(params)
        await wait_state(lsp_client)
        yield
        await lsp_client.shutdown_session()

    return client


def open_document(client, uri: str, text: str, version: int = 1, language_id: str = "python") -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=language_id, version=version, text=text)
        )
    )


def change(client, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
    """An incremental didChange replacing (line, character) `start`..`end` by `text`."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(*start), types.Position(*end)), text=text
                )
            ],
        )
    )


def type_chars(client, uri: str, row: int, col: int, version: int, typed: str) -> int:
    """Types `typed` one character at a time from (row, col), a didChange each from `version` on;
    the next version."""
    for ch in typed:
        change(client, uri, version, (row, col), (row, col), ch)
        col += 1
        version += 1
    return version


def inline_params(
    uri: str, line: int, character: int,
    trigger: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Invoked,
) -> types.InlineCompletionParams:  # fmt: skip
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=trigger),
    )


def rss_kb(pid: int) -> int:
    """Resident memory of a process (Linux /proc), in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS line in /proc/{pid}/status")


async def edit_prediction(client, uri: str, line: int, character: int):
    """dlm/editPrediction at (line, character): {version, edits, ...}, or None for no edit."""
    return await request(
        client,
        "dlm/editPrediction",
        {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
    )


def run_cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """`dlm-lsp ARGS` run to its end as a user runs it, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "dlm.lsp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=server_env(**env), check=False)  # fmt: skip
