"""The answer to dlm/editPrediction: the edit memory's next edit, else the model's rewrite.

With `nextEdits.enabled` the edit memory (lsp.next_edits) answers first; a failure there costs
the request, never the server. When it has no proposal and `nextEdits.modelFallback` is on, the
model rewrites the region around the cursor (lsp.inline, the "wide" mode) and its changes are
sent as edits, after the confidence gate. Copilot's next-edit request (lsp.copilot_nes) gets the
same answer in its own shape.
"""

from __future__ import annotations

import logging

from dlm.lsp import convert, next_edits
from dlm.lsp.documents import Document
from dlm.lsp.inline import InlinePredictor

log = logging.getLogger(__name__)


async def edit_prediction(edits: next_edits.EditContext, predictor: InlinePredictor, doc: Document,
                          row: int, col: int) -> dict | None:
    """The dlm/editPrediction result at the cursor, or None (nothing to propose)."""
    if edits.options.next_edits.enabled:
        try:
            found = await next_edits.propose(edits, doc, row, col)
        except Exception:  # the edit memory costs this request, never the server
            log.exception("edit memory: no proposal for %s", doc.uri)
            found = None
        if found is not None:
            edits.stats.add("offered")
            return found
        if not edits.options.next_edits.model_fallback:
            return None
    return await model_edit_prediction(edits, predictor, doc, row, col)


async def model_edit_prediction(edits: next_edits.EditContext, predictor: InlinePredictor, doc: Document,
                                row: int, col: int) -> dict | None:
    """The model's wide rewrite of the region around the cursor as edits (nextEdits.modelFallback)."""
    last = predictor.last.get(doc.uri)
    if last is not None and last.at(doc.version, row, col):
        answer = last  # the inline request at this position already ran the model
    else:
        answer = await predictor.predict(doc, row, col, "wide")
    if not predictor.shows_edits(answer):
        return None
    out = convert.edit_prediction(doc, answer.built, answer.sugg, answer.version, edits.next_id())
    out.update(convert.suggestion_data(answer.confidence, answer.edits_rewrite_recent))
    return out
