"""A slow fake step backend for scheduling and protocol tests only.

It claims nothing about the model: its "prediction" is a fixed function of
the prompt (region reversed, path appended) so that a test can tell whether
a result belongs to the request it answers. Run as a script it serves on a
loopback port (for the kill-the-server test).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

from dlm.coder_model.types import Prediction


def fake_text(prompt) -> str:
    return prompt.region[::-1] + "|" + prompt.path


@dataclass
class FakeJob:
    prompt: object
    needed: int
    done_steps: int = 0


class FakeBackend:
    """Each request needs `params.steps` steps; every batched step sleeps `step_s`."""

    def __init__(self, step_s: float = 0.002):
        self.step_s = step_s
        self.batch_sizes: list[int] = []
        self.released = 0
        self._lock = threading.Lock()

    def describe(self):
        return {"model": "fake", "device": "none"}

    def begin(self, request):
        if request.prompt.region == "<reject>":
            raise ValueError("fake backend rejects this prompt")
        return FakeJob(request.prompt, request.params.steps)

    def step(self, jobs):
        self.batch_sizes.append(len(jobs))
        time.sleep(self.step_s)
        for j in jobs:
            j.done_steps += 1

    def is_done(self, job):
        return job.done_steps >= job.needed

    def finish(self, job):
        return Prediction(text=fake_text(job.prompt), steps=job.done_steps, tokens=job.done_steps)

    def release(self, job):
        self.released += 1


def start_fake_server(port: int = 0, *, step_s: float = 0.002, token=None, limits=None, ssl_context=None,
                      max_batch: int = 32):
    from dlm.coder_model.remote.protocol import Limits
    from dlm.coder_model.remote.server import BatchScheduler, ServerOptions, ServerThread

    backend = FakeBackend(step_s)
    options = ServerOptions(host="127.0.0.1", port=port, token=token, ssl_context=ssl_context,
                            limits=limits or Limits(), model_name="fake", device="none")
    srv = ServerThread(BatchScheduler(backend, max_batch=max_batch), options).start()
    srv.backend = backend
    return srv


if __name__ == "__main__":  # python fakes.py PORT STEP_S
    srv = start_fake_server(int(sys.argv[1]), step_s=float(sys.argv[2]))
    print(f"listening on 127.0.0.1:{srv.port}", flush=True)
    threading.Event().wait()
