"""A slow fake step backend for scheduling and protocol tests only.

It claims nothing about the model: its "prediction" is a fixed function of
the prompt (region reversed, path appended) so that a test can tell whether
a result belongs to the request it answers. Special regions make it misbehave
the way a model can: "<reject>" is refused by `prepare`, "<explode>" breaks
every batched step it is part of, "<explode-alone>" fails its own decode only,
"<slow-prepare>" blocks `prepare` until `release_prepare` is set. Run as a
script it serves on a loopback port (for the kill-the-server test).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

from dlm.coder_model.layout import LayoutBudget
from dlm.coder_model.types import Prediction


def wait_until(condition, timeout_s: float = 10.0, poll_s: float = 0.01) -> bool:
    """Poll `condition()` until it holds or `timeout_s` passes; whether it held. The caller
    asserts what it needs afterwards, with its own message."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def fake_text(prompt) -> str:
    return prompt.region[::-1] + "|" + prompt.path


@dataclass
class FakeJob:
    prompt: object
    needed: int
    done_steps: int = 0


class FakeBackend:
    """Each request needs `params.steps` steps; every batched step sleeps `step_s`."""

    budget = LayoutBudget(max_context=96, max_history=32, max_suffix=24)

    def __init__(self, step_s: float = 0.002):
        self.step_s = step_s
        self.batch_sizes: list[int] = []
        self.released = 0
        self.forgotten: list[str] = []
        self.prepare_threads: set[str] = set()
        self.prepare_started = threading.Event()
        self.release_prepare = threading.Event()
        self._lock = threading.Lock()

    def describe(self):
        return {"model": "fake", "device": "none"}

    def prepare(self, prompt, params):
        with self._lock:
            self.prepare_threads.add(threading.current_thread().name)
        if prompt.region == "<reject>":
            raise ValueError("fake backend rejects this prompt")
        if prompt.region == "<slow-prepare>":
            self.prepare_started.set()
            self.release_prepare.wait(60)
        return len(prompt.region)

    def begin(self, request):
        assert request.prepared is not None, "the scheduler got an unprepared request"
        return FakeJob(request.prompt, request.params.steps)

    def step(self, jobs):
        self.batch_sizes.append(len(jobs))
        if any(j.prompt.region == "<explode>" for j in jobs):
            raise RuntimeError("fake forward pass broken by one request")
        time.sleep(self.step_s)
        errors = []
        for j in jobs:
            if j.prompt.region == "<explode-alone>":
                errors.append(ValueError("fake decode failure of one request"))
                continue
            j.done_steps += 1
            errors.append(None)
        return errors

    def is_done(self, job):
        return job.done_steps >= job.needed

    def finish(self, job):
        return Prediction(text=fake_text(job.prompt), steps=job.done_steps, tokens=job.done_steps)

    def release(self, job):
        self.released += 1

    def forget(self, owner):
        self.forgotten.append(owner)


def start_fake_server(port: int = 0, *, step_s: float = 0.002, token=None, limits=None, ssl_context=None,
                      max_batch: int = 32, max_connections: int = 256):
    from dlm.coder_model.remote.batching import BatchScheduler
    from dlm.coder_model.remote.tcp_server import ServerOptions, ServerThread
    from dlm.coder_model.remote.wire import Limits

    backend = FakeBackend(step_s)
    options = ServerOptions(host="127.0.0.1", port=port, token=token, ssl_context=ssl_context,
                            limits=limits or Limits(), model_name="fake", device="none",
                            max_connections=max_connections)
    srv = ServerThread(BatchScheduler(backend, max_batch=max_batch), options).start()
    srv.backend = backend
    return srv


if __name__ == "__main__":  # python fakes.py PORT STEP_S
    srv = start_fake_server(int(sys.argv[1]), step_s=float(sys.argv[2]))
    print(f"listening on 127.0.0.1:{srv.port}", flush=True)
    threading.Event().wait()
