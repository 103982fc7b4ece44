"""dlm/status follows a remote model server by itself, not only when a prediction request
finds it gone or back. A loopback `dlm-lsp serve` of a tiny checkpoint is killed and restarted
while the language server (`--remote`) gets no request at all."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from lsp_helpers import server_env
from test_hardening_lsp import RawServer

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(checkpoint: str, port: int) -> subprocess.Popen:
    env = server_env()
    env.pop("DLM_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", f"127.0.0.1:{port}", "--model", checkpoint,
         "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, "dlm-lsp serve exited"
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("dlm-lsp serve did not start listening")


def _wait_status(server: RawServer, state: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = server.next_message(max(0.1, deadline - time.monotonic()))
        if msg.get("method") == "dlm/status" and msg["params"]["state"] == state:
            return msg["params"]
    raise AssertionError(f"no dlm/status {state!r} within {timeout} s")


def test_status_follows_the_remote_connection(tiny_checkpoint):
    port = _free_port()
    serve = _serve(tiny_checkpoint, port)
    lsp = RawServer("--remote", f"127.0.0.1:{port}", "--device", "cpu", DLM_ENGINE_FACTORY="")
    try:
        lsp.initialize()
        serve.kill()
        serve.wait()
        status = _wait_status(lsp, "disconnected")  # no request was sent
        assert f"127.0.0.1:{port}" in status["message"]
        serve = _serve(tiny_checkpoint, port)
        _wait_status(lsp, "ready")
        assert lsp.call("dlm/stats", {})["result"]["state"] == "ready"
    finally:
        serve.kill()
        lsp.close()
