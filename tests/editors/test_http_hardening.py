"""Hardening of `dlm-lsp http`, driven with raw sockets: request smuggling after an
error, windows cut to what the model takes, deep JSON, slow clients, a connection cap, and the
checks that keep a web page (or another machine) off a developer's local endpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from dlm.lsp import http_endpoint as he

pytestmark = pytest.mark.timeout(180)
TOKEN = b"0123456789abcdef0123456789abcdef"


def _start(holder: he.EngineHolder, **opts):
    predictor = he.Predictor(holder, he.EndpointOptions(deadline_ms=600_000, min_confidence=0.0, **opts))
    server = he.make_server("127.0.0.1", 0, predictor)
    holder.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    holder.wait_loaded(120)
    return server


@pytest.fixture(scope="module")
def endpoint(tiny_checkpoint):
    from dlm.coder_model.engine import load_engine

    holder = he.EngineHolder(lambda: load_engine(tiny_checkpoint, "cpu"))
    server = _start(holder, sampler={"steps": 4, "block_len": 16, "max_blocks": 1},
                    header_timeout_s=1.0, body_timeout_s=1.0)  # fmt: skip
    yield server
    server.shutdown()
    server.server_close()
    holder.close()


def connect(server) -> socket.socket:
    s = socket.create_connection(server.server_address[:2], timeout=60)
    return s


def request(method: str, path: str, body: bytes = b"", headers: dict | None = None, port: int = 0) -> bytes:
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json"}
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body


class Responses:
    """Reads HTTP/1.1 responses off a socket; None once the server has closed it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def next(self):
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            if not self._fill():
                return None
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, json.loads(body) if body else None


