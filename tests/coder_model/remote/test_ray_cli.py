"""`dlm-lsp serve --engine ray` end to end:
its own local Ray cluster, the listening line plain serve prints, a token-authenticated
RemoteEngine answered by the replica, and a clean exit on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

pytest.importorskip("dlm.coder_model.remote.ray_serve", reason="Ray Serve is not installed (pip install -e '.[ray]'): the --engine ray "
                    "tests need it")

from dlm.coder_model.remote.client import RemoteEngine, parse_host_port
from dlm.coder_model.remote.listening import read_listening_address
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_cli_serves_with_token_and_stops_on_sigterm(tiny_checkpoint, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("ray-cli-token-0123456789abcdef\n")
    os.chmod(token_file, 0o600)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "serve", "--engine", "ray", "--listen", "127.0.0.1:0", "--model",
         tiny_checkpoint, "--device", "cpu", "--token-file", str(token_file), "--ray-address", "local",
         "--replica-cpus", "0.5", "--replica-threads", "1", "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        address = read_listening_address(proc.stderr, 240)
        assert address is not None, "the ray ingress never printed its listening line"
        rest: list[str] = []
        threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True).start()
        eng = RemoteEngine("127.0.0.1", parse_host_port(address)[1], token=token_file.read_text().strip())
        try:
            assert eng.wait_connected(30), eng.status().message
            pred = eng.predict(Prompt(prefix="def f(x):\n", region="    return", cursor=10, suffix="\n",
                                      language="python", path="a.py"),
                               SamplerParams(steps=4, block_len=4, max_blocks=1), CancelToken())
            assert not pred.cancelled and pred.steps > 0
            assert "ray:" in eng.status().device
        finally:
            eng.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, "".join(rest)[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
