"""The memory's proposals as the server asks them (lsp.memory_proposals): in the memory's own
order, or ordered by the line ranker's trees, whose probability becomes each one's score."""

from __future__ import annotations

import math

from dlm.coder_model.edit_memory.boosting import Trees
from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory.line_ranker import FEATURES, LineRanker
from dlm.lsp.memory_proposals import MEMORY_BEAM, memory_proposals, shipped_ranker

SHORT, LONG = "close()", "close_all(registry, strict=True)"


def _memory() -> RepoMemory:
    memory = RepoMemory()
    for k in range(6):  # the short continuation twice as often as the long one
        rest = LONG if k % 3 == 0 else SHORT
        memory.update_file(f"m{k}.py", f"def handler_{k}(registry):\n    registry.{rest}\n    return registry\n")
    return memory


def _longer_is_better() -> LineRanker:
    """One tree: a draft longer than 10 characters is likely the line, a shorter one is not."""
    length = float(FEATURES.index("length"))
    return LineRanker(Trees(0.0, [[[length, 10.0, 1.0, 2.0], [-3.0], [3.0]]]))


def test_the_memory_orders_its_drafts_and_the_ranker_reorders_them_with_its_probability():
    memory, before, after = _memory(), "def handler_9(registry):\n    registry.", "\n    return registry\n"
    own = memory_proposals(memory, before, after, "new.py", {})
    assert own[0].text == SHORT and LONG in [p.text for p in own]
    ranked = memory_proposals(memory, before, after, "new.py", {}, _longer_is_better(), lambda text: True)
    assert ranked[0].text == LONG
    assert ranked[0].score == 1 / (1 + math.exp(-3.0))
    assert [p.score for p in ranked] == sorted((p.score for p in ranked), reverse=True)
    beam = {c.text for c in memory.complete(before, after, path="new.py", beam=MEMORY_BEAM)}
    assert {p.text for p in ranked} <= beam  # ranked from the memory's whole beam, the best VERIFIED kept


def test_the_ranker_reads_whether_each_draft_parses():
    """`parses` is asked of each draft, and its answer is a feature the trees split on."""
    parses_at = float(FEATURES.index("parses"))
    ranker = LineRanker(Trees(0.0, [[[parses_at, 0.5, 1.0, 2.0], [-4.0], [4.0]]]))
    memory, before, after = _memory(), "def handler_9(registry):\n    registry.", "\n    return registry\n"
    asked = []

    def parses(text: str) -> bool:
        asked.append(text)
        return text == LONG

    ranked = memory_proposals(memory, before, after, "new.py", {}, ranker, parses)
    assert ranked[0].text == LONG and set(asked) >= {SHORT, LONG}
    # by default the check runs on the text around the cursor: both parse, the memory's order stands
    ranked = memory_proposals(memory, before, after, "new.py", {}, ranker)
    assert ranked[0].text == SHORT


def test_the_shipped_ranker_reads_and_scores_in_zero_to_one():
    ranker = shipped_ranker()
    assert ranker is not None
    memory, before, after = _memory(), "def handler_9(registry):\n    registry.", "\n    return registry\n"
    ranked = memory_proposals(memory, before, after, "new.py", {}, ranker)
    assert ranked and all(0.0 <= p.score <= 1.0 for p in ranked)
