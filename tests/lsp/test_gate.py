"""lsp.gate: the request deadline, the show/don't-show decision, and which lines count as
recently typed. Pure functions: times are plain numbers given by the test."""

from __future__ import annotations

from dlm.lsp.documents import Document
from dlm.lsp.gate import RecentEdits, deadline_at, decide, replaced_lines


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
