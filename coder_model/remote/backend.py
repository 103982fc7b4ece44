"""The native model behind the remote server's batching scheduler (batching.py).

`ModelBackend` drives the native `dlm` model through the sampler's
per-request `BlockDecoder`: `prepare` cuts and tokenizes a prompt (on the
server's worker threads), `begin` prefills it against the owner's prefix
cache, `step` runs one denoising step of every active request in one
`DLM.forward_blocks` pass. Imports torch, so the scheduler and the network
front end (which do not) stay light and testable with a fake backend.

Prompts are encoded with the budget of the checkpoint (`LayoutBudget.for_window`
of its context window), the same one LocalEngine uses and the one the
server announces in `hello`: the model sees over the wire what it saw in
training.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import torch
from dlm.coder_model import budget as budget_rules
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.engine import (
    NativeModel,
    checks_proposals,
    refine_prediction,
    starts_from_draft,
    verify_prediction,
)
from dlm.coder_model.layout import LayoutBudget, encode_prompt
from dlm.coder_model.remote.batching import Request
from dlm.coder_model.sampler import BlockDecoder
from dlm.coder_model.types import Prediction, Prompt, SamplerParams

log = logging.getLogger("dlm.remote.backend")

def check_region(prompt: Prompt, budget: LayoutBudget) -> None:
    """A region that cannot fit the model's window is refused (ValueError): it is what the model
    rewrites and cannot be cut. The rest is cut by encode_prompt, by characters before tokenizing."""
    if not budget_rules.region_fits(prompt.region, budget):
        raise ValueError(f"the region has {len(prompt.region)} characters, more than the model's window of "
                         f"{budget.max_context} tokens can hold; send the lines around the cursor as the region")


@dataclass
class _Job:
    dec: BlockDecoder | None
    key: tuple[str, str]
    cache: PrefixCache
    shared: bool  # the cache lives in the LRU (False: a throwaway for a concurrent request on the same doc)
    verified: Prediction | None = None  # memory proposals checked at begin (coder_model.verify): done


class ModelBackend(NativeModel):
    """Batched denoising steps of the native model, with per-(owner, document) prefix caches.

    The owner is the server-assigned identity of a connection, so a client
    reuses only its own context. A cache is used by one request at a time:
    when two requests of the same owner and document overlap (the editor's
    older request not yet cancelled), the newer one decodes with a fresh
    cache, which gives the same result, only without reuse.
    """

    def __init__(self, model, tok, *, device: str = "cpu", name: str = "", max_caches: int = 64,
                 max_cache_bytes: int = 4 << 30, budget: LayoutBudget | None = None, calibration=None):
        super().__init__(model, tok, device=device, name=name, max_caches=max_caches, budget=budget,
                         calibration=calibration)
        self.max_cache_bytes = max_cache_bytes
        self._caches: OrderedDict[tuple[str, str], PrefixCache] = OrderedDict()
        self._busy: set[tuple[str, str]] = set()
        self._drop_on_release: set[tuple[str, str]] = set()  # busy caches of owners that are gone

    def describe(self) -> dict[str, str]:
        return {"model": self.name, "device": self.device}

    def prepare(self, prompt: Prompt, params: SamplerParams) -> list[int]:
        """Context token ids of a prompt (thread-safe: no model, no shared state)."""
        check_region(prompt, self.budget)
        ids = encode_prompt(self.tok, prompt, self.budget)
        need = len(ids) + params.block_len * params.max_blocks
        limit = self.model.config.max_seq_len
        if need > limit:
            raise ValueError(f"{len(ids)} context tokens + block_len {params.block_len} x max_blocks "
                             f"{params.max_blocks} = {need} positions exceed this model's max_seq_len of {limit}; "
                             "send a smaller block_len or max_blocks")
        return ids

    def begin(self, request: Request) -> _Job:
        if request.prepared is None:
            raise RuntimeError("request reached the model unprepared; the server must call prepare() first")
        ids = request.prepared
        key = (request.owner, request.prompt.path or "<untitled>")
        if key in self._busy:
            cache, shared = PrefixCache(), False
        else:
            cache, shared = self._caches.pop(key, None) or PrefixCache(), True
            self._busy.add(key)
        checks = checks_proposals(request.prompt, request.params, self.budget)
        if checks or starts_from_draft(self.model, request.prompt):
            # The memory's proposals: the denoiser checks them in a few passes, or refines the best
            # one, right here (as LocalEngine does), so the job is done at once; the scheduler answers it.
            try:
                if checks:
                    pred = verify_prediction(self.model, self.tok, request.prompt, request.params, ids, cache, 0.0)
                else:
                    pred = refine_prediction(self.model, self.tok, request.prompt, request.params, ids, cache,
                                             cancel=request.cancel, deadline=request.deadline(),
                                             calibration=self.calibration)
            except BaseException:
                self.release(_Job(None, key, cache, shared))
                raise
            return _Job(None, key, cache, shared, verified=pred)
        dec = BlockDecoder(self.model, self.tok, ids, request.params, cache, request.cancel, deadline=request.deadline(),
                           step_timer=self.step_timer, calibration=self.calibration, prompt=request.prompt)
        job = _Job(dec, key, cache, shared)
        try:
            job.dec.prefill()
        except BaseException:
            self.release(job)
            raise
        return job

    def step(self, jobs: list[_Job]) -> list[BaseException | None]:
        errors: list[BaseException | None] = []
        with torch.inference_mode():
            blocks = [j.dec.block_input() for j in jobs]  # each (L_j,)
            hidden = self.model.forward_blocks(blocks, [j.dec.cache for j in jobs])  # each (L_j, dim)
            for job, h in zip(jobs, hidden):
                try:  # one request's decode failing must not take the others' results with it
                    job.dec.advance(h)
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - handed to the scheduler, which fails this job only
                    errors.append(exc)
        return errors

    def is_done(self, job: _Job) -> bool:
        if job.verified is not None:
            return True
        return job.dec.check_cancel()  # also stops a request with no time left for another step

    def finish(self, job: _Job) -> Prediction:
        return job.verified if job.verified is not None else job.dec.prediction()

    def release(self, job: _Job) -> None:
        if not job.shared:
            return
        self._busy.discard(job.key)
        if job.key in self._drop_on_release:
            self._drop_on_release.discard(job.key)
            return
        if job.cache.k and job.dec is not None and job.dec.context_ids[: len(job.cache)] != job.cache.tokens:
            job.cache.clear()  # cannot happen with an exact cache; cheap insurance against stale K/V
        self._caches[job.key] = job.cache
        self._evict()

    def forget(self, owner: str) -> None:
        """Drop the caches of a connection that is gone (its K/V would never be reused)."""
        for key in [k for k in self._caches if k[0] == owner]:
            del self._caches[key]
        self._drop_on_release.update(k for k in self._busy if k[0] == owner)

    def _evict(self) -> None:
        total = sum(c.nbytes() for c in self._caches.values())
        while self._caches and (len(self._caches) > self.max_caches or total > self.max_cache_bytes):
            _, old = self._caches.popitem(last=False)  # least recently used first
            total -= old.nbytes()


# Tokens of one batched forward pass when --max-batch-tokens is not given. On a GPU a pass of a few
# thousand tokens costs little more than one of 32: batching is the throughput. On a CPU a pass
# costs in proportion to its tokens (embedded model, one thread: 8 ms for a 32-slot block, 42 ms for
# four of them in one pass, 392 ms for 1,024 slots), so batching buys nothing and would make a
# light request's every step as slow as the heaviest one it shares a pass with: one job per pass.
def default_max_batch_tokens(device: str) -> int:
    return 4096 if str(device).startswith("cuda") else 0


def load_scheduler(model_dir: str | None, device: str = "auto", *, max_batch: int = 32, max_caches: int = 64,
                   max_batch_tokens: int | None = None, max_owner_slots: int = 2048):
    """(scheduler, model name, device) for a checkpoint directory (None: the embedded one).

    The native family gets the batching scheduler; other families (dream,
    llada) are served one request at a time through their Engine.
    `max_batch_tokens` None: default_max_batch_tokens(device).
    """
    from dlm.coder_model.engine import load_engine, load_native, open_checkpoint
    from dlm.coder_model.remote.batching import BatchScheduler, EngineScheduler

    d, family, dev = open_checkpoint(model_dir, device)
    if family != "dlm":
        log.warning("%s is a %r checkpoint: served without step batching (one request at a time)", d, family)
        return EngineScheduler(load_engine(str(d), dev)), d.name, dev
    model, tok, calibration = load_native(d, dev)
    backend = ModelBackend(model, tok, device=dev, name=d.name, max_caches=max_caches, calibration=calibration)
    if max_batch_tokens is None:
        max_batch_tokens = default_max_batch_tokens(dev)
    return (BatchScheduler(backend, max_batch=max_batch, max_batch_tokens=max_batch_tokens,
                           max_owner_slots=max_owner_slots), d.name, dev)