def call(server, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    with connect(server) as s:
        s.sendall(request(method, path, body, headers, server.server_address[1]))
        return Responses(s).next()


def fim(prefix: str, suffix: str) -> bytes:
    return json.dumps(
        {"model": "dlm", "prompt": f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"}
    ).encode()


# ---- smuggling ------------------------------------------------------------------------------------
def test_an_unread_body_is_not_read_as_the_next_request(endpoint):
    port = endpoint.server_address[1]
    hidden = request("GET", "/v1/models", port=port)
    with connect(endpoint) as s:
        # 404 is answered before the body is read; the body hides a GET
        s.sendall(request("POST", "/v1/nope", hidden, port=port) + request("GET", "/health", port=port))
        r = Responses(s)
        assert r.next()[0] == 404
        nxt = r.next()
        assert nxt is None or (nxt[0] == 200 and "status" in nxt[2]), (
            f"the hidden request was answered: {nxt}"
        )


def test_a_refused_large_body_closes_the_connection(endpoint):
    port = endpoint.server_address[1]
    hidden = request("GET", "/v1/models", port=port)
    with connect(endpoint) as s:
        head = request("POST", "/v1/completions", headers={"Content-Length": str(50_000_000)}, port=port)
        s.sendall(head + hidden)
        r = Responses(s)
        status, headers, _ = r.next()
        assert status == 413 and headers.get("connection") == "close"
        assert r.next() is None  # closed: the hidden GET is never answered


def test_a_bad_content_length_closes_the_connection(endpoint):
    port = endpoint.server_address[1]
    with connect(endpoint) as s:
        s.sendall(
            request("POST", "/v1/completions", headers={"Content-Length": "12abc"}, port=port)
            + request("GET", "/v1/models", port=port)
        )
        r = Responses(s)
        assert r.next()[0] == 400
        assert r.next() is None


# ---- 200 or 4xx, never 500 ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [20_000, 60_000, 150_000])
def test_a_very_long_cursor_line_gets_no_suggestion_not_a_500(endpoint, n):
    line = "x = [" + "1, " * (n // 3)
    status, _, body = call(endpoint, "POST", "/v1/completions", fim("import os\n" + line, "]\nprint(x)\n"))
    assert status == 200, body
    assert body["choices"][0]["text"] == ""


def test_a_long_prefix_and_suffix_are_cut_to_the_model(endpoint):
    many = "".join(f"v{i} = {i}\n" for i in range(20_000))
    status, _, body = call(endpoint, "POST", "/v1/completions", fim(many + "y = ", "\n" + many))
    assert status == 200, body
    assert isinstance(body["choices"][0]["text"], str)


def test_deeply_nested_json_is_a_400(endpoint):
    body = b"[" * 100_000 + b"]" * 100_000
    status, _, out = call(endpoint, "POST", "/v1/completions", body)
    assert status == 400 and "nested too deeply" in out["error"]["message"]


# ---- slow clients -------------------------------------------------------------------------------------
def test_slow_headers_and_bodies_are_cut_off(endpoint):
    port = endpoint.server_address[1]
    with connect(endpoint) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the end of headers
        assert Responses(s).next() is None  # closed by the header deadline
    with connect(endpoint) as s:
        s.sendall(request("POST", "/v1/completions", headers={"Content-Length": "100"}, port=port) + b'{"pro')
        assert Responses(s).next() is None  # closed by the body deadline


def test_connections_over_the_cap_get_503(tiny_checkpoint):
    from dlm.lsp.engine_holder import EngineHolder

    holder = EngineHolder(lambda: pytest.fail("no request reaches the engine"))
    server = he.make_server("127.0.0.1", 0, he.Predictor(holder, he.EndpointOptions(max_connections=3)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    idle = [connect(server) for _ in range(3)]
    try:
        for s in idle:  # each is being served (one request answered, then idle, kept alive)
            s.sendall(request("GET", "/v1/models", port=server.server_address[1]))
            assert Responses(s).next()[0] == 200
        status, _, body = call(server, "GET", "/v1/models")
        assert status == 503 and "3 open connections" in body["error"]["message"]
        assert server.refused == 1
    finally:
        for s in idle:
            s.close()
    for _ in range(600):  # the idle connections' threads end when they see the close
        if server.active == 0:
            break
        time.sleep(0.05)
    assert call(server, "GET", "/v1/models")[0] == 200
    server.shutdown()
    server.server_close()


# ---- who may call ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guarded():
    from dlm.lsp.engine_holder import EngineHolder

    holder = EngineHolder(lambda: pytest.fail("not loaded in these tests"))
    server = he.make_server("127.0.0.1", 0, he.Predictor(holder, he.EndpointOptions(token=TOKEN)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_token_is_required_and_compared(guarded):
    assert call(guarded, "GET", "/v1/models")[0] == 401
    assert call(guarded, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert call(guarded, "GET", "/v1/models", headers={"Authorization": "Basic " + TOKEN.decode()})[0] == 401
    status, _, body = call(
        guarded, "GET", "/v1/models", headers={"Authorization": "Bearer " + TOKEN.decode()}
    )
    assert status == 200 and body["data"][0]["id"] == "dlm"


def test_browser_requests_are_refused(guarded):
    auth = {"Authorization": "Bearer " + TOKEN.decode()}
    for origin in ("https://evil.example", "null", "http://127.0.0.1:8765"):
        status, _, body = call(guarded, "POST", "/v1/completions", fim("a", "b"), {**auth, "Origin": origin})
        assert status == 403 and "Origin" in body["error"]["message"]
    status, _, body = call(guarded, "GET", "/v1/models", headers={**auth, "Host": "evil.example:8765"})
    assert status == 403 and "Host" in body["error"]["message"]
    assert (
        call(
            guarded, "GET", "/v1/models", headers={**auth, "Host": f"localhost:{guarded.server_address[1]}"}
        )[0]
        == 200
    )
    status, _, body = call(
        guarded, "POST", "/v1/completions", fim("a", "b"), {**auth, "Content-Type": "text/plain"}
    )
    assert status == 415 and "application/json" in body["error"]["message"]


def test_host_check():
    assert he.host_allowed("127.0.0.1:8765", "127.0.0.1")
    assert he.host_allowed("localhost", "127.0.0.1")
    assert he.host_allowed("[::1]:8765", "::1")
    assert he.host_allowed("10.0.0.5:8765", "10.0.0.5")
    assert not he.host_allowed("attacker.example", "127.0.0.1")
    assert not he.host_allowed("10.0.0.6:8765", "10.0.0.5")
    assert he.host_allowed(
        "gpu-box.lan:8765", "0.0.0.0"
    )  # any name on a wildcard address (the token guards it)


def test_cli_refuses_a_non_loopback_address_without_a_token(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DLM_TOKEN", None)
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "http", "--listen", "0.0.0.0:0", "--device", "cpu"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "without a token" in out.stderr
    token_file = tmp_path / "token"
    token_file.write_bytes(TOKEN)
    token_file.chmod(0o600)
    proc = subprocess.Popen(cmd + ["--token-file", str(token_file), "--model", str(tmp_path / "none")],
                            env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for line in proc.stderr:
            if "listening on" in line:
                break
        else:
            raise AssertionError("dlm-lsp http with a token did not start")
    finally:
        proc.kill()
        proc.wait()
