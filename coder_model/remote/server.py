"""The remote-mode model server: asyncio TCP front end + a batching scheduler.

Threads: the asyncio loop (sockets, handshakes, framing) runs in one thread;
the model runs in one scheduler thread, so a slow forward pass never stalls
reading frames, answering cancels or refusing bad clients. They meet in two
places: `BatchScheduler.submit` (loop -> scheduler, under a condition
variable) and `loop.call_soon_threadsafe` (scheduler -> loop, to send a
result).

Scheduling (continuous batching): the scheduler keeps a set of active
requests. Between two denoising steps it admits new requests (tokenize +
prefill), drops cancelled ones (so a cancel frame stops a request within one
step) and finished ones, then runs one step of every active request in one
forward pass through the backend. The backend owns the per-(client,
document) prefix KV caches.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dlm.coder_model.remote import auth
from dlm.coder_model.remote.protocol import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    IdleTimeout,
    Limits,
    ProtocolError,
    encode_frame,
    error_message,
    params_from_wire,
    prompt_from_wire,
    read_frame,
    result_message,
)
from dlm.coder_model.types import CancelToken, Engine, Prediction, Prompt, SamplerParams

log = logging.getLogger("dlm.remote.server")


# ------------------------------------------------------------------ scheduling


@dataclass
class Request:
    """One predict request inside the server."""

    client_id: str
    request_id: int
    prompt: Prompt
    params: SamplerParams
    on_done: Callable[[Prediction | None, ProtocolError | None], None]
    cancel: CancelToken = field(default_factory=CancelToken)
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0  # prefill start
    prefilled: float = 0.0  # prefill end
    steps_run: int = 0


class BatchBackend(Protocol):
    """What the scheduler needs from a model: per-request jobs stepped together.

    `begin` tokenizes and prefills one request (raising ValueError for a
    prompt it cannot take); `step` runs one denoising step of every job in
    `jobs` in one forward pass; `release` is called exactly once per begun
    job, done or not, so the backend can return its prefix cache.
    """

    def describe(self) -> dict[str, str]: ...

    def begin(self, request: Request) -> Any: ...

    def step(self, jobs: list[Any]) -> None: ...

    def is_done(self, job: Any) -> bool: ...

    def finish(self, job: Any) -> Prediction: ...

    def release(self, job: Any) -> None: ...


@dataclass
class SchedulerStats:
    forward_passes: int = 0  # batched steps run
    request_steps: int = 0  # sum over requests of the steps run for them
    admitted: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    max_batch_seen: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


def _cancelled_prediction(req: Request, now: float) -> Prediction:
    queue_end = req.started or now
    return Prediction(
        text="",
        cancelled=True,
        steps=req.steps_run,
        queue_ms=(queue_end - req.submitted) * 1e3,
        prefill_ms=((req.prefilled or queue_end) - queue_end) * 1e3 if req.started else 0.0,
        denoise_ms=(now - req.prefilled) * 1e3 if req.prefilled else 0.0,
    )


class BatchScheduler:
    """Continuous batching of denoising steps over all clients' requests."""

    def __init__(self, backend: BatchBackend, *, max_batch: int = 32):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: use at least 1")
        self.backend = backend
        self.max_batch = max_batch
        self.stats = SchedulerStats()
        self._pending: collections.deque[Request] = collections.deque()
        self._active: list[tuple[Request, Any]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dlm-remote-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, req: Request) -> None:
        with self._cond:
            if self._stopping:
                req.on_done(None, ProtocolError("shutting_down", "the server is shutting down; retry later",
                                                request_id=req.request_id, fatal=False))
                return
            self._pending.append(req)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # The loop below runs in the scheduler thread only.
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._pending and not self._active:
                    self._cond.wait()
                if self._stopping:
                    break
                admit: list[Request] = []
                keep: collections.deque[Request] = collections.deque()
                for req in self._pending:  # cancelled while queued: answer without any work
                    if req.cancel.cancelled:
                        self._answer_cancelled(req)
                    elif len(self._active) + len(admit) < self.max_batch:
                        admit.append(req)
                    else:
                        keep.append(req)
                self._pending = keep
            for req in admit:
                self._begin(req)
            self._drop_cancelled()
            if self._active:
                self._step()
        self._shutdown()

    def _begin(self, req: Request) -> None:
        req.started = time.perf_counter()
        try:
            job = self.backend.begin(req)
        except ValueError as exc:  # a prompt this model cannot take: that request only
            self.stats.failed += 1
            req.on_done(None, ProtocolError("bad_request", str(exc), request_id=req.request_id, fatal=False))
            return
        except Exception as exc:  # a model failure must not kill the scheduler
            log.exception("prefill failed for request %s of %s", req.request_id, req.client_id)
            self.stats.failed += 1
            req.on_done(None, ProtocolError("server_error", f"prefill failed: {type(exc).__name__}: {exc}; "
                                            "see the server log", request_id=req.request_id, fatal=False))
            return
        req.prefilled = time.perf_counter()
        self.stats.admitted += 1
        self._active.append((req, job))
        self._finish_done()  # a job may be complete after prefill (e.g. no slots to fill)

    def _drop_cancelled(self) -> None:
        still = []
        for req, job in self._active:
            if req.cancel.cancelled:
                self._release(job)
                self._answer_cancelled(req)
            else:
                still.append((req, job))
        self._active = still

    def _step(self) -> None:
        jobs = [job for _, job in self._active]
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(jobs))
        try:
            self.backend.step(jobs)
        except Exception as exc:
            log.exception("denoising step failed for a batch of %d", len(jobs))
            for req, job in self._active:
                self._release(job)
                self.stats.failed += 1
                req.on_done(None, ProtocolError("server_error", f"denoising step failed: {type(exc).__name__}: "
                                                f"{exc}; see the server log", request_id=req.request_id,
                                                fatal=False))
            self._active = []
            return
        self.stats.forward_passes += 1
        self.stats.request_steps += len(jobs)
        for req, _ in self._active:
            req.steps_run += 1
        self._finish_done()

    def _finish_done(self) -> None:
        still = []
        for req, job in self._active:
            if not self.backend.is_done(job):
                still.append((req, job))
                continue
            try:
                pred = self.backend.finish(job)
            except Exception as exc:
                log.exception("decoding the result of request %s failed", req.request_id)
                self._release(job)
                self.stats.failed += 1
                req.on_done(None, ProtocolError("server_error", f"result failed: {type(exc).__name__}: {exc}",
                                                request_id=req.request_id, fatal=False))
                continue
            self._release(job)
            now = time.perf_counter()
            pred = replace(
                pred,
                queue_ms=(req.started - req.submitted) * 1e3,
                prefill_ms=(req.prefilled - req.started) * 1e3,
                denoise_ms=(now - req.prefilled) * 1e3,
            )
            self.stats.completed += 1
            req.on_done(pred, None)
        self._active = still

    def _release(self, job: Any) -> None:
        try:
            self.backend.release(job)
        except Exception:
            log.exception("releasing a job failed")

    def _answer_cancelled(self, req: Request) -> None:
        self.stats.cancelled += 1
        req.on_done(_cancelled_prediction(req, time.perf_counter()), None)

    def _shutdown(self) -> None:
        with self._cond:
            pending, self._pending = list(self._pending), collections.deque()
        for req, job in self._active:
            self._release(job)
            self._answer_cancelled(req)
        self._active = []
        for req in pending:
            self._answer_cancelled(req)


