"""The contracts between the editor side and the model side (DESIGN §3).

Nothing here imports torch: `dlm.lsp` uses these types before (and even
without) a model being loaded.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

ConfidenceRule = Literal["max_prob", "margin", "entropy"]
DecodeOrder = Literal["confidence", "left_to_right"]


@dataclass(frozen=True)
class MemoryProposal:
    """A whole insertion at the cursor proposed by the repository memory (DESIGN §10), with the
    memory's own probability of it; the engine's denoiser checks it against the suffix."""

    text: str
    score: float


@dataclass(frozen=True)
class RetrievedSnippet:
    """Lines of another file of the project, similar to the lines above the cursor (DESIGN §10):
    the layout gives them to the model in sections of their own, before the file's."""

    path: str
    text: str


@dataclass(frozen=True)
class Prompt:
    """What the model sees for one prediction.

    `region` is the current text of the editable region and `cursor` an offset
    (in characters) inside it. `prefix`/`suffix` are the windowed texts
    before/after the region. `history` holds rendered edit events (unified
    diffs), oldest first.

    `insert` is the mode (DESIGN §4). False (edit mode: after a pause, a jump,
    dlm/editPrediction): the model writes the new text of the whole region.
    True (typing): the model writes only the text to insert at the cursor, up
    to the end of the statement; it never re-types the region. Either way the
    engine answers `Prediction.text` as the new region (for an insertion:
    region[:cursor] + insertion + region[cursor:]), so no caller changes.
    `snippets` are retrieved from other files of the project (best first); the
    layout keeps what its budget holds.
    """

    prefix: str
    region: str
    cursor: int
    suffix: str
    history: tuple[str, ...] = ()
    language: str = ""
    path: str = ""
    # Insertions at the cursor proposed by the repository memory, best first: the engine scores
    # them with the denoiser and answers the best one (or none) instead of decoding freely.
    proposals: tuple[MemoryProposal, ...] = ()
    insert: bool = False
    snippets: tuple[RetrievedSnippet, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.cursor <= len(self.region):
            raise ValueError(
                f"Prompt.cursor={self.cursor} is outside the region of length "
                f"{len(self.region)}; pass an offset between 0 and len(region)"
            )


@dataclass(frozen=True)
class LayoutBudget:
    """Token budgets of the model's context (DESIGN §3, §4); the far ends are cut first.

    Part of the Engine contract: the LSP fits its text windows to it, the layout
    (coder_model.layout) cuts to it, and a remote server announces its model's in
    `hello`, so local and remote serving give the model the same token layout.
    """

    # The defaults are for_window(2048): a client that learns no budget (an old remote server)
    # sizes its windows as a 2048-token model trained with these proportions would expect.
    max_context: int = 2048
    max_history: int = 2048 // 3
    max_suffix: int = 2048 // 4

    def __post_init__(self) -> None:
        for name in ("max_context", "max_history", "max_suffix"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"LayoutBudget.{name}={value!r}: use a non-negative whole number of tokens")
        if self.max_context < 1:
            raise ValueError(f"LayoutBudget.max_context={self.max_context}: the context needs at least 1 token")

    @classmethod
    def for_window(cls, context_tokens: int) -> LayoutBudget:
        """The proportions training uses: a third for history, a quarter for the suffix."""
        return cls(max_context=context_tokens, max_history=context_tokens // 3, max_suffix=context_tokens // 4)


@dataclass(frozen=True)
class SamplerParams:
    """Knobs of the iterative unmasking sampler (DESIGN §5).

    Defaults are the ones `dlm-lsp bench` tuned for the embedded model.
    `threshold=1.0` with `order="left_to_right"` decodes one slot per step
    left to right: the autoregressive baseline on the same network.
    """

    steps: int = 32  # upper bound on denoising steps per block
    block_len: int = 32  # L: masked slots per block
    max_blocks: int = 2  # block extension when no <eom> appears in a block
    rule: ConfidenceRule = "max_prob"
    threshold: float = 0.9  # commit every slot whose confidence is above it
    temperature: float = 0.0  # 0 = greedy
    order: DecodeOrder = "confidence"
    seed: int = 0
    # Repository-memory proposals (Prompt.proposals), checked by coder_model.verify: the confidence
    # is sigmoid(memory_bias + memory_weight * logit(p_memory) + model_weight * log(p_model)); a
    # proposal the model gives less than `veto` is never answered. verify_passes = 0 skips the model
    # (the memory alone: a diagnostic, never the product's default). Defaults by measurement
    # (python -m dlm.drivers.evaluation.memory_mix, xarray + astropy, 500 held-out lines): the
    # model's weight 0.25 was chosen on one half and is neutral on the other (+0.4 points, 95%
    # interval -1.6..+2.4); weights and bias are the logistic fit of "right" on that half. Rerun
    # with the order-12 memory (issue 21): every weight 0..4 within a point of the memory alone
    # (-0.8 at the chosen 2.0, -4.0..+2.0); kept, and the gate (lsp.options.min_confidence)
    # calibrated through the server with these values.
    memory_weight: float = 1.0
    model_weight: float = 0.25
    memory_bias: float = 0.74
    veto: float = 0.0
    verify_passes: int = 2
    # Against degenerate answers (issue 23; coder_model.sampler). repeat_penalty: logits
    # subtracted from a token that would repeat its committed neighbour, start a third copy of
    # the n-gram before or after it, or add a blank line to a blank line (0 = off).
    # end_threshold: length-aware decoding; at a block's first step <eom> is committed at the
    # first slot where p(<eom>) + p(<pad>) (the answer has ended) reaches it (0 = off; confidence
    # order only: the autoregressive baseline finds its end left to right). 0.3 measured better
    # than 0.5 (the median length) on every set of BENCHMARKS.md "Degenerate answers".
    repeat_penalty: float = 2.0
    end_threshold: float = 0.3

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps={self.steps}: need at least 1 denoising step")
        if self.block_len < 1:
            raise ValueError(f"block_len={self.block_len}: need at least 1 slot")
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks={self.max_blocks}: need at least 1 block")
        if self.rule not in ("max_prob", "margin", "entropy"):
            raise ValueError(f"rule={self.rule!r}: use max_prob, margin or entropy")
        if self.order not in ("confidence", "left_to_right"):
            raise ValueError(f"order={self.order!r}: use confidence or left_to_right")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold={self.threshold}: use a value in [0, 1]")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: use a value >= 0")
        if not 0 <= self.verify_passes <= 8:
            raise ValueError(f"verify_passes={self.verify_passes}: use 0 (no model) to 8")
        if not 0.0 <= self.veto <= 1.0:
            raise ValueError(f"veto={self.veto}: use a probability in [0, 1]")
        for name in ("memory_weight", "model_weight", "memory_bias"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)}: use a finite number")
        if self.repeat_penalty < 0:
            raise ValueError(f"repeat_penalty={self.repeat_penalty}: use a value >= 0 (0 = off)")
        if not 0.0 <= self.end_threshold <= 1.0:
            raise ValueError(f"end_threshold={self.end_threshold}: use a value in [0, 1] (0 = off)")


