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
from concurrent.futures import Future
from pathlib import Path

from dlm.coder_model.types import CancelToken, EngineStatus, LayoutBudget, Prediction, Prompt, SamplerParams
from fake_engine import on_a_thread
from lsp_helpers import SERVER, request, server_env
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities


class ModeEngine:
    budget = LayoutBudget.for_window(384)

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        mark = ("INS" if prompt.insert else "REW") + (f"_{prompt.snippets[0].path}" if prompt.snippets else "")
        mark = mark.replace("/", "_").replace(".", "_")
        text = prompt.region[: prompt.cursor] + mark + prompt.region[prompt.cursor :]
        return Prediction(text, steps=1, tokens=1, confidence=1.0)

    def submit(self, prompt, params, cancel, deadline=None) -> Future:
        return on_a_thread(self.predict, prompt, params, cancel, deadline)

    def status(self) -> EngineStatus:
        return EngineStatus(state="ready", device="cpu", model="mode (insertion-path test only)")

    def close(self) -> None:
        pass


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
        env = server_env(DLM_ENGINE_FACTORY="test_insertion_lsp:engine", XDG_CACHE_HOME=str(tmp_path / "cache"),
                         HOME=str(tmp_path / "home"))
        client = await ClientServerConfig(server_command=list(SERVER), server_env=env).start()
        await client.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
            initialization_options={"minConfidence": 0}))
        try:
            for _ in range(600):
                stats = await request(client, "dlm/stats", {})
                if stats["state"] == "ready" and stats["index"]["state"] == "ready":
                    break
                await asyncio.sleep(0.1)
            uri = main.as_uri()
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

            async def ask(row: int, col: int):
                res = await client.text_document_inline_completion_async(types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri), position=types.Position(row, col),
                    context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
                return [] if res is None else (res.items if hasattr(res, "items") else res)

            # opened, not typed in, the cursor mid-line (text after it): the edit mode's region rewrite
            items = await ask(1, 4)
            assert [i.insert_text for i in items] == ["REW"]
            # opened, not typed in, at a completion point (the end of the line's text): the insertion
            items = await ask(3, 4)
            assert len(items) == 1 and items[0].insert_text == "INS_db_util_py" and items[0].range is None
            # typing on the last line: an insertion prompt, with the other file's lines as a snippet
            pos = types.Position(3, 4)
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                [types.TextDocumentContentChangePartial(range=types.Range(pos, pos), text="re")]))
            items = await ask(3, 6)
            assert len(items) == 1 and items[0].insert_text == "INS_db_util_py"
            assert items[0].range is None  # a pure insertion at the cursor: nothing of the line is replaced
        finally:
            await client.shutdown_session()

    asyncio.run(scenario())
