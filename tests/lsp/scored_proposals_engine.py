"""A test double of the model's check of the repository memory's proposals (loaded in the server
subprocess through DLM_ENGINE_FACTORY="scored_proposals_engine:scored").

It makes no claim about the model: each proposal gets the confidence of the first entry of
FAKE_PROPOSAL_SCORES (a JSON list of [substring, confidence]) whose substring it holds; a
proposal that holds none is vetoed. It answers the best proposal, as coder_model.engine's
verify_prediction does, with every proposal it let through in `proposal_confidences`, best
first. Each prompt's proposals are appended to FAKE_PROPOSALS_LOG (one JSON list a line), so a
test can see what the memory proposed.
"""

from __future__ import annotations

import json
import os

from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams
from fake_engine import FakeEngineBase, at_cursor


class ScoredProposalsEngine(FakeEngineBase):
    model_name = "scored-proposals fake (tests only)"

    def __init__(self, scores: list[tuple[str, float]], log_path: str | None) -> None:
        self.scores, self.log_path = scores, log_path

    def confidence(self, text: str) -> float | None:
        return next((c for sub, c in self.scores if sub in text), None)

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        if cancel.cancelled:
            return Prediction("", cancelled=True)
        if self.log_path and prompt.proposals:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps([p.text for p in prompt.proposals]) + "\n")
        scored = [(p.text, self.confidence(p.text)) for p in prompt.proposals]
        ranked = sorted(((t, c) for t, c in scored if c is not None), key=lambda tc: -tc[1])
        if not ranked:  # no proposal (a free decode) or every one vetoed: no change
            return Prediction(prompt.region, steps=1, confidence=None if not prompt.proposals else 0.0)
        text, confidence = ranked[0]
        return Prediction(at_cursor(prompt, text), steps=1, confidence=confidence,
                          proposal_confidences=tuple(ranked))


def scored(model, device):
    raw = json.loads(os.environ.get("FAKE_PROPOSAL_SCORES", "[]"))
    return ScoredProposalsEngine([(str(s), float(c)) for s, c in raw], os.environ.get("FAKE_PROPOSALS_LOG"))
