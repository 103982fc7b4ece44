"""Refinement of the repository memory's best draft: the block starts from the draft, not from masks.

For a model trained to start from a draft (ModelConfig.draft_start; the trainer's --draft-start;
docs/architecture.md §4): the first proposal's tokens, then <eom>, fill the
block. Each step the model reads the whole block and proposes a token for every slot; every slot
where it proposes another token with probability above `params.threshold` is rewritten at once,
in parallel. The run ends when a step rewrites nothing, at `params.steps`, or at the deadline.
The answer is the block up to its first <eom>; its confidence is the calibrated mean of its
tokens' probabilities, as the sampler's. A kept draft token is not a committed one:
`Prediction.tokens` counts the rewritten slots only, so tokens per step measures the parallel
rewriting.
"""

from __future__ import annotations

import time

import torch
from dlm.coder_model.confidence_calibration import Calibration
from dlm.coder_model.layout import encode_target, new_region
from dlm.coder_model.sampler import DEADLINE_MARGIN_S, output_head, raw_confidence
from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams


def draft_block(tok, draft: str, block_len: int) -> list[int]:
    """The block a run starts from: the draft's tokens and <eom>, cut or padded with <pad> to
    `block_len` (a draft longer than the block loses its end and its <eom>)."""
    ids = encode_target(tok, draft)[:block_len]
    return ids + [tok.pad_id] * (block_len - len(ids))


def refine(model, tok, context_ids: list[int], draft: str, params: SamplerParams, *, cache,
           cancel: CancelToken | None = None, deadline: float | None = None,
           calibration: Calibration | None = None, prompt: Prompt | None = None,
           queue_ms: float = 0.0) -> Prediction:
    """The draft refined by the model in one block (module docstring); `prompt` makes the answer
    a new region (Prompt.insert: the draft is an insertion at the cursor)."""
    cancel = cancel or CancelToken()
    calibration = calibration or Calibration.identity()
    if cancel.cancelled:
        return Prediction(text="", cancelled=True, queue_ms=queue_ms)
    dev = model.tok_emb.weight.device
    w, token_of_row = output_head(model, tok)
    row_of = {int(t): r for r, t in enumerate(token_of_row.tolist())}
    slots = draft_block(tok, draft, params.block_len)
    probs = [0.0] * len(slots)
    t0 = time.perf_counter()
    with torch.inference_mode():
        reused = model.prefill(context_ids, cache)
        prefill_ms = (time.perf_counter() - t0) * 1000
        steps = changed_total = 0
        t1 = time.perf_counter()
        while steps < max(1, params.steps):
            if cancel.cancelled:
                return Prediction(text="", cancelled=True, queue_ms=queue_ms, steps=steps)
            if deadline is not None and steps and time.monotonic() > deadline - DEADLINE_MARGIN_S:
                break  # the draft as refined so far
            hidden = model.forward(torch.tensor(slots, dtype=torch.long, device=dev)[None],
                                   start_pos=len(cache), context_len=len(cache), cache=cache)[0]
            if model.copy_head is None:
                scores = hidden.float() @ w.float().t()
            else:  # the copy head's mixture over the context, as the sampler reads it
                scores = model.log_probs(hidden, cache)[:, token_of_row]
            p = torch.softmax(scores, dim=-1)  # (L, V'): the slots' outputs
            best_p, best_row = p.max(-1)
            best = token_of_row[best_row].tolist()
            current = torch.tensor([row_of.get(s, 0) for s in slots], dtype=torch.long, device=dev)
            kept_p = p.gather(1, current[:, None]).squeeze(1).tolist()
            best_p = best_p.tolist()
            steps += 1
            changed = 0
            for i, (b, bp) in enumerate(zip(best, best_p)):
                if b != slots[i] and bp > params.threshold:
                    slots[i], probs[i] = b, bp
                    changed += 1
                else:
                    probs[i] = kept_p[i]
            changed_total += changed
            if not changed:
                break
        denoise_ms = (time.perf_counter() - t1) * 1000
    content: list[int] = []
    kept: list[float] = []
    ended = False
    for s, pr in zip(slots, probs):
        kept.append(pr)
        if s in (tok.eom_id, tok.pad_id):
            ended = True
            break
        content.append(s)
    text = tok.decode(content)
    region = new_region(prompt, text) if prompt is not None else text
    confidence = calibration(raw_confidence(kept, calibration.kind)) if ended else 0.0
    if not ended and prompt is not None:
        region = prompt.region  # no end in the block: an answer that stops mid-thought is not shown
    late = deadline is not None and time.monotonic() > deadline
    return Prediction(text=region, confidence=confidence, late=late, steps=steps, tokens=changed_total,
                      queue_ms=queue_ms, prefill_ms=prefill_ms, denoise_ms=denoise_ms,
                      context_tokens=len(context_ids), cached_tokens=reused, blocks=1)
