"""Fairness between the remote server's connections, checked with a fake
backend whose forward pass costs one millisecond of a fake clock per token in it: every time
here is that clock's, so the checks are exact and never depend on the machine.

The case: one client keeps 20 requests with 256-slot blocks in flight; another sends a
default request (32 slots, 32 steps). A pass that stepped all 21 together (5,152 tokens) would
make the default request take 160x its solo time; each pass goes to the owners served least,
so the default request finishes within 2x its solo time.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from dlm.coder_model.limits import DEFAULT_DEADLINE_MS, MAX_REQUEST_DEADLINES
from dlm.coder_model.remote.batching import BatchScheduler, EngineScheduler, PassTimer, Request
from dlm.coder_model.remote.wire import ProtocolError, params_from_wire, prompt_from_wire
from dlm.coder_model.types import Prediction, Prompt, SamplerParams
from remote_fakes import FakeBackend, wait_until

pytestmark = pytest.mark.timeout(120)


def cpu_cost(tokens: int) -> float:
    """A CPU's forward pass: time in proportion to its tokens (measured: 8 ms for 32 tokens, 392 ms
    for 1,024 with the embedded model), 1 ms per token here."""
    return float(tokens)


def gpu_cost(tokens: int) -> float:
    """A GPU's: a fixed cost per pass, and little more per token until the device is full."""
    return 20.0 + tokens / 256


class TokenClockBackend(FakeBackend):
    """A pass costs `cost(tokens)` ms of a fake clock (`now`); it records each pass's owners.
    A job needs `params.steps` steps (FakeBackend)."""

    def __init__(self, cost=cpu_cost) -> None:
        super().__init__(step_s=0.0)
        self.cost = cost
        self.now = 0.0  # ms
        self.passes: list[list[str]] = []
        self.hook = None  # called after each pass with the pass number

    def begin(self, request):
        job = super().begin(request)
        job.owner, job.block_len = request.owner, request.params.block_len
        return job

    def step(self, jobs):
        errors = super().step(jobs)
        self.now += self.cost(sum(j.block_len for j in jobs))
        self.passes.append([j.owner for j in jobs])
        if self.hook is not None:
            self.hook(len(self.passes))
        return errors

    def clock(self) -> float:  # seconds, for BatchScheduler(clock=...)
        return self.now / 1000.0


def request(owner: str, rid: int, steps: int, block_len: int, done: dict, backend: TokenClockBackend) -> Request:
    p = Prompt(prefix="", region=f"r{rid}", cursor=0, suffix="", path=f"{owner}.py")

    def on_done(pred, err):
        done[(owner, rid)] = (backend.now, pred, err)

    return Request(owner, rid, p, SamplerParams(steps=steps, block_len=block_len, threshold=1.0), on_done,
                   prepared=len(p.region))


def normal_latency(with_heavy: bool, cost=cpu_cost, **scheduler_options) -> tuple[float, TokenClockBackend]:
    """Fake-clock ms from the normal request's arrival to its answer, and the backend."""
    backend = TokenClockBackend(cost)
    sched = BatchScheduler(backend, clock=backend.clock, **scheduler_options)
    done: dict = {}
    arrived: dict = {}
    normal = request("normal", 1, 32, 32, done, backend)

    def arrive(n: int) -> None:
        if n == 3:  # the normal request comes while the heavy client's passes run
            arrived["at"] = backend.now
            sched.submit(normal)

    if with_heavy:
        for i in range(20):
            sched.submit(request("heavy", 100 + i, 10_000, 256, done, backend))
        backend.hook = arrive
    else:
        arrived["at"] = 0.0
        sched.submit(normal)
    sched.start()
    def finished() -> bool:  # the normal request is answered, and (if any) the heavy client went on after it
        return ("normal", 1) in done and (not with_heavy or "heavy" in backend.passes[-1])

    try:
        assert wait_until(finished, 60), "the normal request was never answered, or the heavy client stopped"
    finally:
        sched.stop()
    at, pred, err = done[("normal", 1)]
    assert err is None and pred.text
    return at - arrived["at"], backend


