"""The contracts between the editor side and the model side (docs/architecture.md §3).

Nothing here imports torch: `dlm.lsp` uses these types before (and even
without) a model being loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol, get_args, runtime_checkable

from dlm.coder_model.caps import Cap, check, option

ConfidenceRule = Literal["max_prob", "margin", "entropy"]
DecodeOrder = Literal["confidence", "left_to_right"]


@dataclass(frozen=True)
class MemoryProposal:
    """A whole insertion at the cursor proposed by the repository memory (docs/architecture.md §10), with the
    memory's own probability of it; the engine's denoiser checks it against the suffix."""

    text: str
    score: float


@dataclass(frozen=True)
class RetrievedSnippet:
    """Lines of another file of the project, similar to the lines above the cursor (docs/architecture.md §10):
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

    `insert` is the mode (docs/architecture.md §4). False (edit mode: after a pause, a jump,
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
    """Token budgets of the model's context (docs/architecture.md §3, §4); the far ends are cut first.

    Part of the Engine contract: the LSP fits its text windows to it, the layout
    (coder_model.layout) cuts to it, and a remote server announces its model's in
    `hello`, so local and remote serving give the model the same token layout.
    """

    # The defaults are for_window(2048): a client that learns no budget (an old remote server)
    # sizes its windows as a 2048-token model trained with these proportions would expect.
    max_context: int = 2048
    max_history: int = 2048 // 3
    max_suffix: int = 2048 // 4
    # The repository memory's drafts (Prompt.proposals) in their own section, for a model trained
    # with one (ModelConfig.drafts_window); 0: no section, the proposals are only checked.
    max_drafts: int = 0

    def __post_init__(self) -> None:
        for name in ("max_context", "max_history", "max_suffix", "max_drafts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"LayoutBudget.{name}={value!r}: use a non-negative whole number of tokens")
        if self.max_context < 1:
            raise ValueError(f"LayoutBudget.max_context={self.max_context}: the context needs at least 1 token")

    @classmethod
    def for_window(cls, context_tokens: int, drafts_tokens: int = 0) -> LayoutBudget:
        """The proportions training uses: a third for history, a quarter for the suffix; and
        `drafts_tokens` for the memory's drafts (a model trained with them)."""
        return cls(max_context=context_tokens, max_history=context_tokens // 3, max_suffix=context_tokens // 4,
                   max_drafts=drafts_tokens)


@dataclass(frozen=True)
class SamplerParams:
    """Knobs of the iterative unmasking sampler (docs/architecture.md §5).

    Defaults are the ones `dlm-lsp bench` tuned for the embedded model.
    `threshold=1.0` with `order="left_to_right"` decodes one slot per step
    left to right: the autoregressive baseline on the same network.
    """

    # Each field's cap is the one every door checks a request against (coder_model.limits): it
    # bounds one request's cost for everyone sharing the model. `valid` is the wider range a
    # SamplerParams built in code may hold (a benchmark's heavy client), where it differs.
    steps: int = option(
        32, Cap("int", 1, 4096, valid=(1, None)), "denoising steps per block (upper bound)")
    block_len: int = option(
        32, Cap("int", 1, 1024, valid=(1, None)), "masked slots per block (L)")
    max_blocks: int = option(
        2, Cap("int", 1, 64, valid=(1, None)), "blocks at most: another block follows when no <eom> comes")
    # (RUF009 takes option() for a call in a default: it returns the field, as field() does)
    rule: ConfidenceRule = option(  # noqa: RUF009
        "max_prob", Cap("choice", choices=get_args(ConfidenceRule)), "how a slot's confidence is measured")
    threshold: float = option(0.9, Cap("float", 0.0, 1.0), "commit every slot whose confidence is above this")
    temperature: float = option(
        0.0, Cap("float", 0.0, 100.0, valid=(0.0, None)), "sampling temperature (0: greedy)")
    order: DecodeOrder = option(  # noqa: RUF009
        "confidence", Cap("choice", choices=get_args(DecodeOrder)),
        "which slots commit first: the most confident, or left to right")
    seed: int = option(0, Cap("int", 0, 2**63 - 1, valid=(None, None)), "sampling seed")
    # Repository-memory proposals (Prompt.proposals), checked by coder_model.verify: the confidence
    # is sigmoid(memory_bias + memory_weight * logit(p_memory) + model_weight * log(p_model)); a
    # proposal the model gives less than `veto` is never answered. verify_passes = 0 skips the model
    # (the memory alone: a diagnostic, never the product's default). Defaults by measurement
    # (python -m dlm.drivers.evaluation.memory_mix, xarray + astropy, 500 held-out lines): the
    # model's weight 0.25 was chosen on one half and is neutral on the other (+0.4 points, 95%
    # interval -1.6..+2.4); weights and bias are the logistic fit of "right" on that half. With
    # the order-12 memory: every weight 0..4 within a point of the memory alone
    # (-0.8 at the chosen 2.0, -4.0..+2.0); kept, and the gate (lsp.options.min_confidence)
    # calibrated through the server with these values.
    memory_weight: float = option(
        1.0, Cap("float", -100.0, 100.0, valid=(None, None)),
        "repository memory: weight of the memory's logit")
    model_weight: float = option(
        0.25, Cap("float", -100.0, 100.0, valid=(None, None)),
        "repository memory: weight of the model's log score")
    memory_bias: float = option(
        0.74, Cap("float", -100.0, 100.0, valid=(None, None)),
        "repository memory: bias of the mixed confidence")
    veto: float = option(
        0.0, Cap("float", 0.0, 1.0),
        "repository memory: a proposal the model gives less than this probability is never shown")
    # 0: the model is off the typing path. On the development repositories' frozen cases the line
    # ranker's trees alone (lsp.options IndexOptions.rank_drafts) beat the memory checked by the
    # model in 2 passes on exact (+2.3 points) and on precision at an equal shown share, at half
    # its latency (BENCHMARKS.md "The shipped configuration"); 2 is the check those figures measured.
    verify_passes: int = option(
        0, Cap("int", 0, 8), "repository memory: model passes per proposal (0: the memory alone, "
        "ranked by the line ranker when index.rankDrafts is on; 2: the denoiser's check)")
    # The fast path: where the memory's own side of the mix (the model's weight left out) already
    # reaches `memory_first`, the check would rarely change the answer, so none runs (no prefill,
    # no pass) and the memory's confidence is the answer's. At 0.7, 40% of the development
    # repositories' requests take it, 99.8% of them with the checked answer; exact at gate 0 is the
    # checked configuration's, and at the default gate 41% of lines are shown at 71% precision
    # (39% at 74% checked): the highest threshold at 40% shown and 70% precision (BENCHMARKS.md
    # "The fast path"). A veto (> 0) asks for every proposal to be checked: no fast path then.
    memory_first: float = option(
        0.7, Cap("float", 0.0, 2.0),
        "repository memory: a proposal the memory alone gives at least this confidence is answered "
        "without the model's check (above 1: every proposal is checked)")
    # Against degenerate answers (coder_model.sampler). repeat_penalty: logits
    # subtracted from a token that would repeat its committed neighbour, start a third copy of
    # the n-gram before or after it, or add a blank line to a blank line (0 = off).
    # end_threshold: length-aware decoding; at a block's first step <eom> is committed at the
    # first slot where p(<eom>) + p(<pad>) (the answer has ended) reaches it (0 = off; confidence
    # order only: the autoregressive baseline finds its end left to right). 0.3 measured better
    # than 0.5 (the median length) on every set of BENCHMARKS.md "Degenerate answers".
    repeat_penalty: float = option(
        2.0, Cap("float", 0.0, 100.0, valid=(0.0, None)), "logits off a token that repeats (0: off)")
    end_threshold: float = option(
        0.3, Cap("float", 0.0, 1.0), "length-aware end: p(<eom>) + p(<pad>) at which an answer ends (0: off)")

    def __post_init__(self) -> None:
        # The fields' own caps (their `valid` ranges where wider than a request's), converted to
        # the cap's kind: 16.0 steps is 16.
        for f in fields(self):
            value, problem = check(f.name, getattr(self, f.name), f.metadata["cap"].in_code)
            if problem is not None:
                raise ValueError(problem)
            object.__setattr__(self, f.name, value)


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
    # False: `confidence` is no probability (a hosted engine's answer: 1.0 when it answered
    # something, coder_model.hosted); the gate lets such an answer through, except over text the
    # user just typed (lsp.gate), as for an engine that computes no confidence
    scored: bool = True

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.prefill_ms + self.denoise_ms

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


class CancelToken:
    """A thread-safe flag; the sampler checks it before every denoising step. An engine that
    waits on the network instead registers `on_cancel`, so that a superseded request is aborted
    at once rather than at its next look at the flag."""

    __slots__ = ("_callbacks", "_event", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:  # on the cancelling thread: each only schedules its abort
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call `callback` once when the token is cancelled (at once when it already is)."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()

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


@dataclass(frozen=True)
class EngineTraits:
    """What the language server treats differently per engine, beyond the Engine protocol. An
    engine declares them as its `traits` attribute; one without it has the defaults (`traits_of`)."""

    hosted: bool = False  # text leaves the machine (the index's send filters apply); no probability
    deadline_ms: int | None = None  # its own answer deadline (a remote model takes longer); None: the option's
    next_edits: bool = False  # its region rewrite is a next-edit proposal of its own (Mercury Edit)


def traits_of(engine: object) -> EngineTraits:
    """`engine`'s declared traits, or the defaults (the embedded and remote engines, test doubles)."""
    traits = getattr(engine, "traits", None)
    return traits if isinstance(traits, EngineTraits) else EngineTraits()


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

    def submit(
        self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline: float | None = None
    ) -> Future[Prediction]:
        """`predict` without waiting: a Future of its Prediction, or of its exception (a ValueError:
        a request the model cannot take). The LSP awaits it on its event loop, so none of its
        threads sits waiting on the model: an engine with an inference queue queues the request
        there, one whose `predict` waits on the wire runs it on a thread of its own."""
        ...

    def status(self) -> EngineStatus: ...

    def close(self) -> None: ...
