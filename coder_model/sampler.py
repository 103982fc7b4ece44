"""Iterative unmasking of the masked block (DESIGN §5).

Each step runs the network over the block (context K/V come from the exact
prefix cache), scores the still-masked slots and commits every slot whose
confidence is above `threshold` (at least one, and enough that the block is
done within `steps`). When <eom> (or <pad>) is committed at slot k, every slot
after k becomes <pad> at once. A block with no <eom> is moved into the context
and a new block is appended (up to `max_blocks`). The CancelToken is checked
before every step.

`BlockDecoder` is the per-request state machine, so that a server can run the
steps of many requests in one forward pass (`DLM.forward_blocks`);
`generate` is the one-request loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from dlm import kernels
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.model import DLM
from dlm.coder_model.tokenizer import SPECIAL_TOKENS, Tokenizer
from dlm.coder_model.types import CancelToken, Prediction, SamplerParams
from dlm.kernels import reference as reference_ops

UNSET = -1  # a slot not yet committed (its input token is <mask>)


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
    ) -> None:
        self.model, self.tok, self.params = model, tok, params
        self.context_ids = list(context_ids)
        self.cache = cache if cache is not None else PrefixCache()
        self.cancel = cancel or CancelToken()
        self.stats = DecodeStats(context_tokens=len(self.context_ids))
        self.output: list[int] = []  # committed content of finished blocks
        self.slots: list[int] = []  # current block: token id or UNSET
        self.block_steps = 0
        self.done = False
        self.ended = False  # an <eom> was produced
        self._gen = torch.Generator().manual_seed(params.seed) if params.temperature > 0 else None

    # -- lifecycle -------------------------------------------------------------
    def prefill(self) -> None:
        self.stats.cached_tokens = self._prefill_context()
        self._new_block()

    def _prefill_context(self) -> int:
        """Bring the cache up to self.context_ids; returns the tokens reused."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            reused = self.model.prefill(self.context_ids, self.cache)
        self.stats.prefill_ms += (time.perf_counter() - t0) * 1000
        return reused

    def _new_block(self) -> None:
        self.slots = [UNSET] * self.params.block_len
        self.block_steps = 0
        self.stats.blocks += 1

    def block_input(self) -> torch.Tensor:
        """Block tokens (L,) with <mask> in uncommitted slots."""
        m = self.tok.mask_id
        return torch.tensor([m if s == UNSET else s for s in self.slots], dtype=torch.long)

    def check_cancel(self) -> bool:
        if self.cancel.cancelled and not self.done:
            self.stats.cancelled = True
            self.done = True
        return self.done

    # -- one step ----------------------------------------------------------------
    def advance(self, hidden: torch.Tensor) -> None:
        """Commit slots given the block's final hidden states (L, dim)."""
        masked = [i for i, s in enumerate(self.slots) if s == UNSET]
        pos = torch.tensor(masked, dtype=torch.long, device=hidden.device)
        tokens, conf = self._score(hidden, pos)
        tokens, conf = tokens.tolist(), conf.float().tolist()

        p = self.params
        self.block_steps += 1
        self.stats.steps += 1
        steps_left = max(p.steps - self.block_steps + 1, 1)
        need = max(1, math.ceil(len(masked) / steps_left))  # finish within the step budget
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

        enders = (self.tok.eom_id, self.tok.pad_id)
        first_end = None
        for j in chosen:
            slot = masked[j]
            self.slots[slot] = tokens[j]
            if tokens[j] in enders and (first_end is None or slot < first_end):
                first_end = slot
        n_committed = len(chosen)
        if first_end is not None:
            # everything after the end marker is padding: no steps spent on it
            n_committed = sum(1 for j in chosen if masked[j] <= first_end)
            self.slots[first_end] = self.tok.eom_id
            for i in range(first_end + 1, len(self.slots)):
                self.slots[i] = self.tok.pad_id
        self.stats.committed += n_committed
        self.stats.committed_per_step.append(n_committed)

        if UNSET not in self.slots:
            self._finish_block()

    def _score(self, hidden: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        w, token_of_row = output_head(self.model, self.tok)
        if p.temperature == 0:
            rows, conf = kernels.unmask_scores(hidden, w, pos, p.rule, impl=self.model.impl)
            return token_of_row[rows], conf
        logits = (hidden[pos].float() @ w.float().t()) / p.temperature  # (M, V')
        probs = torch.softmax(logits, dim=-1)
        rows = torch.multinomial(probs.cpu(), 1, generator=self._gen).squeeze(1).to(hidden.device)
        _, conf = reference_ops.confidence_from_logits(logits, p.rule)
        if p.rule == "max_prob":
            conf = probs.gather(1, rows[:, None]).squeeze(1)
        return token_of_row[rows], conf

    def _finish_block(self) -> None:
        enders = (self.tok.eom_id, self.tok.pad_id)
        content = []
        for s in self.slots:
            if s in enders:
                self.ended = True
                break
            content.append(s)
        self.output.extend(content)
        if self.ended or self.stats.blocks >= self.params.max_blocks:
            self.done = True
            return
        # block diffusion: the finished block becomes context of the next
        self.context_ids.extend(self.slots)
        self._prefill_context()
        self._new_block()

    def text(self) -> str:
        return self.tok.decode(self.output)

    def prediction(self, queue_ms: float = 0.0) -> Prediction:
        """The Engine-level result of this request."""
        s = self.stats
        return Prediction(
            text="" if s.cancelled else self.text(),
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


def generate(
    model: DLM,
    tok: Tokenizer,
    context_ids: list[int],
    params: SamplerParams,
    cache: PrefixCache | None = None,
    cancel: CancelToken | None = None,
) -> BlockDecoder:
    """Decode one request to the end (or until cancelled); returns its decoder."""
    dec = BlockDecoder(model, tok, context_ids, params, cache, cancel)
    if dec.check_cancel():
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
