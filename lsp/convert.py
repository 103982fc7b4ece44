"""Plain translations between our types and LSP's (no server state here).

A prediction, post-processed into a `Suggestion` for a `BuiltContext` of a
`Document`, becomes an InlineCompletionItem, a CompletionList or the
`dlm/editPrediction` result; LSP params (lsprotocol objects, or plain dicts
for our custom methods) give their position.
"""

from __future__ import annotations

from typing import Any

from dlm.lsp.context import BuiltContext
from dlm.lsp.documents import Document
from dlm.lsp.postprocess import Suggestion
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

ACCEPT_COMMAND = "dlm.acceptCompletion"


def param(obj: Any, *path: str, default: Any = None) -> Any:
    """A field of params given as an lsprotocol object or a plain dict (custom methods)."""
    for name in path:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


def command_item_id(params: Any) -> Any:
    """The suggestion id in `{item: {command: {arguments: [id, ...]}}}` (didShowCompletion,
    didPartiallyAcceptCompletion, didShowInlineEdit), or None when there is none."""
    args = param(params, "item", "command", "arguments")
    return args[0] if isinstance(args, (list, tuple)) and args else None


def position_of(params: Any) -> tuple[int, int]:
    """(line, character) of params' `position`; JsonRpcInvalidParams when it is not one."""
    pos = param(params, "position")
    line, ch = param(pos, "line"), param(pos, "character")
    if not isinstance(line, int) or not isinstance(ch, int):
        raise JsonRpcInvalidParams(
            f"position must be {{line: int, character: int}}, got {pos!r}; send an LSP Position"
        )
    return line, ch


def document_uri(params: Any) -> str | None:
    """The textDocument uri of params (camelCase from clients, snake_case from lsprotocol)."""
    uri = param(params, "textDocument", "uri") or param(params, "text_document", "uri")
    return uri if isinstance(uri, str) else None


def cursor_position(doc: Document, row: int, col: int) -> types.Position:
    """LSP position of a (row, code-point column) of the document."""
    return types.Position(*doc.to_position(row, col))


def region_position(doc: Document, built: BuiltContext, offset: int) -> types.Position:
    """LSP position of a code-point offset inside the region."""
    row, rem = built.start_line, offset
    while row < built.end_line and rem >= len(doc.lines[row]):
        rem -= len(doc.lines[row])
        row += 1
    line, ch = doc.to_position(row, rem)
    return types.Position(line=line, character=ch)


def replace_end(doc: Document, built: BuiltContext, sugg: Suggestion) -> types.Position | None:
    """Where the text the suggestion replaces ends (None: a pure insertion)."""
    return region_position(doc, built, sugg.replace_end) if sugg.replace_end is not None else None


def suggestion_data(confidence: float | None, rewrites_recent: bool) -> dict:
    """What the server knows of a suggestion's quality (docs/protocol.md): `confidence`
    (calibrated, null when the engine computes none) and `rewritesRecent`."""
    return {"confidence": confidence, "rewritesRecent": rewrites_recent}


def inline_item(
    doc: Document, row: int, col: int, text: str, end: types.Position | None, item_id: str,
    data: dict | None = None,
) -> types.InlineCompletionItem:
    """An inline suggestion at the cursor; accepting it runs ACCEPT_COMMAND with its id (and
    its `data`, when given, as a second argument: inline items have no data field)."""
    start = cursor_position(doc, row, col)
    return types.InlineCompletionItem(
        insert_text=text,
        range=types.Range(start=start, end=end) if end is not None else None,
        command=types.Command(
            title="dlm: accept", command=ACCEPT_COMMAND, arguments=[item_id] + ([data] if data else [])
        ),
    )


def completion_list(
    doc: Document, row: int, col: int, built: BuiltContext, sugg: Suggestion, data: dict | None = None
) -> types.CompletionList:
    """The suggestion as the one item of a completion list (for clients without inline completion)."""
    start = cursor_position(doc, row, col)
    end = replace_end(doc, built, sugg) or start
    text = sugg.insert_text
    words = doc.line(row)[:col].split()
    return types.CompletionList(
        is_incomplete=True,  # ask again on the next keystroke: the prediction depends on it
        items=[
            types.CompletionItem(
                label=text.strip().split("\n", 1)[0][:60] or text,
                kind=types.CompletionItemKind.Text,
                detail="dlm",
                text_edit=types.TextEdit(range=types.Range(start=start, end=end), new_text=text),
                sort_text="0",
                filter_text=words[-1] if words else "",
                data=data,
            )
        ],
    )


def position_dict(p: types.Position) -> dict:
    return {"line": p.line, "character": p.character}


def edit_prediction(doc: Document, built: BuiltContext, sugg: Suggestion, version: int, prediction_id: str) -> dict:
    """The `dlm/editPrediction` result: the suggestion's edits as LSP ranges of the document."""
    edits = [
        {
            "range": {
                "start": position_dict(region_position(doc, built, e.start)),
                "end": position_dict(region_position(doc, built, e.end)),
            },
            "newText": e.text,
        }
        for e in sugg.edits
    ]
    return {"id": prediction_id, "version": version, "edits": edits}
