"""LocalEngine: the native model in-process behind the Engine protocol.

One inference thread owns the model; `predict` hands it a job and waits, so
requests from any thread are serialised and the time spent waiting is
reported as `queue_ms`. The engine keeps a few prefix KV caches keyed by
document path, so consecutive keystrokes in one file reuse their context.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from dlm.coder_model.budget import model_budget
from dlm.coder_model.inference_thread import InferenceThread
from dlm.coder_model.types import (
    CancelToken,
    EngineStatus,
    LayoutBudget,
    MemoryProposal,
    Prediction,
    Prompt,
    SamplerParams,
)

log = logging.getLogger("dlm.engine")


class NativeModel:
    """A loaded native checkpoint as a runner of requests holds it: model and tokenizer, the
    layout budget, the calibration of its confidence and its measured step time. LocalEngine
    (in-process, one request at a time) and the remote ModelBackend (batched steps) are both one."""

    def __init__(self, model, tok, *, device: str, name: str, max_caches: int, budget: LayoutBudget | None,
                 calibration) -> None:
        from dlm.coder_model.confidence_calibration import Calibration
        from dlm.coder_model.sampler import StepTimer

        self.model, self.tok = model, tok
        # Deadline planning (sampler): this runner's measured step time; confidence: its calibration.
        self.step_timer = StepTimer()
        self.calibration = calibration if calibration is not None else Calibration.identity()
        self.device = device
        self.name = name
        # The context the checkpoint was trained on (docs/architecture.md §3): the LSP fits its windows to it.
        self.budget = budget or model_budget(model.config)
        self.max_caches = max_caches  # prefix KV caches kept, least recently used evicted


class LocalEngine(InferenceThread, NativeModel):
    def __init__(self, model, tok, *, device: str = "cpu", name: str = "", max_caches: int = 8,
                 budget: LayoutBudget | None = None, calibration=None) -> None:
        super().__init__(model, tok, device=device, name=name, max_caches=max_caches, budget=budget,
                         calibration=calibration)
        self._caches: OrderedDict[str, object] = OrderedDict()
        self.runs = 0  # model runs started (not skipped as cancelled while queued)
        self._start_inference_thread("dlm-inference")

    # -- Engine protocol (predict and close: InferenceThread) -----------------
    def status(self) -> EngineStatus:
        return EngineStatus(state="ready", device=self.device, model=self.name)

    # -- inference thread -------------------------------------------------------
    def _cache_for(self, key: str):
        from dlm.coder_model.cache import PrefixCache

        cache = self._caches.pop(key, None) or PrefixCache()
        self._caches[key] = cache
        while len(self._caches) > self.max_caches:
            self._caches.popitem(last=False)
        return cache

    def _run(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, queue_ms: float,
             deadline: float | None = None) -> Prediction:
        from dlm.coder_model.layout import encode_prompt
        from dlm.coder_model.sampler import generate

        if cancel.cancelled:  # superseded while it waited: don't touch the model
            return Prediction(text="", cancelled=True, queue_ms=queue_ms)
        if deadline is not None and time.monotonic() >= deadline:  # its time ran out in the queue
            return Prediction(text=prompt.region, late=True, queue_ms=queue_ms)
        self.runs += 1
        ids = encode_prompt(self.tok, prompt, self.budget)
        cache = self._cache_for(prompt.path or "<untitled>")
        if checks_proposals(prompt, params, self.budget):
            pred = verify_prediction(self.model, self.tok, prompt, params, ids, cache, queue_ms)
            pred.late = deadline is not None and time.monotonic() > deadline
            return pred
        if starts_from_draft(self.model, prompt):
            return refine_prediction(self.model, self.tok, prompt, params, ids, cache, cancel=cancel,
                                     deadline=deadline, calibration=self.calibration, queue_ms=queue_ms)
        dec = generate(self.model, self.tok, ids, params, cache=cache, cancel=cancel, deadline=deadline,
                       step_timer=self.step_timer, calibration=self.calibration, prompt=prompt)
        return dec.prediction(queue_ms)


def checks_proposals(prompt: Prompt, params: SamplerParams, budget: LayoutBudget) -> bool:
    """Does the engine answer from the memory's proposals (verify_prediction: checked in
    `params.verify_passes` passes, or none: the memory's order) rather than decode? A model
    trained with a drafts section (`budget.max_drafts`) decodes with them in its context when no
    check is asked: it writes from the drafts."""
    if not prompt.proposals:
        return False
    return not (budget.max_drafts and params.verify_passes == 0)


def starts_from_draft(model, prompt: Prompt) -> bool:
    """Does a run that writes from the drafts (not checks_proposals) start its block from the
    best one (a model trained to: ModelConfig.draft_start) rather than from masks?"""
    return bool(prompt.proposals) and bool(getattr(model.config, "draft_start", False))


def refine_prediction(model, tok, prompt: Prompt, params: SamplerParams, ids: list[int], cache, *,
                      cancel: CancelToken | None = None, deadline: float | None = None, calibration=None,
                      queue_ms: float = 0.0) -> Prediction:
    """The memory's best draft refined by the model (coder_model.refine) into the new region."""
    from dlm.coder_model.refine import refine

    return refine(model, tok, ids, prompt.proposals[0].text, params, cache=cache, cancel=cancel, deadline=deadline,
                  calibration=calibration, prompt=prompt, queue_ms=queue_ms)


