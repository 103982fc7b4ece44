"""The filters every alternative passes before it is listed after the inline answer
(lsp.inline_alternatives), on a document and a prediction's result made by hand: the
gate with the alternative's own confidence, the inline post-processing (degenerate answers),
secrets, the syntax check, distinct texts, only what the memory proposed, and the list's length."""

from __future__ import annotations

from dataclasses import replace

import pytest
from dlm.coder_model.types import MemoryProposal, Prompt
from dlm.lsp.context import BuiltContext
from dlm.lsp.documents import Document
from dlm.lsp.inline import InlineAnswer
from dlm.lsp.inline_alternatives import MAX_INLINE_ITEMS, inline_alternatives
from dlm.lsp.options import Options
from dlm.lsp.postprocess import Suggestion

TEXT = "def handler(registry):\n    frobnicate_\n    return registry\n"
ROW, COL = 1, len("    frobnicate_")
FIRST = "widget(registry)"
TOKEN = 'token = "ghp_' + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"[:36] + '"'


def _result(doc: Document, ranked: list[tuple[str, float]], first: str = FIRST, late: bool = False,
            proposed: list[str] | None = None) -> InlineAnswer:
    region = doc.lines[ROW]
    prompt = Prompt(prefix=doc.lines[0], region=region, cursor=COL, suffix="".join(doc.lines[ROW + 1 :]),
                    language="python", path="m.py", insert=True,
                    proposals=tuple(MemoryProposal(t, 0.5) for t in (proposed or [t for t, _ in ranked])))
    return InlineAnswer(version=1, row=ROW, col=COL, built=BuiltContext(prompt, ROW, ROW, "typing"),
                        sugg=Suggestion(insert_text=first), confidence=None, late=late,
                        proposal_confidences=tuple(ranked), inline_rewrites_recent=False,
                        edits_rewrite_recent=False)


@pytest.fixture
def doc() -> Document:
    return Document("file:///w/m.py", TEXT, 1, "python")


def test_the_runners_up_are_listed_best_first_with_their_own_confidence(doc):
    ranked = [(FIRST, 0.9), ("gadget(registry)", 0.8), ("widget(registry, strict=True)", 0.7)]
    assert inline_alternatives(doc, ROW, COL, _result(doc, ranked), Options()) == ranked[1:]


@pytest.mark.parametrize("why,text,confidence", [
    ("under the gate", "gadget(registry)", 0.3),
    ("breaks the syntax", "gadget(registry):", 0.8),
    ("puts a secret on the line", TOKEN, 0.8),
    ("degenerate", "get_get_get_get_get_(registry)", 0.8),
    ("the first item's text again", FIRST, 0.8),
    ("only the beginning of the first item", "widget", 0.8),
    ("an empty insertion", "", 0.8),
    ("only retypes the next line", "return registry", 0.8),
])  # fmt: skip
def test_an_alternative_that_fails_a_filter_is_not_listed(doc, why, text, confidence):
    kept = ("sprocket(registry)", 0.6)
    ranked = [(FIRST, 0.9), (text, confidence), kept]
    assert inline_alternatives(doc, ROW, COL, _result(doc, ranked), Options()) == [kept], why


def test_a_lower_gate_lists_what_the_default_one_holds_back(doc):
    ranked = [(FIRST, 0.9), ("gadget(registry)", 0.3)]
    assert inline_alternatives(doc, ROW, COL, _result(doc, ranked), Options(min_confidence=0.2)) == ranked[1:]


def test_no_more_than_the_list_holds_and_only_what_the_memory_proposed(doc):
    ranked = [(FIRST, 0.9)] + [(f"gadget_{i}(registry)", 0.8 - i / 100) for i in range(5)]
    found = inline_alternatives(doc, ROW, COL, _result(doc, ranked), Options())
    assert found == ranked[1:MAX_INLINE_ITEMS]
    # a ranking that names text the prompt's proposals did not hold lists nothing of it
    res = _result(doc, [(FIRST, 0.9), ("injected(registry)", 0.8)], proposed=[FIRST])
    assert inline_alternatives(doc, ROW, COL, res, Options()) == []


def test_a_late_answer_or_a_rewrite_of_the_line_has_no_alternatives(doc):
    ranked = [(FIRST, 0.9), ("gadget(registry)", 0.8)]
    assert inline_alternatives(doc, ROW, COL, _result(doc, ranked, late=True), Options()) == []
    res = _result(doc, ranked)
    res = replace(res, sugg=Suggestion(insert_text=FIRST, replace_end=COL))
    assert inline_alternatives(doc, ROW, COL, res, Options()) == []
