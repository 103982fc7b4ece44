"""RemoteEngine: the Engine protocol over a TCP connection to `dlm-lsp serve`.

One connection carries every request (many in flight, answered in any
order). An I/O thread runs an asyncio loop that keeps the connection up:
it connects, authenticates, reads results, and after a failure reconnects
with exponential backoff (plus jitter, so many laptops do not reconnect in
lockstep after a server restart). `predict` runs in the caller's thread
(`submit` runs it on a thread of the engine's) and never waits for a connection: while disconnected it returns an empty,
cancelled Prediction at once so the editor gets "no suggestion" instead of a
stall, and `status()` says "disconnected" with the reason.

The server announces its model's context budget in `hello` (`budget`:
max_context, max_history, max_suffix); `RemoteEngine.budget` is that budget,
so the LSP windows the text for the model it really talks to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import random
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from dlm.coder_model.remote import auth
from dlm.coder_model.remote.wire import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    ProtocolError,
    cancel_message,
    encode_frame,
    predict_message,
    prediction_from_wire,
    read_frame,
)
from dlm.coder_model.secrets import contains_secret
from dlm.coder_model.types import CancelToken, EngineStatus, LayoutBudget, Prediction, Prompt, SamplerParams

log = logging.getLogger("dlm.remote.client")

TLS_CA_ENV = "DLM_TLS_CA"
_POLL_S = 0.005  # how often a waiting predict() looks at its CancelToken
# Threads that run `submit`'s predicts (each waits on the wire for its answer); the server takes
# at most its own max_inflight at once and answers the rest empty.
_SUBMIT_THREADS = 8


class RemoteRefused(Exception):
    """The server (or this client) refused the session: wrong token, version mismatch, ..."""


@dataclass
class _Session:
    writer: asyncio.StreamWriter
    model: str
    device: str
    max_frame_bytes: int
    max_inflight: int
    budget: LayoutBudget
    features: frozenset = frozenset()  # the server's hello: fields beyond version 1 it takes


def _empty() -> Prediction:
    return Prediction(text="", cancelled=True)


class RemoteEngine:
    """Engine over TCP. `RemoteEngine("gpu-box", 7341, token=b"...", tls=True)`.

    token: the shared secret (bytes or str); None = no auth (loopback servers only).
    tls: wrap the connection in TLS; `cafile` is the CA (or self-signed cert) to trust,
    default $DLM_TLS_CA, else the system store; `server_hostname` overrides the name checked in the cert.
    request_timeout: a request with no answer after this long returns empty (and is cancelled).
    backoff_initial/backoff_max: reconnect delays (seconds), doubling after each failure.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: bytes | str | None = None,
        tls: bool = False,
        cafile: str | None = None,
        server_hostname: str | None = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        client_id: str | None = None,
    ):
        self.host = host
        self.port = int(port)
        self._token = token.encode("utf-8") if isinstance(token, str) else token
        self._ssl: ssl.SSLContext | None = None
        if tls:
            # DLM_TLS_CA lets `dlm-lsp --remote ... --tls` trust a self-signed server certificate
            # without a command-line flag for it.
            self._ssl = ssl.create_default_context(cafile=cafile or os.environ.get(TLS_CA_ENV) or None)
        self._server_hostname = server_hostname
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # Stable across reconnects so the server's prefix caches for our documents survive a blip.
        self.client_id = client_id or f"dlm-{uuid.uuid4().hex[:16]}"

        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future[Prediction]] = {}
        self._session: _Session | None = None
        # Until the first hello, the layout's default; from then on the last server's.
        self._budget = LayoutBudget()
        self._ever_tried = False
        self._last_error = ""
        self._connected_event = threading.Event()
        self.reconnects = 0  # successful connections after the first
        self.connects = 0
        self._closing = False
        # Called (from the I/O thread) when the connection comes up or goes down, so that a
        # front end can tell the editor without waiting for the next request (dlm/status).
        self.on_status_change: Callable[[], None] | None = None
        self._submitted = concurrent.futures.ThreadPoolExecutor(
            _SUBMIT_THREADS, thread_name_prefix="dlm-remote-predict")

        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run_loop, name=f"dlm-remote-{host}:{port}", daemon=True)
        self._thread.start()
        self._maintainer = asyncio.run_coroutine_threadsafe(self._maintain(), self._loop)

    # ------------------------------------------------------------ Engine API

    def predict(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Prediction:
        """`deadline` (time.monotonic()) travels as `deadline_ms`, the time left; an answer not
        back by the deadline is cancelled and reported late (the server plans to it too)."""
        session = self._session
        if session is None or cancel.cancelled:
            return _empty()
        deadline_ms = None if deadline is None else (deadline - time.monotonic()) * 1e3
        if deadline_ms is not None and deadline_ms <= 0:
            return replace(_empty(), late=True)
        if contains_secret(prompt.region):
            # The wire masks a secret's line (wire.without_secrets); the answer is the new
            # region, and one built on a masked region would delete the user's line.
            log.debug("remote: the editable region holds a secret; no suggestion asked for it")
            return _empty()
        rid = next(self._ids)
        try:
            if prompt.proposals and "proposals" not in session.features:
                prompt = replace(prompt, proposals=())  # an older server: it decodes freely
            if prompt.insert and "insert" not in session.features:
                prompt = replace(prompt, insert=False)  # an older server's model rewrites the region
            if prompt.snippets and "snippets" not in session.features:
                prompt = replace(prompt, snippets=())
            frame = encode_frame(predict_message(rid, prompt, params, deadline_ms))
        except (ValueError, TypeError) as exc:  # e.g. lone surrogates in the text cannot be UTF-8 encoded
            self._note(f"prompt could not be encoded for the wire ({exc}); returned no suggestion")
            return _empty()
        if len(frame) - 4 > session.max_frame_bytes:
            self._note(f"prompt of {len(frame)} bytes exceeds the server's frame limit of "
                       f"{session.max_frame_bytes}; returned no suggestion (shrink the context window)")
            return _empty()
        fut: concurrent.futures.Future[Prediction] = concurrent.futures.Future()
        with self._lock:
            if len(self._pending) >= session.max_inflight:
                self._note(f"{len(self._pending)} requests already in flight (server limit "
                           f"{session.max_inflight}); returned no suggestion")
                return _empty()
            self._pending[rid] = fut
        t0 = time.perf_counter()
        self._loop.call_soon_threadsafe(self._send, session, frame)
        give_up_at = t0 + self.request_timeout
        while True:
            try:
                pred = fut.result(timeout=_POLL_S)
                break
            except concurrent.futures.TimeoutError:
                pass
            timed_out = time.perf_counter() >= give_up_at
            if deadline is not None and time.monotonic() > deadline and not fut.done():
                with self._lock:  # past the deadline the answer can no longer be shown
                    self._pending.pop(rid, None)
                self._loop.call_soon_threadsafe(self._send, session, encode_frame(cancel_message(rid)))
                return replace(_empty(), late=True)
            if cancel.cancelled or timed_out:
                with self._lock:
                    self._pending.pop(rid, None)
                if fut.done():  # answered in the meantime
                    pred = fut.result()
                    break
                # Do not wait for the server's acknowledgement: the editor has moved on.
                self._loop.call_soon_threadsafe(self._send, session, encode_frame(cancel_message(rid)))
                if timed_out:
                    self._note(f"no answer from {self.host}:{self.port} within {self.request_timeout:g} s; "
                               "request cancelled")
                return _empty()
        if not pred.cancelled:
            # Time on the wire and in (de)serialisation counts as queueing, so total_ms is what the caller saw.
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            pred = replace(pred, queue_ms=pred.queue_ms + max(0.0, elapsed_ms - pred.total_ms))
        return pred

    def submit(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> concurrent.futures.Future[Prediction]:
        """`predict` on a thread of this engine's (it waits on the wire, watching its deadline and
        `cancel`): a Future of its Prediction, so the caller's thread does not wait."""
        return self._submitted.submit(self.predict, prompt, params, cancel, deadline)

    def status(self) -> EngineStatus:
        session = self._session
        extra = {"remote": f"{self.host}:{self.port}", "tls": self._ssl is not None, "connects": self.connects,
                 "reconnects": self.reconnects, "in_flight": len(self._pending)}
        if session is not None:
            return EngineStatus(state="ready", device=session.device, model=session.model,
                                message=self._last_error, extra=extra)
        if not self._ever_tried:
            return EngineStatus(state="loading", message=f"connecting to {self.host}:{self.port}", extra=extra)
        return EngineStatus(
            state="disconnected",
            message=f"not connected to {self.host}:{self.port}: {self._last_error or 'connecting'}; "
            "suggestions resume when the connection is back (reconnecting with backoff)",
            extra=extra,
        )

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True

        def _stop() -> None:
            if self._wake is not None:
                self._wake.set()
            if self._session is not None:
                self._session.writer.close()

        try:
            self._loop.call_soon_threadsafe(_stop)
            self._maintainer.result(timeout=5)
        except (RuntimeError, concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
        self._fail_pending()
        self._submitted.shutdown(wait=False, cancel_futures=True)  # the running ones end with their answer
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def budget(self) -> LayoutBudget:
        """The context budget of the server's model (from its hello)."""
        return self._budget

    # --------------------------------------------------------- extra helpers

    @property
    def connected(self) -> bool:
        return self._session is not None

    def wait_connected(self, timeout: float) -> bool:
        """Block until connected (tests, bench, CLI start-up); True if connected."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._session is not None:
                return True
            self._connected_event.wait(min(0.05, max(deadline - time.monotonic(), 0)))
        return self._session is not None

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------- the I/O thread

    def _note(self, message: str) -> None:
        if self._closing:
            return  # our own close() ended the connection: nothing to report
        self._last_error = message
        log.warning("%s", message)

    def _status_changed(self) -> None:
        callback = self.on_status_change
        if callback is not None and not self._closing:
            try:
                callback()
            except Exception:  # the listener's failure must not stop reconnecting
                log.exception("on_status_change callback failed")

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _send(self, session: _Session, frame: bytes) -> None:
        if self._session is session and not session.writer.is_closing():
            session.writer.write(frame)

    def _fail_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_result(_empty())

    async def _maintain(self) -> None:
        self._wake = asyncio.Event()
        delay = self.backoff_initial
        while not self._closing:
            reconnect_now = False
            writer = None
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, ssl=self._ssl,
                                            server_hostname=self._server_hostname if self._ssl else None),
                    self.connect_timeout,
                )
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    # Latency over throughput, and notice a vanished server without waiting on a request.
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                session = await asyncio.wait_for(self._handshake(reader, writer), self.connect_timeout)
                self._budget = session.budget
                self._session = session
                self._last_error = ""
                self.connects += 1
                if self.connects > 1:
                    self.reconnects += 1
                self._connected_event.set()
                self._status_changed()
                log.info("connected to %s:%s (model %s on %s)", self.host, self.port, session.model, session.device)
                delay = self.backoff_initial
                reconnect_now = await self._read_loop(reader)
            except RemoteRefused as exc:
                self._note(str(exc))
            except ProtocolError as exc:
                self._note(f"protocol error with {self.host}:{self.port}: {exc}")
            except asyncio.TimeoutError:
                self._note(f"connecting to {self.host}:{self.port} timed out after {self.connect_timeout:g} s")
            except ConnectionRefusedError:
                self._note(f"connection refused: nothing listens on {self.host}:{self.port}; is `dlm-lsp serve` "
                           "running there (and the port right)?")
            except ssl.SSLError as exc:
                self._note(f"TLS with {self.host}:{self.port} failed: {exc}; check --tls on both ends and the CA "
                           "(cafile) that signed the server's certificate")
            except (OSError, ConnectionClosed, asyncio.IncompleteReadError) as exc:
                self._note(f"connection to {self.host}:{self.port} failed: {exc or type(exc).__name__}")
            finally:
                self._ever_tried = True
                was_connected, self._session = self._session is not None, None
                self._connected_event.clear()
                if writer is not None:
                    writer.close()
                self._fail_pending()
                if was_connected or self.connects == 0:  # down, or the first try failed
                    self._status_changed()
            if self._closing:
                break
            if reconnect_now:  # the server closed an idle connection: not a failure
                delay = self.backoff_initial
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), delay * random.uniform(0.8, 1.2))
            except asyncio.TimeoutError:
                pass
            delay = min(delay * 2, self.backoff_max)

    async def _read_handshake_frame(self, reader: asyncio.StreamReader, where: str) -> dict:
        """The server's next hello frame; an error frame instead (a refusal) raises RemoteRefused."""
        msg = await read_frame(reader, max_bytes=1 << 20, first_byte_timeout=self.connect_timeout,
                               frame_timeout=self.connect_timeout)
        if msg["t"] == "error":
            raise RemoteRefused(f"{where} refused the connection: {msg.get('code')}: {msg.get('message')}")
        return msg

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Session:
        where = f"{self.host}:{self.port}"
        msg = await self._read_handshake_frame(reader, where)
        if msg["t"] != "hello" or msg.get("stage") != "challenge":
            raise RemoteRefused(f"{where} did not greet with a dlm-lsp hello; is it a `dlm-lsp serve` port?")
        if msg.get("v") != PROTOCOL_VERSION:
            raise RemoteRefused(f"{where} speaks protocol version {msg.get('v')!r}, this client "
                                f"{PROTOCOL_VERSION}; install the same dlm-lsp version on both machines")
        server_nonce = msg.get("nonce")
        if not isinstance(server_nonce, bytes) or len(server_nonce) != auth.NONCE_BYTES:
            raise RemoteRefused(f"{where} sent a malformed challenge")
        wants_auth = bool(msg.get("auth"))
        if wants_auth and self._token is None:
            raise RemoteRefused(f"{where} requires a token; pass --token-file FILE or set {auth.TOKEN_ENV}")
        if not wants_auth and self._token is not None:
            # A server that skips auth cannot prove it knows the token: refuse rather than send it our code.
            raise RemoteRefused(f"{where} does not ask for a token but this client has one; refusing to talk "
                                "to a server that cannot prove it knows it. Start the server with the same "
                                "--token-file, or drop the token on the client for a loopback server")
        client_nonce = auth.make_nonce()
        proof = auth.client_proof(self._token, server_nonce, client_nonce) if self._token is not None else None
        writer.write(encode_frame({"t": "hello", "id": 0, "stage": "response", "v": PROTOCOL_VERSION,
                                   "nonce": client_nonce, "proof": proof, "client": self.client_id}))
        await writer.drain()
        msg = await self._read_handshake_frame(reader, where)
        if msg["t"] != "hello" or msg.get("stage") != "welcome":
            raise RemoteRefused(f"{where} sent {msg['t']!r} instead of the welcome hello")
        if self._token is not None and not auth.proofs_match(
            auth.server_proof(self._token, server_nonce, client_nonce), msg.get("proof")
        ):
            raise RemoteRefused(f"{where} could not prove it knows the token (wrong token on the server, or "
                                "not the server you meant); check --token-file on both ends")
        limits = msg.get("limits") if isinstance(msg.get("limits"), dict) else {}
        return _Session(
            writer=writer,
            model=str(msg.get("model", "")),
            device=str(msg.get("device", "")),
            max_frame_bytes=int(limits.get("max_frame_bytes", 4 << 20)),
            max_inflight=int(limits.get("max_inflight", 64)),
            budget=budget_from_hello(msg, where),
            features=frozenset(f for f in msg.get("features", []) if isinstance(f, str))
            if isinstance(msg.get("features"), list) else frozenset(),
        )

    async def _read_loop(self, reader: asyncio.StreamReader) -> bool:
        """Dispatch frames until the connection ends; True if the server closed it for idleness."""
        while True:
            try:
                msg = await read_frame(reader, max_bytes=64 << 20, first_byte_timeout=None, frame_timeout=30.0)
            except ConnectionClosed:
                self._note(f"{self.host}:{self.port} closed the connection")
                return False
            t, rid = msg["t"], msg["id"]
            if t == "result":
                try:
                    pred = prediction_from_wire(msg)
                except ProtocolError as exc:
                    self._note(f"malformed result from the server: {exc}")
                    pred = _empty()
                self._resolve(rid, pred)
            elif t == "error":
                code, text = msg.get("code"), msg.get("message")
                if rid:
                    self._note(f"server error for request {rid}: {code}: {text}")
                    self._resolve(rid, _empty())
                else:
                    idle = code == "timeout" and not self._pending
                    if not idle:
                        self._note(f"{self.host}:{self.port} closed the connection: {code}: {text}")
                    return idle
            else:
                raise ProtocolError("protocol", f"unexpected {t!r} from the server")

    def _resolve(self, rid: int, pred: Prediction) -> None:
        with self._lock:
            fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():  # None: cancelled or timed out on our side already
            fut.set_result(pred)


def budget_from_hello(msg: dict, where: str) -> LayoutBudget:
    """The model's context budget a welcome hello announces; RemoteRefused if it is malformed."""
    raw = msg.get("budget")
    if raw is None:
        # Servers before the budget was part of hello: their model's real window is unknown.
        log.warning("%s did not announce its model's context budget; using the default %s. Upgrade dlm-lsp on "
                    "the server so that the editor sizes its context to the model", where, LayoutBudget())
        return LayoutBudget()
    if not isinstance(raw, dict):
        raise RemoteRefused(f"{where} sent a malformed budget in hello ({raw!r}); install the same dlm-lsp "
                            "version on both machines")
    try:
        return LayoutBudget(max_context=raw["max_context"], max_history=raw["max_history"],
                            max_suffix=raw["max_suffix"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteRefused(f"{where} sent a malformed budget in hello ({raw!r}: {exc}); install the same "
                            "dlm-lsp version on both machines") from None


def parse_host_port(text: str, default_port: int | None = 7341) -> tuple[str, int]:
    """'host:port', '[::1]:port', 'host' -> (host, port); ValueError with a hint otherwise.

    The one HOST:PORT parser of the project (serve, --remote, --tcp, http --listen).
    With default_port=None the port is required.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: write an IPv6 address as [ADDR]:PORT")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"{text!r}: no host; write HOST:PORT, e.g. 127.0.0.1:{default_port or 7341}")
    if not port_text:
        if default_port is None:
            raise ValueError(f"{text!r}: no port; write HOST:PORT, e.g. {host}:7341")
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number; write HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is out of range 0-65535")
    return host, port

