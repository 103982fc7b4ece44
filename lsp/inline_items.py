"""The inline list answered to textDocument/inlineCompletion, and typing through a shown item
(with textDocument/completion, the same insertion for clients without inline completion).

`InlineList.complete` answers with the rest of a shown insertion while the user types through
it (no model call), else with the model's answer (lsp.inline) as the first item and the
repository memory's other checked proposals after it (lsp.inline_alternatives). Every item gets
an id for the accept command (lsp.suggestion_ids); a shown pure insertion is kept per document
(`ShownInsertion`) so that typing through it shows the rest, with the alternatives that start
with what is typed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlm.lsp import context, convert
from dlm.lsp.documents import Document
from dlm.lsp.inline import InlineAnswer, InlinePredictor
from dlm.lsp.inline_alternatives import inline_alternatives
from lsprotocol import types

Alternatives = list[tuple[str, dict | None]]  # (insertion, its data), listed after the first item


@dataclass
class ShownInsertion:
    """A pure insertion shown at the cursor: the line around the cursor when it was shown, its
    text, the data shown with it and the alternatives listed after it."""

    row: int
    before: str
    after: str
    text: str
    data: dict | None = None
    alternatives: Alternatives = field(default_factory=list)


class InlineList:
    """The inline list of each request, and the shown insertion of each document (typing through)."""

    def __init__(self, predictor: InlinePredictor, next_id: Callable[[], str]) -> None:
        self.predictor = predictor
        self.ctx = predictor.ctx
        self.next_id = next_id
        self.shown: dict[str, ShownInsertion] = {}  # uri -> the shown insertion (typing through it)

    def forget(self, uri: str) -> None:
        self.shown.pop(uri, None)

    async def complete(self, doc: Document, line: int, character: int) -> list[types.InlineCompletionItem]:
        """The inline items at a position (none: nothing to show)."""
        stats = self.ctx.stats
        if doc.binary:  # a binary file opened as text: nothing to complete (the index skips them too)
            stats.add("requests")
            stats.add("binary")
            return []
        row, col = doc.clamp(line, character)
        rest = self.from_type_through(doc, row, col)
        if rest is not None:
            stats.add("cache_hits")
            stats.add("requests")
            data = self.shown[doc.uri].data
            return self.items(doc, row, col, rest, None, data, self.alternatives_through(doc, row, col))
        mode = context.choose_mode(doc, row, self.ctx.options.context, col=col)
        answer = await self.predictor.predict(doc, row, col, mode)
        if not self.predictor.shows_insertion(answer):
            return []
        sugg = answer.sugg
        end = convert.replace_end(doc, answer.built, sugg)
        data = convert.suggestion_data(answer.confidence, answer.inline_rewrites_recent)
        return self.items(doc, row, col, sugg.insert_text, end, data, self.alternatives(doc, row, col, answer))

    async def completion(self, doc: Document, line: int, character: int) -> types.CompletionList:
        """textDocument/completion, the fallback of clients without inline completion: the model's
        insertion while typing as one completion item (none: nothing to show)."""
        row, col = doc.clamp(line, character)
        answer = await self.predictor.predict(doc, row, col, "typing")
        if not self.predictor.shows_insertion(answer):
            return types.CompletionList(is_incomplete=True, items=[])
        data = convert.suggestion_data(answer.confidence, answer.inline_rewrites_recent)
        return convert.completion_list(doc, row, col, answer.built, answer.sugg, data)

    def from_type_through(self, doc: Document, row: int, col: int) -> str | None:
        """The rest of a shown suggestion the user is typing through, or None."""
        if not self.ctx.options.scheduler.type_through:
            return None
        entry = self.shown.get(doc.uri)
        if entry is None or entry.row != row:
            return None
        line = doc.line(row)
        if not line[:col].startswith(entry.before) or line[col:] != entry.after:
            return None
        typed = line[len(entry.before) : col]
        if not typed or not entry.text.startswith(typed) or len(typed) >= len(entry.text):
            return None
        return entry.text[len(typed) :]

    def alternatives_through(self, doc: Document, row: int, col: int) -> Alternatives:
        """While typing through the first item (`from_type_through`): the rest of each
        alternative listed with it that starts with what is typed, in their order."""
        entry = self.shown.get(doc.uri)
        if entry is None:
            return []
        typed = doc.line(row)[len(entry.before) : col]
        return [(t[len(typed) :], d) for t, d in entry.alternatives if t.startswith(typed) and len(t) > len(typed)]

    def alternatives(self, doc: Document, row: int, col: int, answer: InlineAnswer) -> Alternatives:
        """The alternatives to the first inline item (lsp.inline_alternatives), each with its data
        (its own confidence); their time is the `alternatives_ms` stage."""
        t0 = time.monotonic()
        found = inline_alternatives(doc, row, col, answer, self.ctx.options)
        if answer.proposal_confidences:
            self.ctx.stats.stage("alternatives_ms", (time.monotonic() - t0) * 1000)
        return [(text, convert.suggestion_data(confidence, False)) for text, confidence in found]

    def item(self, doc: Document, row: int, col: int, text: str, end: types.Position | None,
             data: dict | None = None) -> types.InlineCompletionItem:
        """One inline item with a fresh id; a pure insertion (`end` None) is kept, with its data,
        for typing through it."""
        item_id = self.next_id()
        if end is None:
            line = doc.line(row)
            self.shown[doc.uri] = ShownInsertion(row, line[:col], line[col:], text, data)
        return convert.inline_item(doc, row, col, text, end, item_id, data)

    def items(self, doc: Document, row: int, col: int, text: str, end: types.Position | None,
              data: dict | None, alternatives: Alternatives) -> list[types.InlineCompletionItem]:
        """The inline list: the first item (`item`), then the alternatives to it (pure
        insertions at the cursor, each with its own id and data). Typing through the first item
        keeps the alternatives that start with what is typed (`from_type_through`)."""
        first = self.item(doc, row, col, text, end, data)
        if end is not None or not alternatives:
            return [first]
        self.shown[doc.uri].alternatives = alternatives
        return [first, *(convert.inline_item(doc, row, col, t, None, self.next_id(), d) for t, d in alternatives)]
