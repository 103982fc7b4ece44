"""A degenerate answer is never shown by the real server, and dlm/stats counts it.

The engine here is a test double (this module is also the server subprocess's engine factory,
DLM_ENGINE_FACTORY=test_degenerate_lsp:engine): it makes no claim about the model, it answers
the filler the embedded model wrote without the sampler's defences, so the server's path from answer to editor is
what is tested.
"""

from __future__ import annotations

import asyncio

from dlm.coder_model.types import Prompt
from fake_engine import InsertingEngine

FILLER = "self_assertEqual_get_get_get_get_get_get_get_get_get_name)"


class FillerEngine(InsertingEngine):
    """Inserts FILLER at the cursor with full confidence."""

    model_name = "filler (degenerate-answer test only)"

    def insertion(self, prompt: Prompt) -> str:
        return FILLER


def engine(model=None, device=None) -> FillerEngine:
    return FillerEngine()


def test_the_server_holds_back_a_degenerate_answer_and_counts_it():
    from lsp_helpers import inline_params, inline_session, open_document, server_env

    async def scenario():
        env = server_env(DLM_ENGINE_FACTORY="test_degenerate_lsp:engine")
        async with inline_session(env, {"minConfidence": 0}, "degenerate-test") as client:
            uri = "file:///w/a.py"
            open_document(client, uri, "if \n")
            res = await client.text_document_inline_completion_async(inline_params(uri, 0, 3))
            assert res is None or not res.items
            stats = await client.protocol.send_request_async("dlm/stats", {})
            assert stats.completed == 1 and stats.held_back_degenerate == 1 and stats.shown == 0

    asyncio.run(scenario())
