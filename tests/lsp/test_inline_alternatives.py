"""Alternatives in the inline list: the repository memory's other proposals, checked with the
answer in the same model passes, listed after it (lsp.inline_alternatives).

The first test runs the embedded model: a workspace continues a line two ways, and the inline
answer lists both, best first, each with its own confidence. The others use the
ScoredProposalsEngine double (tests/lsp/scored_proposals_engine.py), which gives each proposal a
set confidence: they check what the server lists around the check (its order, the gate, the
syntax check, typing through), not the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lsp_helpers import SERVER, inline_params, open_document, request, start_in_workspace, type_chars
from lsprotocol import types

EMPTY_HANDLER = "def handler_99(registry):\n\n    return registry\n"
HANDLER = "def handler_{k}(registry):\n    frobnicate_{rest}\n    return registry\n"


def _project(root: Path, continuations: list[tuple[str, int]]) -> None:
    """Files whose handler calls `frobnicate_<continuation>`, each continuation in `n` files."""
    root.mkdir(parents=True, exist_ok=True)
    k = 0
    for rest, n in continuations:
        for _ in range(n):
            (root / f"mod{k}.py").write_text(HANDLER.format(k=k, rest=rest))
            k += 1


async def _start(tmp_path: Path, root: Path, init: dict, **env: str):
    return await start_in_workspace(tmp_path, root, {"deadlineMs": 5000, **init}, [*SERVER, "--device", "cpu"], **env)


async def _ask(client, uri: str, row: int, col: int):
    return await client.text_document_inline_completion_async(
        inline_params(uri, row, col, types.InlineCompletionTriggerKind.Automatic))


async def _type_and_ask(client, uri: str, typed: str):
    open_document(client, uri, EMPTY_HANDLER)
    type_chars(client, uri, 1, 0, 2, typed)
    return await _ask(client, uri, 1, len(typed))


def _listed(res) -> list[tuple[str, str, float]]:
    """(insert text, item id, confidence) of each item; every item carries its own id and data."""
    out = []
    for item in res.items:
        assert item.range is None  # a pure insertion at the cursor
        item_id, data = item.command.arguments
        out.append((item.insert_text, item_id, data["confidence"]))
    return out


@pytest.mark.asyncio
async def test_the_memorys_two_continuations_are_both_listed_best_first(tmp_path: Path):
    root = tmp_path / "proj"
    root.mkdir()
    # one file continues the line two ways (the memory: about 2/3 and 1/3)
    a, b = "widget(registry, widget_id=42, strict=True)", "widget(registry, widget_id=7, strict=False)"
    (root / "handlers.py").write_text("\n\n".join(HANDLER.format(k=k, rest=rest)
                                                for k, rest in enumerate([a, a, b, a, b, a])))
    client = await _start(tmp_path, root, {"minConfidence": 0})
    try:
        res = await _type_and_ask(client, (root / "new.py").as_uri(), "    frobnicate_")
        listed = _listed(res)
        texts = [t for t, _, _ in listed]
        assert sorted(texts[:2]) == sorted([a, b]), texts
        assert len(listed) <= 3
        assert len(set(texts)) == len(texts) and "" not in texts
        assert len({i for _, i, _ in listed}) == len(listed)  # each its own id (accepted on its own)
        confidences = [c for _, _, c in listed]
        assert all(isinstance(c, float) for c in confidences)
        assert confidences == sorted(confidences, reverse=True) and confidences[0] > confidences[1]
        stats = await request(client, "dlm/stats", {})
        assert stats["offered"] == 1 and stats["model_runs"] == 1  # one answer, one model run for all
    finally:
        await client.shutdown_session()


# The check prefers `gadget` though the memory saw `widget` more often; `sprocket(registry):` is
# not a statement (the syntax check holds it back); `doohickey` is the least confident.
CONTINUATIONS = [("widget(registry, widget_id=42, strict=True)", 4), ("gadget(registry)", 3),
                 ("sprocket(registry):", 3), ("doohickey(registry, 3)", 2)]
SCORES = [["gadget", 0.9], ["sprocket", 0.8], ["widget", 0.6], ["doohickey", 0.3]]


@pytest.mark.asyncio
@pytest.mark.parametrize("min_confidence,expected", [
    (0.5, [("gadget(registry)", 0.9), ("widget(registry, widget_id=42, strict=True)", 0.6)]),
    (0.2, [("gadget(registry)", 0.9), ("widget(registry, widget_id=42, strict=True)", 0.6),
           ("doohickey(registry, 3)", 0.3)]),
])
async def test_alternatives_follow_the_checks_order_and_pass_the_gate_and_the_syntax_check(
        tmp_path: Path, min_confidence: float, expected: list):
    root = tmp_path / "proj"
    _project(root, CONTINUATIONS)
    log = tmp_path / "proposals.jsonl"
    # the memory's own order goes to the check (no line ranker): the check's order is under test
    client = await _start(tmp_path, root, {"minConfidence": min_confidence, "index": {"rankDrafts": False}},
                          DLM_ENGINE_FACTORY="scored_proposals_engine:scored",
                          FAKE_PROPOSAL_SCORES=json.dumps(SCORES), FAKE_PROPOSALS_LOG=str(log))
    try:
        res = await _type_and_ask(client, (root / "new.py").as_uri(), "    frobnicate_")
        proposed = json.loads(log.read_text().splitlines()[-1])
        # the memory proposed all four, and the check let them through above the gate but `doohickey`
        assert sorted(proposed) == sorted(rest for rest, _ in CONTINUATIONS)
        assert [(t, c) for t, _, c in _listed(res)] == expected
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_typing_through_the_answer_keeps_the_alternatives_that_match(tmp_path: Path):
    root = tmp_path / "proj"
    _project(root, [("gadget(registry)", 3), ("gadget(registry, strict=True)", 3), ("widget(registry)", 3)])
    client = await _start(tmp_path, root, {"minConfidence": 0.5},
                          DLM_ENGINE_FACTORY="scored_proposals_engine:scored",
                          FAKE_PROPOSAL_SCORES=json.dumps([["strict", 0.7], ["gadget", 0.9],
                                                           ["widget", 0.8]]))
    try:
        uri = (root / "new.py").as_uri()
        typed = "    frobnicate_"
        res = await _type_and_ask(client, uri, typed)
        assert [t for t, _, _ in _listed(res)] == [
            "gadget(registry)", "widget(registry)", "gadget(registry, strict=True)"]
        before = await request(client, "dlm/stats", {})
        type_chars(client, uri, 1, len(typed), 2 + len(typed), "gad")  # the user types into the first item
        res = await _ask(client, uri, 1, len(typed) + 3)
        after = await request(client, "dlm/stats", {})
        assert after["cache_hits"] - before["cache_hits"] == 1 and after["model_runs"] == before["model_runs"]
        listed = _listed(res)
        assert [(t, c) for t, _, c in listed] == [("get(registry)", 0.9), ("get(registry, strict=True)", 0.7)]
    finally:
        await client.shutdown_session()
