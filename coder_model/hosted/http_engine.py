"""HostedEngine: the Engine protocol over a model server's HTTP API (docs/engines.md).

One thread of the engine's own (`dlm-hosted-http`) runs an asyncio event loop that owns one
`httpx.AsyncClient`: connections are kept alive and reused, at most MAX_CONNECTIONS at once, no
redirect is followed (a redirect would take the key to another host) and nothing is read from the
environment (proxies, .netrc). `submit` schedules the request on that loop and returns a
concurrent Future, so no thread of the language server waits on the network; `predict` is
`submit(...).result()`. A request's CancelToken aborts it: the task is cancelled, httpx closes
that connection, and the Future answers a cancelled Prediction (nothing of it reaches the editor).

One request, in order (`_predict`):

1. the prompt is cut to the engine's budget (prompts.fit) and every line holding a secret is
   emptied in every field (coder_model.remote.wire.without_secrets, as for a remote server); a
   region that holds a secret is not sent at all (an answer built on its emptied line would
   delete it);
2. the repository memory's drafts (Prompt.proposals, while typing) are ranked by the memory's
   side of the one mix (coder_model.proposal_mix with no model); when the best one is confident
   (`memoryFirst`, 0.7) it answers and nothing is sent;
3. otherwise the kind's request (prompts.build) goes out with the time left to the deadline
   (the engine's own, `deadlineMs`: a remote model takes longer than the embedded one); 429 and
   5xx are retried at most RETRIES times, with backoff and Retry-After, while time remains; a 429
   whose Retry-After is past the deadline holds every request back until then;
4. the answer is read with a size cap, must be JSON (by Content-Type and by parse) and is made
   the new region by prompts.new_region, which refuses what cannot be right;
5. a non-empty answer has confidence 1.0 for the gate (a backend gives no probability;
   `Prediction.scored` is False, so it still may not rewrite what the user just typed); when the
   backend has nothing (or fails), the best draft answers with its own confidence, under the gate.

Errors reach the status once, in words ("Inception API: 401, check INCEPTION_API_KEY"): the
engine's status message changes (and `on_status_change` is called) when the problem changes, one
warning is logged per distinct problem, and a success clears it. A 401 or 403, or a key that
cannot be loaded, stops the engine (state "failed": a wrong key is wrong for every keystroke;
fix it and restart). The key is never in a log, the status or an error: messages built from what
a server said are masked with it (settings.ApiKey.mask), and httpx's own loggers are kept at
WARNING, where they log no request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import logging
import random
import threading
import time
from collections import deque
from dataclasses import replace

from dlm.coder_model import secrets
from dlm.coder_model.hosted import prompts
from dlm.coder_model.hosted.settings import ApiKey, EngineSettings, EngineSettingsError, load_key
from dlm.coder_model.proposal_mix import Mix, ranked, region_after
from dlm.coder_model.quantiles import percentile
from dlm.coder_model.types import (
    CancelToken,
    EngineStatus,
    EngineTraits,
    LayoutBudget,
    Prediction,
    Prompt,
    SamplerParams,
)

log = logging.getLogger("dlm.hosted")

MAX_CONNECTIONS = 8
MAX_KEEPALIVE = 4
KEEPALIVE_S = 60.0
CONNECT_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 1 << 20  # an answer is a region of a few hundred tokens: 1 MiB is far above it
RETRIES = 2
BACKOFF_S = 0.05
LATENCY_WINDOW = 200  # round trips the status's p50 is taken over
USER_AGENT = "dlm-lsp/0.1"


class _Refused(Exception):
    """A request's failure, with its words for the status; `stops`: the engine cannot go on."""

    def __init__(self, message: str, *, late: bool = False, stops: bool = False) -> None:
        super().__init__(message)
        self.message, self.late, self.stops = message, late, stops