def verify_prediction(model, tok, prompt: Prompt, params: SamplerParams, ids: list[int], cache,
                      queue_ms: float) -> Prediction:
    """The memory's proposals checked by the denoiser (coder_model.verify): the region with the
    chosen insertion, or unchanged when the model vetoes them all; every proposal let through,
    with its own confidence, in `proposal_confidences` (the same passes scored them all)."""
    import torch
    from dlm.coder_model.verify import Mix, region_after, verify

    mix = Mix.of(params).checked(prompt.proposals)
    t0 = time.perf_counter()
    reused = 0
    if mix.passes:  # (the fast path runs no pass: nothing to prefill)
        with torch.inference_mode():
            reused = model.prefill(ids, cache)
    prefill_ms = (time.perf_counter() - t0) * 1000
    v = verify(model, tok, cache, prompt.region, prompt.cursor, prompt.proposals, params.block_len, mix,
               insert=prompt.insert)
    text = prompt.region if v.index is None else region_after(prompt.region, prompt.cursor,
                                                               prompt.proposals[v.index].text)
    return Prediction(text=text, confidence=v.confidence, steps=v.passes, tokens=0, queue_ms=queue_ms,
                      prefill_ms=prefill_ms, denoise_ms=v.ms, context_tokens=len(ids), cached_tokens=reused,
                      blocks=1 if v.passes else 0,
                      proposal_confidences=tuple((prompt.proposals[j].text, c) for j, c in v.ranked))


def load_engine(model: str | Path | None = None, device: str = "auto", impl: str = "auto"):
    """An Engine for a checkpoint directory (None: the embedded checkpoint).

    The family comes from config.json: "dlm" is the native model; the open
    diffusion coder families are loaded by dlm.coder_model.families.
    """
    d, family, dev = open_checkpoint(model, device)
    if dev == "cpu":
        from dlm.coder_model.devices import cpu_threads

        threads = cpu_threads()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
            log.info("the model uses %d CPU thread(s): one core is left to the server (OMP_NUM_THREADS sets it)", threads)
    if family != "dlm":
        from dlm.coder_model.families import load_family_engine
        from dlm.coder_model.families.family_engine import FamilyEngineOptions

        return load_family_engine(d, dev, FamilyEngineOptions(impl=impl))
    m, tok, calibration = load_native(d, dev, impl)
    log.info("loaded %s on %s (confidence: %s)", d, dev,
             "identity" if calibration.is_identity else f"calibrated {calibration.kind}")
    engine = LocalEngine(m, tok, device=dev, name=d.name, calibration=calibration)
    if dev.startswith("cuda"):
        warm_up(engine)
    return engine


WARM_UP_PROMPT = Prompt(prefix="import os\n\n\ndef list_files(path):\n    ", region="return ", cursor=7,
                        suffix="\n\n\ndef main():\n    pass\n", language="python", path="<warm-up>", insert=True)


def warm_up(engine: LocalEngine, params: SamplerParams | None = None) -> float:
    """Run one free decode and one check of a memory proposal before the engine says it is ready.

    On a GPU the first call of each Triton kernel compiles it, which takes seconds: without this the
    first requests after "ready" run out of their deadline with no model step (seen on an H200), and
    the status would be untrue. Runs in the loading thread, before any request can reach the engine.
    Returns the seconds it took."""
    t0 = time.monotonic()
    params = params or SamplerParams()
    engine._run(WARM_UP_PROMPT, params, CancelToken(), 0.0)
    engine._run(replace(WARM_UP_PROMPT, proposals=(MemoryProposal("[name for name in os.listdir(path)]", 0.5),)),
                params, CancelToken(), 0.0)
    engine._caches.pop(WARM_UP_PROMPT.path, None)
    engine.runs = 0
    took = time.monotonic() - t0
    log.info("warmed up on %s in %.1f s (the GPU kernels compiled)", engine.device, took)
    return took


def open_checkpoint(model: str | Path | None, device: str) -> tuple[Path, str, str]:
    """(directory, family, device) for a checkpoint directory (None: the embedded one) and a
    --device value (auto, cpu, cuda, cuda:N); the family is config.json's model_type."""
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir, read_config, resolve_device

    d = Path(model) if model is not None else embedded_checkpoint_dir()
    if not d.is_dir():
        raise FileNotFoundError(f"model directory {d} does not exist; pass --model DIR of a checkpoint")
    family = read_config(d).get("model_type", "dlm")
    return d, family, str(resolve_device(device))


def load_native(d: Path, device: str, impl: str = "auto"):
    """(model, tokenizer, calibration) of a native ("dlm") checkpoint directory; the calibration
    is the identity when the checkpoint has no calibration.json."""
    from dlm.coder_model.checkpoint import load_model
    from dlm.coder_model.confidence_calibration import Calibration

    calibration = Calibration.load(d)
    model, tok = load_model(d, device=device, impl=impl)
    return model, tok, calibration
