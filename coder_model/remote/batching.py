"""The remote server's model side: one thread that batches every client's denoising steps.

Kept apart from the networking (tcp_server.py) because the two fail and scale
differently: sockets, handshakes and framing must stay responsive while a
forward pass runs, and the model must never be touched from the event loop.
This module imports neither asyncio nor torch, so it is tested with a fake
backend and the real model alike.

Scheduling (continuous batching): the scheduler keeps a set of active
requests. Between two denoising steps it admits new requests (prefill of an
already prepared prompt), drops cancelled ones (so a cancel frame stops a
request within one step) and finished ones, then runs one step of every active
request in one forward pass through the backend.

Isolation: whatever one request does (bad parameters the backend rejects, a
decode that raises), only that request fails. Prompt preparation (tokenizing,
encoding) is `prepare`, which the server runs on its own worker threads, never
here, so one client's large prompts cannot hold up the steps of everyone else.

Prefix caches belong to `Request.owner`, an identity the server assigns to a
connection (never a name the client chose), so one client can neither reuse
nor probe another's cache; `forget(owner)` drops them when the connection ends.

Fairness between connections (a heavy client slows itself, not the others):
- every owner has a count of the work served to it, in tokens (a step costs its
  block_len, a prefill its context tokens); each forward pass takes the jobs of
  the owners served least so far, up to `max_batch_tokens` tokens (the first job
  always goes). That is weighted fair queuing by tokens: two busy owners get
  the same tokens per second, whatever their requests' sizes, and a 1024-slot
  step is taken as often as 32 steps of 32 slots, not as often as one.
- an owner that was idle (nothing queued or running: its count is dropped)
  comes back at the least count of the busy owners minus one default
  request's worth (`RETURN_CREDIT_TOKENS`), as Linux's CFS places a waking
  task: a client that sent nothing while another kept 20 requests in flight
  has its next request served first, so its latency is its solo latency plus
  at most the pass running when it came. The credit is bounded: a client that
  pauses between requests gets that much priority per request, no more.
- an owner has at most `max_owner_requests` requests and `max_owner_slots`
  masked slots in the batch at once (its first request always gets in); the
  rest wait in its own queue, so one client cannot fill the batch.
- `check_request` refuses a request heavier than the default one whose time,
  estimated from this server's measured pass times, exceeds
  MAX_REQUEST_DEADLINES default deadlines, or whose single step would take
  longer than a default deadline (a pass cannot be interrupted, so it would
  hold every other client's request that long). A request no heavier than the
  default (block_len <= 32, <= 2,048 slot-steps) is always taken.
`clock` (perf_counter by default) times the passes; tests inject a fake one.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from dlm.coder_model.limits import DEFAULT_DEADLINE_MS, MAX_REQUEST_DEADLINES, request_slot_steps
from dlm.coder_model.remote.wire import ProtocolError
from dlm.coder_model.types import CancelToken, Engine, Prediction, Prompt, SamplerParams

if TYPE_CHECKING:  # only annotated here; the backend builds it (it lives in coder_model.layout / .types)
    from dlm.coder_model.layout import LayoutBudget

log = logging.getLogger("dlm.remote.batching")


@dataclass
class Request:
    """One predict request inside the server."""

    owner: str  # server-assigned identity of the connection; keys the prefix caches
    request_id: int
    prompt: Prompt
    params: SamplerParams
    on_done: Callable[[Prediction | None, ProtocolError | None], None]
    cancel: CancelToken = field(default_factory=CancelToken)
    deadline_ms: float | None = None  # time the client had left when it sent the request
    prepared: Any = None  # the backend's `prepare` result (token ids), made off the scheduler thread
    submitted: float = field(default_factory=time.perf_counter)
    received: float = field(default_factory=time.monotonic)  # the clock the sampler's deadline uses
    started: float = 0.0  # prefill start
    prefilled: float = 0.0  # prefill end
    steps_run: int = 0

    def deadline(self) -> float | None:
        """Absolute time.monotonic() by which to answer (the sampler plans its steps to it)."""
        return None if self.deadline_ms is None else self.received + self.deadline_ms / 1000.0


class BatchBackend(Protocol):
    """What the scheduler needs from a model: per-request jobs stepped together.

    `prepare` turns a prompt into model input without touching the model
    (tokenizing, layout); it must be thread-safe, since the server calls it
    on worker threads, and raises ValueError for a prompt it cannot take.
    `begin` prefills one prepared request (ValueError: this request cannot
    run, e.g. its blocks do not fit the model). `step` runs one denoising step
    of every job in one forward pass and returns one entry per job: None, or
    the exception that failed that job alone; if `step` raises, no job
    advanced (the scheduler then steps each job alone to find the culprit).
    `release` is called exactly once per begun job, done or not, so the
    backend can keep its prefix cache; `forget(owner)` drops an owner's caches.
    `budget` is the context layout the backend encodes prompts with.
    """

    budget: LayoutBudget

    def describe(self) -> dict[str, str]: ...

    def prepare(self, prompt: Prompt, params: SamplerParams) -> Any: ...

    def begin(self, request: Request) -> Any: ...

    def step(self, jobs: list[Any]) -> list[BaseException | None]: ...

    def is_done(self, job: Any) -> bool: ...

    def finish(self, job: Any) -> Prediction: ...

    def release(self, job: Any) -> None: ...

    def forget(self, owner: str) -> None: ...


DEFAULT_PARAMS = SamplerParams()
DEFAULT_SLOT_STEPS = request_slot_steps(DEFAULT_PARAMS)  # 32 x 2 x 32 = 2,048

# An owner coming back after being idle may be this many tokens behind the busy ones: one default
# request's steps (32 steps of a 32-slot block, two blocks), so its next request goes first.
RETURN_CREDIT_TOKENS = 32 * 32 * 2


class PassTimer:
    """Measured time of a forward pass per token, by pass size (powers of two), as an EMA.

    `estimate_ms(tokens)` is the time of a pass of that many tokens: from the same size
    class when measured, else from the nearest smaller one scaled by tokens (an upper
    bound where a pass has fixed costs, as on every device), else the nearest larger one;
    None before any pass was measured. Used by the scheduler thread, written there only.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._per_token: dict[int, float] = {}

    def observe(self, tokens: int, ms: float) -> None:
        if tokens <= 0 or ms < 0:
            return
        b, v = (tokens - 1).bit_length(), ms / tokens  # size classes (2^(b-1), 2^b]
        old = self._per_token.get(b)
        self._per_token[b] = v if old is None else old + self.alpha * (v - old)

    def estimate_ms(self, tokens: int) -> float | None:
        table = self._per_token.copy()  # read from the server's thread while the scheduler's writes
        if not table or tokens <= 0:
            return None
        b = (tokens - 1).bit_length()
        if b in table:
            return table[b] * tokens
        smaller = [k for k in table if k < b]
        k = max(smaller) if smaller else min(table)
        return table[k] * tokens


