"""Repository memory through the real server with the embedded model: a line the workspace
already holds is proposed by the memory, ranked by the line ranker and shown at the cursor, or
checked by the denoiser when the check is asked for (sampler.verifyPasses).

The workspace repeats a distinctive call, so the memory's only proposal is known; the
test claims that the product answers with it when the gate lets everything through, not how
often the model agrees in general (BENCHMARKS.md measures that).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lsp_helpers import SERVER, inline_params, open_document, request, start_in_workspace, type_chars
from lsprotocol import types

CPU_SERVER = [*SERVER, "--device", "cpu"]
LINE = "    frobnicate_widget(registry, widget_id=42, strict=True)\n"


def _project(root: Path) -> None:
    for i in range(6):
        (root / f"mod{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / f"mod{i}.py").write_text(f"def handler_{i}(registry):\n{LINE}    return registry\n")


async def _type_and_ask(client, uri: str, text: str, row: int, typed: str):
    open_document(client, uri, text)
    type_chars(client, uri, row, 0, 2, typed)
    return await client.text_document_inline_completion_async(
        inline_params(uri, row, len(typed), types.InlineCompletionTriggerKind.Automatic))


async def _frobnicate(tmp_path: Path, init: dict) -> tuple[list[str], dict]:
    """The inline items after `    frobnicate_` typed in a new file of the workspace, and dlm/stats."""
    root = tmp_path / "proj"
    _project(root)
    client = await start_in_workspace(tmp_path, root, init, CPU_SERVER)
    try:
        uri = (root / "new.py").as_uri()
        res = await _type_and_ask(client, uri, "def handler_9(registry):\n\n    return registry\n", 1,
                                  "    frobnicate_")
        return [i.insert_text for i in res.items], await request(client, "dlm/stats", {})
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_by_default_the_ranked_memory_answers_with_no_model_pass(tmp_path: Path):
    items, stats = await _frobnicate(tmp_path, {"minConfidence": 0, "deadlineMs": 5000})
    assert items == ["widget(registry, widget_id=42, strict=True)"]
    assert stats["offered"] == 1 and stats["memory_answers"] >= 1 and stats["steps"] == 0


@pytest.mark.asyncio
async def test_the_memory_proposes_a_workspace_line_and_the_denoiser_checks_it(tmp_path: Path):
    # every proposal checked (no fast path: sampler.memoryFirst above 1)
    check = {"verifyPasses": 2, "memoryFirst": 2.0}
    items, stats = await _frobnicate(tmp_path, {"minConfidence": 0, "deadlineMs": 5000, "sampler": check,
                                                "index": {"rankDrafts": False}})
    assert items == ["widget(registry, widget_id=42, strict=True)"]
    assert stats["offered"] == 1 and stats["steps"] >= 1  # the denoiser ran on the proposal


@pytest.mark.asyncio
async def test_a_proposal_the_memory_is_sure_of_takes_the_fast_path(tmp_path: Path):
    """The one line of the workspace that continues `frobnicate_`: the memory is sure of it, so at
    the default `sampler.memoryFirst` the check asked for is skipped: no model pass."""
    items, stats = await _frobnicate(tmp_path, {"minConfidence": 0, "deadlineMs": 5000, "sampler": {"verifyPasses": 2},
                                                "index": {"rankDrafts": False}})
    assert items == ["widget(registry, widget_id=42, strict=True)"]
    assert stats["offered"] == 1 and stats["memory_answers"] >= 1 and stats["steps"] == 0
    assert stats["no_steps"] == 0  # counted as the memory's answer, not as "no time for a step"


@pytest.mark.asyncio
async def test_with_the_index_off_the_model_answers_alone(tmp_path: Path):
    root = tmp_path / "proj"
    _project(root)
    init = {"minConfidence": 0, "deadlineMs": 5000, "index": {"enabled": False}}
    client = await start_in_workspace(tmp_path, root, init, CPU_SERVER, folders=False, indexed=False)
    try:
        uri = (root / "new.py").as_uri()
        res = await _type_and_ask(client, uri, "def handler_9(registry):\n\n    return registry\n", 1,
                                  "    frobnicate_")
        texts = [i.insert_text for i in res.items]
        assert texts != ["widget(registry, widget_id=42, strict=True)"]  # the model alone never saw it
        assert (await request(client, "dlm/stats", {}))["index"]["state"] == "off"
    finally:
        await client.shutdown_session()
