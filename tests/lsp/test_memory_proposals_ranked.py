"""The memory's proposals as the server asks them (lsp.memory_proposals): in the memory's own
order, or ordered by the line ranker's trees, whose probability becomes each one's score."""

from __future__ import annotations

import math

from dlm.coder_model.edit_memory.boosting import Trees
from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory.line_ranker import FEATURES, LineRanker
from dlm.lsp.memory_proposals import MEMORY_BEAM, DraftSyntax, memory_proposals, shipped_ranker

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
    ranked = memory_proposals(memory, before, after, "new.py", {}, _longer_is_better(), DraftSyntax(lambda text: True))
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

    ranked = memory_proposals(memory, before, after, "new.py", {}, ranker, DraftSyntax(parses))
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


DOCSTRING_ABOVE = 'def handler_9(registry):\n    """Handle the registry.\n\n    More words here.\n    '
CODE_BELOW = '\n    return registry\n\n\ndef other():\n    """Other."""\n    return 1\n'


def test_a_string_that_swallows_the_code_below_is_read_around_the_cursor():
    assert DraftSyntax.of_text("python", DOCSTRING_ABOVE, CODE_BELOW).string_swallows_code
    closed_below = '\n    """\n    return registry\n'
    assert not DraftSyntax.of_text("python", DOCSTRING_ABOVE, closed_below).string_swallows_code
    assert not DraftSyntax.of_text("python", "x = 1\n", "\ny = 2\n").string_swallows_code


def test_the_ranker_reads_whether_a_draft_closes_the_string_the_code_below_needs_closed():
    """The trees split on `string_swallows_code` (the request) and `closes_string` (the draft)."""
    swallows = float(FEATURES.index("string_swallows_code"))
    closes = float(FEATURES.index("closes_string"))
    ranker = LineRanker(Trees(0.0, [[[swallows, 0.5, 1.0, 2.0], [-4.0], [closes, 0.5, 3.0, 4.0], [-4.0], [4.0]]]))
    memory = RepoMemory()
    for k in range(6):  # prose twice as often as the closing quotes after the same line
        rest = '    """\n' if k % 3 == 0 else "    Even more words.\n    \"\"\"\n"
        memory.update_file(f"h{k}.py", f'def handler_{k}(registry):\n    """Handle the registry.\n\n'
                           f"    More words here.\n{rest}    return registry\n")
    own = memory_proposals(memory, DOCSTRING_ABOVE, CODE_BELOW, "new.py", {})
    assert own[0].text != '"""' and '"""' in [p.text for p in own]
    ranked = memory_proposals(memory, DOCSTRING_ABOVE, CODE_BELOW, "new.py", {}, ranker)
    assert ranked[0].text == '"""' and ranked[0].score == 1 / (1 + math.exp(-4.0))
    # with the docstring closed below, no draft is told apart: the memory's order stands
    ranked = memory_proposals(memory, DOCSTRING_ABOVE, '\n    """\n    return registry\n', "new.py", {}, ranker)
    assert ranked[0].text == own[0].text