def estimate_request_ms(timer: PassTimer, params: SamplerParams, deadline_ms: float | None) -> tuple[float, float] | None:
    """(one step, the whole request) in ms by the measured pass times; None before any.

    A block takes at most min(steps, block_len) steps (each commits a slot at least); a
    request with a deadline stops at it (the sampler plans to it)."""
    step = timer.estimate_ms(params.block_len)
    if step is None:
        return None
    total = params.max_blocks * min(params.steps, params.block_len) * step
    if deadline_ms is not None:
        total = min(total, deadline_ms)
    return step, total


@dataclass
class SchedulerStats:
    forward_passes: int = 0  # batched steps run
    request_steps: int = 0  # sum over requests of the steps run for them
    admitted: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    refused: int = 0  # refused by check_request (estimated time over the bound)
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


def _failure(req: Request, what: str, exc: BaseException) -> ProtocolError:
    return ProtocolError("server_error", f"{what} failed: {type(exc).__name__}: {exc}; the other requests go on, "
                         "see the server log", request_id=req.request_id, fatal=False)


class _SchedulerThread:
    """A scheduler's one thread, and the condition that callers wake it with."""

    def __init__(self, thread_name: str) -> None:
        self.stats = SchedulerStats()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError


class BatchScheduler(_SchedulerThread):
    """Continuous batching of denoising steps over all clients' requests, fair between owners."""

    def __init__(self, backend: BatchBackend, *, max_batch: int = 32, max_batch_tokens: int = 4096,
                 max_owner_requests: int | None = None, max_owner_slots: int = 2048,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__("dlm-remote-scheduler")
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: use at least 1")
        if max_batch_tokens < 0 or max_owner_slots < 1:
            raise ValueError(f"max_batch_tokens={max_batch_tokens}, max_owner_slots={max_owner_slots}: use "
                             "max_batch_tokens >= 0 and max_owner_slots >= 1")
        self.backend = backend
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens  # tokens of one forward pass (its first job always goes)
        self.max_owner_requests = max_owner_requests or max(1, max_batch // 4)
        self.max_owner_slots = max_owner_slots
        self.clock = clock
        self.pass_timer = PassTimer()
        self._pending: dict[str, collections.deque[Request]] = {}  # per owner, in arrival order
        self._forget: list[str] = []
        self._active: list[tuple[Request, Any]] = []
        self._served: dict[str, float] = {}  # owner -> tokens served (fair queuing), while it has work

    @property
    def budget(self) -> LayoutBudget:
        return self.backend.budget

    def describe(self) -> dict[str, str]:
        return self.backend.describe()

    def prepare(self, prompt: Prompt, params: SamplerParams) -> Any:
        """Tokenize and lay out a prompt; called on the server's worker threads, never the scheduler's."""
        return self.backend.prepare(prompt, params)

    def check_request(self, params: SamplerParams, deadline_ms: float | None) -> str | None:
        """Why this server refuses a request of `params` (None: it takes it), by its measured
        pass times (nothing is refused before a pass has been measured)."""
        est = estimate_request_ms(self.pass_timer, params, deadline_ms)
        if est is None:
            return None
        step_ms, total_ms = est
        # A request no larger than the default one is always taken: the bound is for heavier ones (a
        # loaded CPU may take 40 ms a step, and 2 x 32 steps of it is the default's worst case).
        if params.block_len <= DEFAULT_PARAMS.block_len and request_slot_steps(params) <= DEFAULT_SLOT_STEPS:
            return None
        if step_ms > DEFAULT_DEADLINE_MS and params.block_len > DEFAULT_PARAMS.block_len:
            return (f"one denoising step of block_len {params.block_len} takes about {step_ms:.0f} ms on this server, "
                    f"longer than the {DEFAULT_DEADLINE_MS} ms deadline of a default request; a step cannot be "
                    "interrupted, so it would hold every other client's request that long; send a smaller block_len")
        bound = MAX_REQUEST_DEADLINES * DEFAULT_DEADLINE_MS
        if total_ms > bound and request_slot_steps(params) > DEFAULT_SLOT_STEPS:
            return (f"this request would take about {total_ms / 1000:.1f} s on this server (max_blocks "
                    f"{params.max_blocks} x {min(params.steps, params.block_len)} steps x {step_ms:.1f} ms per step "
                    f"of block_len {params.block_len}), over the {bound / 1000:g} s bound ({MAX_REQUEST_DEADLINES}x "
                    "the default deadline); ask for fewer steps, blocks or slots, or send a deadline_ms")
        return None

    def submit(self, req: Request) -> None:
        with self._cond:
            if self._stopping:
                req.on_done(None, ProtocolError("shutting_down", "the server is shutting down; retry later",
                                                request_id=req.request_id, fatal=False))
                return
            self._pending.setdefault(req.owner, collections.deque()).append(req)
            self._cond.notify()

    def forget(self, owner: str) -> None:
        """Drop an owner's prefix caches (its connection closed); done between steps."""
        with self._cond:
            self._forget.append(owner)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # Everything below runs in the scheduler thread only.
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._pending and not self._active and not self._forget:
                    self._cond.wait()
                if self._stopping:
                    break
                forget, self._forget = self._forget, []
                admit = self._choose_admissions()
            for owner in forget:
                self._forget_owner(owner)
            for req in admit:
                self._begin(req)
            self._drop_cancelled()
            if self._active:
                self._step()
            self._drop_idle_owners()
        self._shutdown()

    # ---- fairness --------------------------------------------------------------------------------
    def _owner_load(self) -> tuple[collections.Counter, collections.Counter]:
        requests: collections.Counter[str] = collections.Counter()
        slots: collections.Counter[str] = collections.Counter()
        for req, _ in self._active:
            requests[req.owner] += 1
            slots[req.owner] += req.params.block_len
        return requests, slots

    def _join(self, owner: str) -> None:
        """An owner with new work: placed at the busy owners' least count minus the return credit."""
        busy = [v for o, v in self._served.items() if o != owner]
        floor = (min(busy) - RETURN_CREDIT_TOKENS) if busy else 0.0
        self._served[owner] = max(self._served.get(owner, floor), floor)

    def _choose_admissions(self) -> list[Request]:
        """Pending requests to begin now (called with the lock held): owners served least first,
        one request per owner per round, within max_batch and each owner's caps."""
        for owner, queue in self._pending.items():  # cancelled while queued: answered without any work
            if any(r.cancel.cancelled for r in queue):
                for r in [r for r in queue if r.cancel.cancelled]:
                    self._answer_cancelled(r)
                    queue.remove(r)
        self._pending = {o: q for o, q in self._pending.items() if q}
        for owner in self._pending:
            if owner not in self._served:
                self._join(owner)
        requests, slots = self._owner_load()
        admit: list[Request] = []
        room = self.max_batch - len(self._active)
        progress = True
        while room > 0 and progress:
            progress = False
            for owner in sorted(self._pending, key=lambda o: self._served.get(o, 0.0)):
                queue = self._pending[owner]
                if not queue or room <= 0:
                    continue
                req = queue[0]
                first = requests[owner] == 0
                if not first and (requests[owner] >= self.max_owner_requests
                                  or slots[owner] + req.params.block_len > self.max_owner_slots):
                    continue
                queue.popleft()
                admit.append(req)
                requests[owner] += 1
                slots[owner] += req.params.block_len
                room -= 1
                progress = True
        self._pending = {o: q for o, q in self._pending.items() if q}
        return admit

    def _choose_pass(self) -> list[int]:
        """Indices into _active of the jobs stepped in the next forward pass: the owners served
        least first (counting what this pass adds), up to max_batch_tokens (the first always)."""
        by_owner: dict[str, list[int]] = {}
        for i, (req, _) in enumerate(self._active):
            by_owner.setdefault(req.owner, []).append(i)
        added: collections.Counter[str] = collections.Counter()
        chosen: list[int] = []
        tokens = 0
        while by_owner:
            owner = min(by_owner, key=lambda o: (self._served.get(o, 0.0) + added[o], o))
            i = by_owner[owner].pop(0)
            if not by_owner[owner]:
                del by_owner[owner]
            cost = self._active[i][0].params.block_len
            if chosen and tokens + cost > self.max_batch_tokens:
                continue  # does not fit this pass; a smaller job of another owner may
            chosen.append(i)
            tokens += cost
            added[owner] += cost
        return chosen

    def _charge(self, owner: str, tokens: float) -> None:
        self._served[owner] = self._served.get(owner, 0.0) + tokens

    def _drop_idle_owners(self) -> None:
        """Owners with nothing active or pending leave the fair-queuing table (they rejoin by _join)."""
        busy = {req.owner for req, _ in self._active}
        with self._cond:
            busy.update(self._pending)
        for owner in [o for o in self._served if o not in busy]:
            del self._served[owner]

    # ---- requests ----------------------------------------------------------------------------------
    def _forget_owner(self, owner: str) -> None:
        try:
            self.backend.forget(owner)
        except Exception:
            log.exception("dropping the prefix caches of %s failed", owner)

    def _begin(self, req: Request) -> None:
        req.started = time.perf_counter()
        try:
            job = self.backend.begin(req)
        except ValueError as exc:  # a request this model cannot take: that request only
            self.stats.failed += 1
            req.on_done(None, ProtocolError("bad_request", str(exc), request_id=req.request_id, fatal=False))
            return
        except Exception as exc:  # a model failure must not kill the scheduler
            log.exception("prefill failed for request %s of %s", req.request_id, req.owner)
            self.stats.failed += 1
            req.on_done(None, _failure(req, "prefill", exc))
            return
        req.prefilled = time.perf_counter()
        if isinstance(req.prepared, (list, tuple)):  # the context tokens: a prefill is work done for its owner
            self._charge(req.owner, len(req.prepared))
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

    def _step_alone(self, job: Any) -> BaseException | None:
        try:
            (err,) = self.backend.step([job])
            return err
        except Exception as exc:  # noqa: BLE001 - this job's failure, reported by _step
            return exc

    def _step(self) -> None:
        chosen = self._choose_pass()
        entries = [self._active[i] for i in chosen]
        jobs = [job for _, job in entries]
        tokens = sum(req.params.block_len for req, _ in entries)
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(jobs))
        passes = 1
        t0 = self.clock()
        try:
            errors = self.backend.step(jobs)
            if len(errors) != len(jobs):
                raise RuntimeError(f"backend.step returned {len(errors)} results for {len(jobs)} jobs")
            self.pass_timer.observe(tokens, (self.clock() - t0) * 1000)
        except Exception as exc:  # noqa: BLE001 - any failure of the batched pass: find the culprit
            if len(jobs) == 1:
                errors = [exc]
            else:
                # The batched pass failed and no job advanced: step each job alone, so that
                # the request that broke the pass fails and every other one goes on.
                log.warning("a batched step of %d requests failed (%s: %s); stepping them one by one",
                            len(jobs), type(exc).__name__, exc)
                errors = [self._step_alone(job) for job in jobs]
                passes = len(jobs)
        self.stats.forward_passes += passes
        failed: set[int] = set()
        for (req, job), err in zip(entries, errors):
            self._charge(req.owner, req.params.block_len)
            if err is None:
                req.steps_run += 1
                self.stats.request_steps += 1
                continue
            log.error("denoising step failed for request %s of %s: %s: %s", req.request_id, req.owner,
                      type(err).__name__, err, exc_info=err)
            self._release(job)
            self.stats.failed += 1
            req.on_done(None, _failure(req, "denoising step", err))
            failed.add(id(job))
        self._active = [(req, job) for req, job in self._active if id(job) not in failed]
        self._finish_done()

    def _finish_done(self) -> None:
        still = []
        for req, job in self._active:
            try:
                done = self.backend.is_done(job)
                pred = self.backend.finish(job) if done else None
            except Exception as exc:
                log.exception("decoding the result of request %s failed", req.request_id)
                self._release(job)
                self.stats.failed += 1
                req.on_done(None, _failure(req, "decoding the result", exc))
                continue
            if pred is None:
                still.append((req, job))
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
            pending = [req for queue in self._pending.values() for req in queue]
            self._pending = {}
        for req, job in self._active:
            self._release(job)
            self._answer_cancelled(req)
        self._active = []
        for req in pending:
            self._answer_cancelled(req)


class EngineScheduler(_SchedulerThread):
    """For model families without a step-level API (dream, llada): one request at a
    time through `Engine.predict`, with the same submit/stats interface.

    The engine encodes (and clips) prompts itself, on its own thread; `prepare`
    has nothing to do. A family engine keeps no cache across requests, so
    `forget` has nothing to drop. Fairness: the owners take turns (round robin,
    one request each), so a client with 20 requests queued delays another's
    next request by one request, not twenty. Its step time is not measured
    here, so `check_request` refuses nothing (the sampler caps still apply).
    """

    def __init__(self, engine: Engine):
        super().__init__("dlm-remote-engine")
        self.engine = engine
        self._queue: dict[str, collections.deque[Request]] = {}  # per owner; dict order is the turn order

    @property
    def budget(self) -> LayoutBudget:
        return self.engine.budget

    def describe(self) -> dict[str, str]:
        st = self.engine.status()
        return {"model": st.model, "device": st.device}

    def prepare(self, prompt: Prompt, params: SamplerParams) -> None:
        return None

    def check_request(self, params: SamplerParams, deadline_ms: float | None) -> str | None:
        return None

    def forget(self, owner: str) -> None:
        return None

    def submit(self, req: Request) -> None:
        with self._cond:
            self._queue.setdefault(req.owner, collections.deque()).append(req)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            for queue in self._queue.values():
                for req in queue:
                    req.cancel.cancel()
            self._cond.notify()
        self._thread.join(timeout)

    def _next(self) -> Request:
        """The first owner's oldest request; that owner goes to the back of the turn order."""
        owner = next(iter(self._queue))
        queue = self._queue.pop(owner)
        req = queue.popleft()
        if queue:
            self._queue[owner] = queue
        return req

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._queue:
                    self._cond.wait()
                if self._stopping and not self._queue:
                    return
                req = self._next()
            req.started = time.perf_counter()
            try:
                pred = self.engine.predict(req.prompt, req.params, req.cancel, req.deadline())
            except Exception as exc:
                log.exception("predict failed")
                self.stats.failed += 1
                req.on_done(None, _failure(req, "predict", exc))
                continue
            self.stats.forward_passes += pred.steps
            self.stats.request_steps += pred.steps
            if pred.cancelled:
                self.stats.cancelled += 1
            else:
                self.stats.completed += 1
            req.on_done(replace(pred, queue_ms=pred.queue_ms + (req.started - req.submitted) * 1e3), None)
