"""lsp.gate: the request deadline, the show/don't-show decision, and which lines count as
recently typed. Pure functions: times are plain numbers given by the test."""

from __future__ import annotations

import asyncio

from dlm.lsp.documents import Document
from dlm.lsp.gate import RecentEdits, deadline_at, decide, replaced_lines
from lsp_helpers import change, inline_params, inline_session, open_document, server_env
from lsprotocol import types


def test_deadline_counts_from_the_keystroke_when_the_request_belongs_to_it():
    assert deadline_at(last_change_at=10.0, arrived_at=10.02, deadline_ms=250) == 10.25
    # a request long after the last change (a pause, a manual trigger): from its arrival
    assert deadline_at(last_change_at=10.0, arrived_at=12.0, deadline_ms=250) == 12.25
    # a document never edited (0 = never): from the arrival
    assert deadline_at(last_change_at=0.0, arrived_at=5.0, deadline_ms=100) == 5.1


def test_decide_thresholds_late_and_recent_rewrites():
    assert decide(0.8, False, False, 0.7, 0.98).show
    assert decide(0.6, False, False, 0.7, 0.98).reason == "low_confidence"
    assert decide(0.99, False, True, 0.7, 0.98).reason == "late"  # late is never shown, however sure
    assert decide(0.9, True, False, 0.7, 0.98).reason == "rewrites_recent"
    assert decide(0.99, True, False, 0.7, 0.98).show
    # an engine without a confidence is not gated, but may not rewrite what was just typed
    assert decide(None, False, False, 0.7, 0.98).show
    assert not decide(None, True, False, 0.7, 0.98).show
    assert decide(0.0, False, False, 0.0, 0.0).show  # gate at 0: everything on time is shown


def test_replaced_lines_maps_region_offsets_to_document_lines():
    region = "a = 1\nb = 2\nc = 3\n"
    assert replaced_lines(region, 10, [(6, 11)]) == [(11, 11)]  # "b = 2"
    assert replaced_lines(region, 10, [(4, 8)]) == [(10, 11)]  # across a line break
    assert replaced_lines(region, 10, [(6, 6)]) == []  # an insertion replaces nothing


def _doc() -> Document:
    return Document("file:///t.py", "".join(f"line{i}\n" for i in range(10)), 1)


def test_recent_edits_follow_inserted_and_deleted_lines():
    doc, rec = _doc(), RecentEdits(window_s=5.0)
    rec.record(doc.apply((3, 0), (3, 0), "total = ", 2))  # typed on line 3
    t = rec.spans[-1][2]
    assert rec.touches([(3, 3)], t) and not rec.touches([(4, 6)], t)
    rec.record(doc.apply((0, 0), (0, 0), "new\nnew\n", 3))  # two lines added above: line 3 is now 5
    now = rec.spans[-1][2]
    assert rec.touches([(5, 5)], now) and rec.touches([(0, 1)], now)
    assert not rec.touches([(3, 4)], now)
    rec.record(doc.apply((4, 0), (6, 0), "", 4))  # lines 4-5 deleted: the typed line is gone
    now = rec.spans[-1][2]
    assert not rec.touches([(7, 9)], now)


def test_recent_edits_expire_after_the_window():
    doc, rec = _doc(), RecentEdits(window_s=5.0)
    rec.record(doc.apply((3, 0), (3, 0), "x", 2))
    t = rec.spans[-1][2]
    assert rec.touches([(3, 3)], t + 4.9)
    assert not rec.touches([(3, 3)], t + 5.1)


def test_recent_edits_keep_a_bounded_number_of_spans():
    doc, rec = _doc(), RecentEdits(window_s=1e9, max_spans=4)
    for i in range(9):
        rec.record(doc.apply((i, 0), (i, 0), "x", i + 2))
    assert len(rec.spans) == 4


# ---- the gate in the real server (subprocess) with the slow fake engine: scheduling and gating
# only; the fake's fixed confidence (FAKE_CONFIDENCE) is a number the test chooses.