def _quiet_http_loggers() -> None:
    """httpx and httpcore log each request at INFO/DEBUG: kept at WARNING (no request line, no header)."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


class HostedEngine:
    """A model behind an HTTP API as an Engine. `HostedEngine(EngineSettings(kind="mercury-edit"))`
    reads INCEPTION_API_KEY; `key` gives one instead (tests)."""

    def __init__(self, settings: EngineSettings, key: ApiKey | None = None, *,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, retries: int = RETRIES) -> None:
        self.settings = settings.resolved()
        self.kind = self.settings.kind
        self.budget: LayoutBudget = self.settings.budget
        self.deadline_ms = self.settings.deadline_ms
        # the language server filters what it sends, takes the deadline from here, and (Mercury
        # Edit) offers the region rewrite as a next edit beside the edit memory's
        self.traits = EngineTraits(hosted=True, deadline_ms=self.deadline_ms,
                                   next_edits=self.kind in prompts.EDIT_KINDS)
        self.url = self.settings.endpoint(prompts.ENDPOINTS[self.kind])
        # openai-fim: is the server `dlm-lsp http` (its /v1/models says so)? None: not known yet
        self._dlm_server: bool | None = None if self.kind == "openai-fim" else False
        self.max_response_bytes = max_response_bytes
        self.retries = retries
        self.on_status_change = None  # set by lsp.engine_holder: called when the status's words change
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._problem = ""
        self._stopped = ""  # why the engine answers nothing any more (a key that does not work)
        self._said: set[str] = set()
        self._cool_until = 0.0
        self.requests = 0
        self.errors = 0
        self._closing = False
        self._tasks: set[asyncio.Task] = set()
        self._key: ApiKey | None = None
        try:
            self._key = key if key is not None else load_key(self.settings)
        except EngineSettingsError as exc:
            self._stopped = str(exc)
            log.warning("%s", exc)
        _quiet_http_loggers()
        import httpx  # here, not at import: `import dlm.lsp` stays light

        self._httpx = httpx
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dlm-hosted-http", daemon=True)
        self._thread.start()
        self._client = asyncio.run_coroutine_threadsafe(self._make_client(), self._loop).result(10)
        log.info("hosted engine: %s (key from %s)", self.settings.describe(),
                 self._key.source if self._key is not None else "nowhere: none sent")

    async def _make_client(self):
        httpx = self._httpx
        return httpx.AsyncClient(
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE,
                                keepalive_expiry=KEEPALIVE_S),
            timeout=httpx.Timeout(30.0, connect=CONNECT_TIMEOUT_S),
            follow_redirects=False, trust_env=False,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
        )

    # ---- the Engine protocol -----------------------------------------------------------------------
    def submit(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
               deadline: float | None = None) -> concurrent.futures.Future[Prediction]:
        """The request on the engine's loop: a Future of its Prediction (a cancelled one when
        `cancel` fires first)."""
        if deadline is None:
            deadline = time.monotonic() + self.deadline_ms / 1000.0
        if not self._closing:
            try:
                return asyncio.run_coroutine_threadsafe(self._run(prompt, params, cancel, deadline), self._loop)
            except RuntimeError:  # the loop is gone
                pass
        done: concurrent.futures.Future[Prediction] = concurrent.futures.Future()
        done.set_result(Prediction(text="", cancelled=True))  # closed: no suggestion, never an error
        return done

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        return self.submit(prompt, params, cancel, deadline).result()

    def status(self) -> EngineStatus:
        backend = {"kind": self.kind, "host": self.settings.host, "model": self.settings.model,
                   "p50_ms": self.latency_p50(), "requests": self.requests, "errors": self.errors,
                   "problem": self._stopped or self._problem}
        return EngineStatus(state="failed" if self._stopped else "ready", device=self.settings.host,
                            model=f"{self.kind}{' ' + self.settings.model if self.settings.model else ''}",
                            message=self._stopped or self._problem, extra={"backend": backend})

    def latency_p50(self) -> float | None:
        v = percentile(list(self._latencies), 50)
        return None if v is None else round(v, 1)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True

        async def stop() -> None:
            for task in list(self._tasks):
                task.cancel()
            await self._client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        except (RuntimeError, concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # ---- one request -------------------------------------------------------------------------------
    async def _run(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float) -> Prediction:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        loop = self._loop
        cancel.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))
        try:
            return await self._predict(prompt, params, cancel, deadline)
        except asyncio.CancelledError:  # superseded: its connection is closed, nothing of it is shown
            return Prediction(text="", cancelled=True)
        finally:
            self._tasks.discard(task)

    async def _predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float) -> Prediction:
        t0 = time.perf_counter()
        if cancel.cancelled or self._closing:
            return Prediction(text="", cancelled=True)
        masked = secrets_masked(prompts.fit(prompt, self.budget, self.kind))
        drafts = self._drafts(masked, params)
        best = drafts[0] if drafts else None
        if best is not None and best[1] >= self.settings.memory_first:
            return self._draft_answer(prompt, drafts, t0)
        if self._stopped:
            return self._draft_answer(prompt, drafts, t0) if best else Prediction(text=prompt.region)
        if secrets.contains_secret(prompt.region):
            log.debug("hosted: the editable region holds a secret; nothing is sent for it")
            return self._draft_answer(prompt, drafts, t0) if best else Prediction(text=prompt.region)
        if time.monotonic() < self._cool_until:
            return self._draft_answer(prompt, drafts, t0) if best else Prediction(text=prompt.region)
        if self._dlm_server is None:
            await self._detect_dlm_server(deadline)
        request = prompts.build(self.kind, masked, self.settings.model, self.settings.max_tokens,
                                bool(self._dlm_server))
        try:
            region, rtt_ms, tokens, queue_ms = await self._ask(request, masked, deadline, t0)
        except _Refused as refused:
            self.errors += 1
            self._set_problem(refused.message, stops=refused.stops)
            if best is not None and not refused.late:
                return self._draft_answer(prompt, drafts, t0)
            return Prediction(text=prompt.region, late=refused.late, queue_ms=(time.perf_counter() - t0) * 1000)
        self._set_problem("")
        if region is None or region == prompt.region:
            if best is not None:
                return self._draft_answer(prompt, drafts, t0)
            return Prediction(text=prompt.region, steps=1, confidence=0.0, scored=False, queue_ms=queue_ms,
                              denoise_ms=rtt_ms, late=time.monotonic() > deadline)
        # the region sent is the prompt's own (a region holding a secret is never sent)
        return Prediction(text=region, steps=1, tokens=tokens, confidence=1.0,
                          scored=False, queue_ms=queue_ms, denoise_ms=rtt_ms, late=time.monotonic() > deadline,
                          proposal_confidences=tuple(drafts))

    @staticmethod
    def _drafts(prompt: Prompt, params: SamplerParams) -> list[tuple[str, float]]:
        """The memory's drafts, (insertion, the memory's confidence), best first."""
        if not prompt.proposals:
            return []
        mix = replace(Mix.of(params), model_weight=0.0, passes=0)
        order = ranked(prompt.proposals, [None] * len(prompt.proposals), mix)
        return [(prompt.proposals[j].text, c) for j, c in order]

    @staticmethod
    def _draft_answer(prompt: Prompt, drafts: list[tuple[str, float]], t0: float) -> Prediction:
        text, confidence = drafts[0]
        return Prediction(text=region_after(prompt.region, prompt.cursor, text), steps=1, confidence=confidence,
                          proposal_confidences=tuple(drafts), queue_ms=(time.perf_counter() - t0) * 1000)

    async def _ask(self, request: prompts.Request, prompt: Prompt, deadline: float,
                   t0: float) -> tuple[str | None, float, int, float]:
        """(the new region or None, the answered round trip in ms, completion tokens, ms before it);
        _Refused with the words for the status otherwise."""
        body = json.dumps(request.body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = self._key.authorization()
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Refused(f"{self._who()}: no answer within the deadline ({self.deadline_ms} ms, engine.deadlineMs)",
                               late=True)
            self.requests += 1
            t_send = time.perf_counter()
            try:
                status, got_headers, data = await asyncio.wait_for(self._post(body, headers), left)
            except asyncio.TimeoutError:
                raise _Refused(f"{self._who()}: no answer within the deadline ({self.deadline_ms} ms, "
                               "engine.deadlineMs)", late=True) from None
            except self._httpx.HTTPError as exc:
                if attempt < 1 and deadline - time.monotonic() > 0.05:  # a kept-alive connection the server closed
                    attempt += 1
                    continue
                raise _Refused(f"{self._who()}: cannot reach {self.settings.host} ({self._mask(type(exc).__name__)}: "
                               f"{self._mask(str(exc))[:120] or 'no detail'})") from None
            rtt_ms = (time.perf_counter() - t_send) * 1000
            if status == 200:
                self._latencies.append(rtt_ms)
                decoded = self._json(got_headers, data)
                if isinstance(decoded, _Refused):
                    raise decoded
                try:
                    region = prompts.new_region(self.kind, prompt, prompts.answer_text(self.kind, decoded),
                                                self.settings.max_tokens)
                except prompts.BadAnswer as exc:
                    raise _Refused(f"{self._who()} {self._mask(str(exc))}; nothing applied") from None
                usage = decoded.get("usage") if isinstance(decoded, dict) else None
                tokens = usage.get("completion_tokens", 0) if isinstance(usage, dict) else 0
                tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
                return region, rtt_ms, tokens, (t_send - t0) * 1000
            if status in (401, 403):
                raise _Refused(f"{self._who()}: {status}, {self._key_advice()}; restart dlm-lsp after fixing it",
                               stops=True)
            if status == 429 or 500 <= status < 600:
                wait = self._retry_after(got_headers)
                backoff = BACKOFF_S * (2 ** attempt) * (1 + random.random())
                pause = max(wait or 0.0, backoff)
                if attempt < self.retries and time.monotonic() + pause < deadline - 0.02:
                    attempt += 1
                    await asyncio.sleep(pause)
                    continue
                if status == 429 and wait and time.monotonic() + wait > deadline:
                    self._cool_until = time.monotonic() + min(wait, 600.0)
                    raise _Refused(f"{self._who()}: 429, rate limited; suggestions resume in {wait:.0f} s")
                raise _Refused(f"{self._who()}: {status}{' (rate limited)' if status == 429 else ''} after "
                               f"{attempt + 1} tries{self._detail(data)}")
            raise _Refused(f"{self._who()}: {status} at {prompts.ENDPOINTS[self.kind]}{self._detail(data)}; "
                           "check engine.url and engine.model")

    async def _detect_dlm_server(self, deadline: float) -> None:
        """Ask /v1/models once whether the server is `dlm-lsp http` (prompts.dlm_fields); a server
        that cannot be asked now is asked again with the next request."""
        headers = {} if self._key is None else {"Authorization": self._key.authorization()}
        left = min(1.0, deadline - time.monotonic())
        if left <= 0:
            return
        try:
            resp = await asyncio.wait_for(self._client.get(self.settings.endpoint("/v1/models"), headers=headers), left)
        except (asyncio.TimeoutError, self._httpx.HTTPError):
            return
        owners = set()
        try:
            data = resp.json() if resp.status_code == 200 and len(resp.content) < 65536 else {}
            owners = {m.get("owned_by") for m in data.get("data", []) if isinstance(m, dict)}
        except (ValueError, AttributeError):
            pass
        self._dlm_server = "dlm-lsp" in owners
        if self._dlm_server:
            log.info("hosted engine: %s is dlm-lsp http; its requests carry the editable region", self.settings.host)

    async def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """POST the body; (status, headers, the body read up to the cap). A body over the cap is
        refused (its connection is closed unread)."""
        async with self._client.stream("POST", self.url, content=body, headers=headers) as resp:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise _Refused(f"{self._who()} answered a body over {self.max_response_bytes} bytes; nothing "
                                   "applied")
                chunks.append(chunk)
            return resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, b"".join(chunks)

    def _json(self, headers: dict[str, str], data: bytes):
        """The decoded JSON answer, or a _Refused saying why it is none."""
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json" and not ctype.endswith("+json"):
            return _Refused(f"{self._who()} answered Content-Type {ctype or 'none'!r}, not JSON; nothing applied")
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return _Refused(f"{self._who()} answered a body that is not JSON; nothing applied")

    # ---- words -------------------------------------------------------------------------------------
    def _who(self) -> str:
        vendor = self.settings.defaults.vendor
        return vendor if self.kind.startswith("mercury") else f"{vendor} at {self.settings.host}"

    def _key_advice(self) -> str:
        if self._key is None:
            return "it wants a key: set engine.apiKeyEnv (or apiKeyFile) and engine.keyHost in your user settings"
        env = self.settings.api_key_env or self.settings.defaults.key_env
        return f"check {env}" if env and not self.settings.api_key_file else f"check the key in {self._key.source}"

    def _mask(self, text: str) -> str:
        return self._key.mask(text) if self._key is not None else text

    def _detail(self, data: bytes) -> str:
        """What the server said about an error, short and masked ('' when nothing readable)."""
        try:
            obj = json.loads(data[:4096].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return ""
        message = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(message, dict):
            message = message.get("message")
        if not isinstance(message, str) or not message.strip():
            return ""
        return f": {self._mask(message.strip())[:160]}"

    @staticmethod
    def _retry_after(headers: dict[str, str]) -> float | None:
        value = headers.get("retry-after", "").strip()
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())

    def _set_problem(self, message: str, stops: bool = False) -> None:
        if stops:
            self._stopped = message
        if message == self._problem and not stops:
            return
        self._problem = message
        if message and message not in self._said and len(self._said) < 64:
            self._said.add(message)
            log.warning("%s", message)
        callback = self.on_status_change
        if callback is not None and not self._closing:
            try:
                callback()
            except Exception:  # the listener's failure must not fail the request
                log.debug("on_status_change failed", exc_info=True)


def secrets_masked(prompt: Prompt) -> Prompt:
    """`prompt` with every line holding a secret emptied in every field (coder_model.remote.wire:
    the one rule for text that leaves the machine)."""
    from dlm.coder_model.remote.wire import without_secrets

    return without_secrets(prompt)
