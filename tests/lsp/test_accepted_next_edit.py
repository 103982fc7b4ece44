"""An accepted next edit counts as a repetition of its pattern (lsp.next_edits.accepted_edit).

The client reports `dlm/acceptedEdit {id}` right before it applies the proposal. The servers
here wait 30 s before a pause ends an edit (`history.idleS`), so an accepted site two lines
from the user's rename would join that rename's edit if the report were not taken: the rename
would count as made once. The gate (`minConfidence` 0.5) sits between the far site's confidence
for a rename made once and for one made twice, so the far site is proposed only when the
accepted site counted.
"""

from __future__ import annotations

import contextlib
import itertools
from types import SimpleNamespace

import pytest
from lsp_helpers import SERVER, change, edit_prediction, open_document, request, server_env, wait_state
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

TEXT = ("def total(rows):\n    n = count(rows)\n    m = count(rows) * 2\n    return n + m\n\n\n"
        + "".join(f"# filler {i}\n" for i in range(15))
        + "def mean(rows):\n    return sum(rows) / count(rows)\n")
FAR = TEXT.splitlines().index("    return sum(rows) / count(rows)")
INIT = {"editPredictions": True, "index": {"enabled": False}, "history": {"idleS": 30},
        "nextEdits": {"minConfidence": 0.5, "modelFallback": False, "gitCommits": 0, "checkWithModel": False}}


async def start(tmp_path):
    client = await ClientServerConfig(
        server_command=[*SERVER, "--device", "cpu"],
        server_env=server_env(HOME=str(tmp_path), DLM_ENGINE_FACTORY="fake_engine:echo_proposals",
                              FAKE_STEP_S="0.01", FAKE_STEPS="1"),
    ).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=INIT))
    await wait_state(client, timeout_s=20)
    return client


async def rename_then_near_site(client, uri: str) -> dict:
    """The user renames count -> tally on line 1; the server's next edit: the use on line 2."""
    open_document(client, uri, TEXT)
    change(client, uri, 2, (1, 8), (1, 13), "tally")
    res = await edit_prediction(client, uri, 1, 13)
    assert res is not None and res["label"] == "rename count → tally"
    (edit,) = res["edits"]
    assert edit["range"]["start"] == {"line": 2, "character": 8} and edit["newText"] == "tally"
    assert "jump" not in res
    return res


def apply(client, uri: str, version: int, res: dict) -> None:
    (edit,) = res["edits"]
    rng = edit["range"]
    change(client, uri, version, (rng["start"]["line"], rng["start"]["character"]),
           (rng["end"]["line"], rng["end"]["character"]), edit["newText"])


@contextlib.asynccontextmanager
async def near_site_proposed(tmp_path):
    """A server with stats.py open, the rename made at one use and the near site proposed:
    (client, uri, the proposal); shut down after."""
    client = await start(tmp_path)
    try:
        uri = "file:///proj/stats.py"
        yield client, uri, await rename_then_near_site(client, uri)
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_an_accepted_site_counts_as_the_rename_made_again_and_its_far_site_is_proposed(tmp_path):
    async with near_site_proposed(tmp_path) as (client, uri, res):
        client.protocol.notify("dlm/acceptedEdit", {"id": res["id"], "textDocument": {"uri": uri}})
        apply(client, uri, 3, res)
        res = await edit_prediction(client, uri, 1, 13)
        assert res is not None, "the far use was not proposed after the accepted site"
        (edit,) = res["edits"]
        assert edit["range"]["start"]["line"] == FAR and edit["newText"] == "tally"
        assert res["confidence"] >= 0.5


@pytest.mark.asyncio
async def test_an_accept_that_is_not_of_an_answered_proposal_for_the_text_as_it_is_counts_nothing(tmp_path):
    # the same steps, the report wrong: an id never answered, a report repeated after the edit is
    # in, a report for a version the document has left: the site joins the rename's edit, and the
    # far site stays under the gate
    async with near_site_proposed(tmp_path) as (client, uri, res):
        client.protocol.notify("dlm/acceptedEdit", {"id": "no such id", "textDocument": {"uri": uri}})
        client.protocol.notify("dlm/acceptedEdit", {"id": None})
        apply(client, uri, 3, res)
        client.protocol.notify("dlm/acceptedEdit", {"id": res["id"], "textDocument": {"uri": uri}})
        assert await edit_prediction(client, uri, 1, 13) is None
        assert (await request(client, "dlm/stats", {}))["documents"] == 1  # the server took it calmly


def memory_server():
    """The parts of a server that lsp.next_edits uses to learn and answer, in process."""
    from dlm.lsp.documents import Documents
    from dlm.lsp.next_edits import NextEdits
    from dlm.lsp.options import parse_options

    options, problems = parse_options(INIT)
    assert not problems, problems
    ids = itertools.count(1)
    return SimpleNamespace(options=options, next_edits=NextEdits(), documents=Documents(),
                           path_of=lambda uri: "stats.py", next_id=lambda: str(next(ids)))


def rename_counts(ls) -> list[int]:
    return [e.count for e in ls.next_edits.memory.patterns() if e.pattern.kind == "rename"]


@pytest.mark.parametrize("reported", [True, False])
def test_an_accepted_site_is_an_edit_of_its_own_that_repeats_the_rename(reported):
    # lsp.next_edits in process: the memory's count of the rename, as a rename made again by hand
    # after a pause would leave it (2); unreported, the accepted site joins the user's edit (1)
    from dlm.lsp import next_edits

    ls = memory_server()
    uri = "file:///proj/stats.py"
    doc = ls.documents.open(uri, TEXT, 1, "python")

    def edit(start, end, text):
        next_edits.record(ls, doc, doc.apply(start, end, text, doc.version + 1))

    edit((1, 8), (1, 13), "tally")
    pending, open_edit = next_edits._pending(ls, doc, "stats.py", doc.lines)
    found = ls.next_edits.memory.propose("stats.py", doc.lines, 1, pending=pending, open_edit=open_edit)
    res = next_edits.result(ls, doc, found[0], found[0].support, 1)
    (site,) = res["edits"]
    assert site["range"]["start"] == {"line": 2, "character": 8} and site["newText"] == "tally"
    tracker = ls.next_edits.trackers[uri]
    if reported:
        next_edits.accepted_edit(ls, {"id": res["id"], "textDocument": {"uri": uri}})
        assert rename_counts(ls) == [1] and tracker.open is None  # the user's rename: closed
    edit((2, 8), (2, 13), "tally")
    if reported:
        # the accepted edit is closed as soon as it is in: the rename made twice
        assert rename_counts(ls) == [2] and tracker.open is None and not ls.next_edits.accepting
        edit((2, 23), (2, 23), " + 1")  # typing right after it on its line: an edit of its own
        assert rename_counts(ls) == [2] and tracker.open is not None
        # a second report of the same id counts nothing more
        next_edits.accepted_edit(ls, {"id": res["id"], "textDocument": {"uri": uri}})
        ls.next_edits.close_open_edit(uri)
        assert rename_counts(ls) == [2]
    else:
        assert rename_counts(ls) == [] and tracker.open is not None  # one edit, still open
        ls.next_edits.close_open_edit(uri)
        assert rename_counts(ls) == [1]
