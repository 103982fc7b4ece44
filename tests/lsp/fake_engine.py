"""Test doubles for the *scheduling* tests (loaded in the server subprocess through
DLM_ENGINE_FACTORY). They make no claim about model behaviour: the text they return is
a fixed marker so the tests can see which request a result belongs to.

Also what every double of the Engine contract shares: `FakeEngineBase` (submit on a thread,
status, close), `InsertingEngine` (an answer inserted at the cursor) and `at_cursor`.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future

from dlm.coder_model.types import CancelToken, EngineStatus, LayoutBudget, Prediction, Prompt, SamplerParams

MARK = "FAKE"


def on_a_thread(predict, prompt, params, cancel, deadline=None) -> Future:
    """The Engine contract's `submit` for a test double: a Future completed by its `predict` (its
    result or its exception) on a thread of its own, so the server's event loop never waits."""
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(predict(prompt, params, cancel, deadline))
        except Exception as exc:  # noqa: BLE001 - the server reads it from the Future
            fut.set_exception(exc)

    threading.Thread(target=run, name="fake-engine-predict", daemon=True).start()
    return fut


def at_cursor(prompt: Prompt, insertion: str) -> str:
    """The prompt's region with `insertion` at its cursor: what an inserting double answers."""
    return prompt.region[: prompt.cursor] + insertion + prompt.region[prompt.cursor :]


class FakeEngineBase:
    """The Engine contract around a test double's `predict`: `submit` runs it on a thread, `status`
    says ready on the CPU with `model_name` (what the double is for), `close` has nothing to free."""

    budget = LayoutBudget()
    model_name = "fake (tests only)"

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        raise NotImplementedError

    def submit(self, prompt, params, cancel, deadline=None) -> Future:
        return on_a_thread(self.predict, prompt, params, cancel, deadline)

    def status(self) -> EngineStatus:
        return EngineStatus(state="ready", device="cpu", model=self.model_name)

    def close(self) -> None:
        pass


class InsertingEngine(FakeEngineBase):
    """Inserts `insertion(prompt)` at the cursor at once, with full confidence."""

    def insertion(self, prompt: Prompt) -> str:
        raise NotImplementedError

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        return Prediction(at_cursor(prompt, self.insertion(prompt)), steps=1, tokens=1, confidence=1.0)


class SlowFakeEngine(FakeEngineBase):
    """Sleeps `steps` x `step_s` (checking the CancelToken each step, like the sampler),
    then inserts MARK at the cursor; a region containing "TODO" gets it replaced by "DONE"
    (an edit away from the cursor). One request at a time, like LocalEngine."""

    model_name = "slow-fake (scheduling tests only)"

    def __init__(self, step_s: float = 0.02, steps: int = 10) -> None:
        self.step_s, self.steps = step_s, steps
        self.budget = LayoutBudget()  # the Engine contract; the server fits its windows to it
        # a fixed confidence for the gate tests (FAKE_CONFIDENCE); None: the fake computes none
        self.confidence = float(os.environ["FAKE_CONFIDENCE"]) if "FAKE_CONFIDENCE" in os.environ else None
        self._lock = threading.Lock()

    def predict(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Prediction:
        # No deadline planning and no confidence (None: the server's confidence gate lets it
        # through); the server still drops an answer that arrives after its deadline.
        t0 = time.monotonic()
        with self._lock:
            t1 = time.monotonic()
            for i in range(self.steps):
                if cancel.cancelled:
                    return Prediction("", steps=i, cancelled=True, queue_ms=(t1 - t0) * 1000)
                time.sleep(self.step_s)
            region = prompt.region
            if "TODO" in region:
                text = region.replace("TODO", "DONE", 1)
            else:
                text = at_cursor(prompt, MARK)
            return Prediction(
                text,
                steps=self.steps,
                tokens=self.steps,
                queue_ms=(t1 - t0) * 1000,
                denoise_ms=(time.monotonic() - t1) * 1000,
                confidence=self.confidence,
            )

def slow(model, device):
    time.sleep(float(os.environ.get("FAKE_LOAD_S", "0")))
    return SlowFakeEngine(
        float(os.environ.get("FAKE_STEP_S", "0.02")), int(os.environ.get("FAKE_STEPS", "10"))
    )


def failing(model, device):
    raise RuntimeError("fake engine refuses to load (test of the failure path)")


class FieldSizesEngine(SlowFakeEngine):
    """Answers with the sizes of the prompt's path and language at the cursor ("P<n>L<m>"), for
    the tests that check those fields are bounded before they reach an engine."""

    def predict(self, prompt, params, cancel, deadline=None):
        pred = super().predict(prompt, params, cancel, deadline)
        if pred.cancelled:
            return pred
        pred.text = at_cursor(prompt, f"P{len(prompt.path)}L{len(prompt.language)}")
        return pred


def field_sizes(model, device):
    return FieldSizesEngine(float(os.environ.get("FAKE_STEP_S", "0.001")), 1)


class RefusingEngine(SlowFakeEngine):
    """Refuses every request as a model refuses blocks longer than it takes (ValueError)."""

    def predict(self, prompt, params, cancel, deadline=None):
        raise ValueError(f"block_len {params.block_len} x max_blocks {params.max_blocks} exceed the fake's length")


def refusing(model, device):
    return RefusingEngine(0.001, 1)


class ProposalEchoEngine(SlowFakeEngine):
    """Sleeps like the slow fake, then answers the prompt's first proposal (as the denoiser's
    check does when it lets it through) with a fixed confidence; no proposal: the region as it
    is. For the edit memory's scheduling tests (drops, undo, Copilot's shape), not its quality."""

    def predict(self, prompt, params, cancel, deadline=None):
        pred = super().predict(prompt, params, cancel, deadline)
        if pred.cancelled:
            return pred
        pred.text = at_cursor(prompt, prompt.proposals[0].text) if prompt.proposals else prompt.region
        pred.confidence = 0.9
        return pred


def echo_proposals(model, device):
    return ProposalEchoEngine(float(os.environ.get("FAKE_STEP_S", "0.001")), int(os.environ.get("FAKE_STEPS", "1")))