@dataclass
class Prediction:
    """The result of one `Engine.predict` call."""

    text: str  # the new text of the region ("" and cancelled=True if cancelled)
    steps: int = 0  # denoising forward passes over the block(s)
    tokens: int = 0  # tokens committed (content, <eom> included, pads excluded)
    queue_ms: float = 0.0  # waiting for the inference thread
    prefill_ms: float = 0.0  # computing KV of changed context tokens
    denoise_ms: float = 0.0  # the denoising steps
    cancelled: bool = False
    context_tokens: int = 0  # tokens before the masked block
    cached_tokens: int = 0  # of those, reused from the prefix KV cache
    blocks: int = 0
    # calibrated P(the suggestion is right) from the committed slots' probabilities; None: the
    # engine computes none (open families, older remote servers), so no confidence gate applies
    confidence: float | None = None
    late: bool = False  # finished after its deadline: never shown
    # The repository memory's proposals (Prompt.proposals) the check let through, each as
    # (insertion, its own confidence), best first: the answered one is the first, the others are
    # the editor's alternatives to it. Empty when the engine checked none (a free decode, the
    # open families, older remote servers).
    proposal_confidences: tuple[tuple[str, float], ...] = ()

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.prefill_ms + self.denoise_ms

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


class CancelToken:
    """A thread-safe flag; the sampler checks it before every denoising step."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class EngineStatus:
    state: Literal["loading", "ready", "failed", "disconnected"] = "loading"
    device: str = ""
    model: str = ""
    message: str = ""  # why it failed, what to do
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """Local and remote engines implement this; the LSP cannot tell them apart.

    `budget` is the context the model takes; the LSP sizes its windows to it.
    """

    budget: LayoutBudget

    def predict(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Prediction:
        """`deadline`: absolute time.monotonic() by which to answer (None: no deadline); the
        engine plans its steps to it and answers the confident part or nothing, never late."""
        ...

    def status(self) -> EngineStatus: ...

    def close(self) -> None: ...
