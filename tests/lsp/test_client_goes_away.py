"""The client going away at any moment ends the server at once, quietly, through one exit path.

The real server runs as a subprocess with --log-file, driven by a minimal JSON-RPC
client over pipes. Its stdout is a pipe, or a socket when a test must close only
the client's reading side (`shutdown(SHUT_RD)`: the server's next write fails
with EPIPE while nothing wakes a poll() on its end, so the failed write is what
ends it). Each test puts the server in a state (idle, a completion being
computed, dlm/status being sent while the workspace is indexed, the model
loading, after `shutdown`), closes the client's ends (or kills the client), and
checks that the process ends within a generous timeout, that neither the log
file nor stderr holds a traceback, and the exit code: 0 after `shutdown` +
`exit`, 1 for `exit` without `shutdown` (LSP specification), 0 when the client
goes away, which one INFO line says.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lsp_helpers import server_env

EXIT_TIMEOUT_S = 20.0  # generous: the server ends within a second or two
FAKE = {"DLM_ENGINE_FACTORY": "fake_engine:slow", "FAKE_STEP_S": "0.001"}
NOISE = ("Traceback", "BrokenPipeError", "Exception ignored", "Logging error", "terminate called")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipes and /proc as on Linux")


def frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def initialize(root: Path | None, msg_id: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "initialize",
            "params": {"processId": None, "rootUri": root.as_uri() if root else None,
                       "capabilities": {"window": {"workDoneProgress": True}}}}  # fmt: skip


INITIALIZED = {"jsonrpc": "2.0", "method": "initialized", "params": {}}
SHUTDOWN = {"jsonrpc": "2.0", "id": 900, "method": "shutdown"}
EXIT = {"jsonrpc": "2.0", "method": "exit"}


def did_open(uri: str, text: str) -> dict:
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}  # fmt: skip


def inline_completion(msg_id: int, uri: str, line: int, character: int) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/inlineCompletion",
            "params": {"textDocument": {"uri": uri}, "position": {"line": line, "character": character},
                       "context": {"triggerKind": 1}}}  # fmt: skip


class Server:
    """The real server with a hand-driven client. `stdout_socket`: the server's stdout is one end of
    a socketpair (the test holds the other), else a pipe."""

    def __init__(self, tmp: Path, env: dict[str, str], *, module: str = "dlm.lsp.cli",
                 args: tuple[str, ...] = (), stdout_socket: bool = False, log_file: bool = True) -> None:  # fmt: skip
        self.log, self.err = tmp / "server.log", tmp / "stderr.txt"
        logs = ("--log-file", str(self.log)) if log_file else ()
        cmd = [sys.executable, "-m", module, "--stdio", *logs, *args]
        self.sock = None
        theirs = None
        if stdout_socket:
            self.sock, theirs = socket.socketpair()
        with open(self.err, "wb") as errf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                         stdout=theirs if theirs is not None else subprocess.PIPE,
                                         stderr=errf, env=server_env(**env), cwd=tmp)  # fmt: skip
        if theirs is not None:
            theirs.close()
        self.fd = self.sock.fileno() if self.sock is not None else self.proc.stdout.fileno()
        self.buf = b""
        self.seen: list[dict] = []

    def send(self, *messages: dict) -> None:
        for m in messages:
            self.proc.stdin.write(frame(m))
        self.proc.stdin.flush()

    def read_until(self, pred, timeout_s: float = 60.0) -> dict:
        """Read the server's messages until one satisfies `pred`; that one."""
        deadline = time.monotonic() + timeout_s
        while True:
            while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                header = self.buf[:end].decode()
                length = int(header.lower().split("content-length:")[1].split("\r\n")[0])
                if len(self.buf) < end + 4 + length:
                    break
                msg = json.loads(self.buf[end + 4 : end + 4 + length])
                self.buf = self.buf[end + 4 + length :]
                self.seen.append(msg)
                if pred(msg):
                    return msg
            left = deadline - time.monotonic()
            seen = [m.get("method", m.get("id")) for m in self.seen]
            assert left > 0, f"timed out waiting for a message; seen: {seen}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                assert chunk, f"the server closed its stdout; log:\n{self.text()[-3000:]}"
                self.buf += chunk

    def start(self, root: Path | None = None) -> dict:
        """initialize + initialized; the first dlm/status that says the model is ready."""
        self.send(initialize(root), INITIALIZED)
        return self.read_until(lambda m: m.get("method") == "dlm/status" and m["params"]["state"] == "ready")

    def quiet(self, for_s: float = 1.0, timeout_s: float = 30.0) -> None:
        """Read until the server has said nothing for `for_s` (idle)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], for_s)
            if not ready:
                return
            chunk = os.read(self.fd, 1 << 16)
            assert chunk, "the server closed its stdout"
            self.buf += chunk
        raise AssertionError(f"the server never went quiet for {for_s} s")

    def close_stdin(self) -> None:
        self.proc.stdin.close()

    def close_stdout(self) -> None:
        if self.sock is not None:
            self.sock.close()
        else:
            self.proc.stdout.close()

    def close_ends(self, which: str) -> None:
        """The client closes "stdin", "stdout" or "both" of its ends (stdout first)."""
        if which in ("both", "stdout"):
            self.close_stdout()
        if which in ("both", "stdin"):
            self.close_stdin()

    def stop_reading(self) -> None:
        """The client stops reading (its reading side shut) but keeps stdin open: only the server's
        next write can tell it that the client is gone."""
        assert self.sock is not None
        self.sock.shutdown(socket.SHUT_RD)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ended(self, timeout_s: float = EXIT_TIMEOUT_S) -> tuple[int, str]:
        """Wait for the process to end: (exit code, log file + stderr), checked for noise."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            log = self.text()[-3000:]
            raise AssertionError(f"the server did not end within {timeout_s:.0f} s; log:\n{log}") from None
        finally:
            for f in (self.proc.stdin, self.proc.stdout, self.sock):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
        out = self.text() + "\n--- stderr ---\n" + self.err.read_text(errors="replace")
        for word in NOISE:
            assert word not in out, f"{word!r} in the server's output:\n{out[-6000:]}"
        return rc, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def started():
    servers: list[Server] = []

    def start(*args, **kwargs) -> Server:
        servers.append(Server(*args, **kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.kill()


def went_away(out: str, why: str) -> None:
    lines = [ln for ln in out.splitlines() if "dlm.lsp.server_cli" in ln]
    assert len(lines) == 1 and " INFO " in lines[0] and "the client went away" in lines[0], lines
    assert why in lines[0], lines


def ends_as_gone(s, why: str) -> None:
    """The server `s` ends with 0, its one log line saying the client went away and `why`."""
    rc, out = s.ended()
    assert rc == 0
    went_away(out, why)


def workspace(tmp: Path, files: int = 1) -> tuple[Path, str]:
    root = tmp / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()  # a project root
    for i in range(files):
        (root / "pkg" / f"m{i:03d}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    main = root / "main.py"
    main.write_text("def add(a, b):\n    return a + b\n\n")
    return root, main.as_uri()


def test_without_a_log_file_the_line_goes_to_stderr(started, tmp_path):
    """Without --log-file the records go to the client once it is initialized; the one that says
    it went away cannot, and stderr takes it."""
    s = started(tmp_path, FAKE, log_file=False)
    s.start()
    s.close_ends("both")
    ends_as_gone(s, "went away")


def test_tcp_client_closes_the_connection(tmp_path):
    log = tmp_path / "server.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--tcp", f"127.0.0.1:{port}", "--log-file", str(log)]
    with open(tmp_path / "stderr.txt", "wb") as errf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                                env=server_env(**FAKE))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server never listened"
                time.sleep(0.1)
        with conn:
            conn.sendall(frame(initialize(None)) + frame(INITIALIZED))
            got = b""
            while b'"id": 1' not in got:
                chunk = conn.recv(1 << 16)
                assert chunk, "the server closed the connection"
                got += chunk
        rc = proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text(errors="replace") + "\n--- stderr ---\n" + (tmp_path / "stderr.txt").read_text()
    for word in NOISE:
        assert word not in out, f"{word!r} in the server's output:\n{out[-6000:]}"
    assert rc == 0
    went_away(out, "went away")


# ---- the client closes its ends ------------------------------------------------------------------


@pytest.mark.parametrize("which", ["both", "stdin", "stdout"])
def test_idle_server_ends_when_the_client_closes_its_ends(started, tmp_path, which):
    """Idle: closing stdin is end of input; closing only stdout (stdin still open, nothing to
    write) is seen at once too (poll() on the server's end of the pipe)."""
    s = started(tmp_path, FAKE)
    s.start()
    s.quiet()
    s.close_ends(which)
    ends_as_gone(s, {"stdin": "end of input", "stdout": "stdout", "both": "went away"}[which])


def test_a_completion_whose_answer_cannot_be_written_ends_the_server(started, tmp_path):
    """A completion is being computed when the client stops reading (stdin stays open): writing
    the answer fails with EPIPE, which pygls logged as tracebacks; the server ends instead."""
    root, uri = workspace(tmp_path)
    s = started(tmp_path, {**FAKE, "FAKE_STEP_S": "0.1", "FAKE_STEPS": "10"}, stdout_socket=True)
    s.start(root)
    s.send(did_open(uri, "def add(a, b):\n    return a + b\n\nx = ad"), inline_completion(2, uri, 3, 6))
    time.sleep(0.3)  # the fake engine is in its 1 s computation
    s.stop_reading()
    ends_as_gone(s, "could not be written")


def test_status_notifications_while_indexing_meet_a_client_that_stopped_reading(started, tmp_path):
    """The workspace is being indexed (slowly), dlm/status and $/progress go out every 0.5 s from
    the indexer's side: the client stops reading, the next one fails to be written, the server ends."""
    root, _ = workspace(tmp_path, files=60)
    s = started(tmp_path, {**FAKE, "SLOW_INDEX_S": "0.1", "XDG_CACHE_HOME": str(tmp_path / "cache")},
                module="slow_index_server", stdout_socket=True)  # fmt: skip
    s.start(root)
    s.read_until(lambda m: m.get("method") == "dlm/status" and m["params"]["index"]["state"] == "indexing"
                 and m["params"]["index"].get("done", 0) > 0)  # fmt: skip
    s.stop_reading()
    ends_as_gone(s, "could not be written")


@pytest.mark.parametrize("which", ["both", "stdin"])
def test_closing_while_the_workspace_is_indexed(started, tmp_path, which):
    root, _ = workspace(tmp_path, files=60)
    s = started(tmp_path, {**FAKE, "SLOW_INDEX_S": "0.1", "XDG_CACHE_HOME": str(tmp_path / "cache")},
                module="slow_index_server")  # fmt: skip
    s.start(root)
    s.read_until(lambda m: m.get("method") == "dlm/status" and m["params"]["index"]["state"] == "indexing")
    s.close_ends(which)
    ends_as_gone(s, "went away")


@pytest.mark.parametrize("which", ["both", "stdin", "stdout"])
def test_closing_while_the_model_loads(started, tmp_path, which):
    """The (fake) model takes 60 s to load: the server does not wait for it."""
    s = started(tmp_path, {**FAKE, "FAKE_LOAD_S": "60"})
    s.send(initialize(None), INITIALIZED)
    s.read_until(lambda m: m.get("id") == 1)
    s.read_until(lambda m: m.get("method") == "dlm/status" and m["params"]["state"] == "loading")
    s.close_ends(which)
    ends_as_gone(s, "the model is still loading")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay_s", [0.3, 1.5])
def test_closing_while_the_real_model_loads(started, tmp_path, delay_s):
    """The embedded model: its load imports torch and reads the weights in a thread, where the
    interpreter's shutdown would abort the process."""
    s = started(tmp_path, {}, args=("--device", "cpu"))
    s.send(initialize(None), INITIALIZED)
    s.read_until(lambda m: m.get("id") == 1)
    time.sleep(delay_s)
    s.close_ends("both")
    rc, _ = s.ended(60)
    assert rc == 0


# ---- shutdown and exit -----------------------------------------------------------------------------


def test_shutdown_then_the_pipes_close_with_a_completion_in_flight(started, tmp_path):
    """What Neovim does on :qa!: `shutdown`, then its pipes close before the answer is read, while
    a completion is still being computed."""
    root, uri = workspace(tmp_path)
    s = started(tmp_path, {**FAKE, "FAKE_STEP_S": "0.1", "FAKE_STEPS": "10"})
    s.start(root)
    s.send(did_open(uri, "def add(a, b):\n    return a + b\n\nx = ad"), inline_completion(2, uri, 3, 6))
    time.sleep(0.2)
    s.send(SHUTDOWN)
    s.close_ends("both")
    rc, out = s.ended()
    assert rc == 0
    went_away(out, "went away")
    assert "without shutdown" not in out


@pytest.mark.parametrize("shutdown,code", [(True, 0), (False, 1)])
def test_what_the_client_sent_before_it_went_is_handled(started, tmp_path, shutdown, code):
    """`shutdown` and `exit` sent, then both ends closed at once, nothing read: the answer to
    `shutdown` cannot be written, yet `exit` is still read and gives the exit code."""
    s = started(tmp_path, FAKE)
    s.start()
    s.quiet()
    s.send(*([SHUTDOWN] if shutdown else []), EXIT)
    s.close_ends("both")
    rc, out = s.ended()
    assert rc == code
    lines = [ln for ln in out.splitlines() if "dlm.lsp.server_cli" in ln]
    assert len(lines) == 1 and lines[0].split(": ", 1)[1].startswith("exit "), lines


def test_shutdown_without_exit_then_end_of_input(started, tmp_path):
    s = started(tmp_path, FAKE)
    s.start()
    s.send(SHUTDOWN)
    assert s.read_until(lambda m: m.get("id") == 900)["result"] is None
    s.close_stdin()
    ends_as_gone(s, "end of input")


@pytest.mark.parametrize("shutdown,code", [(True, 0), (False, 1)])
@pytest.mark.parametrize("close_stdin", [True, False])
def test_exit_codes(started, tmp_path, shutdown, code, close_stdin):
    """`exit`: 0 after `shutdown`, else 1; the process ends even when the client keeps stdin open
    (a thread still waits in a read of it)."""
    s = started(tmp_path, FAKE)
    s.start()
    if shutdown:
        s.send(SHUTDOWN)
        s.read_until(lambda m: m.get("id") == 900)
    s.send(EXIT)
    if close_stdin:
        s.close_stdin()
    rc, out = s.ended()
    assert rc == code
    lines = [ln for ln in out.splitlines() if "dlm.lsp.server_cli" in ln]
    assert len(lines) == 1 and " INFO " in lines[0] and lines[0].split(": ", 1)[1].startswith("exit "), lines


@pytest.mark.parametrize("shutdown", [True, False])
def test_exit_while_the_model_loads(started, tmp_path, shutdown):
    s = started(tmp_path, {**FAKE, "FAKE_LOAD_S": "60"})
    s.send(initialize(None), INITIALIZED)
    s.read_until(lambda m: m.get("id") == 1)
    if shutdown:
        s.send(SHUTDOWN)
        s.read_until(lambda m: m.get("id") == 900)
    s.send(EXIT)
    rc, out = s.ended()
    assert rc == (0 if shutdown else 1)
    assert "the model is still loading" in out


# ---- the client is killed ------------------------------------------------------------------------

CLIENT = textwrap.dedent("""
    import json, subprocess, sys, time
    def frame(obj):
        body = json.dumps(obj).encode()
        return b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body
    cmd, env, messages, err = json.loads(sys.argv[1])
    with open(err, "wb") as errf:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, env=env)
    print(proc.pid, flush=True)
    for m in messages:
        proc.stdin.write(frame(m))
    proc.stdin.flush()
    while True:  # reads a little of what the server says, then stops: the rest stays in flight
        if not proc.stdout.read1(1 << 16):
            break
""")


def gone(pid: int) -> bool:
    """The process has ended (no longer in /proc, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_client_killed_with_requests_in_flight(tmp_path):
    root, uri = workspace(tmp_path, files=20)
    log, err = tmp_path / "server.log", tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--log-file", str(log)]
    text = "def add(a, b):\n    return a + b\n\nx = ad"
    messages = [initialize(root), INITIALIZED, did_open(uri, text)]
    messages += [inline_completion(10 + i, uri, 3, 6) for i in range(5)]
    env = server_env(**{**FAKE, "FAKE_STEP_S": "0.1", "FAKE_STEPS": "10"})
    client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps([cmd, env, messages, str(err)])],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=tmp_path)  # fmt: skip
    try:
        pid = int(client.stdout.readline())
        deadline = time.monotonic() + 60
        while "engine ready" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and not gone(pid), "the server never got ready"
            time.sleep(0.05)
        time.sleep(0.3)  # the completions are being computed
        client.send_signal(signal.SIGKILL)
        client.wait()
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while not gone(pid):
            assert time.monotonic() < deadline, f"the server did not end; log:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        if "pid" in locals() and not gone(pid):
            os.kill(pid, signal.SIGKILL)
    out = log.read_text(errors="replace") + "\n--- stderr ---\n" + err.read_text(errors="replace")
    for word in NOISE:
        assert word not in out, f"{word!r} in the server's output:\n{out[-6000:]}"
    went_away(out, "went away")
