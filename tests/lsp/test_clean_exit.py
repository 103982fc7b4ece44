"""`shutdown` and `exit` at any moment end the server cleanly, while the model loads included: the real
server over stdio with the embedded model (its load imports torch and reads weights in a thread)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from lsp_helpers import SERVER, server_env


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay_s", [0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
def test_shutdown_and_exit_while_the_model_loads_exit_with_zero(delay_s, tmp_path):
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as errf:
        proc = subprocess.Popen([*SERVER, "--device", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=errf, env=server_env())
        try:
            t0 = time.monotonic()
            proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                     "params": {"processId": None, "rootUri": None, "capabilities": {}}}))
            proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
            proc.stdin.flush()
            time.sleep(max(0.0, delay_s - (time.monotonic() - t0)))
            proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
            proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "exit"}))
            proc.stdin.flush()
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err.read_text(errors="replace")
    assert rc == 0, f"exit code {rc} after shutdown + exit at {delay_s} s; stderr:\n{text[-2000:]}"
    assert "terminate called" not in text and "Traceback" not in text, text[-2000:]