class EngineScheduler:
    """For model families without a step-level API (dream, llada): one request at a
    time through `Engine.predict`, with the same submit/stats interface."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.stats = SchedulerStats()
        self._queue: collections.deque[Request] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dlm-remote-engine", daemon=True)

    def describe(self) -> dict[str, str]:
        st = self.engine.status()
        return {"model": st.model, "device": st.device}

    def start(self) -> None:
        self._thread.start()

    def submit(self, req: Request) -> None:
        with self._cond:
            self._queue.append(req)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            for req in self._queue:
                req.cancel.cancel()
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._queue:
                    self._cond.wait()
                if self._stopping and not self._queue:
                    return
                req = self._queue.popleft()
            req.started = time.perf_counter()
            try:
                pred = self.engine.predict(req.prompt, req.params, req.cancel)
            except Exception as exc:
                log.exception("predict failed")
                self.stats.failed += 1
                req.on_done(None, ProtocolError("server_error", f"predict failed: {type(exc).__name__}: {exc}",
                                                request_id=req.request_id, fatal=False))
                continue
            self.stats.forward_passes += pred.steps
            self.stats.request_steps += pred.steps
            if pred.cancelled:
                self.stats.cancelled += 1
            else:
                self.stats.completed += 1
            req.on_done(replace(pred, queue_ms=pred.queue_ms + (req.started - req.submitted) * 1e3), None)


# ------------------------------------------------------------------ networking


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 7341
    token: bytes | None = None
    ssl_context: ssl.SSLContext | None = None
    limits: Limits = field(default_factory=Limits)
    model_name: str = ""
    device: str = ""


class _Conn:
    """One client connection: handshake, then a reader loop; results are written back from the loop."""

    _next_serial = 0

    def __init__(self, server: RemoteServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.limits = server.options.limits
        self.inflight: dict[int, Request] = {}
        self.closed = False
        _Conn._next_serial += 1
        self.client_id = f"conn{_Conn._next_serial}"
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def send(self, message: dict[str, Any]) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(encode_frame(message))

    async def run(self) -> None:
        try:
            await self._handshake()
            log.info("client %s (%s) connected", self.client_id, self.peer)
            await self._serve()
        except ConnectionClosed:
            pass
        except ProtocolError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.server.stats["closed_for_errors"] += 1
            self.send(error_message(exc.code, exc.message))
            try:
                await asyncio.wait_for(self.writer.drain(), 1.0)
            except (OSError, asyncio.TimeoutError):
                pass
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            log.info("connection from %s lost: %s", self.peer, exc)
        finally:
            self.closed = True
            for req in self.inflight.values():  # nobody will read their results
                req.cancel.cancel()
            self.inflight.clear()
            self.writer.close()

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
        client = msg.get("client")
        if isinstance(client, str) and 0 < len(client) <= 128:
            # A stable client id (kept across reconnects) keys the prefix caches.
            self.client_id = client
        self.send({
            "t": "hello", "id": 0, "stage": "welcome", "v": PROTOCOL_VERSION,
            "proof": auth.server_proof(token, nonce, client_nonce) if token is not None else None,
            "model": self.server.options.model_name, "device": self.server.options.device,
            "limits": {"max_frame_bytes": self.limits.max_frame_bytes, "max_inflight": self.limits.max_inflight},
        })
        await self.writer.drain()

    async def _serve(self) -> None:
        while True:
            try:
                msg = await read_frame(self.reader, max_bytes=self.limits.max_frame_bytes,
                                       first_byte_timeout=self.limits.idle_timeout_s,
                                       frame_timeout=self.limits.frame_timeout_s)
            except IdleTimeout:
                if self.inflight:
                    continue  # the client is waiting for results, not idle
                raise
            try:
                self._dispatch(msg)
            except ProtocolError as exc:
                if exc.fatal:
                    raise
                self.send(error_message(exc.code, exc.message, exc.request_id))
            await self.writer.drain()  # back-pressure: stop reading while the client does not read

    def _dispatch(self, msg: dict[str, Any]) -> None:
        t, rid = msg["t"], msg["id"]
        if t == "cancel":
            req = self.inflight.get(rid)
            if req is not None:  # unknown ids are late cancels of finished requests: nothing to do
                req.cancel.cancel()
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
        prompt = prompt_from_wire(msg.get("prompt"), rid)
        params = params_from_wire(msg.get("params"), rid)
        loop = asyncio.get_running_loop()

        def on_done(pred: Prediction | None, err: ProtocolError | None) -> None:  # scheduler thread
            loop.call_soon_threadsafe(self._deliver, rid, req, pred, err)

        req = Request(self.client_id, rid, prompt, params, on_done)
        self.inflight[rid] = req
        self.server.scheduler.submit(req)

    def _deliver(self, rid: int, req: Request, pred: Prediction | None, err: ProtocolError | None) -> None:
        if self.inflight.get(rid) is not req:
            return  # connection gone, or the id was reused after a cancel
        del self.inflight[rid]
        self.server.stats["results"] += 1
        if err is not None:
            self.send(error_message(err.code, err.message, rid))
        else:
            self.send(result_message(rid, pred))


class RemoteServer:
    """The TCP server. `await start()` binds; `await serve_forever()`; `close()`."""

    def __init__(self, scheduler: BatchScheduler | EngineScheduler, options: ServerOptions):
        auth.check_bind_allowed(options.host, options.token)
        self.scheduler = scheduler
        self.options = options
        self.stats: collections.Counter[str] = collections.Counter()
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Conn] = set()
        self.port = options.port

    async def start(self) -> int:
        self.scheduler.start()
        self._server = await asyncio.start_server(
            self._on_connect, self.options.host, self.options.port,
            ssl=self.options.ssl_context,
            ssl_handshake_timeout=self.options.limits.handshake_timeout_s if self.options.ssl_context else None,
            limit=64 * 1024,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(self, reader, writer)
        self._conns.add(conn)
        self.stats["connections"] += 1
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

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


class ServerThread:
    """A RemoteServer on its own event loop in a background thread (tests, bench)."""

    def __init__(self, scheduler: BatchScheduler | EngineScheduler, options: ServerOptions):
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
