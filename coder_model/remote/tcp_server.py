"""The remote-mode network front end: asyncio TCP, handshake, frames, per-connection limits.

Kept apart from the model (batching.py) so that a slow forward pass never
stalls reading frames, answering cancels or refusing bad clients. The asyncio
loop runs in one thread and owns every socket; the model runs in the
scheduler's thread; prompt preparation (cutting, tokenizing) runs on a small
worker pool so that neither of the other two waits on a client's large
prompt. They meet in `Scheduler.submit` (loop -> scheduler) and
`loop.call_soon_threadsafe` (scheduler -> loop, to send a result).

Identity: each connection gets an owner id from the server (`conn<N>`), which
keys its prefix caches and its log lines. The `client` label a client sends in
`hello` is its own choice, so it is never used as an identity: a second token
holder presenting someone else's label gets nothing of theirs.

Limits (a client can hurt only itself): frame size, requests and frame bytes in
flight per connection, handshake/frame/idle timeouts (`Limits`), a cap on
connections held (`ServerOptions.max_connections`), the parameter caps of
coder_model.limits (checked in wire.py), and the scheduler's: fair shares of
the forward passes between connections, a cap on each connection's requests and
slots in the batch, and a refusal of requests whose measured cost is too high
(`check_request`; batching.py says how).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from dlm.coder_model.remote import auth
from dlm.coder_model.remote.batching import Request, SchedulerStats
from dlm.coder_model.remote.wire import (
    FEATURES,
    PROTOCOL_VERSION,
    ConnectionClosed,
    IdleTimeout,
    Limits,
    ProtocolError,
    deadline_from_wire,
    encode_frame,
    error_message,
    params_from_wire,
    prompt_from_wire,
    read_frame,
    read_sized_frame,
    result_message,
)
from dlm.coder_model.types import Prediction, Prompt, SamplerParams

log = logging.getLogger("dlm.remote.tcp_server")


class Scheduler(Protocol):
    """What the front end needs from the model side (BatchScheduler, EngineScheduler)."""

    stats: SchedulerStats

    @property
    def budget(self) -> Any: ...

    def prepare(self, prompt: Prompt, params: SamplerParams) -> Any: ...

    def check_request(self, params: SamplerParams, deadline_ms: float | None) -> str | None: ...

    def start(self) -> None: ...

    def submit(self, req: Request) -> None: ...

    def forget(self, owner: str) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 7341
    token: bytes | None = None
    ssl_context: ssl.SSLContext | None = None
    limits: Limits = field(default_factory=Limits)
    model_name: str = ""
    device: str = ""
    # Connections held at once (authenticated, plus as many still in their handshake);
    # each costs a socket and buffers, and an idle one is kept for idle_timeout_s.
    max_connections: int = 256
    prepare_workers: int = 2  # threads that cut and tokenize prompts

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections}: use at least 1")
        if self.prepare_workers < 1:
            raise ValueError(f"prepare_workers={self.prepare_workers}: use at least 1")


@dataclass
class _InFlight:
    request: Request
    nbytes: int  # frame size, counted against Limits.max_inflight_bytes until answered


class _Conn:
    """One client connection: handshake, then a reader loop; results are written back from the loop."""

    def __init__(self, server: RemoteServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 owner: str):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.limits = server.options.limits
        self.inflight: dict[int, _InFlight] = {}
        self.inflight_bytes = 0
        # One prompt of this connection in preparation at a time: a burst of large prompts
        # from one client occupies one worker, and the others stay free for other clients.
        self.prepare_lock = asyncio.Lock()
        self.closed = False
        self.authenticated = False
        self.owner = owner  # assigned by the server: the identity of this connection's caches and log lines
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def send(self, message: dict[str, Any]) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(encode_frame(message))

    async def run(self) -> None:
        try:
            await self._handshake()
            log.info("connection %s from %s authenticated", self.owner, self.peer)
            await self._serve()
        except ConnectionClosed:
            pass
        except ProtocolError as exc:
            log.warning("closing connection %s from %s: %s", self.owner, self.peer, exc)
            self.server.stats["closed_for_errors"] += 1
            await self.close_with(exc.code, exc.message)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            log.info("connection %s from %s lost: %s", self.owner, self.peer, exc)
        finally:
            self.closed = True
            for entry in self.inflight.values():  # nobody will read their results
                entry.request.cancel.cancel()
            self.inflight.clear()
            self.inflight_bytes = 0
            self.writer.close()
            if self.authenticated:
                self.server.scheduler.forget(self.owner)

    async def close_with(self, code: str, message: str) -> None:
        """Send a connection-level error and let it reach the client before the socket closes."""
        self.send(error_message(code, message))
        try:
            await asyncio.wait_for(self.writer.drain(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass

    async def _handshake(self) -> None:
        deadline = time.monotonic() + self.limits.handshake_timeout_s
        token = self.server.options.token
        nonce = auth.make_nonce()
        self.send({"t": "hello", "id": 0, "stage": "challenge", "v": PROTOCOL_VERSION, "nonce": nonce,
                   "auth": token is not None})
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            msg = await read_frame(self.reader, max_bytes=self.limits.max_frame_bytes,
                                   first_byte_timeout=remaining, frame_timeout=remaining)
        except IdleTimeout:
            raise ProtocolError("timeout", f"no hello within {self.limits.handshake_timeout_s:g} s of "
                                "connecting; clients must authenticate promptly") from None
        if msg["t"] != "hello" or msg.get("stage") != "response":
            raise ProtocolError("protocol", f"expected hello (stage response) first, got {msg['t']!r}; "
                                "connect with a dlm-lsp client")
        version = msg.get("v")
        if version != PROTOCOL_VERSION:
            raise ProtocolError("version_mismatch", f"client speaks protocol version {version!r}, this server "
                                f"speaks {PROTOCOL_VERSION}; install the same dlm-lsp version on both machines")
        client_nonce = msg.get("nonce")
        if not isinstance(client_nonce, bytes) or len(client_nonce) != auth.NONCE_BYTES:
            raise ProtocolError("protocol", f"hello nonce must be {auth.NONCE_BYTES} random bytes")
        if token is not None and not auth.proofs_match(auth.client_proof(token, nonce, client_nonce),
                                                       msg.get("proof")):
            raise ProtocolError("auth_failed", "wrong token: the client's proof does not match this "
                                "server's token; use the same --token-file / DLM_TOKEN on both ends")
        # msg["client"] is a label of the client's choosing: not an identity, so neither used nor logged.
        self.server.admit_authenticated(self)  # ProtocolError when --max-connections are held already
        self.authenticated = True
        budget = self.server.scheduler.budget
        self.send({
            "t": "hello", "id": 0, "stage": "welcome", "v": PROTOCOL_VERSION,
            "proof": auth.server_proof(token, nonce, client_nonce) if token is not None else None,
            "model": self.server.options.model_name, "device": self.server.options.device,
            "limits": {"max_frame_bytes": self.limits.max_frame_bytes, "max_inflight": self.limits.max_inflight,
                       "max_inflight_bytes": self.limits.max_inflight_bytes},
            "budget": {"max_context": budget.max_context, "max_history": budget.max_history,
                       "max_suffix": budget.max_suffix},
            "features": list(FEATURES),
        })
        await self.writer.drain()

    async def _serve(self) -> None:
        while True:
            try:
                msg, nbytes = await read_sized_frame(self.reader, max_bytes=self.limits.max_frame_bytes,
                                                     first_byte_timeout=self.limits.idle_timeout_s,
                                                     frame_timeout=self.limits.frame_timeout_s)
            except IdleTimeout:
                if self.inflight:
                    continue  # the client is waiting for results, not idle
                raise
            try:
                self._dispatch(msg, nbytes)
            except ProtocolError as exc:
                if exc.fatal:
                    raise
                self.send(error_message(exc.code, exc.message, exc.request_id))
            await self.writer.drain()  # back-pressure: stop reading while the client does not read

    def _dispatch(self, msg: dict[str, Any], nbytes: int) -> None:
        t, rid = msg["t"], msg["id"]
        if t == "cancel":
            entry = self.inflight.get(rid)
            if entry is not None:  # unknown ids are late cancels of finished requests: nothing to do
                entry.request.cancel.cancel()
            return
        if t != "predict":
            raise ProtocolError("protocol", f"a client may send only predict and cancel after hello, got {t!r}")
        if rid == 0:
            raise ProtocolError("bad_request", "predict needs an id >= 1", fatal=False)
        if rid in self.inflight:
            raise ProtocolError("duplicate_id", f"request id {rid} is already in flight; use a fresh id",
                                request_id=rid)
        if len(self.inflight) >= self.limits.max_inflight:
            raise ProtocolError("too_many_requests", f"{len(self.inflight)} requests already in flight on this "
                                f"connection (limit {self.limits.max_inflight}); wait for results or cancel some",
                                request_id=rid)
        if self.inflight_bytes + nbytes > self.limits.max_inflight_bytes:
            raise ProtocolError("too_many_requests", f"this request's {nbytes} bytes would bring the prompts in "
                                f"flight on this connection to {self.inflight_bytes + nbytes} bytes (limit "
                                f"{self.limits.max_inflight_bytes}); send windowed prompts, wait for results or "
                                "cancel some", request_id=rid)
        prompt = prompt_from_wire(msg.get("prompt"), rid)
        params = params_from_wire(msg.get("params"), rid)
        deadline_ms = deadline_from_wire(msg, rid)
        problem = self.server.scheduler.check_request(params, deadline_ms)  # by the measured step time
        if problem is not None:
            self.server.scheduler.stats.refused += 1
            raise ProtocolError("bad_request", problem, request_id=rid, fatal=False)
        loop = asyncio.get_running_loop()

        def on_done(pred: Prediction | None, err: ProtocolError | None) -> None:  # scheduler thread
            loop.call_soon_threadsafe(self._deliver, rid, req, pred, err)

        req = Request(self.owner, rid, prompt, params, on_done, deadline_ms=deadline_ms)
        self.inflight[rid] = _InFlight(req, nbytes)
        self.inflight_bytes += nbytes
        # Cutting and tokenizing run on the worker pool: the reader goes on with the next
        # frame, and the scheduler thread only ever sees prepared requests.
        self.server.spawn(self._prepare_and_submit(req))

    async def _prepare_and_submit(self, req: Request) -> None:
        async with self.prepare_lock:
            if not req.cancel.cancelled:  # cancelled before its turn: the scheduler answers it without work
                try:
                    req.prepared = await self.server.run_prepare(req.prompt, req.params)
                except ValueError as exc:  # a prompt this model cannot take: that request only
                    req.on_done(None, ProtocolError("bad_request", str(exc), request_id=req.request_id,
                                                    fatal=False))
                    return
                except Exception as exc:
                    log.exception("preparing request %s of %s failed", req.request_id, self.owner)
                    req.on_done(None, ProtocolError("server_error", f"preparing the prompt failed: "
                                                    f"{type(exc).__name__}: {exc}; see the server log",
                                                    request_id=req.request_id, fatal=False))
                    return
        self.server.scheduler.submit(req)

    def _deliver(self, rid: int, req: Request, pred: Prediction | None, err: ProtocolError | None) -> None:
        entry = self.inflight.get(rid)
        if entry is None or entry.request is not req:
            return  # connection gone, or the id was reused after a cancel
        del self.inflight[rid]
        self.inflight_bytes -= entry.nbytes
        self.server.stats["results"] += 1
        if err is not None:
            self.send(error_message(err.code, err.message, rid))
        else:
            self.send(result_message(rid, pred))


class RemoteServer:
    """The TCP server. `await start()` binds; `await serve_forever()`; `close()`."""

    def __init__(self, scheduler: Scheduler, options: ServerOptions):
        auth.check_bind_allowed(options.host, options.token)
        self.scheduler = scheduler
        self.options = options
        self.stats: collections.Counter[str] = collections.Counter()
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Conn] = set()
        self._authenticated: set[_Conn] = set()
        self._tasks: set[asyncio.Task] = set()
        self._owner_ids = itertools.count(1)
        self._prepare_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.port = options.port

    async def start(self) -> int:
        self._prepare_pool = concurrent.futures.ThreadPoolExecutor(self.options.prepare_workers,
                                                                   thread_name_prefix="dlm-remote-prepare")
        self.scheduler.start()
        self._server = await asyncio.start_server(
            self._on_connect, self.options.host, self.options.port,
            ssl=self.options.ssl_context,
            ssl_handshake_timeout=self.options.limits.handshake_timeout_s if self.options.ssl_context else None,
            limit=64 * 1024,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def run_prepare(self, prompt: Prompt, params: SamplerParams) -> Any:
        assert self._prepare_pool is not None, "call start() first"
        return await asyncio.get_running_loop().run_in_executor(self._prepare_pool, self.scheduler.prepare,
                                                                prompt, params)

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a reference, or the loop may drop the task midway
        task.add_done_callback(self._tasks.discard)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(self, reader, writer, owner=f"conn{next(self._owner_ids)}")
        self.stats["connections"] += 1
        if len(self._conns) - len(self._authenticated) >= self.options.max_connections:
            # as many handshakes as connections may be pending; beyond that, refuse at once
            self.stats["refused_connections"] += 1
            log.warning("refusing %s from %s: %d connections still in their handshake", conn.owner, conn.peer,
                        len(self._conns) - len(self._authenticated))
            await conn.close_with("too_many_connections", self._too_many_message())
            writer.close()
            return
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)
            self._authenticated.discard(conn)

    def _too_many_message(self) -> str:
        return (f"the server holds its limit of {self.options.max_connections} connections; retry later, or ask "
                "the server's operator to raise --max-connections")

    def admit_authenticated(self, conn: _Conn) -> None:
        """Count an authenticated connection, or refuse it when the server holds max_connections."""
        if len(self._authenticated) >= self.options.max_connections:
            self.stats["refused_connections"] += 1
            raise ProtocolError("too_many_connections", self._too_many_message())
        self._authenticated.add(conn)

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    async def serve_forever(self) -> None:
        assert self._server is not None, "call start() first"
        async with self._server:
            await self._server.serve_forever()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.send(error_message("shutting_down", "the server is shutting down; the client will reconnect"))
            conn.writer.close()
        self.scheduler.stop()
        if self._prepare_pool is not None:
            self._prepare_pool.shutdown(wait=False, cancel_futures=True)


class ServerThread:
    """A RemoteServer on its own event loop in a background thread (tests, bench)."""

    def __init__(self, scheduler: Scheduler, options: ServerOptions):
        self.server = RemoteServer(scheduler, options)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dlm-remote-server", daemon=True)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def stats(self) -> SchedulerStats:
        return self.server.scheduler.stats

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to start() in the caller's thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.server.aclose())
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
