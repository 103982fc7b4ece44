"""Insertion while typing through the real server: the typing path sends the engine an
insertion prompt (Prompt.insert) with snippets of the workspace's other files, and the inline
item is the insertion; a request after an idle pause is the region rewrite of the edit mode.

The engine is a test double (this module is also the server subprocess's engine factory,
DLM_ENGINE_FACTORY=test_insertion_lsp:engine): it makes no claim about the model. It answers, as
the new region, the region with a marker inserted at the cursor that says what it was sent:
INS or REW (the mode), then the first snippet's path when it got snippets.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from dlm.coder_model.types import LayoutBudget, Prompt
from fake_engine import InsertingEngine
from lsp_helpers import change, inline_params, open_document, start_in_workspace


class ModeEngine(InsertingEngine):
    budget = LayoutBudget.for_window(384)
    model_name = "mode (insertion-path test only)"

    def insertion(self, prompt: Prompt) -> str:
        mark = ("INS" if prompt.insert else "REW") + (f"_{prompt.snippets[0].path}" if prompt.snippets else "")
        return mark.replace("/", "_").replace(".", "_")


def engine(model=None, device=None) -> ModeEngine:
    return ModeEngine()


SHARED = "    conn = open_database(settings.url)\n    rows = conn.fetch_rows(table_name)\n"


def test_typing_sends_an_insertion_prompt_with_workspace_snippets_and_shows_the_insertion(tmp_path: Path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "db_util.py").write_text("def load(settings, table_name):\n" + SHARED + "    return rows\n")
    main = root / "main.py"
    text = "def run(settings, table_name):\n" + SHARED + "    \n"
    main.write_text(text)

    async def scenario():
        client = await start_in_workspace(tmp_path, root, {"minConfidence": 0},
                                          DLM_ENGINE_FACTORY="test_insertion_lsp:engine")
        try:
            uri = main.as_uri()
            open_document(client, uri, text)

            async def ask(row: int, col: int):
                res = await client.text_document_inline_completion_async(inline_params(uri, row, col))
                return [] if res is None else (res.items if hasattr(res, "items") else res)

            # opened, not typed in, the cursor mid-line (text after it): the edit mode's region rewrite
            items = await ask(1, 4)
            assert [i.insert_text for i in items] == ["REW"]
            # opened, not typed in, at a completion point (the end of the line's text): the insertion
            items = await ask(3, 4)
            assert len(items) == 1 and items[0].insert_text == "INS_db_util_py" and items[0].range is None
            # typing on the last line: an insertion prompt, with the other file's lines as a snippet
            change(client, uri, 2, (3, 4), (3, 4), "re")
            items = await ask(3, 6)
            assert len(items) == 1 and items[0].insert_text == "INS_db_util_py"
            assert items[0].range is None  # a pure insertion at the cursor: nothing of the line is replaced
        finally:
            await client.shutdown_session()

    asyncio.run(scenario())
