"""The answer to dlm/editPrediction: the edit memory's next edit, else the model's rewrite.

With `nextEdits.enabled` the edit memory (lsp.next_edits) answers first; a failure there costs
the request, never the server. When it has no proposal and `nextEdits.modelFallback` is on, the
model rewrites the region around the cursor (lsp.inline, the "wide" mode) and its changes are
sent as edits, after the confidence gate. Copilot's next-edit request (lsp.copilot_nes) gets the
same answer in its own shape.

An engine whose rewrite is a next edit of its own (Mercury Edit: `EngineTraits.next_edits`) is
asked beside the edit memory on every request, `modelFallback` or not: the user chose it for
its next edits. Both are asked at once; when both propose, the edit memory's proposal is
shown (a tie: the backend gives no probability to weigh against the memory's calibrated one,
and the memory's proposal follows what the user just did), else the engine's. The engine's
answer is kept as the position's last answer, so the next request there reuses it.

Every rewrite shown as edits (the engine's or the model fallback's) passes the same filters as
the edit memory's proposals: degenerate output is dropped (lsp.postprocess), a rewrite that adds
a syntax error around its region (`syntax_check.rewrite_problem`) or drops non-blank lines it
puts nothing in place of (`drops_lines`) is held back and counted, then the gate decides.
"""

from __future__ import annotations

import asyncio
import difflib
import logging

from dlm.coder_model.types import traits_of
from dlm.lsp import convert, next_edits, syntax_check
from dlm.lsp.documents import Document
from dlm.lsp.inline import InlineAnswer, InlinePredictor

log = logging.getLogger(__name__)

# the engine's requests still running after the edit memory answered (kept from the collector)
_running: set[asyncio.Task] = set()


async def edit_prediction(edits: next_edits.EditContext, predictor: InlinePredictor, doc: Document,
                          row: int, col: int) -> dict | None:
    """The dlm/editPrediction result at the cursor, or None (nothing to propose)."""
    opts = edits.options.next_edits
    if not opts.enabled:
        return await model_edit_prediction(edits, predictor, doc, row, col)
    engine_task: asyncio.Task | None = None
    if edits.holder.ready() and traits_of(edits.holder.engine).next_edits:
        engine_task = asyncio.ensure_future(model_edit_prediction(edits, predictor, doc, row, col))
    try:
        found = await next_edits.propose(edits, doc, row, col)
    except Exception:  # the edit memory costs this request, never the server
        log.exception("edit memory: no proposal for %s", doc.uri)
        found = None
    if found is not None:
        edits.stats.add("offered")
        if engine_task is not None and not engine_task.done():
            _running.add(engine_task)  # its answer is kept for the position (InlinePredictor.last)
            engine_task.add_done_callback(_finished)
        elif engine_task is not None:
            _finished(engine_task)
        return found
    if engine_task is not None:
        return await engine_task
    if not opts.model_fallback:
        return None
    return await model_edit_prediction(edits, predictor, doc, row, col)


def _finished(task: asyncio.Task) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("the engine's next edit failed: %s", task.exception())


async def model_edit_prediction(edits: next_edits.EditContext, predictor: InlinePredictor, doc: Document,
                                row: int, col: int) -> dict | None:
    """The model's wide rewrite of the region around the cursor as edits (nextEdits.modelFallback,
    or an engine whose rewrite is a next edit), after the filters and the gate."""
    last = predictor.last.get(doc.uri)
    if last is not None and last.at(doc.version, row, col):
        answer = last  # the inline request at this position already ran the model
    else:
        answer = await predictor.predict(doc, row, col, "wide")
    if answer is not None and answer.sugg.edits:
        held = held_back_by(doc, answer)
        if held:
            predictor.ctx.stats.add(held)
            log.info("held back a rewrite (%s) of %s", held, doc.uri.rsplit("/", 1)[-1])
            return None
    if not predictor.shows_edits(answer):
        return None
    out = convert.edit_prediction(doc, answer.built, answer.sugg, answer.version, edits.next_id())
    out.update(convert.suggestion_data(answer.confidence, answer.edits_rewrite_recent))
    if traits_of(edits.holder.engine).next_edits:
        out["source"] = "engine"
    return out


def held_back_by(doc: Document, answer: InlineAnswer) -> str:
    """The stats counter of the filter that holds the answer's edits back, or '' (none does)."""
    prompt, first = answer.built.prompt, answer.built.start_line
    old = prompt.region
    new = rewritten(old, answer.sugg.edits)
    if drops_lines(old, new):
        return "held_back_deletes_lines"
    lines = list(doc.lines)
    last = min(len(lines) - 1, first + max(0, len(old.splitlines()) - 1))
    try:
        if syntax_check.rewrite_problem(doc.language_id, lines, first, last, new):
            return "held_back_syntax"
    except Exception:  # a grammar edge case: the check lets the rewrite through
        log.debug("syntax check of a rewrite failed", exc_info=True)
    return ""


def rewritten(region: str, region_edits) -> str:
    """`region` with the edits (region offsets, non-overlapping) applied."""
    out, pos = [], 0
    for e in sorted(region_edits, key=lambda e: e.start):
        out.append(region[pos : e.start])
        out.append(e.text)
        pos = e.end
    out.append(region[pos:])
    return "".join(out)


def drops_lines(old: str, new: str) -> bool:
    """Does the rewrite drop non-blank lines it puts nothing in place of? A deletion of such a line,
    or a replacement by fewer non-blank lines than it takes (joining two lines into one is a
    rewrite; losing two is what a model that stops early does)."""
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        taken = sum(1 for x in a[i1:i2] if x.strip())
        given = sum(1 for x in b[j1:j2] if x.strip())
        if tag == "delete" and taken:
            return True
        if tag == "replace" and taken - given >= 2:
            return True
    return False
