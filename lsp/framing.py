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
dispatch, responses) is still pygls'. They also see the client go, whenever
it goes: a write that fails is dropped quietly (pygls logs a traceback for it
and raises it into the handler that answered), the end of the input, a
client that closed only its end of stdout; they return, and `server.link`
says how the conversation ended (lsp.server_cli.leave ends the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import select
import stat
import sys
import threading
import time
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


class Link:
    """How the conversation with the client ends: its `exit` (`exit_code`), or the client going away
    (`ended`: one line saying how; the first one wins). The process then leaves through one function
    (lsp.server_cli.leave). `ended` wakes the serving loop (`on_end`): a thread may still block in a
    read of stdin, and the process must not wait for input that will never come."""

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.ended: str | None = None
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None

    def end(self, message: str) -> None:
        with self._lock:
            if self.ended is not None or self.exit_code is not None:
                return
            self.ended = message
            wake = self._wake
        if wake is not None:
            wake()

    def went_away(self, why: str) -> None:
        self.end(f"the client went away ({why})")

    def on_end(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wake = wake
            ended = self.ended
        if ended is not None:
            wake()


class PipeWriter:
    """pygls' writer on a byte stream (stdout): each message written and flushed whole, under a lock
    (answers, dlm/status and log records are written from the event loop, and may be from other
    threads). A write that fails (the client closed its end of the pipe: EPIPE; or the stream is
    closed) returns quietly and calls `on_lost` with the reason: pygls would log a traceback for it
    and raise it into whatever was answering, which logs another. After that, `lost` is true and
    every message is dropped without a word: nobody is left to read it."""

    def __init__(self, stream: BinaryIO, on_lost: Callable[[str], None]) -> None:
        self._stream = stream
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self.lost = False  # nothing more reaches the client (a write failed, or `exit` closed the stream)

    def write(self, data: bytes) -> None:
        with self._lock:
            if self.lost:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
                return
            except (OSError, ValueError) as exc:  # ValueError: the stream is closed
                self.lost = True
                why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self._on_lost(f"a message to it could not be written: {why}")

    def close(self) -> None:
        """`exit`: the stream is closed (the client reads its end); nothing is written after it."""
        with self._lock:
            self.lost = True
            try:
                self._stream.close()
            except (OSError, ValueError):  # it had gone already; unwritten bytes have no reader
                pass


INPUT_SILENT_MS = 200  # the client's input, still open, says nothing this long: it is gone


def _pipe_fd(stream: Any) -> int | None:
    """The descriptor of `stream` when it is a pipe or a socket (what poll() can watch for the
    other end closing), else None (a file, a terminal, a test's in-memory stream)."""
    if getattr(select, "poll", None) is None:
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


def end_when_input_is_silent(stdin: Any, link: Link, why: str) -> None:
    """The client reads no more of what the server writes (`why`). What it sent before it went is
    still handled (Neovim quits right after sending `shutdown`, which saves the index): while its
    input has bytes to read, the reader goes on, and at the end of the input the link ends as
    always. Input still open and silent means the client closed only its reading end: the link
    ends now."""
    fd = _pipe_fd(stdin)
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            try:
                events = poller.poll(INPUT_SILENT_MS)
            except OSError:
                break
            if not events:
                break
            if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                return  # the end of its input is there, after what is left to read
            time.sleep(0.05)  # bytes the reader has yet to take
    link.went_away(why)


def watch_hangup(stdout: Any, writer: PipeWriter, on_lost: Callable[[str], None]) -> None:
    """When stdout is a pipe or a socket, a thread waits for the client to close its end (poll()
    reports POLLERR or POLLHUP, asked for or not): the output is lost then, not at the next message
    the server writes, which an idle server whose client stopped reading would wait for forever."""
    fd = _pipe_fd(stdout)
    if fd is None:
        return  # a file or a terminal has no reader to lose
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: only POLLERR, POLLHUP and POLLNVAL wake it

    def wait() -> None:
        try:
            poller.poll()
        except OSError:
            return
        if not writer.lost:  # `exit` closing stdout is not the client going away
            on_lost("it closed its end of the server's stdout")

    threading.Thread(target=wait, name="dlm-stdout-hangup", daemon=True).start()


async def _serve_until_end(serving: Awaitable[None], link: Link) -> None:
    """Run `serving` until it returns or the link ends, whichever is first."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def set_ended() -> None:
        if not ended.done():
            ended.set_result(None)

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(set_ended)
        except RuntimeError:  # the loop is closed: serving is over already
            pass

    link.on_end(wake)
    task = asyncio.ensure_future(serving)
    await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
        return
    task.cancel()  # it waits for stdin, which may never answer; the thread reading it is left behind
    with contextlib.suppress(asyncio.CancelledError):
        await task


def serve_stdio(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """pygls' `start_io`, with our framing. Returns when the client is done: `server.link` says how
    (its `exit`, the end of its input, a write to it that failed, its end of stdout closed)."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    read1 = getattr(stdin, "read1", None) or stdin.read
    link = server.link = Link()
    server._stop_event = threading.Event()
    output_lost_once = threading.Lock()

    def output_lost(why: str) -> None:
        if output_lost_once.acquire(blocking=False):  # the first reason; the rest say the same
            threading.Thread(target=end_when_input_is_silent, args=(stdin, link, why),
                             name="dlm-client-gone", daemon=True).start()  # fmt: skip

    writer = PipeWriter(stdout, output_lost)
    server.protocol.set_writer(writer)
    # One thread blocks in read(); the server's pool stays for handlers.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlm-stdin")

    def read(n: int) -> bytes:
        try:
            return read1(n)
        except (OSError, ValueError) as exc:  # e.g. ECONNRESET on a socket whose peer was killed
            link.went_away(f"reading its messages failed: {getattr(exc, 'strerror', None) or exc}")
            return b""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def read_chunk() -> Awaitable[bytes]:
            return loop.run_in_executor(executor, read, READ_CHUNK)

        await _serve_until_end(serve(FrameReader(read_chunk), server.protocol, server._stop_event), link)
        link.went_away("end of input: it closed the server's stdin")

    watch_hangup(stdout, writer, output_lost)
    try:
        asyncio.run(main())
    except BrokenPipeError:  # a write outside the writer (none is known): the same end, told the same way
        link.went_away("broken pipe")
    except KeyboardInterrupt:
        link.end("interrupted (SIGINT)")
    except SystemExit as exc:  # pygls' `exit`: 0 after `shutdown`, else 1 (LSP spec); the CLI returns it
        link.exit_code = exc.code if isinstance(exc.code, int) else 1
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        server.shutdown()


class SocketWriter:
    """pygls' writer on a TCP connection: once the connection is closing, messages are dropped
    without a word (asyncio would warn for each) and the link ends."""

    def __init__(self, writer: asyncio.StreamWriter, link: Link) -> None:
        self._writer = writer
        self._link = link
        self.lost = False

    def write(self, data: bytes) -> None:
        if self.lost:
            return
        if self._writer.transport.is_closing():
            self.lost = True
            self._link.went_away("it closed the connection")
            return
        self._writer.write(data)

    def close(self) -> None:
        self.lost = True
        self._writer.close()


def serve_tcp(server: Any, host: str, port: int) -> None:
    """pygls' `start_tcp`, with our framing. Returns when the client is done (`server.link`)."""
    server._stop_event = stop_event = threading.Event()
    link = server.link = Link()

    async def connection(stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.protocol.set_writer(SocketWriter(writer, link))

        async def read_chunk() -> bytes:
            try:
                return await stream.read(READ_CHUNK)
            except OSError as exc:  # ECONNRESET: the client was killed with unread data
                link.went_away(f"reading its messages failed: {exc.strerror or exc}")
                return b""

        await serve(FrameReader(read_chunk), server.protocol, stop_event)
        link.went_away("it closed the connection")
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
    except KeyboardInterrupt:
        link.end("interrupted (SIGINT)")
    except SystemExit as exc:  # `exit`, as in serve_stdio
        link.exit_code = exc.code if isinstance(exc.code, int) else 1
