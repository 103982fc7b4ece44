"""Latest wins, per document (docs/architecture.md §2).

Each document has at most one model run in flight and one pending. A new
request for a different (version, position) supersedes the pending one (it
answers "no suggestion" at once) and cancels the running one through its
CancelToken, so the engine frees the device within one denoising step. A
request for the same key as the running or pending job joins it instead of
starting another run. A pending job whose document version moved on before
it could start is skipped. Runs of one document start at most every
`throttle_ms` (leading edge: the first request runs at once, there is no
debounce delay). Documents are independent of each other.

`$/cancelRequest` cancels the handler's task; the waiter leaves the job, and
a job nobody waits for any more is cancelled too.

Work starts one of two ways. `start(cancel)` runs on the event loop when the
job starts (not when it is submitted: a request that is superseded or joins
another never builds its context) and returns a concurrent Future: the server
builds the prompt there and hands it to the engine's own inference queue, so
no pool thread sits waiting on the inference thread. A blocking `work(cancel)`
runs in the executor instead (engines without a queue, tests).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from dlm.coder_model.types import CancelToken
from dlm.lsp.stats import Stats

log = logging.getLogger(__name__)


Start = Callable[[CancelToken], "concurrent.futures.Future | None"]


@dataclass(eq=False)
class Job:
    key: Hashable
    work: Callable[[CancelToken], Any] | None  # blocking; runs in the executor
    start: Start | None  # non-blocking; runs on the loop when the job starts (None: nothing to run)
    valid: Callable[[], bool]  # still worth running (document version unchanged)?
    future: asyncio.Future
    cancel: CancelToken = field(default_factory=CancelToken)
    waiters: int = 0
    started: bool = False
    counted_cancel: bool = False


@dataclass
class _Slot:
    running: Job | None = None
    pending: Job | None = None
    last_start: float = -1e9
    timer: Any = None  # a pending throttle timer (asyncio.TimerHandle or the injected call_later's)


class LatestWins:
    """Latest-wins scheduling of model runs, per document.

    `clock` (seconds) and `call_later(delay_s, callback) -> handle with .cancel()` are
    time.monotonic and the event loop's call_later; tests pass their own to check the
    throttle without waiting for it.
    """

    def __init__(
        self, executor: Executor, stats: Stats, throttle_ms: float = 20.0, *,
        clock: Callable[[], float] = time.monotonic,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:  # fmt: skip
        self.executor = executor
        self.stats = stats
        self.throttle_s = throttle_ms / 1000.0
        self._clock = clock
        self._call_later = call_later
        self._slots: dict[str, _Slot] = {}
        self._failures: set[tuple[str, str]] = set()  # (what, exception type and message) said once

    def _failed(self, what: str, exc: BaseException) -> None:
        """A run that could not start or failed costs its request alone: each distinct failure is
        logged once as a warning (the client shows warnings; a failure repeated on every
        keystroke is one line, not one per keystroke), and again at debug level."""
        self.stats.add("failed")
        reason = (what, f"{type(exc).__name__}: {exc}"[:500])
        if reason in self._failures or len(self._failures) >= 64:
            log.debug("%s: %s", what, exc, exc_info=exc)
            return
        self._failures.add(reason)
        log.warning("%s: %s (said once; suggestions go on without this one)", what, exc, exc_info=exc)

    async def submit(
        self, doc_id: str, key: Hashable, work: Callable[[CancelToken], Any] | None, valid: Callable[[], bool],
        timeout_s: float = 10.0, *, start: Start | None = None,
    ) -> Any:  # fmt: skip
        """Run `start` (or `work`) under the latest-wins policy; None when superseded, cancelled,
        skipped or when `start` found nothing to run."""
        if (work is None) == (start is None):
            raise ValueError("LatestWins.submit takes exactly one of work (blocking) and start (non-blocking)")
        loop = asyncio.get_running_loop()
        slot = self._slots.setdefault(doc_id, _Slot())
        job = None
        for j in (slot.running, slot.pending):
            if j is not None and j.key == key and not j.cancel.cancelled and not j.future.done():
                job = j
                break
        if job is None:
            job = Job(key, work, start, valid, loop.create_future())
            if slot.pending is not None:
                self._resolve(slot.pending, None)
                self.stats.add("superseded")
            if slot.running is not None:
                self._cancel(slot.running)
            slot.pending = job
            self._kick(doc_id)
        job.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout_s)
        except asyncio.TimeoutError:
            log.warning("prediction for %s took over %.1f s; giving up on it", doc_id, timeout_s)
            self._cancel(job)
            return None
        finally:
            job.waiters -= 1
            if job.waiters == 0 and not job.future.done():  # $/cancelRequest: nobody wants it now
                if slot.pending is job:
                    slot.pending = None
                    self._resolve(job, None)
                    self.stats.add("superseded")
                else:
                    self._cancel(job)

    def invalidate(self, doc_id: str) -> None:
        """The document changed: its running prediction is stale, stop it now."""
        slot = self._slots.get(doc_id)
        if slot is not None and slot.running is not None:
            self._cancel(slot.running)

    def forget(self, doc_id: str) -> None:
        slot = self._slots.pop(doc_id, None)
        if slot is None:
            return
        if slot.timer is not None:
            slot.timer.cancel()
        for job in (slot.running, slot.pending):
            if job is not None:
                self._cancel(job)
                self._resolve(job, None)

    # ---- internals ---------------------------------------------------------------------------------
    def _cancel(self, job: Job) -> None:
        job.cancel.cancel()
        if job.started and not job.counted_cancel:
            job.counted_cancel = True
            self.stats.add("cancelled")

    @staticmethod
    def _resolve(job: Job, value: Any) -> None:
        if not job.future.done():
            job.future.set_result(value)

    def _kick(self, doc_id: str) -> None:
        slot = self._slots.get(doc_id)
        if slot is None or slot.running is not None or slot.pending is None:
            return
        loop = asyncio.get_running_loop()
        wait = slot.last_start + self.throttle_s - self._clock()
        if wait > 0:
            if slot.timer is None:

                def fire() -> None:
                    slot.timer = None
                    self._kick(doc_id)

                slot.timer = (self._call_later or loop.call_later)(wait, fire)
            return
        job, slot.pending = slot.pending, None
        if job.cancel.cancelled or job.future.done() or not job.valid():
            self._resolve(job, None)
            self.stats.add("skipped")
            self._kick(doc_id)
            return
        if job.start is not None:
            try:
                started = job.start(job.cancel)
            except Exception as exc:  # noqa: BLE001 - a failure to build the prompt fails this request alone
                self._failed("prediction could not start", exc)
                started = None
            if started is None:  # nothing to run (no context at this position)
                self._resolve(job, None)
                self._kick(doc_id)
                return
            fut = asyncio.wrap_future(started, loop=loop)
        else:
            fut = loop.run_in_executor(self.executor, job.work, job.cancel)
        job.started = True
        slot.running = job
        slot.last_start = self._clock()
        self.stats.add("model_runs")

        def done(f: asyncio.Future) -> None:
            if slot.running is job:
                slot.running = None
            exc = f.exception()
            if exc is not None:
                self._failed("prediction failed", exc)
                self._resolve(job, None)
            else:
                self._resolve(job, None if job.cancel.cancelled else f.result())
            self._kick(doc_id)

        fut.add_done_callback(done)
