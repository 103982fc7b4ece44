"""LSP base protocol framing (`Content-Length: N\\r\\n\\r\\n` + N bytes of JSON), robust to bad frames.

pygls 2.1 reads frames with a regular expression on each header line and
`read(N)`: one frame without a Content-Length, with a negative or non-numeric
one, or with a body shorter than declared leaves it out of step with the
stream for good (it answers nothing again), and `Content-Length:
1000000000000` makes it allocate the body (MemoryError). This reader keeps a
byte buffer and, after any bad frame, logs what was wrong and resynchronises
on the next `Content-Length:` header in the stream:

- a header block without a usable Content-Length (missing, negative, not a
  number, over MAX_BODY_BYTES) is dropped, and so are the bytes after it up
  to the next `Content-Length:` (its body, whose length is unknown or refused);
- a body that is not JSON, and holds a `Content-Length:` header (the sender
  declared more bytes than it sent, so we read into the next frame), is cut
  there and the rest is read again as the next frame;
- a body that is not JSON gets a -32700 (parse error) response, and JSON that
  is not a JSON-RPC 2.0 message gets -32600 (invalid request), with the id
  when it has a usable one, else null (JSON-RPC 2.0 §5).

`serve_stdio` and `serve_tcp` replace pygls' `start_io` / `start_tcp` loops
(lsp.server.DlmServer calls them); everything after framing (structuring,
dispatch, responses) is still pygls'.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # a larger frame is refused (a 10 MB document is ~11 MB of JSON)
MAX_HEADER_BYTES = 64 * 1024  # a header block longer than this is junk
READ_CHUNK = 1 << 16

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

_HEADER_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_HEADER_LINES = re.compile(
    rb"(?:[A-Za-z0-9-]+[ \t]*:[^\r\n]*\r\n)*"
)  # e.g. Content-Type before Content-Length
_KEEP_TAIL = 32  # bytes kept when dropping junk: a "Content-Length:" may straddle two reads


class FrameReader:
    """Frames from a byte stream; `read_chunk()` returns the next bytes (b"" at end of stream)."""

    def __init__(self, read_chunk: Callable[[], Awaitable[bytes]], max_body: int = MAX_BODY_BYTES) -> None:
        self._read_chunk = read_chunk
        self.max_body = max_body
        self._buf = bytearray()
        self._eof = False
        self.bad_frames = 0  # frames dropped for bad framing (not counting bad JSON)

    async def _fill(self) -> bool:
        """Read more bytes into the buffer; False at end of stream."""
        if self._eof:
            return False
        chunk = await self._read_chunk()
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def push_back(self, data: bytes) -> None:
        """Read `data` again before the rest of the stream (a body that ran into the next frame)."""
        self._buf[:0] = data

    def _drop_until_header(self, start: int = 0) -> bool:
        """Drop bytes up to the next `Content-Length:` at or after `start`; True when one is in
        the buffer (it is now at offset 0)."""
        m = _CONTENT_LENGTH.search(self._buf, start)
        if m is not None:
            del self._buf[: m.start()]
            return True
        keep = min(len(self._buf), _KEEP_TAIL)
        del self._buf[: len(self._buf) - keep]
        return False

    async def _skip_to_header(self, after: int) -> bool:
        """Discard bytes (a refused frame's body) until a `Content-Length:` header starts the
        buffer; False at end of stream. Memory stays bounded whatever the sender declared."""
        found = self._drop_until_header(after)
        while not found:
            if not await self._fill():
                return False
            found = self._drop_until_header(0)
        return True

    def _bad(self, reason: str) -> None:
        self.bad_frames += 1
        log.warning("bad frame from the client: %s; skipping to the next Content-Length header", reason)

    async def read_frame(self) -> bytes | None:
        """The next frame's body, or None at end of stream."""
        while True:
            end = self._buf.find(_HEADER_END)
            while end < 0:
                if len(self._buf) > MAX_HEADER_BYTES:
                    self._bad(f"no end of headers within {MAX_HEADER_BYTES} bytes")
                    if not await self._skip_to_header(1):
                        return None
                elif not await self._fill():
                    if self._buf.strip():
                        log.warning(
                            "the client closed the stream inside a frame header (%d bytes dropped)",
                            len(self._buf),
                        )
                    return None
                end = self._buf.find(_HEADER_END)
            header = bytes(self._buf[:end])
            m = _CONTENT_LENGTH.search(header)
            if m is None:
                del self._buf[: end + len(_HEADER_END)]
                self._bad(f"a header block without Content-Length ({header[:80]!r})")
                if not await self._skip_to_header(0):
                    return None
                continue
            if m.start() > 0 and not _HEADER_LINES.fullmatch(header[: m.start()]):
                # junk before the header (the rest of a bad frame): drop it
                self._bad(f"{m.start()} bytes of junk before a header ({header[: min(m.start(), 80)]!r})")
                del self._buf[: m.start()]
                continue
            value = header[m.end() :].split(b"\r\n", 1)[0].strip()
            length = int(value) if value.isdigit() else None
            if length is None or length > self.max_body:
                why = (
                    f"Content-Length {value[:40]!r} is not a non-negative whole number"
                    if length is None
                    else f"Content-Length {length} is over the {self.max_body}-byte limit"
                )
                self._bad(why)
                del self._buf[: end + len(_HEADER_END)]
                if not await self._skip_to_header(0):
                    return None
                continue
            body_start = end + len(_HEADER_END)
            while len(self._buf) < body_start + length:
                if not await self._fill():
                    log.warning(
                        "the client closed the stream inside a frame body (%d of %d bytes)",
                        len(self._buf) - body_start,
                        length,
                    )
                    return None
            body = bytes(self._buf[body_start : body_start + length])
            del self._buf[: body_start + length]
            return body


def error_response(msg_id: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def usable_id(obj: Any) -> Any:
    """The message's id when it is one JSON-RPC allows (string or integer), else None."""
    msg_id = obj.get("id") if isinstance(obj, dict) else None
    return (
        msg_id
        if isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool))
        else None
    )