@pytest.mark.parametrize("cost,max_batch_tokens", [
    (cpu_cost, 0),  # what `dlm-lsp serve` uses on a CPU (backend.load_scheduler): one job per pass
    (gpu_cost, 4096),  # BatchScheduler's default, for a GPU
])  # fmt: skip
def test_a_heavy_client_slows_itself_not_a_normal_one(cost, max_batch_tokens):
    solo, _ = normal_latency(False, cost, max_batch_tokens=max_batch_tokens)
    assert solo == 32 * cost(32)  # 32 steps of a 32-slot block
    shared, backend = normal_latency(True, cost, max_batch_tokens=max_batch_tokens)
    assert shared <= 2 * solo, f"the normal request took {shared:.0f} ms with the heavy client, {solo:.0f} ms alone"
    # the heavy client went on after it (normal_latency waits for that): slowed, not stopped, and
    # never more than its cap of requests in one pass
    assert max(p.count("heavy") for p in backend.passes) <= 8  # max_batch 32 // 4


def test_each_connection_has_a_cap_on_its_requests_and_slots_in_the_batch():
    backend = TokenClockBackend()
    sched = BatchScheduler(backend, clock=backend.clock, max_batch=32, max_owner_requests=4, max_owner_slots=512)
    done: dict = {}
    for i in range(20):
        sched.submit(request("heavy", i, 3, 256, done, backend))
    sched.start()
    try:
        assert wait_until(lambda: len(done) == 20, 60)
    finally:
        sched.stop()
    assert backend.passes and max(len(p) for p in backend.passes) <= 2  # 512 slots = two 256-slot blocks
    assert all(err is None for _, _, err in done.values())


def test_an_idle_client_comes_back_first_and_busy_clients_share_evenly():
    backend = TokenClockBackend()
    sched = BatchScheduler(backend, clock=backend.clock, max_batch_tokens=0)  # one job per pass
    done: dict = {}
    for owner in ("a", "b"):  # both busy for a long time, same block size
        for i in range(4):
            sched.submit(request(owner, i, 200, 32, done, backend))
    sched.start()
    try:
        assert wait_until(lambda: len(backend.passes) >= 400, 60)
    finally:
        sched.stop()
    window = [p[0] for p in backend.passes[100:400]]
    assert abs(window.count("a") - window.count("b")) <= 2


def test_prepared_context_counts_as_work_and_cancelled_pending_requests_are_answered():
    backend = TokenClockBackend()
    sched = BatchScheduler(backend, clock=backend.clock, max_owner_requests=1)
    done: dict = {}
    first = request("x", 1, 50, 32, done, backend)
    queued = request("x", 2, 50, 32, done, backend)
    queued.cancel.cancel()
    sched.submit(first)
    sched.submit(queued)
    sched.start()
    try:
        assert wait_until(lambda: len(done) == 2, 30)
    finally:
        sched.stop()
    assert done[("x", 2)][1].cancelled and done[("x", 1)][1].text


# ---- the bound on a request's cost -------------------------------------------------------------------


def test_a_request_over_the_slot_step_cap_is_refused_on_the_wire():
    heavy = {"block_len": 1024, "max_blocks": 3, "steps": 4096, "threshold": 1.0}
    with pytest.raises(ProtocolError) as err:
        params_from_wire(heavy, 5)
    assert err.value.code == "bad_request" and not err.value.fatal
    assert "slot-steps" in err.value.message and "fewer steps" in err.value.message


