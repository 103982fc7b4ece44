"""Iterative unmasking of the masked block (docs/architecture.md §5).

Each step runs the network over the block (context K/V come from the exact
prefix cache), scores the still-masked slots and commits every slot whose
confidence is above `threshold` (at least one, and enough that the block is
done within `steps`). When <eom> (or <pad>) is committed at slot k, every slot
after k becomes <pad> at once. A block with no <eom> is moved into the context
and a new block is appended (up to `max_blocks`). The CancelToken is checked
before every step.

Deadline (docs/architecture.md §5, anytime decoding): a request may carry an absolute
`time.monotonic()` deadline. The decoder asks the engine's `StepTimer` (an EMA
of measured step times per block length) how many more steps fit before it
and commits enough slots per step to finish the block in that many. When not
even one more step fits, it stops and answers with the confident part: the
committed left part of the new region whose every slot is above `threshold`,
turned into an insertion at the cursor cut at a line or word boundary, or
nothing. A result finished after its deadline is marked `late`; callers never
show it.

Confidence: every committed slot keeps the probability the model gave its
token. A suggestion's raw confidence combines the probabilities of its
content slots and its <eom> (`CONFIDENCE_KINDS`: geometric mean, minimum or
product; `evaluation.calibrate` measures which ranks correct suggestions best
and stores the choice with a monotone calibration map in calibration.json);
`Prediction.confidence` is the calibrated value.

Against degenerate answers (filler of blank lines, `get_get_get_`):
- length-aware decoding (`end_threshold`): at a block's first step, where every
  slot is masked, p(<eom>) + p(<pad>) at slot j is the model's probability that
  the answer has ended by j (it was trained with <pad> after <eom>). <eom> is
  committed at the first slot where that reaches the threshold, before any
  content. Without it the most confident slot of the first step is the block's
  last one (a <pad>), which pins the answer to the whole block, and the model
  fills the gap with blank lines;
- a repetition penalty (`repeat_penalty`): a slot whose best token would repeat
  its committed neighbour, start a third copy of the n-gram next to it (up to
  MAX_REPEAT_PERIOD tokens), or add a second blank line is scored again with
  those tokens' logits lowered. Only such slots are rescored (a few rows of the
  LM head), so the fused unmask kernel still scores the rest.
What still gets through is caught by `coder_model.degenerate` before anything is
shown.

`BlockDecoder` is the per-request state machine, so that a server can run the
steps of many requests in one forward pass (`DLM.forward_blocks`);
`generate` is the one-request loop.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import torch
from dlm import kernels
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.confidence_calibration import Calibration
from dlm.coder_model.layout import new_region
from dlm.coder_model.model import DLM
from dlm.coder_model.tokenizer import SPECIAL_TOKENS, Tokenizer
from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams
from dlm.kernels import reference as reference_ops

UNSET = -1  # a slot not yet committed (its input token is <mask>)

# Kept free before the deadline for what follows the sampler: decoding the text,
# postprocess and the reply (a few ms on CPU; measured by `dlm-lsp bench`'s stages).
DEADLINE_MARGIN_S = 0.010

CONFIDENCE_KINDS = ("geo_mean", "min", "product")

# Longest unit (in tokens) the repetition penalty looks for next to a slot.
MAX_REPEAT_PERIOD = 4
_TRAILING_BREAKS = re.compile(r"(?:\n[ \t]*)+$")  # line breaks with only spaces between, at the end
_LEADING_BREAKS = re.compile(r"^(?:[ \t]*\n)+")  # ... at the start


def raw_confidence(probs: list[float], kind: str) -> float:
    """Combine committed-slot probabilities into one score in [0, 1] (0 when there are none)."""
    if not probs:
        return 0.0
    if kind == "min":
        return min(probs)
    logs = [math.log(max(p, 1e-12)) for p in probs]
    if kind == "geo_mean":
        return math.exp(sum(logs) / len(logs))
    if kind == "product":
        return math.exp(sum(logs))
    raise ValueError(f"confidence kind {kind!r}: use one of {', '.join(CONFIDENCE_KINDS)}")


STARVED_DECAY = 0.7  # StepTimer.starved: a 4x overestimate heals in 4 requests


class StepTimer:
    """Running estimate of one denoising step's wall time, per block length (an EMA).

    One per engine: step time depends on the machine, the model and its load,
    which change slowly, so recent steps predict the next one. Until a block
    length has a measured step, a prefill of at least that many tokens seeds it
    (a step runs the same layers over block_len tokens). Used by one inference
    thread at a time (the engine's), so it needs no lock.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"StepTimer alpha={alpha}: use a weight in (0, 1]")
        self.alpha = alpha
        self._ms: dict[int, float] = {}

    def estimate_ms(self, block_len: int) -> float | None:
        return self._ms.get(block_len)

    def observe(self, block_len: int, ms: float) -> None:
        old = self._ms.get(block_len)
        self._ms[block_len] = ms if old is None else old + self.alpha * (ms - old)

    def seed_from_prefill(self, block_len: int, tokens: int, ms: float) -> None:
        if block_len not in self._ms and tokens >= block_len > 0:
            self._ms[block_len] = ms * block_len / tokens

    def starved(self, block_len: int) -> None:
        """A request had time left but ran no step because the estimate said none fits.

        Only a step that runs updates the estimate, so one slow step (a cold start, a busy
        machine) would otherwise stop every later request at zero steps, for good. Each
        starved request shrinks the estimate until a step is tried and measured again.
        """
        if block_len in self._ms:
            self._ms[block_len] *= STARVED_DECAY


def partial_region(region: str, cursor: int, left: str) -> str | None:
    """The new region for a confident left part `left` of the model's region, or None.

    Only an insertion at the cursor can be read off a left part (what follows it
    is unknown): `left` must repeat the region up to the cursor and go beyond it.
    The inserted text is cut at a boundary a user can accept: mid-line, the rest
    of the cursor line; at the end of a line, whole lines if it has any; else the
    last whole word (a token may be half an identifier).
    """
    before = region[:cursor]
    if not left.startswith(before) or len(left) <= cursor:
        return None
    ins = left[cursor:]
    eol = region.find("\n", cursor)
    rest_of_line = region[cursor:] if eol < 0 else region[cursor:eol]
    if rest_of_line.strip() or "\n" not in ins:
        ins = ins.split("\n", 1)[0]
        k = len(ins)
        while k > 0 and (ins[k - 1].isalnum() or ins[k - 1] == "_"):
            k -= 1
        ins = ins[:k]
    else:
        ins = ins[: ins.rfind("\n")]
    if not ins.strip():
        return None
    return before + ins + region[cursor:]


@dataclass
class DecodeStats:
    steps: int = 0
    committed: int = 0  # content tokens and <eom> committed by the sampler
    committed_per_step: list[int] = field(default_factory=list)
    blocks: int = 0
    prefill_ms: float = 0.0
    denoise_ms: float = 0.0
    context_tokens: int = 0
    cached_tokens: int = 0
    cancelled: bool = False
    out_of_time: bool = False  # stopped before the block was done: the deadline left no room for a step
    late: bool = False  # finished after the deadline
    forced_by_deadline: int = 0  # steps that committed more slots than the step budget asked, to be on time
    # how the answer's end was committed: "eom" (the model wrote <eom>), "pad" (it wrote <pad>,
    # which ends the answer the same way), "length" (length-aware decoding); "" = no end yet
    ended_by: str = ""


def output_head(model: DLM, tok: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """LM-head rows the sampler may commit, and the token id of each row.

    Only content tokens, <eom> and <pad> are outputs: layout markers, <mask> and
    vocabulary rows beyond the tokenizer are never committed. Dropping their rows
    (instead of masking logits) keeps the fused unmask kernel usable.
    Returns weight (V', dim) and token_of_row (V',) int64; cached on the model.
    """
    w = model.lm_head_weight
    cached = getattr(model, "_output_head", None)
    if cached is not None and cached[0] is w and cached[1].device == w.device:
        return cached[1], cached[2]
    ids = [tok.pad_id, tok.eom_id] + list(range(len(SPECIAL_TOKENS), min(tok.vocab_size, w.shape[0])))
    token_of_row = torch.tensor(ids, dtype=torch.long, device=w.device)
    sub = w.detach()[token_of_row].contiguous()  # (V', dim)
    model._output_head = (w, sub, token_of_row)
    return sub, token_of_row


def planned_end(ended: list[float], threshold: float) -> int | None:
    """Length-aware decoding's end slot: the first slot whose P(the answer has ended there),
    p(<eom>) + p(<pad>), reaches `threshold` (the median of the model's length distribution at
    0.5); None when none does (the answer runs on past the block)."""
    return next((j for j, e in enumerate(ended) if e >= threshold), None)


def newline_rows(model: DLM, tok: Tokenizer) -> torch.Tensor:
    """Rows of the output head (output_head) whose token is whitespace holding a line break:
    the tokens that make blank lines. Bool (V',); cached on the model."""
    _w, token_of_row = output_head(model, tok)
    cached = getattr(model, "_newline_rows", None)
    if cached is not None and cached[0] is token_of_row:
        return cached[1]
    ids = token_of_row.tolist()
    texts = [tok.decode([t]) for t in ids]
    rows = torch.tensor([t not in (tok.pad_id, tok.eom_id) and "\n" in x and not x.strip()
                         for t, x in zip(ids, texts)], dtype=torch.bool, device=token_of_row.device)
    model._newline_rows = (token_of_row, rows)
    return rows


class BlockDecoder:
    """Decoding state of one request."""

    def __init__(
        self,
        model: DLM,
        tok: Tokenizer,
        context_ids: list[int],
        params: SamplerParams,
        cache: PrefixCache | None = None,
        cancel: CancelToken | None = None,
        *,
        deadline: float | None = None,
        step_timer: StepTimer | None = None,
        calibration: Calibration | None = None,
        prompt: Prompt | None = None,
        clock=time.monotonic,
    ) -> None:
        """`deadline` is absolute (`clock()` time, time.monotonic by default); `step_timer` is the
        engine's (a private one when None: no estimate before the first step); `prompt` lets a
        partial answer become a region (without it, running out of time answers nothing)."""
        self.model, self.tok, self.params = model, tok, params
        self.context_ids = list(context_ids)
        self.cache = cache if cache is not None else PrefixCache()
        self.cancel = cancel or CancelToken()
        self.deadline = deadline
        self.step_timer = step_timer if step_timer is not None else StepTimer()
        self.calibration = calibration if calibration is not None else Calibration.identity()
        self.prompt = prompt
        self.clock = clock
        self.stats = DecodeStats(context_tokens=len(self.context_ids))
        self.output: list[int] = []  # committed content of finished blocks
        self.output_probs: list[float] = []  # probability of each token in output
        self.eom_prob: float | None = None  # probability of the committed <eom> (None: no <eom>)
        self.slots: list[int] = []  # current block: token id or UNSET
        self.slot_probs: list[float] = []  # current block: probability of each committed slot
        self.block_steps = 0
        self.done = False
        self.ended = False  # an <eom> was produced
        self._mark: float | None = None  # perf_counter at the end of the prefill / the last step
        self._gen = torch.Generator().manual_seed(params.seed) if params.temperature > 0 else None

    # -- lifecycle -------------------------------------------------------------
    def prefill(self) -> None:
        self.stats.cached_tokens = self._prefill_context()
        self._new_block()
        self._mark = time.perf_counter()

    def _prefill_context(self) -> int:
        """Bring the cache up to self.context_ids; returns the tokens reused."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            reused = self.model.prefill(self.context_ids, self.cache)
        ms = (time.perf_counter() - t0) * 1000
        self.stats.prefill_ms += ms
        self.step_timer.seed_from_prefill(self.params.block_len, len(self.context_ids) - reused, ms)
        return reused

    def _new_block(self) -> None:
        self.slots = [UNSET] * self.params.block_len
        self.slot_probs = [0.0] * self.params.block_len
        self.block_steps = 0
        self.stats.blocks += 1

    # -- deadline ----------------------------------------------------------------
    def time_left_s(self) -> float | None:
        """Seconds before the deadline minus the margin kept for the reply; None without a deadline."""
        if self.deadline is None:
            return None
        return self.deadline - DEADLINE_MARGIN_S - self.clock()

    def steps_affordable(self) -> int | None:
        """Whole steps that fit before the deadline by the engine's estimate; None when unknown."""
        left = self.time_left_s()
        if left is None:
            return None
        est = self.step_timer.estimate_ms(self.params.block_len)
        if est is None:
            # nothing measured yet: one step is allowed while there is time, and it seeds the estimate
            return 1 if left > 0 else 0
        return max(0, math.floor(left * 1000 / max(est, 1e-3)))

    def check_deadline(self) -> bool:
        """Before a step: stop (out of time) when no step fits before the deadline."""
        if not self.done and self.deadline is not None and self.steps_affordable() == 0:
            self.stats.out_of_time = True
            self.done = True
            left = self.time_left_s()
            if self.stats.steps == 0 and left is not None and left > 0:
                self.step_timer.starved(self.params.block_len)
        return self.done

    def block_input(self) -> torch.Tensor:
        """Block tokens (L,) with <mask> in uncommitted slots."""
        m = self.tok.mask_id
        return torch.tensor([m if s == UNSET else s for s in self.slots], dtype=torch.long)

    def check_cancel(self) -> bool:
        """Before a step: True when the request is over (cancelled, out of time, or done)."""
        if self.cancel.cancelled and not self.done:
            self.stats.cancelled = True
            self.done = True
        if not self.done:
            self.check_deadline()
        return self.done

    # -- one step ----------------------------------------------------------------
    def _row_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores (M, V') over the output head's rows for block slots with final hidden states
        (M, dim): the LM head's logits, or, for a model with a copy head, the log of its
        mixture over the context (plain torch: the fused kernel knows no copy head)."""
        w, token_of_row = output_head(self.model, self.tok)
        if self.model.copy_head is None:
            return hidden.float() @ w.float().t()
        return self.model.log_probs(hidden, self.cache)[:, token_of_row]

    def advance(self, hidden: torch.Tensor) -> None:
        """Commit slots given the block's final hidden states (L, dim)."""
        p = self.params
        n_planned = 0  # <eom> committed by length-aware decoding (0 or 1)
        if self.block_steps == 0 and p.end_threshold > 0 and p.order == "confidence":
            n_planned = self._plan_length(hidden)
        masked = [i for i, s in enumerate(self.slots) if s == UNSET]
        if not masked:  # the answer ended at the block's first slot: nothing to write
            self.block_steps += 1
            self.stats.steps += 1
            if self._mark is not None:
                self.step_timer.observe(p.block_len, (time.perf_counter() - self._mark) * 1000)
            self.stats.committed += n_planned
            self.stats.committed_per_step.append(n_planned)
            self._finish_block()
            self._mark = time.perf_counter()
            return
        pos = torch.tensor(masked, dtype=torch.long, device=hidden.device)
        tokens, conf = self._score(hidden, pos)
        tokens, conf = tokens.tolist(), conf.float().tolist()
        if p.repeat_penalty > 0:
            self._penalise_repeats(hidden, pos, masked, tokens, conf)

        self.block_steps += 1
        self.stats.steps += 1
        if self._mark is not None:  # since the prefill or the last step: this step's forward pass
            self.step_timer.observe(p.block_len, (time.perf_counter() - self._mark) * 1000)
        steps_left = max(p.steps - self.block_steps + 1, 1)
        need = max(1, math.ceil(len(masked) / steps_left))  # finish within the step budget
        affordable = self.steps_affordable()  # steps after this one that fit before the deadline
        if affordable is not None:
            on_time = math.ceil(len(masked) / (affordable + 1))  # this step and `affordable` more
            if on_time > need:
                need = on_time
                self.stats.forced_by_deadline += 1
        if p.order == "left_to_right":
            # leftmost slot first, then further slots left to right while above threshold
            chosen = [0]
            for j in range(1, len(masked)):
                if len(chosen) >= need and not conf[j] > p.threshold:
                    break
                chosen.append(j)
        else:
            ranked = sorted(range(len(masked)), key=lambda j: -conf[j])
            chosen = [j for j in ranked if conf[j] > p.threshold]
            if len(chosen) < need:
                chosen = ranked[:need]

        probs = conf if self._conf_is_prob() else self._token_probs(hidden, pos, chosen, tokens)
        enders = (self.tok.eom_id, self.tok.pad_id)
        first_end = None
        for j in chosen:
            slot = masked[j]
            self.slots[slot] = tokens[j]
            self.slot_probs[slot] = probs[j]
            if tokens[j] in enders and (first_end is None or slot < first_end):
                first_end = slot
                self.stats.ended_by = "eom" if tokens[j] == self.tok.eom_id else "pad"
        n_committed = len(chosen)
        if first_end is not None:
            # everything after the end marker is padding: no steps spent on it
            n_committed = sum(1 for j in chosen if masked[j] <= first_end)
            self.slots[first_end] = self.tok.eom_id
            for i in range(first_end + 1, len(self.slots)):
                self.slots[i] = self.tok.pad_id
                self.slot_probs[i] = 0.0
        n_committed += n_planned
        self.stats.committed += n_committed
        self.stats.committed_per_step.append(n_committed)

        if UNSET not in self.slots:
            self._finish_block()
        self._mark = time.perf_counter()

    # -- against degenerate answers --------------------------------------------------
    def _plan_length(self, hidden: torch.Tensor) -> int:
        """Length-aware decoding at a block's first step: commit <eom> at the first slot where
        p(<eom>) + p(<pad>) reaches `end_threshold` (slots after it become <pad>). Returns the
        slots committed (1 or 0)."""
        logits = self._row_logits(hidden)  # (L, V'); rows 0 and 1 are <pad> and <eom>
        if self.params.temperature > 0:
            logits = logits / self.params.temperature
        probs = torch.softmax(logits, dim=-1)
        ended = (probs[:, 0] + probs[:, 1]).tolist()  # (L,)
        k = planned_end(ended, self.params.end_threshold)
        if k is None:
            return 0  # the model expects the answer to go on past this block
        self.slots[k] = self.tok.eom_id
        self.slot_probs[k] = ended[k]
        self.stats.ended_by = "length"
        for i in range(k + 1, len(self.slots)):
            self.slots[i] = self.tok.pad_id
            self.slot_probs[i] = 0.0
        return 1

    def _neighbours(self, i: int) -> tuple[list[int], list[int]]:
        """Committed content tokens next to slot i: (left, nearest last; right, nearest first),
        up to 2 * MAX_REPEAT_PERIOD each; the left side runs on into the finished blocks."""
        enders = (self.tok.eom_id, self.tok.pad_id)
        n = 2 * MAX_REPEAT_PERIOD
        left: list[int] = []
        j = i - 1
        while j >= 0 and len(left) < n and self.slots[j] != UNSET:
            left.append(self.slots[j])
            j -= 1
        if j < 0:
            left.extend(reversed(self.output[-(n - len(left)) :]) if len(left) < n else [])
        right: list[int] = []
        j = i + 1
        while j < len(self.slots) and len(right) < n and self.slots[j] != UNSET and self.slots[j] not in enders:
            right.append(self.slots[j])
            j += 1
        return left[::-1], right

    def _repeats(self, i: int) -> tuple[set[int], bool]:
        """(tokens that would repeat next to slot i, whether a line break there makes a second
        blank line in a row)."""
        left, right = self._neighbours(i)
        out: set[int] = set()
        if left:
            out.add(left[-1])
        if right:
            out.add(right[0])
        for n in range(2, MAX_REPEAT_PERIOD + 1):
            if len(left) >= 2 * n and left[-n:] == left[-2 * n : -n]:
                out.add(left[-n])  # two copies to the left: the third would start here
            if len(right) >= 2 * n and right[:n] == right[n : 2 * n]:
                out.add(right[n - 1])
        # a line break here joins the breaks that end the left side and start the right side
        # (slots are committed in any order): two or more already make it a second blank line
        before = _TRAILING_BREAKS.search(self.tok.decode(left[-4:])) if left else None
        after = _LEADING_BREAKS.search(self.tok.decode(right[:4])) if right else None
        breaks = (before.group(0).count("\n") if before else 0) + (after.group(0).count("\n") if after else 0)
        return out, breaks >= 2

    def _penalise_repeats(self, hidden: torch.Tensor, pos: torch.Tensor, masked: list[int],
                          tokens: list[int], conf: list[float]) -> None:
        """Rescore (in place) the slots whose best token repeats its neighbourhood, with the
        logits of every repeating token lowered by `repeat_penalty`."""
        nl_rows = None
        todo: list[tuple[int, set[int], bool]] = []
        for j, slot in enumerate(masked):
            reps, blank = self._repeats(slot)
            if blank and nl_rows is None:
                nl_rows = newline_rows(self.model, self.tok)
            tok_is_newline = blank and "\n" in (t := self.tok.decode([tokens[j]])) and not t.strip()
            if tokens[j] in reps or tok_is_newline:
                todo.append((j, reps, blank))
        if not todo:
            return
        p = self.params
        _w, token_of_row = output_head(self.model, self.tok)
        row_of_token = getattr(self.model, "_row_of_token", None)
        if row_of_token is None or len(row_of_token) != len(token_of_row):
            row_of_token = {int(t): r for r, t in enumerate(token_of_row.tolist())}
            self.model._row_of_token = row_of_token
        idx = torch.tensor([j for j, _r, _b in todo], dtype=torch.long, device=hidden.device)
        logits = self._row_logits(hidden[pos[idx]])  # (T, V')
        for r, (_j, reps, blank) in enumerate(todo):
            rows = [row_of_token[t] for t in reps if t in row_of_token]
            if rows:
                logits[r, rows] -= p.repeat_penalty
            if blank:
                logits[r, nl_rows] -= p.repeat_penalty
        if p.temperature > 0:
            logits = logits / p.temperature
            probs = torch.softmax(logits, dim=-1)
            picked = torch.multinomial(probs.cpu(), 1, generator=self._gen).squeeze(1).to(hidden.device)
            _, c = reference_ops.confidence_from_logits(logits, p.rule)
            if p.rule == "max_prob":
                c = probs.gather(1, picked[:, None]).squeeze(1)
        else:
            picked, c = reference_ops.confidence_from_logits(logits, p.rule)
        new_tokens, new_conf = token_of_row[picked].tolist(), c.float().tolist()
        for r, (j, _reps, _blank) in enumerate(todo):
            tokens[j], conf[j] = new_tokens[r], new_conf[r]

    def _conf_is_prob(self) -> bool:
        """With the max_prob rule the score of a slot is the probability of the token it commits."""
        return self.params.rule == "max_prob"

    def _token_probs(self, hidden: torch.Tensor, pos: torch.Tensor, chosen: list[int], tokens: list[int]) -> list[float]:
        """Probability of each chosen slot's token (margin/entropy rules score slots otherwise).

        Only the chosen slots: one extra (len(chosen), V') product per step. Index j of the
        result matches index j of `pos`; slots not chosen get 0.
        """
        _w, token_of_row = output_head(self.model, self.tok)
        idx = torch.tensor(chosen, dtype=torch.long, device=hidden.device)
        logits = self._row_logits(hidden[pos[idx]])  # (C, V')
        if self.params.temperature > 0:
            logits = logits / self.params.temperature
        probs = torch.softmax(logits, dim=-1)  # (C, V')
        row_of_token = {int(t): r for r, t in enumerate(token_of_row.tolist())}
        rows = torch.tensor([row_of_token.get(tokens[j], 0) for j in chosen], dtype=torch.long, device=hidden.device)
        picked = probs.gather(1, rows[:, None]).squeeze(1).tolist()  # (C,)
        out = [0.0] * len(tokens)
        for j, pj in zip(chosen, picked):
            out[j] = pj
        return out

    def _score(self, hidden: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        w, token_of_row = output_head(self.model, self.tok)
        if p.temperature == 0 and self.model.copy_head is None:
            rows, conf = kernels.unmask_scores(hidden, w, pos, p.rule, impl=self.model.impl)
            return token_of_row[rows], conf
        if p.temperature == 0:
            rows, conf = reference_ops.confidence_from_logits(self._row_logits(hidden[pos]), p.rule)
            return token_of_row[rows], conf
        logits = self._row_logits(hidden[pos]) / p.temperature  # (M, V')
        probs = torch.softmax(logits, dim=-1)
        rows = torch.multinomial(probs.cpu(), 1, generator=self._gen).squeeze(1).to(hidden.device)
        _, conf = reference_ops.confidence_from_logits(logits, p.rule)
        if p.rule == "max_prob":
            conf = probs.gather(1, rows[:, None]).squeeze(1)
        return token_of_row[rows], conf

    def _finish_block(self) -> None:
        enders = (self.tok.eom_id, self.tok.pad_id)
        content, probs = [], []
        for s, prob in zip(self.slots, self.slot_probs):
            if s in enders:
                self.ended = True
                self.eom_prob = prob
                break
            content.append(s)
            probs.append(prob)
        self.output.extend(content)
        self.output_probs.extend(probs)
        if self.ended or self.stats.blocks >= self.params.max_blocks:
            self.done = True
            return
        if self.check_deadline():  # no time for a second block: the answer is the first one's left part
            self.slots, self.slot_probs = [], []
            return
        # block diffusion: the finished block becomes context of the next
        self.context_ids.extend(self.slots)
        self._prefill_context()
        self._new_block()

    def text(self) -> str:
        return self.tok.decode(self.output)

    @property
    def complete(self) -> bool:
        """The model finished its answer (<eom>, or the block budget) without running out of time."""
        return self.done and not self.stats.cancelled and not self.stats.out_of_time

    def left_part(self) -> tuple[list[int], list[float]]:
        """The committed left part of the answer: the finished blocks' tokens, then the current
        block's, from the start up to the first one not committed or below `threshold` (tokens,
        probs)."""
        ids: list[int] = []
        probs: list[float] = []
        enders = (self.tok.eom_id, self.tok.pad_id)
        for s, prob in zip(self.output + self.slots, self.output_probs + self.slot_probs):
            if s == UNSET or s in enders or prob < self.params.threshold:
                break
            ids.append(s)
            probs.append(prob)
        return ids, probs

    def raw_confidences(self) -> dict[str, float]:
        """Every CONFIDENCE_KINDS score of the answer (content slots and <eom>); 0 unless complete."""
        if not self.complete:
            return {k: 0.0 for k in CONFIDENCE_KINDS}
        probs = self.output_probs + ([self.eom_prob] if self.eom_prob is not None else [])
        return {k: raw_confidence(probs, k) for k in CONFIDENCE_KINDS}

    @property
    def unterminated(self) -> bool:
        """The blocks ran out before the model wrote an end: the answer stops mid-thought."""
        return self.complete and not self.ended

    def answer(self) -> tuple[str, float]:
        """(new region text, calibrated confidence) of the request as it stands.

        Complete: the decoded region. Out of time: the confident left part as an insertion
        (`partial_region`), else no change (the prompt's region, or "" without a prompt), with
        confidence 0. Unterminated (no <eom> in max_blocks blocks): never shown as a region that
        stops mid-thought; like a late answer, only its whole lines (or words) inserted at the
        cursor, scored without an <eom>. Cancelled: "".
        """
        s = self.stats
        if s.cancelled:
            return "", 0.0
        if self.complete and (self.ended or self.prompt is None):
            probs = self.output_probs + ([self.eom_prob] if self.eom_prob is not None else [])
            text = self.text() if self.prompt is None else new_region(self.prompt, self.text())
            return text, self.calibration(raw_confidence(probs, self.calibration.kind))
        nothing = self.prompt.region if self.prompt is not None else ""
        if self.prompt is None:
            return nothing, 0.0
        ids, probs = (self.output, self.output_probs) if self.unterminated else self.left_part()
        # the left part of the new region: for an insertion (Prompt.insert), what precedes the cursor
        decoded = self.tok.decode(ids)
        left = self.prompt.region[: self.prompt.cursor] + decoded if self.prompt.insert else decoded
        region = partial_region(self.prompt.region, self.prompt.cursor, left)
        if region is None:
            return nothing, 0.0
        # no <eom> was committed: the score covers the kept slots only, which is what is shown
        return region, self.calibration(raw_confidence(probs, self.calibration.kind))

    def prediction(self, queue_ms: float = 0.0) -> Prediction:
        """The Engine-level result of this request (late when finished after its deadline)."""
        s = self.stats
        if self.deadline is not None and self.clock() > self.deadline:
            s.late = True
        text, confidence = self.answer()
        return Prediction(
            text=text,
            confidence=confidence,
            late=s.late,
            steps=s.steps,
            tokens=s.committed,
            queue_ms=queue_ms,
            prefill_ms=s.prefill_ms,
            denoise_ms=s.denoise_ms,
            cancelled=s.cancelled,
            context_tokens=s.context_tokens,
            cached_tokens=s.cached_tokens,
            blocks=s.blocks,
        )


def generate(model: DLM, tok: Tokenizer, context_ids: list[int], params: SamplerParams, **options) -> BlockDecoder:
    """Decode one request to the end (or until cancelled or out of time); returns its decoder.

    `options` go to BlockDecoder by name: cache, cancel, deadline, step_timer, calibration,
    prompt, clock.
    """
    dec = BlockDecoder(model, tok, context_ids, params, **options)
    if dec.check_cancel():  # cancelled, or no time left for a step (it queued too long): no model work
        return dec
    dec.prefill()
    dev = model.tok_emb.weight.device
    t0 = time.perf_counter()
    prefill_before = dec.stats.prefill_ms
    with torch.inference_mode():
        while not dec.check_cancel():
            hidden = model.forward(
                dec.block_input().to(dev)[None],
                start_pos=len(dec.cache),
                context_len=len(dec.cache),
                cache=dec.cache,
            )[0]  # (L, dim)
            dec.advance(hidden)
            if dec.done:
                break
    # block extension prefills inside the loop: count that time as prefill only
    extension_ms = dec.stats.prefill_ms - prefill_before
    dec.stats.denoise_ms += (time.perf_counter() - t0) * 1000 - extension_ms
    return dec
