"""InferenceThread: one thread owns a model, and requests from any thread queue for it.

The engines that run a model in this process (engine.LocalEngine, families.family_engine.FamilyEngine)
share it: `submit` queues a job and returns a Future, `predict` waits for it, and the time a job
waited is its `queue_ms`. A failure is raised again in the caller; the thread lives on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams

log = logging.getLogger("dlm.engine")


class InferenceThread:
    """One thread owns the model; `predict` hands it a job and waits, so requests from any
    thread are serialised and the time a job waited is its `queue_ms`. A failure is raised
    again in the caller; the thread lives on. Subclasses run a job in `_run`."""

    def _start_inference_thread(self, name: str) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def predict(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Prediction:
        return self.submit(prompt, params, cancel, deadline).result()

    def submit(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Future:
        """Queue a request without waiting: a Future of its Prediction (the LSP awaits it on its
        event loop, so no thread of its own sits waiting on the inference thread)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed; load the model again for a new engine")
        fut: Future = Future()
        self._jobs.put((time.perf_counter(), prompt, params, cancel, deadline, fut))
        return fut

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            # join: a process that exits while the inference thread is still
            # unwinding can abort in torch's C++ teardown ("terminate called ...")
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            t_submit, prompt, params, cancel, deadline, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            queue_ms = (time.perf_counter() - t_submit) * 1000
            try:
                fut.set_result(self._run(prompt, params, cancel, queue_ms, deadline))
            except ValueError as exc:  # a request the model cannot take: the caller says why, once
                fut.set_exception(exc)
            except BaseException as exc:  # hand every failure to the caller: the thread must live on
                log.exception("prediction failed")
                fut.set_exception(exc)

    def _run(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, queue_ms: float,
             deadline: float | None) -> Prediction:
        raise NotImplementedError