async def _inline(client, uri: str, line: int, ch: int):
    return await client.text_document_inline_completion_async(
        inline_params(uri, line, ch, types.InlineCompletionTriggerKind.Automatic))


def _env(**extra: str) -> dict:
    return server_env(DLM_ENGINE_FACTORY="fake_engine:slow", **extra)


def test_server_shows_only_answers_above_min_confidence_and_says_how_sure():
    async def scenario():
        uri = "file:///w/a.py"
        async with inline_session(_env(FAKE_STEP_S="0.001", FAKE_CONFIDENCE="0.7"),
                                  {"minConfidence": 0.6}) as sure:
            open_document(sure, uri, "x = \n")
            res = await _inline(sure, uri, 0, 4)
            assert [i.insert_text for i in res.items] == ["FAKE"]
            assert res.items[0].command.arguments[1] == {"confidence": 0.7, "rewritesRecent": False}
            stats = await sure.protocol.send_request_async("dlm/stats", {})
            # every counter docs/protocol.md lists is there from the start, zero or not
            assert (stats.offered, stats.gated_low_confidence, stats.gated_rewrites_recent, stats.gated_late,
                    stats.no_steps) == (1, 0, 0, 0, 0)
        async with inline_session(_env(FAKE_STEP_S="0.001", FAKE_CONFIDENCE="0.5"),
                                  {"minConfidence": 0.6}) as unsure:
            open_document(unsure, uri, "x = \n")
            assert not (await _inline(unsure, uri, 0, 4)).items
            stats = await unsure.protocol.send_request_async("dlm/stats", {})
            assert stats.gated_low_confidence == 1 and stats.completed == 1

    asyncio.run(scenario())


def test_server_never_shows_a_late_answer():
    async def scenario():
        # 10 steps of 50 ms against a 100 ms deadline: the fake cannot be on time
        async with inline_session(_env(FAKE_STEP_S="0.05", FAKE_CONFIDENCE="0.99"),
                                  {"deadlineMs": 100}) as client:
            open_document(client, "file:///w/b.py", "x = \n")
            assert not (await _inline(client, "file:///w/b.py", 0, 4)).items
            stats = await client.protocol.send_request_async("dlm/stats", {})
            assert stats.late == 1 and stats.gated_late == 1

    asyncio.run(scenario())


def test_edit_predictions_can_be_turned_off_the_model_rewrite_is_off_by_default_and_rewriting_recent_typing_needs_more():
    async def scenario():
        uri, text = "file:///w/todo.py", "def g():\n    # TODO\n    return 1\n"
        params = {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 12}}
        # on by default, but only the edit memory answers: the model's rewrite (modelFallback) is off;
        # and turned off, nothing answers, the model's rewrite included
        for init in ({}, {"editPredictions": False, "nextEdits": {"modelFallback": True}}):
            async with inline_session(_env(FAKE_STEP_S="0.001", FAKE_CONFIDENCE="0.99"), init) as session:
                open_document(session, uri, text)
                assert await session.protocol.send_request_async("dlm/editPrediction", params) is None
        init = {"editPredictions": True, "minConfidence": 0.5, "minConfidenceRewriteRecent": 0.95,
                "nextEdits": {"modelFallback": True}}
        async with inline_session(_env(FAKE_STEP_S="0.001", FAKE_CONFIDENCE="0.9"), init) as on:
            open_document(on, uri, text)
            res = await on.protocol.send_request_async("dlm/editPrediction", params)
            assert res.edits[0].newText == "DONE" and res.confidence == 0.9 and res.rewritesRecent is False
            change(on, uri, 2, (1, 10), (1, 10), "!")  # the user just typed on the TODO line: "# TODO!"
            res = await on.protocol.send_request_async("dlm/editPrediction", params)
            assert res is None  # rewriting what was just typed needs 0.95; the fake is 0.9 sure
            stats = await on.protocol.send_request_async("dlm/stats", {})
            assert stats.gated_rewrites_recent == 1

    asyncio.run(scenario())
