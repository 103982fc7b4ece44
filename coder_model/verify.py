"""The denoiser checks the repository memory's proposals (memory proposes, the model disposes:
docs/architecture.md §10).

The memory (coder_model.memory) proposes whole insertions at the cursor; an n-gram sees only the
text before the cursor. The denoiser scores each proposal with the suffix in view: the block is
filled with the region as it would be after the insertion (edit layout) or the insertion alone
(typing layout, Prompt.insert), then `<eom>`; the proposal's slots and
the `<eom>` are masked in `passes` interleaved groups (slot i in group i mod passes), and each
masked slot is scored with every other slot visible: a pseudo-likelihood, a far better score for a
masked model than one all-masked pass (which ranked the memory's beam worse than the memory's own
order, docs/architecture.md §10). All proposals of a pass go through the model in one batched call.

`choose` (coder_model.proposal_mix, torch-free) mixes the memory's probability and the model's score (weights by measurement, `Mix`)
and may answer None: the model vetoes every proposal. `ranked` orders every proposal the model
lets through by that mixed confidence: the editor lists the runners-up as alternatives.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
from dlm.coder_model.proposal_mix import Mix, choose, ranked, region_after
from dlm.coder_model.types import MemoryProposal

__all__ = ["Mix", "Verdict", "choose", "ranked", "score_proposals"]


@dataclass(frozen=True)
class Verdict:
    index: int | None  # the chosen proposal, None: every one vetoed (or none fits the block)
    confidence: float | None
    model_scores: tuple[float | None, ...]  # per proposal (None: it did not fit the block)
    passes: int = 0  # forward passes run
    ms: float = 0.0
    # (proposal index, mixed confidence) of every proposal not vetoed, best first (`ranked`):
    # the first is `index`, the others are the alternatives an editor may cycle through
    ranked: tuple[tuple[int, float], ...] = ()


def score_proposals(model, tok, cache, region: str, cursor: int, proposals: tuple[MemoryProposal, ...],
                    block_len: int, passes: int = 2, order: str = "interleaved",
                    insert: bool = False) -> tuple[list[float | None], int]:
    """Geometric-mean probability the model gives each proposal's inserted tokens and its <eom>;
    `cache` holds the context. None for a proposal whose region does not fit one block. Returns
    (scores, passes run). `order`: "interleaved" masks slot i in pass i mod `passes` (each slot
    predicted with the others visible); "left_to_right" masks every slot from i on in pass i and
    scores slot i (iterative unmasking, one slot per pass: as many passes as the longest proposal).
    `insert` (Prompt.insert, the typing layout): the block is the insertion alone, then <eom>;
    else the region as it would be after the insertion, then <eom>."""
    before = [] if insert else tok.encode(region[:cursor])
    rows: list[list[int]] = []
    spans: list[tuple[int, int]] = []  # slots [a, b) to score: the insertion and what follows up to <eom>
    keep: list[int] = []
    for j, p in enumerate(proposals):
        ids = tok.encode(p.text if insert else region_after(region, cursor, p.text)) + [tok.eom_id]
        if len(ids) > block_len:
            continue
        a = len(os.path.commonprefix([before, ids]))
        # the block ends one <pad> after <eom> (as in training, pads follow <eom>), not at block_len:
        # the slots past it would cost every pass and say nothing about this proposal
        rows.append(ids + [tok.pad_id] * min(1, block_len - len(ids)))
        spans.append((a, len(ids)))
        keep.append(j)
    scores: list[float | None] = [None] * len(proposals)
    if not rows:
        return scores, 0
    dev = model.tok_emb.weight.device
    logp_sum = [0.0] * len(rows)
    count = [0] * len(rows)
    ran = 0
    groups = passes if order == "interleaved" else max(b - a for a, b in spans)
    with torch.inference_mode():
        for g in range(groups):
            blocks, masked = [], []
            for r, (a, b) in zip(rows, spans):
                if order == "interleaved":
                    slots = [i for i in range(a, b) if (i - a) % passes == g]
                    hidden_from = slots
                else:  # left to right: slot a+g scored with every slot after it masked
                    slots = [a + g] if a + g < b else []
                    hidden_from = list(range(a + g, b))
                blk = list(r)
                for i in hidden_from:
                    blk[i] = tok.mask_id
                blocks.append(torch.tensor(blk, dtype=torch.long))
                masked.append(slots)
            if not any(masked):
                continue
            hidden = model.forward_blocks(blocks, [cache] * len(blocks))
            ran += 1
            for k, (h, slots) in enumerate(zip(hidden, masked)):
                if not slots:
                    continue
                pos = torch.tensor(slots, dtype=torch.long, device=dev)
                logp = model.log_probs(h[pos], cache)  # with a copy head: the mixture
                target = torch.tensor([rows[k][i] for i in slots], dtype=torch.long, device=dev)
                logp_sum[k] += float(logp.gather(1, target[:, None]).sum())
                count[k] += len(slots)
    for k, j in enumerate(keep):
        scores[j] = math.exp(logp_sum[k] / count[k]) if count[k] else None
    return scores, ran


def verify(model, tok, cache, region: str, cursor: int, proposals: tuple[MemoryProposal, ...], block_len: int,
           mix: Mix, insert: bool = False) -> Verdict:
    t0 = time.perf_counter()
    if mix.passes:
        scores, ran = score_proposals(model, tok, cache, region, cursor, proposals, block_len * mix.blocks,
                                      mix.passes, insert=insert)
    else:
        scores, ran = [None] * len(proposals), 0
    order = ranked(proposals, scores, mix)
    index, conf = order[0] if order else (None, None)
    return Verdict(index, conf, tuple(scores), ran, (time.perf_counter() - t0) * 1000, tuple(order))


