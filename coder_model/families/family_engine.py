"""FamilyEngine: the Engine protocol over an open dream/llada checkpoint.

Insertion mode: these models infill, they do not rewrite. A Prompt maps to
prefix = prompt.prefix + region[:cursor] and suffix = region[cursor:] +
prompt.suffix (windowed to the token budgets of InfillOptions); the infilled
text is inserted at the cursor, so Prediction.text = region[:cursor] + infill
+ region[cursor:]. Edit history, language and path are not part of these
models' training format and are not shown to them.

One inference thread owns the model (dlm.coder_model.inference_thread,
as for the native model): `predict` blocks its caller until its request is
done, cancelled, or has failed (the error is re-raised in the caller; the
thread lives on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dlm.coder_model.budget import clip_after, clip_before
from dlm.coder_model.inference_thread import InferenceThread
from dlm.coder_model.families.arch import FamilyArch, FamilyTokens
from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
from dlm.coder_model.types import CancelToken, EngineStatus, LayoutBudget, Prediction, Prompt, SamplerParams


@dataclass
class FamilyEngineOptions:
    infill: InfillOptions = field(default_factory=InfillOptions)
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu; or "bfloat16", "float16", "float32"
    impl: str = "auto"  # dlm.kernels implementation: auto | triton | reference


class FamilyEngine(InferenceThread):
    def __init__(
        self,
        model,
        tokenizer,
        tokens: FamilyTokens,
        arch: FamilyArch,
        path: str,
        device: str,
        options: FamilyEngineOptions | None = None,
    ) -> None:
        self.options = options or FamilyEngineOptions()
        self.model = model
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.arch = arch
        self.path = path
        self.device = device
        self.decoder = InfillDecoder(model, tokens, self.options.infill)
        infill = self.options.infill
        # The infill layout (`prefix [MASK]xL suffix`) has no history segment; the LSP
        # fits its windows to these token counts, as it does for the native model.
        self.budget = LayoutBudget(
            max_context=infill.max_prefix_tokens + infill.max_suffix_tokens,
            max_history=0,
            max_suffix=infill.max_suffix_tokens,
        )
        self._start_inference_thread("dlm-family-inference")

    # -- Engine protocol (predict and close: InferenceThread) ---------------------------------
    def status(self) -> EngineStatus:
        return EngineStatus(
            state="ready",
            device=str(self.device),
            model=str(self.path),
            extra={
                "family": self.arch.family,
                "model_type": self.arch.model_type,
                "dtype": str(self.model.embed.weight.dtype).replace("torch.", ""),
            },
        )

    # -- inference thread ---------------------------------------------------------------------
    def _run(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, queue_ms: float,
             deadline: float | None) -> Prediction:
        # The infill decoder does not plan its steps to the deadline (yet): a request whose
        # time ran out in the queue is skipped, and one that finishes after it is marked late.
        if deadline is not None and time.monotonic() >= deadline:
            return Prediction(text=prompt.region, late=True, queue_ms=queue_ms)
        pred = self._predict(prompt, params, cancel, queue_ms)
        pred.late = deadline is not None and time.monotonic() > deadline
        return pred

    def encode_prompt(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        opt = self.options.infill
        # cut by characters first (coder_model.budget), so that a huge prompt is not tokenized whole
        before = clip_before(prompt.prefix + prompt.region[: prompt.cursor], opt.max_prefix_tokens)
        after = clip_after(prompt.region[prompt.cursor :] + prompt.suffix, opt.max_suffix_tokens)
        pre = self.tokenizer.encode(before, add_special_tokens=False).ids if before else []
        suf = self.tokenizer.encode(after, add_special_tokens=False).ids if after else []
        return pre[-opt.max_prefix_tokens :] if opt.max_prefix_tokens else [], suf[: opt.max_suffix_tokens]

    def _predict(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, queue_ms: float
    ) -> Prediction:
        if cancel.cancelled:
            return Prediction(text="", cancelled=True, queue_ms=queue_ms)
        pre, suf = self.encode_prompt(prompt)
        r = self.decoder.infill(pre, suf, params, cancel)
        if r.cancelled:
            return Prediction(
                text="",
                cancelled=True,
                queue_ms=queue_ms,
                steps=r.steps,
                prefill_ms=r.prefill_ms,
                denoise_ms=r.denoise_ms,
            )
        infill = self.tokenizer.decode(r.tokens, skip_special_tokens=True) if r.tokens else ""
        c = prompt.cursor
        return Prediction(
            text=prompt.region[:c] + infill + prompt.region[c:],
            steps=r.steps,
            tokens=len(r.tokens) + (1 if r.ended else 0),
            queue_ms=queue_ms,
            prefill_ms=r.prefill_ms,
            denoise_ms=r.denoise_ms,
            context_tokens=r.context_tokens,
            cached_tokens=0,
            blocks=1,
        )
