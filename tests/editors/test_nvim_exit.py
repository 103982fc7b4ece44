"""Neovim quitting (`:qa!`) while completions are in flight leaves a quiet server log.

On exit Neovim 0.11 sends `shutdown` and quits without waiting for the answer: the
server's pipes close under it while it writes that answer and the answers of the
completions still being computed. The server ends on its own with one INFO line
("the client went away") and no traceback in its --log-file or on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from test_nvim import Nvim, fake_env, nvim011  # noqa: F401  (nvim011: the fixture)

NOISE = ("Traceback", "BrokenPipeError", "Exception ignored", "Logging error")


def ended(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie nobody reaped yet has ended


def test_nvim_qa_while_completions_are_computed_leaves_no_traceback(nvim011, tmp_path):  # noqa: F811
    log, err, pidfile = tmp_path / "server.log", tmp_path / "server.err", tmp_path / "server.pid"
    server = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--log-file", str(log)]
    # sh records the server's pid (exec keeps it) and its stderr, which Neovim would take
    script = f"echo $$ > {json.dumps(str(pidfile))}; exec {' '.join(json.dumps(a) for a in server)} 2>{json.dumps(str(err))}"
    env = fake_env(tmp_path)
    env["FAKE_STEP_S"] = "0.05"  # a completion takes 0.5 s: some are in flight at :qa!
    nv = Nvim(nvim011, tmp_path, ["sh", "-c", script], env)
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        nv.send("Go")
        for ch in "    retu":
            nv.send(ch)
            time.sleep(0.03)
        nv.send("<Esc>:qa!<CR>")
        nv.proc.wait(timeout=30)
    finally:
        if nv.proc.poll() is None:
            nv.proc.kill()
            nv.proc.wait()
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 20
    while not ended(pid):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise AssertionError(f"the server outlived Neovim; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    out = log.read_text(errors="replace") + "\n--- stderr ---\n" + err.read_text(errors="replace")
    for word in NOISE:
        assert word not in out, f"{word!r} in the server's output:\n{out[-6000:]}"
    lines = [ln for ln in out.splitlines() if "dlm.lsp.server_cli" in ln]
    assert len(lines) == 1 and " INFO " in lines[0] and "the client went away" in lines[0], lines
    # the `shutdown` Neovim sent before quitting was handled (it saves the index), answer or not
    assert "without shutdown" not in lines[0], lines
