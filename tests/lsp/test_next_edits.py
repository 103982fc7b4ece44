"""Next edits from the edit memory through the real server (lsp.next_edits; docs/next-edits.md).

The first test runs the embedded model (its denoiser checks the proposal); the others use the
ProposalEchoEngine double (tests/lsp/fake_engine.py), which answers the proposal it is given
after a set delay: they check what the server does around the check (a version change drops
the proposal, an undo forgets the pattern, Copilot's shape), not the model.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from lsp_helpers import SERVER, change, edit_prediction, open_document, request, server_env, wait_state
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

TEXT = ("def total(rows):\n    n = count(rows)\n    return n\n\n\n"
        "def mean(rows):\n    return sum(rows) / count(rows)\n\n\n"
        + "".join(f"# filler {i}\n" for i in range(20))
        + "def last(rows):\n    return count(rows) - 1\n")


def apply_edit(text: str, edit: dict) -> str:
    lines = text.split("\n")

    def offset(p):
        return sum(len(x) + 1 for x in lines[: p["line"]]) + p["character"]

    rng = edit["range"]
    return text[: offset(rng["start"])] + edit["newText"] + text[offset(rng["end"]) :]


async def start(env: dict, init: dict, timeout_s: float = 120.0):
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"], server_env=server_env(**env)).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=init))
    await wait_state(client, timeout_s=timeout_s)
    return client


def rename_on_line_1(client, uri: str) -> None:
    change(client, uri, 2, (1, 8), (1, 13), "tally")  # count -> tally in `n = count(rows)`


@pytest.mark.asyncio
async def test_a_rename_in_one_place_yields_a_proposal_at_another_use_checked_by_the_model(tmp_path):
    client = await start({"HOME": str(tmp_path)}, {
        "editPredictions": True, "index": {"enabled": False},
        "nextEdits": {"minConfidence": 0, "modelFallback": False, "deadlineMs": 5000, "checkWithModel": True}})
    try:
        uri = "file:///proj/stats.py"
        open_document(client, uri, TEXT)
        rename_on_line_1(client, uri)
        text = TEXT.replace("n = count(rows)", "n = tally(rows)")
        res = await edit_prediction(client, uri, 1, 13)
        assert res is not None and res["source"] == "editMemory" and res["label"] == "rename count → tally"
        (edit,) = res["edits"]
        assert edit["range"]["start"]["line"] == 6  # the nearest other use
        assert apply_edit(text, edit) == text.replace("sum(rows) / count(rows)", "sum(rows) / tally(rows)")
        assert 0 <= res["confidence"] <= 1 and res["version"] == 2
        assert "jump" not in res  # 5 lines away: near enough to show in place

        # accept it; the last use is 24 lines below the cursor: a "jump to" hint
        text = apply_edit(text, edit)
        rng = edit["range"]
        change(client, uri, 3, (rng["start"]["line"], rng["start"]["character"]),
               (rng["end"]["line"], rng["end"]["character"]), edit["newText"])
        res = await edit_prediction(client, uri, 6, 29)
        assert res is not None
        (edit,) = res["edits"]
        assert apply_edit(text, edit) == text.replace("return count(rows) - 1", "return tally(rows) - 1")
        assert res["jump"]["position"] == edit["range"]["start"] and res["jump"]["lines"] == 24

        # another open buffer: the session's pattern proposes there too
        other = "file:///proj/report.py"
        open_document(client, other, "from stats import count\n\nprint(count([1, 2]))\n")
        res = await edit_prediction(client, other, 0, 0)
        assert res is not None and res["edits"][0]["newText"] == "tally"
    finally:
        await client.shutdown_session()


ECHO = {"DLM_ENGINE_FACTORY": "fake_engine:echo_proposals", "FAKE_STEP_S": "0.5", "FAKE_STEPS": "1"}
INIT = {"editPredictions": True, "index": {"enabled": False},
        "nextEdits": {"minConfidence": 0.5, "modelFallback": False, "deadlineMs": 5000, "gitCommits": 0,
                      "checkWithModel": True}}


@pytest.mark.asyncio
async def test_a_version_change_while_the_proposal_is_checked_drops_it_and_an_undo_forgets(tmp_path):
    client = await start({"HOME": str(tmp_path), **ECHO}, INIT, timeout_s=20)
    try:
        uri = "file:///proj/stats.py"
        open_document(client, uri, TEXT)
        rename_on_line_1(client, uri)
        pending = asyncio.ensure_future(edit_prediction(client, uri, 1, 13))
        await asyncio.sleep(0.2)  # the check takes 0.5 s: the user types meanwhile
        change(client, uri, 3, (2, 12), (2, 12), " ")
        assert await pending is None
        assert (await request(client, "dlm/stats", {}))["outdated"] >= 1
        # asked again at the new version, it comes (the pattern is still remembered)
        res = await edit_prediction(client, uri, 1, 13)
        assert res is not None and res["edits"][0]["newText"] == "tally" and res["version"] == 3

        # undo the rename (the editor sends the text back): the memory forgets the pattern
        change(client, uri, 4, (1, 8), (1, 13), "count")
        assert await edit_prediction(client, uri, 1, 13) is None
        await asyncio.sleep(1.6)  # a pause closes the undo; still nothing
        change(client, uri, 5, (2, 0), (2, 0), "")
        assert await edit_prediction(client, uri, 2, 0) is None

        # Copilot's NES method answers with the memory's proposal, by range
        change(client, uri, 6, (1, 8), (1, 13), "tally")
        res = await request(client, "textDocument/copilotInlineEdit",
                            {"textDocument": {"uri": uri, "version": 6}, "position": {"line": 1, "character": 13}})
        (edit,) = res["edits"]
        assert edit["text"] == "tally" and edit["range"]["start"]["line"] == 6
        assert edit["textDocument"] == {"uri": uri, "version": 6}
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_a_ten_thousand_line_paste_proposes_nothing_and_deletes_nothing(tmp_path):
    client = await start({"HOME": str(tmp_path), **ECHO, "FAKE_STEP_S": "0.001"}, INIT, timeout_s=20)
    try:
        uri = "file:///proj/big.py"
        open_document(client, uri, TEXT)
        pasted = "x = count(rows)\n" * 10_000
        change(client, uri, 2, (1, 0), (1, 0), pasted)
        assert await edit_prediction(client, uri, 10_001, 0) is None
        stats = await request(client, "dlm/stats", {})
        assert stats["documents"] == 1  # the server is alive and still tracks it
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_with_the_defaults_a_lone_rename_proposes_its_nearest_use_without_a_model_run(tmp_path):
    # nextEdits defaults: the calibrated confidence alone (no check), the default gate; the fake model
    # takes 5 s per run (a check would miss its deadline and drop the proposal), so an answer shows none ran
    client = await start({"HOME": str(tmp_path), **ECHO, "FAKE_STEP_S": "5"},
                         {"editPredictions": True, "index": {"enabled": False}}, timeout_s=20)
    try:
        uri = "file:///proj/stats.py"
        open_document(client, uri, TEXT)
        rename_on_line_1(client, uri)
        res = await asyncio.wait_for(edit_prediction(client, uri, 1, 13), 3.0)
        assert res is not None and res["label"] == "rename count → tally"
        assert res["edits"][0]["range"]["start"]["line"] == 6 and res["edits"][0]["newText"] == "tally"
        assert 0.2 <= res["confidence"] < 1
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_the_last_edit_of_a_file_proposes_in_the_next_one_edited_or_after_it_is_closed(tmp_path):
    init = {**INIT, "nextEdits": {**INIT["nextEdits"], "minConfidence": 0, "checkWithModel": False}}
    client = await start({"HOME": str(tmp_path), **ECHO}, init, timeout_s=20)
    try:
        first, second = "file:///proj/stats.py", "file:///proj/report.py"
        report = "import stats\n\nprint(stats.count([1, 2]))\nx = 1\n"
        open_document(client, first, TEXT)
        open_document(client, second, report)
        rename_on_line_1(client, first)  # still the open edit of stats.py ...
        change(client, second, 2, (3, 5), (3, 5), "0")  # ... when the user goes on in report.py
        res = await edit_prediction(client, second, 3, 6)
        assert res is not None and res["label"] == "rename count → tally"
        assert res["edits"][0]["range"]["start"]["line"] == 2 and res["edits"][0]["newText"] == "tally"

        # an open edit of a file that is closed is remembered too
        third = "file:///proj/other.py"
        open_document(client, third, "def f(rows):\n    return mean(rows)\n\nprint(mean([1]))\n")
        change(client, third, 2, (1, 11), (1, 15), "average")
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(third)))
        res = await edit_prediction(client, first, 6, 0)
        assert res is not None and res["label"] == "rename mean → average"
    finally:
        await client.shutdown_session()


GUARDED = ("class WS:\n    def send_str(self, data):\n        if self._closed:\n            raise RuntimeError('closed')\n"
           "        self._writer.send(data)\n\n    def send_bytes(self, data):\n        if self._closed:\n"
           "            raise RuntimeError('closed')\n        self._writer.send(data)\n")


@pytest.mark.parametrize("check_with_model", [False, True])
@pytest.mark.asyncio
async def test_a_deleted_two_line_guard_is_proposed_by_range_where_the_same_guard_is(tmp_path, check_with_model):
    # a block pattern's site spans whole lines; with the model's check on, the echo double is shown the
    # lines with the span taken out and answers the proposal (what the server sends must be the same)
    init = {**INIT, "nextEdits": {**INIT["nextEdits"], "minConfidence": 0, "checkWithModel": check_with_model}}
    client = await start({"HOME": str(tmp_path), **ECHO, "FAKE_STEP_S": "0.01"}, init, timeout_s=20)
    try:
        uri = "file:///proj/ws.py"
        open_document(client, uri, GUARDED)
        change(client, uri, 2, (2, 0), (4, 0), "")  # send_str's guard deleted
        text = GUARDED.replace("        if self._closed:\n            raise RuntimeError('closed')\n", "", 1)
        res = await edit_prediction(client, uri, 2, 0)
        assert res is not None and res["label"] == "delete if self._closed: (+1 line)"
        (edit,) = res["edits"]
        assert edit["range"] == {"start": {"line": 5, "character": 0}, "end": {"line": 7, "character": 0}}
        assert edit["newText"] == "" and apply_edit(text, edit) == text.replace(
            "        if self._closed:\n            raise RuntimeError('closed')\n", "")
        # the user changes the guard's message before asking again: that guard is no longer a site
        change(client, uri, 3, (6, 32), (6, 38), "gone")
        assert await edit_prediction(client, uri, 6, 0) is None
    finally:
        await client.shutdown_session()


async def start_in(root, env: dict, next_edits: dict):
    """A server on the workspace folder `root`, indexed (its files are where a jump may lead)."""
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"],
                                      server_env=server_env(**env)).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        initialization_options={"editPredictions": True, "nextEdits": {"gitCommits": 0, **next_edits}}))
    await wait_state(client, timeout_s=20)
    for _ in range(400):
        if (await request(client, "dlm/stats", {}))["index"]["state"] == "ready":
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the workspace index never got ready")
    return client


@contextlib.asynccontextmanager
async def jump_server(root, home, **next_edits):
    """A server on `root` with the fake engine, every proposal shown (minConfidence 0), no model
    check; shut down when the block ends."""
    client = await start_in(root, {"HOME": str(home), **ECHO, "FAKE_STEP_S": "0.01"},
                            {"minConfidence": 0, "checkWithModel": False, **next_edits})
    try:
        yield client
    finally:
        await client.shutdown_session()


def stats_and_report(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "stats.py").write_text("def total(rows):\n    n = count(rows)\n    return n\n\n\n"
                                           "def mean(rows):\n    return sum(rows) / count(rows)\n")
    (root / "pkg" / "report.py").write_text("from .stats import count\n\n\nprint(count([1, 2]))\n")
    (root / "pkg" / "plain.py").write_text("x = 1\n")
    return root


async def renamed_in_stats(client, root, times: int = 2) -> str:
    """Opens pkg/stats.py and renames count -> tally on its line 1, then (times=2) on line 6, a
    pause apart (two edits: a jump is made only for an edit made twice); returns its uri."""
    uri = (root / "pkg" / "stats.py").as_uri()
    open_document(client, uri, (root / "pkg" / "stats.py").read_text())
    rename_on_line_1(client, uri)
    if times == 2:
        await asyncio.sleep(1.6)  # over the burst tracker's pause: the second rename is another edit
        change(client, uri, 3, (6, 23), (6, 28), "tally")  # `return sum(rows) / count(rows)`
    return uri


@pytest.mark.asyncio
async def test_with_no_site_left_here_a_jump_leads_to_a_workspace_file_that_is_not_open(tmp_path):
    root = stats_and_report(tmp_path)
    async with jump_server(root, tmp_path) as client:
        uri, report = await renamed_in_stats(client, root), (root / "pkg" / "report.py").as_uri()
        res = await edit_prediction(client, uri, 6, 28)  # stats.py has no other use of count: report.py has
        assert res is not None and res["edits"] == [] and res["version"] == 3
        assert res["label"] == "rename count → tally" and 0 <= res["confidence"] <= 1
        # its best site: the call (the `elsewhere` trees, fitted on the jump replay, rate it over the import)
        assert res["jump"] == {"uri": report, "path": "pkg/report.py", "position": {"line": 3, "character": 6},
                               "label": "rename count → tally"}
        assert (await request(client, "dlm/stats", {}))["jump_elsewhere"] >= 1

        # the client opens the file there and asks again: the edit itself, in that document, as sure
        # as the jump was (the gate that let the jump through lets the edit through: the server
        # remembers the jump it answered, lsp.next_edits.Landing)
        jump_confidence = res["confidence"]
        open_document(client, report, (root / "pkg" / "report.py").read_text())
        res = await edit_prediction(client, report, 3, 6)
        (edit,) = res["edits"]
        assert edit["newText"] == "tally" and edit["range"]["start"] == {"line": 3, "character": 6}
        assert res["confidence"] == pytest.approx(jump_confidence)


@pytest.mark.asyncio
async def test_a_jump_is_dropped_when_the_other_file_changed_and_never_made_with_other_files_0(tmp_path):
    root = stats_and_report(tmp_path)
    async with jump_server(root, tmp_path) as client:
        uri = await renamed_in_stats(client, root)
        assert (await edit_prediction(client, uri, 6, 28))["jump"]["position"]["line"] == 3
        # the user (or git) changes report.py on disk: the remembered site no longer holds `count`
        (root / "pkg" / "report.py").write_text("from .stats import tally\n\n\nprint(tally([1, 2]))\n")
        assert await edit_prediction(client, uri, 6, 28) is None

    async with jump_server(root, tmp_path / "h2", otherFiles=0) as client:
        (root / "pkg" / "report.py").write_text("from .stats import count\n\n\nprint(count([1, 2]))\n")
        assert await edit_prediction(client, await renamed_in_stats(client, root), 6, 28) is None


@pytest.mark.asyncio
async def test_an_edit_made_once_never_sends_the_user_to_another_file(tmp_path):
    root = stats_and_report(tmp_path)
    async with jump_server(root, tmp_path) as client:
        uri = (root / "pkg" / "scratch.py").as_uri()  # one use of count, renamed once: nothing left here
        open_document(client, uri, "x = count([1])\n")
        change(client, uri, 2, (0, 4), (0, 9), "tally")
        assert await edit_prediction(client, uri, 0, 9) is None  # report.py uses count: no jump for one edit
        await asyncio.sleep(1.6)
        change(client, uri, 3, (0, 0), (0, 0), "y = tally([2])\n")  # an unrelated edit; still none
        assert await edit_prediction(client, uri, 0, 9) is None


def test_a_landing_raises_only_the_jumps_own_site_in_the_jumps_own_file():
    # lsp.next_edits.Landing: the site a jump led to keeps the jump's confidence; nothing else moves
    from dlm.coder_model.edit_memory import Edit, EditMemory
    from dlm.lsp.next_edits import Landing

    mem = EditMemory()
    stats = ["n = count(rows)\n", "m = count(rows)\n"]
    for k in range(2):
        old, stats[k] = stats[k], stats[k].replace("count", "tally")
        mem.observe("stats.py", Edit(k, (old,), (stats[k],), 2.0 * k), stats)
    report = ["from .stats import count\n", "\n", "\n", "print(count([1, 2]))\n", "x = count(3)\n"]
    found = mem.propose("report.py", report, 4, now=5.0, limit=8)
    assert len(found) >= 2
    last = found[-1]
    landing = Landing("file:///report.py", (last.pattern.key, last.site.line, last.site.start), 0.99)
    assert landing.apply("file:///other.py", found) == found  # another file: untouched
    raised = landing.apply("file:///report.py", found)
    assert raised[0].site == last.site and raised[0].support == 0.99
    assert [p.support for p in raised[1:]] == [p.support for p in found[:-1]]
    # a jump less sure than the site already is never lowers it
    low = Landing("file:///report.py", (last.pattern.key, last.site.line, last.site.start), 0.0)
    assert [p.support for p in low.apply("file:///report.py", found)] == [p.support for p in found]
