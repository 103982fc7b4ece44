"""Infilling with an open diffusion coder: `prefix [MASK]xL suffix`.

One request:
1. Span length. The right L is unknown (the model writes content, then
   end-of-text/pad tokens in the slots it does not need). Each candidate L
   gets one full forward pass with every slot masked; the L whose slots the
   model is on average most confident about wins (ties: the shorter). The
   winner's pass is reused as the first denoising step, so a search over n
   lengths costs n - 1 extra passes.
2. Denoising with Fast-dLLM's confidence-threshold parallel decoding: each
   step commits every masked slot whose confidence is above `threshold`, and
   at least one (more when the step budget requires it).
3. Approximate dual cache (Fast-dLLM): a full pass computes K/V of the context
   (prefix and suffix) once; the next k-1 steps run only the block, attending
   to those cached K/V, which go stale as the block fills in and are refreshed
   by a full pass every k steps.
4. The span's content ends at its first end-of-text/pad token; once such a
   token is committed at slot j, the masked slots after j become pad at once.

Logit alignment is the family's: dream (shifted) reads slot j's distribution
at position P+j-1, llada (unshifted) at P+j. For shifted models the block's
query window therefore starts one token early (the last prefix token is
recomputed each step rather than cached) and the prefix is never empty.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from dlm.coder_model.families.arch import FamilyTokens
from dlm.coder_model.families.transformer import BidirectionalLM, KVCache
from dlm.coder_model.types import CancelToken, SamplerParams


@dataclass
class InfillOptions:
    lengths: tuple[int, ...] = (8, 16, 32)  # candidate span lengths, capped by SamplerParams.block_len
    dual_cache: bool = True
    refresh_every: int = 4  # k: full pass (fresh context K/V) every k steps
    fill_after_eos: bool = True  # slots after a committed end token become pad without steps
    add_bos: bool | None = None  # None: llada always, dream only when the prefix is empty
    max_prefix_tokens: int = 1536
    max_suffix_tokens: int = 512

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.lengths):
            raise ValueError(f"lengths={self.lengths}: every candidate span length must be >= 1")
        if self.refresh_every < 1:
            raise ValueError(f"refresh_every={self.refresh_every}: use 1 (exact) or more")


@dataclass
class InfillResult:
    tokens: list[int]  # the span's content (cut at its first end token)
    raw: list[int]  # every slot of the span as decoded
    length: int  # the chosen L
    ended: bool  # an end token was committed inside the span
    steps: int = 0
    committed: int = 0  # slots committed by steps (not pad-filled)
    prefill_ms: float = 0.0
    denoise_ms: float = 0.0
    cancelled: bool = False
    scores: dict[int, float] = field(default_factory=dict)  # length -> probe confidence
    context_tokens: int = 0


def confidence(logits: torch.Tensor, rule: str, temperature: float, gen: torch.Generator | None):
    """(token, confidence in [0, 1]) per row of fp32 logits (L, V).

    max_prob: p(token); margin: p1 - p2; entropy: exp(-H), so that one
    `threshold` in [0, 1] means "sure enough" under every rule.
    """
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # (L, V)
    p = logp.exp()
    if temperature > 0:
        tok = torch.multinomial(p, 1, generator=gen).squeeze(-1)  # (L,)
    else:
        tok = p.argmax(-1)
    if rule == "max_prob":
        conf = p.gather(-1, tok[:, None]).squeeze(-1)
    elif rule == "margin":
        top2 = p.topk(2, dim=-1).values
        conf = top2[:, 0] - top2[:, 1]
    elif rule == "entropy":
        conf = (p * logp).nan_to_num(0.0).sum(-1).exp()
    else:
        raise ValueError(f"unknown confidence rule {rule!r}: use max_prob, margin or entropy")
    return tok, conf


def select_slots(
    conf: torch.Tensor, masked: torch.Tensor, threshold: float, n_min: int, order: str
) -> list[int]:
    """Slots to commit this step. conf (L,) fp32, masked (L,) bool.

    confidence order: every masked slot above threshold, at least n_min (the
    most confident). left_to_right: the leftmost masked slot, then the next
    masked slots while they are above threshold (or needed for n_min).
    """
    cand = masked.nonzero().flatten().tolist()
    if not cand:
        return []
    n_min = max(1, min(n_min, len(cand)))
    if order == "left_to_right":
        sel = [cand[0]]
        for c in cand[1:]:
            if len(sel) < n_min or conf[c] > threshold:
                sel.append(c)
            else:
                break
        return sel
    c = conf.masked_fill(~masked, float("-inf"))
    n = max(n_min, int(((c > threshold) & masked).sum()))
    return c.topk(n).indices.tolist()


def pick_length(scores: dict[int, float]) -> int:
    """The length with the highest probe confidence; ties go to the shorter."""
    return min(scores, key=lambda n: (-scores[n], n))


def candidate_lengths(options: InfillOptions, block_len: int) -> list[int]:
    return sorted({n for n in options.lengths if n <= block_len} | {block_len})


class InfillDecoder:
    def __init__(self, model: BidirectionalLM, tokens: FamilyTokens, options: InfillOptions | None = None):
        self.model = model
        self.tok = tokens
        self.options = options or InfillOptions()
        self.shift = 1 if model.arch.shift_logits else 0
        self.device = model.embed.weight.device
        self.pad_id = (
            tokens.pad_id if tokens.pad_id is not None else (tokens.eos_ids[0] if tokens.eos_ids else None)
        )
        self._end = set(tokens.eos_ids)

    # -- layout ---------------------------------------------------------------------------------
    def layout(self, prefix: list[int], suffix: list[int]) -> list[int]:
        """The prefix the model sees: BOS per family rule (a shifted model needs a token before slot 0)."""
        add = self.options.add_bos
        if add is None:
            add = (self.tok.bos_id is not None) if not self.shift else not prefix
        if add:
            start = self.tok.bos_id if self.tok.bos_id is not None else self.pad_id
            if start is None and self.shift:
                raise ValueError(
                    "empty prefix and no bos/eos/pad token id: a shifted model cannot predict slot 0"
                )
            if start is not None and (not prefix or prefix[0] != start):
                prefix = [start] + prefix
        return prefix

    def _slot_logits(self, hidden: torch.Tensor, rows: slice) -> torch.Tensor:
        logits = self.model.logits(hidden[0, rows])  # (L, V) fp32
        logits[:, self.tok.mask_id] = float("-inf")  # the mask token is never an answer
        return logits

    def _full(self, ids: torch.Tensor, P: int, L: int, want_kv: bool):
        """Full pass. Returns slot logits (L, V) and the context K/V (outside the window) if wanted."""
        N = ids.shape[1]
        pos = torch.arange(N, device=self.device)
        hidden, kv = self.model(ids, pos, want_kv=want_kv, max_pos=N - 1)  # (1, N, d)
        w0 = P - self.shift
        logits = self._slot_logits(hidden, slice(w0, w0 + L))
        ctx: KVCache | None = None
        if want_kv:
            # context = positions [0, w0) and [P+L, N); the window [w0, P+L) is recomputed each step
            ctx = [
                (
                    torch.cat([k[:, :, :w0], k[:, :, P + L :]], dim=2),
                    torch.cat([v[:, :, :w0], v[:, :, P + L :]], dim=2),
                )
                for k, v in kv
            ]
        return logits, ctx

    def _window(self, ids: torch.Tensor, P: int, L: int, ctx: KVCache) -> torch.Tensor:
        w0 = P - self.shift
        pos = torch.arange(w0, P + L, device=self.device)  # (L + shift,)
        hidden, _ = self.model(ids[:, w0 : P + L], pos, kv_cache=ctx, max_pos=P + L - 1)  # (1, L + shift, d)
        return self._slot_logits(hidden, slice(0, L))

    # -- decoding -------------------------------------------------------------------------------
    @torch.no_grad()
    def infill(
        self, prefix: list[int], suffix: list[int], params: SamplerParams, cancel: CancelToken | None = None
    ) -> InfillResult:
        opt = self.options
        prefix = self.layout(list(prefix), list(suffix))
        P, S = len(prefix), len(suffix)
        gen = torch.Generator(device=self.device).manual_seed(params.seed) if params.temperature > 0 else None
        mask = self.tok.mask_id

        def build(L: int) -> torch.Tensor:
            return torch.tensor([prefix + [mask] * L + suffix], dtype=torch.long, device=self.device)

        t0 = time.perf_counter()
        if cancel is not None and cancel.cancelled:
            return InfillResult([], [], 0, False, cancelled=True, context_tokens=P + S)
        lengths = candidate_lengths(opt, params.block_len)
        # Only the best probe so far keeps its logits and context K/V (an 8B model's cache
        # of a long context is ~1 GB; holding one per candidate would multiply that).
        best: tuple[torch.Tensor, KVCache | None] | None = None
        scores: dict[int, float] = {}
        for L in lengths:
            logits, ctx = self._full(build(L), P, L, want_kv=opt.dual_cache)
            _, conf = confidence(logits, "max_prob", 0.0, None)
            scores[L] = float(conf.mean())
            if pick_length(scores) == L:
                best = (logits, ctx)
            del logits, ctx
            if len(lengths) > 1 and cancel is not None and cancel.cancelled:
                return InfillResult([], [], 0, False, cancelled=True, scores=scores, context_tokens=P + S)
        L = pick_length(scores)
        assert best is not None
        logits, ctx = best
        best = None
        t1 = time.perf_counter()

        ids = build(L)
        masked = torch.ones(L, dtype=torch.bool, device=self.device)
        steps = committed = 0
        first_end: int | None = None
        while bool(masked.any()):
            if steps > 0:
                if cancel is not None and cancel.cancelled:
                    return InfillResult(
                        [],
                        [],
                        L,
                        False,
                        steps=steps,
                        cancelled=True,
                        scores=scores,
                        prefill_ms=(t1 - t0) * 1e3,
                        context_tokens=P + S,
                    )
                if not opt.dual_cache or steps % opt.refresh_every == 0:
                    logits, ctx = self._full(ids, P, L, want_kv=opt.dual_cache)
                else:
                    logits = self._window(ids, P, L, ctx)
            steps += 1
            tok, conf = confidence(logits, params.rule, params.temperature, gen)
            remaining = int(masked.sum())
            n_min = math.ceil(remaining / max(1, params.steps - steps + 1))
            for j in select_slots(conf, masked, params.threshold, n_min, params.order):
                ids[0, P + j] = tok[j]
                masked[j] = False
                committed += 1
                if int(tok[j]) in self._end and (first_end is None or j < first_end):
                    first_end = j
            if opt.fill_after_eos and first_end is not None and self.pad_id is not None:
                after = masked.clone()
                after[: first_end + 1] = False
                ids[0, P : P + L][after] = self.pad_id
                masked &= ~after
        t2 = time.perf_counter()
        raw = ids[0, P : P + L].tolist()
        content, ended = [], False
        for t in raw:
            if t in self._end:
                ended = True
                break
            content.append(t)
        return InfillResult(
            tokens=content,
            raw=raw,
            length=L,
            ended=ended,
            steps=steps,
            committed=committed,
            prefill_ms=(t1 - t0) * 1e3,
            denoise_ms=(t2 - t1) * 1e3,
            scores=scores,
            context_tokens=P + S,
        )
