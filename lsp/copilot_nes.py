"""Copilot's next-edit methods, answered with dlm's edit predictions (plain functions).

Editors have clients for GitHub Copilot's "next edit suggestions" (NES), e.g.
Emacs copilot.el's `copilot-nes` and Neovim's copilot-lsp. They speak two
methods that copilot-language-server added beside LSP:

- request `textDocument/copilotInlineEdit`
  params `{textDocument: {uri, version}, position: {line, character}}` ->
  `{edits: [{text, range, textDocument: {uri, version}, command?}]}`:
  `text` replaces `range` of the document at `version`; after applying it the
  client runs `command` with `workspace/executeCommand`;
- notification `textDocument/didShowInlineEdit` `{item: {command: {arguments: [id, ...]}}}`
  (some clients send the whole edit as `item`) when an edit is on screen.

dlm answers the request with the same computation as `dlm/editPrediction`
(lsp.server; off unless initializationOptions set `editPredictions`), and
translates the result here: the region's edits become one Copilot edit that
spans them all (Copilot answers with one edit per suggestion, and copilot.el
shows only the first), `newText` carries the text as well so the edit is an
LSP TextEdit too, and `command` is `dlm.acceptCompletion` with the prediction's
id, so an accepted next edit counts in `dlm/stats` like an accepted inline
completion. A request for a version the server no longer (or not yet) has
gets no edits: the client checks the version and would drop them anyway.
"""

from __future__ import annotations

from typing import Any

from dlm.lsp.convert import ACCEPT_COMMAND, param
from dlm.lsp.documents import Document, content

COPILOT_INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit"


def requested_version(params: Any) -> int | None:
    """The document version the client asks about (None when it sends none)."""
    version = param(params, "textDocument", "version")
    if version is None:
        version = param(params, "text_document", "version")
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def _point(pos: dict) -> tuple[int, int]:
    return pos["line"], pos["character"]


def _text_between(doc: Document, start: tuple[int, int], end: tuple[int, int]) -> str:
    """Document text between two (row, code-point column) points, start <= end."""
    (r1, c1), (r2, c2) = start, end
    if r1 == r2:
        return doc.line(r1)[c1:c2]
    parts = [doc.lines[r1][c1:]]
    parts.extend(doc.lines[r1 + 1 : r2])
    parts.append(content(doc.lines[r2])[:c2])
    return "".join(parts)


def merge_edits(doc: Document, edits: list[dict]) -> dict | None:
    """`dlm/editPrediction` edits ({range, newText}, in order, not overlapping) -> one
    {range, newText} from the first start to the last end, the unchanged text between
    them kept; None when there are none."""
    if not edits:
        return None
    edits = sorted(edits, key=lambda e: _point(e["range"]["start"]))
    text: list[str] = []
    for i, e in enumerate(edits):
        if i:
            prev_end = doc.clamp(*_point(edits[i - 1]["range"]["end"]))
            start = doc.clamp(*_point(e["range"]["start"]))
            text.append(_text_between(doc, prev_end, start))
        text.append(e["newText"])
    return {"range": {"start": edits[0]["range"]["start"], "end": edits[-1]["range"]["end"]},
            "newText": "".join(text)}


def no_edits() -> dict:
    return {"edits": []}


def inline_edits(doc: Document, prediction: dict | None, version: int | None) -> dict:
    """The `textDocument/copilotInlineEdit` answer for a `dlm/editPrediction` result
    (`{id, version, edits}` or None) of `doc`, asked at `version` (None: any). Edits for
    another version than the document's and the client's are dropped."""
    if prediction is None or prediction["version"] != doc.version:
        return no_edits()
    if version is not None and version != prediction["version"]:
        return no_edits()
    merged = merge_edits(doc, prediction["edits"])
    if merged is None:
        return no_edits()
    return {
        "edits": [
            {
                "text": merged["newText"],
                "newText": merged["newText"],
                "range": merged["range"],
                "textDocument": {"uri": doc.uri, "version": prediction["version"]},
                "command": {"title": "dlm: accept next edit", "command": ACCEPT_COMMAND,
                            "arguments": [str(prediction["id"])]},
            }
        ]
    }

