"""The remote server's model side: one thread that batches every client's denoising steps.

Kept apart from the networking (server.py) because the two fail and scale
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
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from dlm.coder_model.remote.protocol import ProtocolError
from dlm.coder_model.types import CancelToken, Engine, Prediction, Prompt, SamplerParams

if TYPE_CHECKING:  # only annotated here; the backend builds it (it lives in coder_model.layout / .types)
    from dlm.coder_model.layout import LayoutBudget

log = logging.getLogger("dlm.remote.scheduler")


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


def _failure(req: Request, what: str, exc: BaseException) -> ProtocolError:
    return ProtocolError("server_error", f"{what} failed: {type(exc).__name__}: {exc}; the other requests go on, "
                         "see the server log", request_id=req.request_id, fatal=False)


class BatchScheduler:
    """Continuous batching of denoising steps over all clients' requests."""

    def __init__(self, backend: BatchBackend, *, max_batch: int = 32):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: use at least 1")
        self.backend = backend
        self.max_batch = max_batch
        self.stats = SchedulerStats()
        self._pending: collections.deque[Request] = collections.deque()
        self._forget: list[str] = []
        self._active: list[tuple[Request, Any]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dlm-remote-scheduler", daemon=True)

    @property
    def budget(self) -> LayoutBudget:
        return self.backend.budget

    def describe(self) -> dict[str, str]:
        return self.backend.describe()

    def prepare(self, prompt: Prompt, params: SamplerParams) -> Any:
        """Tokenize and lay out a prompt; called on the server's worker threads, never the scheduler's."""
        return self.backend.prepare(prompt, params)

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
            for owner in forget:
                self._forget_owner(owner)
            for req in admit:
                self._begin(req)
            self._drop_cancelled()
            if self._active:
                self._step()
        self._shutdown()

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
        jobs = [job for _, job in self._active]
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(jobs))
        passes = 1
        try:
            errors = self.backend.step(jobs)
            if len(errors) != len(jobs):
                raise RuntimeError(f"backend.step returned {len(errors)} results for {len(jobs)} jobs")
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
        still = []
        for (req, job), err in zip(self._active, errors):
            if err is None:
                req.steps_run += 1
                self.stats.request_steps += 1
                still.append((req, job))
                continue
            log.error("denoising step failed for request %s of %s: %s: %s", req.request_id, req.owner,
                      type(err).__name__, err, exc_info=err)
            self._release(job)
            self.stats.failed += 1
            req.on_done(None, _failure(req, "denoising step", err))
        self._active = still
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
            pending, self._pending = list(self._pending), collections.deque()
        for req, job in self._active:
            self._release(job)
            self._answer_cancelled(req)
        self._active = []
        for req in pending:
            self._answer_cancelled(req)


class EngineScheduler:
    """For model families without a step-level API (dream, llada): one request at a
    time through `Engine.predict`, with the same submit/stats interface.

    The engine encodes (and clips) prompts itself, on its own thread; `prepare`
    has nothing to do. A family engine keeps no cache across requests, so
    `forget` has nothing to drop.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.stats = SchedulerStats()
        self._queue: collections.deque[Request] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dlm-remote-engine", daemon=True)

    @property
    def budget(self) -> LayoutBudget:
        return self.engine.budget

    def describe(self) -> dict[str, str]:
        st = self.engine.status()
        return {"model": st.model, "device": st.device}

    def prepare(self, prompt: Prompt, params: SamplerParams) -> None:
        return None

    def forget(self, owner: str) -> None:
        return None

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