def test_requests_estimated_over_ten_deadlines_are_refused_by_measured_step_time():
    backend = TokenClockBackend()
    sched = BatchScheduler(backend, clock=backend.clock)
    assert sched.check_request(SamplerParams(block_len=256, steps=64, max_blocks=4), None) is None  # nothing measured
    done: dict = {}
    sched.submit(request("w", 1, 4, 32, done, backend))  # warm-up: 4 passes of 32 tokens, 1 ms per token
    sched.start()
    try:
        assert wait_until(lambda: len(done) == 1, 30)
    finally:
        sched.stop()
    assert sched.check_request(SamplerParams(), None) is None  # 2 x 32 steps x 32 ms = 2.05 s: taken
    bound_s = MAX_REQUEST_DEADLINES * DEFAULT_DEADLINE_MS / 1000
    too_long = sched.check_request(SamplerParams(block_len=64, steps=64, max_blocks=1), None)  # 64 x 64 ms = 4.1 s
    assert too_long is not None and f"over the {bound_s:g} s bound" in too_long and "deadline_ms" in too_long
    assert sched.check_request(SamplerParams(block_len=64, steps=64, max_blocks=1), 200.0) is None  # it stops at 200 ms
    one_step = sched.check_request(SamplerParams(block_len=512, steps=2, max_blocks=1), 100.0)  # 512 ms per step
    assert one_step is not None and "smaller block_len" in one_step


def test_a_request_no_heavier_than_the_default_is_always_taken():
    sched = BatchScheduler(TokenClockBackend())
    sched.pass_timer.observe(32, 32 * 40.0)  # 40 ms per token: a default step takes 1.3 s
    assert sched.check_request(SamplerParams(), None) is None
    assert sched.check_request(SamplerParams(steps=8, block_len=16, max_blocks=4), None) is None
    assert sched.check_request(SamplerParams(steps=32, block_len=32, max_blocks=3), None) is not None


def test_pass_timer_estimates_from_the_nearest_measured_size():
    timer = PassTimer()
    assert timer.estimate_ms(32) is None
    timer.observe(32, 8.0)
    assert timer.estimate_ms(32) == pytest.approx(8.0)
    assert timer.estimate_ms(1024) == pytest.approx(256.0)  # scaled up from the smaller size
    timer.observe(1024, 400.0)
    assert timer.estimate_ms(1000) == pytest.approx(400.0 / 1024 * 1000)
    assert timer.estimate_ms(8) == pytest.approx(2.0)


# ---- bounded fields in remote mode (the borderline: a 1 MB path was tokenized in full) -----------------


def test_a_megabyte_path_language_and_history_are_bounded_on_the_wire():
    prompt = prompt_from_wire({"prefix": "", "region": "x", "cursor": 0, "suffix": "",
                               "path": "d/" * 500_000 + "f.py", "language": "l" * 1_000_000,
                               "history": ["h" * 100_000] * 1000}, 1)  # fmt: skip
    assert len(prompt.path) <= 512 and prompt.path.endswith("f.py")
    assert len(prompt.language) <= 64
    assert len(prompt.history) <= 64 and all(len(h) <= 16_384 for h in prompt.history)


# ---- the one-at-a-time scheduler (open families) takes owners in turn -----------------------------------


class _RecordingEngine:
    budget = None

    def __init__(self) -> None:
        self.order: list[str] = []
        self.gate = threading.Event()

    def predict(self, prompt, params, cancel, deadline=None):
        self.gate.wait(10)
        self.order.append(prompt.path)
        return Prediction(text="x", steps=1)

    def submit(self, prompt, params, cancel, deadline=None) -> Future:
        fut: Future = Future()
        threading.Thread(target=lambda: fut.set_result(self.predict(prompt, params, cancel, deadline)),
                         daemon=True).start()
        return fut


def test_engine_scheduler_serves_owners_in_turn():
    engine = _RecordingEngine()
    sched = EngineScheduler(engine)
    done: list = []
    for owner, n in (("heavy", 6), ("normal", 2)):
        for i in range(n):
            p = Prompt("", "r", 0, "", path=owner)
            sched.submit(Request(owner, i + 1, p, SamplerParams(), lambda pred, err: done.append(pred)))
    sched.start()
    engine.gate.set()
    try:
        assert wait_until(lambda: len(done) == 8, 30)
    finally:
        sched.stop()
    assert engine.order[:4] == ["heavy", "normal", "heavy", "normal"]
