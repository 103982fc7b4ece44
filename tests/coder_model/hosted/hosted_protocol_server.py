"""A local HTTP server that answers in a hosted backend's documented shapes, for protocol tests.

It records every request (path, headers, JSON body, the connection it came on) and answers what
the test tells it to (`ProtocolServer.respond`): a status, a body, a Content-Type, a delay. While
it delays it watches the client's socket, so a test can see when a request was aborted (the
client closed its connection). It makes no claim about any model: the answers are the test's.

A plain module (imported as `hosted_protocol_server`: pytest puts this folder on sys.path for its
tests; tests/lsp adds it by path).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Response:
    status: int = 200
    body: Any = None  # a JSON value, or bytes sent as they are
    content_type: str = "application/json"
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Record:
    path: str
    headers: dict[str, str]
    body: Any
    connection: tuple[str, int]
    at: float
    aborted_at: float | None = None  # when the client closed the connection while the server delayed


def openai_text(text: str | None) -> dict:
    """An OpenAI /v1/completions answer (openai-fim, mercury-fim)."""
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                      "finish_reason": "stop"}]}


def chat_content(content: str | None) -> dict:
    """A chat-shaped answer (Mercury Edit: choices[0].message.content)."""
    return {"id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}


class ProtocolServer:
    """`with ProtocolServer() as srv: srv.respond = lambda record: Response(body=...)`."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.connections: set[tuple[str, int]] = set()
        self.respond: Callable[[Record], Response] = lambda record: Response(body=openai_text(""))
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                record = Record(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                self.client_address, time.monotonic())
                with server._lock:
                    server.records.append(record)
                    server.connections.add(self.client_address)
                answer = server.respond(record)
                if answer.delay_s and not self._wait(answer.delay_s):
                    record.aborted_at = time.monotonic()
                    self.close_connection = True
                    return
                data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
                head = [f"HTTP/1.1 {answer.status} X", f"Content-Type: {answer.content_type}",
                        f"Content-Length: {len(data)}", *[f"{k}: {v}" for k, v in answer.headers.items()]]
                try:
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
                except OSError:
                    self.close_connection = True

            def _wait(self, seconds: float) -> bool:
                """Wait `seconds`; False as soon as the client closes its connection."""
                end = time.monotonic() + seconds
                sock = self.connection
                while time.monotonic() < end:
                    readable, _, _ = select.select([sock], [], [], min(0.002, max(0.0, end - time.monotonic())))
                    if readable:
                        try:
                            if sock.recv(1, socket.MSG_PEEK) == b"":
                                return False
                        except OSError:
                            return False
                return True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client that hung up is the test's point
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ProtocolServer:  # noqa: PYI034 - as the other test servers here
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_records(self, n: int, timeout_s: float = 10.0) -> list[Record]:
        end = time.monotonic() + timeout_s
        while len(self.records) < n and time.monotonic() < end:
            time.sleep(0.005)
        return self.records
