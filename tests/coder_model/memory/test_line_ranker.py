"""The line ranker (coder_model.memory.line_ranker): the facts it reads of a draft, its file's
format, and that trees fitted on drafts rank by those facts."""

from __future__ import annotations

import json

import pytest
from dlm.coder_model.edit_memory.boosting import fit
from dlm.coder_model.memory import line_ranker as lr


def test_features_read_the_draft_and_the_line():
    before = "def f(rows):\n    total = len(rows)\n    return tot"
    after = "\n\nprint(f([]))\n"
    facts = lr.LineFacts.of(before, after)
    assert facts.typed_line == "    return tot" and "total = len(rows)" in facts.file_lines
    assert "return tot" not in facts.file_lines  # the cursor line is not one of the file's lines
    texts, scores, supports = ["al", "al + 1", "al(rows"], [0.6, 0.3, 0.1], [9, 2, 0]
    x = dict(zip(lr.FEATURES, lr.features(facts, scores, supports, texts, 1, parses=True)))
    assert x["rank"] == 1 and x["score"] == 0.3 and x["score_ratio"] == pytest.approx(0.5)
    assert x["margin"] == pytest.approx(0.2) and x["drafts"] == 3 and x["length"] == len("al + 1")
    assert x["parses"] == 1.0 and x["typed_chars"] == len("return tot") and x["indent"] == 4
    assert x["in_file"] == 0.0
    assert lr.features(facts, scores, supports, texts, 2, parses=False)[lr.FEATURES.index("opens")] == 1.0
    # a draft that makes a line the file already holds
    facts = lr.LineFacts.of("x = 1\n    total = len(", "\n")
    assert lr.features(facts, [0.5], [1], ["rows)"], 0, True)[lr.FEATURES.index("in_file")] == 0.0
    facts = lr.LineFacts.of("    total = len(rows)\n    total = len(", "\n")
    assert lr.features(facts, [0.5], [1], ["rows)"], 0, True)[lr.FEATURES.index("in_file")] == 1.0


def test_trees_fitted_on_drafts_rank_the_right_one_first_and_round_trip_as_json(tmp_path):
    """Drafts whose right one is always the line the file already holds, at any rank: the trees
    learn it, and the ranker read back from its file gives the same probabilities."""
    facts = lr.LineFacts.of("a = f(x)\nb = g(y)\n", "\n")
    others = ["c = h(z)", "d = k(w)", "e = m(v)"]
    X, y = [], []
    for right in range(4):
        rows = others[:right] + ["a = f(x)"] + others[right:]
        for r in range(4):
            X += [lr.features(facts, [0.4, 0.3, 0.2, 0.1], [3, 3, 3, 3], rows, r, True)] * 30
            y += [1.0 if r == right else 0.0] * 30
    ranker = lr.LineRanker(fit(X, y, trees=30, depth=3, min_leaf=5))
    probs = ranker.probabilities(facts, [0.4, 0.3, 0.2, 0.1], [3] * 4, ["c = h(z)", "a = f(x)", "d = k(w)", "e"],
                                 [True] * 4)
    assert max(range(4), key=probs.__getitem__) == 1
    path = tmp_path / "ranker.json"
    path.write_text(json.dumps(ranker.to_json()))
    again = lr.load(path)
    assert again is not None
    assert again.probabilities(facts, [0.4, 0.3, 0.2, 0.1], [3] * 4, ["c = h(z)", "a = f(x)", "d = k(w)", "e"],
                               [True] * 4) == pytest.approx(probs)


def test_a_ranker_fitted_on_other_features_is_refused_and_a_missing_file_is_none(tmp_path):
    path = tmp_path / "ranker.json"
    path.write_text(json.dumps({"features": ["rank"], "base": 0.0, "trees": []}))
    with pytest.raises(ValueError, match="fit it again"):
        lr.load(path)
    assert lr.load(tmp_path / "none.json") is None
