"""How the repository memory's probability of a proposal and the model's score of it combine into
one confidence, and the proposals ranked by it (docs/architecture.md §10).

Pure arithmetic, no torch: the denoiser's check (coder_model.verify) ranks the proposals it
scored with it, and an engine with no denoiser (coder_model.hosted: a model behind an HTTP API)
ranks the memory's drafts by the memory's side of the same mix (`Mix(..., passes=0)`), so one
formula gives every confidence the gate sees of a proposal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dlm.coder_model.types import MemoryProposal, SamplerParams

__all__ = ["Mix", "choose", "ranked", "region_after"]


@dataclass(frozen=True)
class Mix:  # built from SamplerParams (Mix.of): the one knob set that travels with a request
    """How the memory's and the model's scores combine into one confidence (log-linear).

    confidence = sigmoid(bias + memory_weight * logit(p_memory) + model_weight * log(p_model))
    where p_model is the geometric mean probability of the proposal's slots; a proposal with
    p_model < veto is never shown. The defaults are the measured ones (BENCHMARKS.md
    "Repository memory through the server").
    """

    memory_weight: float = SamplerParams.memory_weight
    model_weight: float = SamplerParams.model_weight
    bias: float = SamplerParams.memory_bias
    veto: float = SamplerParams.veto
    passes: int = SamplerParams.verify_passes
    # A proposal is scored in one block of up to block_len * blocks slots: the sampler writes a
    # region in up to max_blocks blocks, so a region it could write is one the check can read (with
    # one block, every proposal on a long multi-line statement went unscored and was vetoed).
    blocks: int = SamplerParams.max_blocks
    first: float = SamplerParams.memory_first  # the fast path: `checked` decides with it

    @classmethod
    def of(cls, params) -> Mix:
        return cls(params.memory_weight, params.model_weight, params.memory_bias, params.veto,
                   params.verify_passes, params.max_blocks, params.memory_first)

    def checked(self, proposals: tuple[MemoryProposal, ...]) -> Mix:
        """This mix, or the memory alone (passes 0) when the memory's best proposal reaches `first`
        by its own side of the mix: the fast path, where the check would rarely change the answer."""
        if not self.passes or not proposals or self.veto > 0:
            return self
        alone = replace(self, passes=0)
        best = ranked(proposals, [None] * len(proposals), alone)
        return alone if best and best[0][1] >= self.first else self

    def combine(self, p_memory: float, p_model: float | None) -> float:
        pm = min(max(p_memory, 1e-6), 1 - 1e-6)
        z = self.bias + self.memory_weight * math.log(pm / (1 - pm))
        if p_model is not None and self.model_weight:
            z += self.model_weight * math.log(max(p_model, 1e-9))
        return 1.0 / (1.0 + math.exp(-z))


def region_after(region: str, cursor: int, insertion: str) -> str:
    return region[:cursor] + insertion + region[cursor:]


def ranked(proposals: tuple[MemoryProposal, ...], model_scores: list[float | None] | tuple[float | None, ...],
           mix: Mix) -> list[tuple[int, float]]:
    """(index, mixed confidence) of each proposal the model does not veto (model score below
    `mix.veto`, or no score: it did not fit), highest confidence first; proposals of equal
    confidence keep the memory's order. With passes == 0 (no model), every proposal is ranked by
    the memory's probability alone."""
    out = []
    for j, (p, s) in enumerate(zip(proposals, model_scores)):
        if mix.passes and (s is None or s < mix.veto):
            continue
        out.append((j, mix.combine(p.score, s)))
    out.sort(key=lambda jc: -jc[1])  # stable: ties keep the memory's order
    return out


def choose(proposals: tuple[MemoryProposal, ...], model_scores: list[float | None],
           mix: Mix) -> tuple[int | None, float | None]:
    """The proposal with the highest mixed confidence, and that confidence; None when each one
    is vetoed (`ranked`). With passes == 0 (no model), the memory's own order decides."""
    order = ranked(proposals, model_scores, mix)
    return order[0] if order else (None, None)
