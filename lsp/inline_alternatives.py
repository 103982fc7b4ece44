"""The alternatives listed after the first inline item: the repository memory's other proposals.

The model's check of the memory's proposals (coder_model.verify) scores every proposal in the
passes that choose the answer (Prediction.proposal_confidences), so the runners-up cost no model
pass of their own. Each is listed only when it passes the filters the first item passed; see
`inline_alternatives`.
"""

from __future__ import annotations

import logging

from dlm.coder_model import secrets
from dlm.lsp import gate, postprocess
from dlm.lsp.documents import Document
from dlm.lsp.inline import InlineAnswer, syntax_problem
from dlm.lsp.options import Options

log = logging.getLogger(__name__)

MAX_INLINE_ITEMS = 3  # the inline list: the answer and up to two alternatives


def inline_alternatives(doc: Document, row: int, col: int, answer: InlineAnswer,
                        options: Options) -> list[tuple[str, float]]:
    """The other proposals of the repository memory the model's check let through, as
    (insertion, confidence), best first, at most MAX_INLINE_ITEMS - 1, for the answer (lsp.inline)
    whose first item is shown.

    Each passes the first item's filters: the inline post-processing (degenerate answers held
    back), the gate with its own confidence, no secret put on the cursor's line, the syntax
    check. None repeats the text of an item listed before it, or only its beginning (accepting
    a part of that item gives as much). Only a pure insertion at the cursor has alternatives;
    the shown/held-back counters stay the first item's."""
    ranked = answer.proposal_confidences
    sugg, prompt = answer.sugg, answer.built.prompt
    if len(ranked) < 2 or sugg.replace_end is not None or not sugg.insert_text:
        return []
    proposed = {p.text for p in prompt.proposals}  # only what the memory proposed for this prompt
    line = doc.line(row)
    listed, out = [sugg.insert_text], []
    for text, confidence in ranked:
        if len(out) >= MAX_INLINE_ITEMS - 1:
            break
        if text not in proposed:
            continue
        if not gate.decide(confidence, False, answer.late, options.min_confidence,
                           options.min_confidence_rewrite_recent).show:
            continue
        new = prompt.region[: prompt.cursor] + text + prompt.region[prompt.cursor :]
        alt = postprocess.suggest(prompt.region, prompt.cursor, new, prompt.suffix, prompt.prefix)
        ins = alt.insert_text
        if alt.held_back or not ins or alt.replace_end is not None or alt.edits:
            continue
        if any(item.startswith(ins) for item in listed):
            continue
        if secrets.inserted_secret(line[:col], ins, line[col:]):
            continue
        problem = syntax_problem(doc, row, col, alt)
        if problem:
            log.debug("held back an alternative that %s: %.80r", problem, ins)
            continue
        listed.append(ins)
        out.append((ins, confidence))
    return out
