"""Model backends for the remote server's batching scheduler.

`ModelBackend` drives the native `dlm` model through the sampler's
per-request `BlockDecoder`: `begin` tokenizes and prefills one request
against its (client, document) prefix cache, `step` runs one denoising step
of every active request in one `DLM.forward_blocks` pass. Imports torch, so
`server.py` (which does not) stays light and testable with a fake backend.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.layout import LayoutBudget, encode_prompt
from dlm.coder_model.remote.server import Request
from dlm.coder_model.sampler import BlockDecoder
from dlm.coder_model.types import Prediction

log = logging.getLogger("dlm.remote.backend")


@dataclass
class _Job:
    dec: BlockDecoder
    key: tuple[str, str]
    cache: PrefixCache
    shared: bool  # the cache lives in the LRU (False: a throwaway for a concurrent request on the same doc)


class ModelBackend:
    """Batched denoising steps of the native model, with per-(client, document) prefix caches.

    A cache is used by one request at a time: when two requests of the same
    client and document overlap (the editor's older request not yet
    cancelled), the newer one decodes with a fresh cache, which gives the same
    result, only without reuse.
    """

    def __init__(self, model, tok, *, device: str = "cpu", name: str = "", max_caches: int = 64,
                 max_cache_bytes: int = 4 << 30, budget: LayoutBudget | None = None):
        self.model, self.tok = model, tok
        self.device = device
        self.name = name
        self.budget = budget or LayoutBudget()
        self.max_caches = max_caches
        self.max_cache_bytes = max_cache_bytes
        self._caches: OrderedDict[tuple[str, str], PrefixCache] = OrderedDict()
        self._busy: set[tuple[str, str]] = set()

    def describe(self) -> dict[str, str]:
        return {"model": self.name, "device": self.device}

    def begin(self, request: Request) -> _Job:
        ids = encode_prompt(self.tok, request.prompt, self.budget)
        key = (request.client_id, request.prompt.path or "<untitled>")
        if key in self._busy:
            cache, shared = PrefixCache(), False
        else:
            cache, shared = self._caches.pop(key, None) or PrefixCache(), True
            self._busy.add(key)
        job = _Job(BlockDecoder(self.model, self.tok, ids, request.params, cache, request.cancel), key, cache, shared)
        try:
            job.dec.prefill()
        except BaseException:
            self.release(job)
            raise
        return job

    def step(self, jobs: list[_Job]) -> None:
        with torch.inference_mode():
            blocks = [j.dec.block_input() for j in jobs]  # each (L_j,)
            hidden = self.model.forward_blocks(blocks, [j.dec.cache for j in jobs])  # each (L_j, dim)
            for job, h in zip(jobs, hidden):
                job.dec.advance(h)

    def is_done(self, job: _Job) -> bool:
        return job.dec.done

    def finish(self, job: _Job) -> Prediction:
        return job.dec.prediction()

    def release(self, job: _Job) -> None:
        if not job.shared:
            return
        self._busy.discard(job.key)
        if job.cache.k and job.dec.context_ids[: len(job.cache)] != job.cache.tokens:
            job.cache.clear()  # cannot happen with an exact cache; cheap insurance against stale K/V
        self._caches[job.key] = job.cache
        self._evict()

    def _evict(self) -> None:
        total = sum(c.nbytes() for c in self._caches.values())
        while self._caches and (len(self._caches) > self.max_caches or total > self.max_cache_bytes):
            _, old = self._caches.popitem(last=False)  # least recently used first
            total -= old.nbytes()

    @property
    def cache_count(self) -> int:
        return len(self._caches)


def load_scheduler(model_dir: str | None, device: str = "auto", *, max_batch: int = 32, max_caches: int = 64):
    """(scheduler, model name, device) for a checkpoint directory (None: the embedded one).

    The native family gets the batching scheduler; other families (dream,
    llada) are served one request at a time through their Engine.
    """
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model, read_config, resolve_device
    from dlm.coder_model.remote.server import BatchScheduler, EngineScheduler

    d = Path(model_dir) if model_dir is not None else embedded_checkpoint_dir()
    if not d.is_dir():
        raise FileNotFoundError(f"model directory {d} does not exist; pass --model DIR of a checkpoint")
    family = read_config(d).get("model_type", "dlm")
    dev = resolve_device(device)
    if family != "dlm":
        from dlm.coder_model.engine import load_engine

        log.warning("%s is a %r checkpoint: served without step batching (one request at a time)", d, family)
        return EngineScheduler(load_engine(str(d), str(dev))), d.name, str(dev)
    model, tok = load_model(d, device=str(dev))
    backend = ModelBackend(model, tok, device=str(dev), name=d.name, max_caches=max_caches)
    return BatchScheduler(backend, max_batch=max_batch), d.name, str(dev)
