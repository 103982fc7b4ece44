"""Boosted trees that re-rank the repository memory's whole-line drafts and say how likely each is
the line the user will write: the memory + trees configuration, with no model.

The memory's own score is the probability of a draft under its n-gram tables; it ranks drafts
well and says little about whether the first one is right (a draft of one common token scores
high, a long line seen once in this very file scores low). The trees read the facts of each draft
(FEATURES: its rank and score, the margin to the next, its support, its length, whether it is a
line already in the file, whether the cursor line with it still parses, what is typed on the
line, whether it holds triple quotes where a string must close) and give the probability that it is exactly the rest of the line. The server shows the
draft they rank first, with that probability as its confidence (the gate reads it).

`features` is the one place the facts are computed: the fitting driver
(drivers/training/fit_line_ranker.py) and the server call it alike, so what the trees were fitted on
is what they are served. The model (`line_ranker.json` beside this file) is data: the trees of
coder_model.edit_memory.boosting, predicted in plain Python. Made by
`python -m dlm.drivers.training.fit_line_ranker --repo DIR ... --out coder_model/memory/line_ranker.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlm.coder_model.edit_memory.boosting import Trees

MODEL_PATH = Path(__file__).with_name("line_ranker.json")
FEATURES = ("rank", "score", "log_support", "score_ratio", "margin", "length", "drafts", "parses",
            "in_file", "typed_chars", "indent", "opens", "closes_string", "string_swallows_code")
_OPENERS, _CLOSERS = "([{", ")]}"


@dataclass(frozen=True)
class LineFacts:
    """What the features read of the request, computed once for all its drafts."""

    typed_line: str  # the cursor line up to the cursor
    file_lines: frozenset[str]  # the file's other lines, stripped
    # the cursor is inside a triple-quoted string whose lines below hold code: its closing quotes
    # are missing, and only a draft that closes it leaves the code below code (lsp.syntax_check)
    string_swallows_code: bool = False

    @classmethod
    def of(cls, before: str, after: str, string_swallows_code: bool = False) -> LineFacts:
        start = before.rfind("\n") + 1
        rest = after.split("\n", 1)[1] if "\n" in after else ""
        others = (line.strip() for line in (before[:start] + rest).split("\n"))
        return cls(before[start:], frozenset(line for line in others if line), string_swallows_code)


def features(facts: LineFacts, scores: Sequence[float], supports: Sequence[int], texts: Sequence[str],
             rank: int, parses: bool) -> list[float]:
    """The FEATURES of draft `rank` among the request's drafts (best first by the memory)."""
    score = scores[rank]
    top = scores[0] or 1e-9
    following = scores[rank + 1] if rank + 1 < len(scores) else 0.0
    line = facts.typed_line + texts[rank]
    opens = sum(line.count(c) for c in _OPENERS) - sum(line.count(c) for c in _CLOSERS)
    typed = facts.typed_line
    closes_string = '"""' in texts[rank] or "'''" in texts[rank]
    return [float(rank), score, math.log1p(supports[rank]), score / top, score - following,
            float(len(texts[rank])), float(len(scores)), float(parses), float(line.strip() in facts.file_lines),
            float(len(typed.strip())), float(len(typed) - len(typed.lstrip())), float(opens),
            float(closes_string), float(facts.string_swallows_code)]


class LineRanker:
    """The fitted trees: `probabilities` of the drafts of one request."""

    def __init__(self, trees: Trees) -> None:
        self.trees = trees

    def probabilities(self, facts: LineFacts, scores: Sequence[float], supports: Sequence[int],
                      texts: Sequence[str], parses: Sequence[bool]) -> list[float]:
        return [self.trees(features(facts, scores, supports, texts, r, parses[r])) for r in range(len(texts))]

    def to_json(self) -> dict:
        return {"features": list(FEATURES), **self.trees.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> LineRanker:
        if data.get("features") != list(FEATURES):
            raise ValueError(f"the ranker was fitted on features {data.get('features')}, this code computes "
                             f"{list(FEATURES)}: fit it again (python -m dlm.drivers.training.fit_line_ranker)")
        return cls(Trees.from_json(data))


def load(path: Path = MODEL_PATH) -> LineRanker | None:
    """The shipped ranker, or None when there is no file (the memory's own order and score stand)."""
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as fh:
        return LineRanker.from_json(json.load(fh))
