"""Scheduler unit tests (in process; the work is a slow stand-in that honours the CancelToken)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from dlm.lsp.latest_wins import LatestWins
from dlm.lsp.stats import Stats


def _work(tag, log, step_s=0.01, steps=10):
    def run(cancel):
        log.append(("start", tag))
        for _ in range(steps):
            if cancel.cancelled:
                log.append(("cancelled", tag))
                return None
            time.sleep(step_s)
        log.append(("done", tag))
        return tag

    return run


def _run(coro):
    return asyncio.run(coro)


def test_latest_wins_and_joins_same_key():
    async def main():
        stats, log = Stats(), []
        with ThreadPoolExecutor(4) as pool:
            s = LatestWins(pool, stats, throttle_ms=0)
            ok = lambda: True
            a = asyncio.ensure_future(s.submit("d", 1, _work(1, log), ok))
            await asyncio.sleep(0.03)  # 1 is running
            b = asyncio.ensure_future(s.submit("d", 2, _work(2, log), ok))
            c = asyncio.ensure_future(s.submit("d", 3, _work(3, log), ok))  # supersedes 2 while pending
            d = asyncio.ensure_future(s.submit("d", 3, _work(99, log), ok))  # same key: joins 3
            results = await asyncio.gather(a, b, c, d)
        return results, log, stats.counts

    results, log, counts = _run(main())
    assert results == [None, None, 3, 3]
    assert ("start", 2) not in log and ("start", 99) not in log
    assert ("cancelled", 1) in log
    assert counts["model_runs"] == 2 and counts["cancelled"] == 1 and counts["superseded"] == 1


def test_documents_are_independent_and_invalid_jobs_skipped():
    async def main():
        stats, log = Stats(), []
        with ThreadPoolExecutor(4) as pool:
            s = LatestWins(pool, stats, throttle_ms=0)
            r = await asyncio.gather(
                s.submit("x", 1, _work("x", log), lambda: True),
                s.submit("y", 1, _work("y", log), lambda: True),
                s.submit("z", 1, _work("z", log), lambda: False),  # the document moved on
            )
        return r, stats.counts

    r, counts = _run(main())
    assert r == ["x", "y", None]
    assert counts["skipped"] == 1 and counts["model_runs"] == 2


def test_leaving_waiter_cancels_the_run():
    async def main():
        stats, log = Stats(), []
        with ThreadPoolExecutor(2) as pool:
            s = LatestWins(pool, stats, throttle_ms=0)
            t = asyncio.ensure_future(s.submit("d", 1, _work(1, log, steps=50), lambda: True))
            await asyncio.sleep(0.05)
            t.cancel()  # what pygls does on $/cancelRequest
            try:
                await t
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(0.05)
        return log, stats.counts

    log, counts = _run(main())
    assert ("cancelled", 1) in log and counts["cancelled"] == 1


class FakeTimers:
    """A clock the test moves by hand and a call_later that records instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pending: list[tuple[float, object]] = []  # (delay_s, callback)

    def clock(self) -> float:
        return self.now

    def call_later(self, delay_s, callback):
        entry = (delay_s, callback)
        self.pending.append(entry)
        timers = self

        class Handle:
            def cancel(self) -> None:
                if entry in timers.pending:
                    timers.pending.remove(entry)

        return Handle()

    def fire(self) -> None:
        (_delay_s, callback), *self.pending = self.pending
        callback()


def test_throttle_delays_the_second_run_not_the_first():
    async def main():
        stats, log, timers = Stats(), [], FakeTimers()
        with ThreadPoolExecutor(2) as pool:
            s = LatestWins(pool, stats, throttle_ms=1500, clock=timers.clock, call_later=timers.call_later)
            first = await s.submit("d", 1, _work(1, log, steps=1), lambda: True)
            # leading edge: the first run started at once, without a timer
            assert first == 1 and timers.pending == [] and stats.counts["model_runs"] == 1
            timers.now = 0.1
            second = asyncio.ensure_future(s.submit("d", 2, _work(2, log, steps=1), lambda: True))
            await asyncio.sleep(0)  # let submit reach the throttle
            assert len(timers.pending) == 1 and stats.counts["model_runs"] == 1  # held back, not run
            delay_s = timers.pending[0][0]
            assert abs(delay_s - 1.4) < 1e-9  # until 1.5 s after the first run started
            timers.now = 1.5
            timers.fire()
            return await second, stats.counts["model_runs"], log

    second, runs, log = _run(main())
    assert second == 2 and runs == 2
    assert [e for e in log if e[0] == "start"] == [("start", 1), ("start", 2)]