def check_message(obj: Any) -> str | None:
    """What makes `obj` not a JSON-RPC 2.0 message, or None when it is one."""
    if not isinstance(obj, dict):
        return f"a JSON-RPC message must be a JSON object, got {type(obj).__name__}"
    if obj.get("jsonrpc") != "2.0":
        return f"'jsonrpc' must be \"2.0\", got {obj.get('jsonrpc')!r}"
    if "id" in obj and obj["id"] is not None and usable_id(obj) is None:
        return f"'id' must be a string or an integer, got {type(obj['id']).__name__}"
    if "method" in obj:
        if not isinstance(obj["method"], str):
            return f"'method' must be a string, got {type(obj['method']).__name__}"
        if obj.get("params") is not None and not isinstance(obj["params"], (dict, list)):  # null: shutdown
            return f"'params' must be an object or an array, got {type(obj['params']).__name__}"
    elif "id" not in obj or ("result" not in obj and "error" not in obj):
        return (
            "a message needs 'method' (a request or notification) or 'id' with 'result'/'error' (a response)"
        )
    return None


def decode(body: bytes, reader: FrameReader) -> tuple[Any, dict | None]:
    """(the JSON-RPC message, None) or (None, the error response to send)."""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        m = _CONTENT_LENGTH.search(body, 1)
        if m is not None:  # the declared length ran past the body into the next frame
            reader.push_back(body[m.start() :])
            log.warning(
                "bad frame from the client: its body is shorter than its Content-Length "
                "(the next header starts inside it); resynchronised on that header"
            )
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        log.warning("a message that is not JSON (%s); answered with a parse error", why)
        return None, error_response(
            None,
            PARSE_ERROR,
            f"parse error: the message body is not valid JSON ({why}); "
            "send one JSON-RPC object per frame, UTF-8 encoded",
        )
    problem = check_message(obj)
    if problem is not None:
        log.warning("an invalid JSON-RPC message (%s); answered with invalid request", problem)
        return None, error_response(usable_id(obj), INVALID_REQUEST, f"invalid request: {problem}")
    return obj, None


async def serve(reader: FrameReader, protocol: Any, stop_event: threading.Event) -> None:
    """Read frames and hand each JSON-RPC message to pygls' protocol until end of stream."""
    while not stop_event.is_set():
        body = await reader.read_frame()
        if body is None:
            break
        message, error = decode(body, reader)
        if error is not None:
            protocol._send_data(error)
            continue
        try:
            # What pygls' loop does with a decoded body (its structure_message as object_hook
            # only changes the top-level dict: nested dicts carry no "jsonrpc").
            protocol.handle_message(protocol.structure_message(message))
        except Exception:  # one message's failure must not end the loop; the reason is logged
            log.exception("could not handle a %s message", message.get("method", "response"))


def serve_stdio(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """pygls' `start_io`, with our framing."""
    from pygls.io_ import StdoutWriter

    stdin = stdin or sys.stdin.buffer
    read1 = getattr(stdin, "read1", None) or stdin.read
    server._stop_event = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    # One thread blocks in read(); the server's pool stays for handlers.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlm-stdin")

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def read_chunk() -> Awaitable[bytes]:
            return loop.run_in_executor(executor, read1, READ_CHUNK)

        await serve(FrameReader(read_chunk), server.protocol, server._stop_event)

    try:
        asyncio.run(main())
    except BrokenPipeError:
        log.error("the connection to the client is lost (broken pipe); shutting down")
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # pygls' `exit`: 0 after `shutdown`, else 1 (LSP spec); the CLI returns it
        server.exit_code = exc.code if isinstance(exc.code, int) else 1
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        server.shutdown()


def serve_tcp(server: Any, host: str, port: int) -> None:
    """pygls' `start_tcp`, with our framing."""
    server._stop_event = stop_event = threading.Event()

    async def connection(stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.protocol.set_writer(writer)

        async def read_chunk() -> bytes:
            return await stream.read(READ_CHUNK)

        await serve(FrameReader(read_chunk), server.protocol, stop_event)
        server.shutdown()

    async def main() -> None:
        server._server = await asyncio.start_server(connection, host, port)
        log.info("serving LSP on %s", ", ".join(str(s.getsockname()) for s in server._server.sockets))
        async with server._server:
            await server._server.serve_forever()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        log.debug("the TCP server was cancelled")
    except SystemExit as exc:  # `exit`, as in serve_stdio
        server.exit_code = exc.code if isinstance(exc.code, int) else 1
