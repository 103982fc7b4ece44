"""A degenerate answer is never shown by the real server, and dlm/stats counts it.

The engine here is a test double (this module is also the server subprocess's engine factory,
DLM_ENGINE_FACTORY=test_degenerate_lsp:engine): it makes no claim about the model, it answers
the filler the embedded model wrote without the sampler's defences, so the server's path from answer to editor is
what is tested.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from dlm.coder_model.types import CancelToken, EngineStatus, LayoutBudget, Prediction, Prompt, SamplerParams
from fake_engine import on_a_thread

FILLER = "self_assertEqual_get_get_get_get_get_get_get_get_get_name)"


class FillerEngine:
    """Inserts FILLER at the cursor with full confidence."""

    budget = LayoutBudget()

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken,
                deadline: float | None = None) -> Prediction:
        text = prompt.region[: prompt.cursor] + FILLER + prompt.region[prompt.cursor :]
        return Prediction(text, steps=1, tokens=1, confidence=1.0)

    def submit(self, prompt, params, cancel, deadline=None) -> Future:
        return on_a_thread(self.predict, prompt, params, cancel, deadline)

    def status(self) -> EngineStatus:
        return EngineStatus(state="ready", device="cpu", model="filler (degenerate-answer test only)")

    def close(self) -> None:
        pass


def engine(model=None, device=None) -> FillerEngine:
    return FillerEngine()


def test_the_server_holds_back_a_degenerate_answer_and_counts_it():
    from lsp_helpers import SERVER, server_env
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    async def scenario():
        client = LanguageClient("degenerate-test", "1")
        await client.start_io(*SERVER, env=server_env(DLM_ENGINE_FACTORY="test_degenerate_lsp:engine"))
        caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities()))
        await client.initialize_async(types.InitializeParams(capabilities=caps,
                                                             initialization_options={"minConfidence": 0}))
        client.initialized(types.InitializedParams())
        try:
            for _ in range(400):
                if (await client.protocol.send_request_async("dlm/stats", {})).state == "ready":
                    break
                await asyncio.sleep(0.05)
            uri = "file:///w/a.py"
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text="if \n")))
            res = await client.text_document_inline_completion_async(types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 3),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
            assert res is None or not res.items
            stats = await client.protocol.send_request_async("dlm/stats", {})
            assert stats.completed == 1 and stats.held_back_degenerate == 1 and stats.shown == 0
        finally:
            await client.shutdown_async(None)
            client.exit(None)
            await client.stop()

    asyncio.run(scenario())
