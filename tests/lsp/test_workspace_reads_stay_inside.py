"""Every read of a workspace file stays inside the workspace and never blocks
(lsp.discovery.read_workspace_file, used by the index, watched-file events and the next-edit
jump scan); a jump leads only to a file the index takes; a file name that is not UTF-8 breaks
no suggestion; the index cache (lsp.index_store) follows no link.

Most tests drive the parts directly (WorkspaceIndex, lsp.next_edits' scan, IndexStore) with a small
stand-in for the repository memory; one drives a real server through dlm/editPrediction."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from dlm.lsp import discovery, index_store, next_edits
from dlm.lsp.options import IndexOptions, NextEditOptions
from dlm.lsp.workspace_index import WorkspaceIndex, _memory_class
from workspace_fakes import FakeMemory, cache_home, ready, wait_until, write  # noqa: F401  (cache_home: autouse)

LINK_REFUSED = "is a symbolic link; remove it: the cache never follows links"


# the storage side of RepoMemory's interface: the indexed texts by path
TextMemory = FakeMemory


@pytest.fixture(autouse=True)
def home_exists(cache_home: Path, tmp_path: Path) -> None:  # noqa: F811 (the imported fixture)
    (tmp_path / "home").mkdir()


def indexed(root: Path, memory_class=lambda: TextMemory, **opts) -> WorkspaceIndex:
    ws = WorkspaceIndex(IndexOptions(**opts), memory_class=memory_class)
    ws.set_roots([str(root)])
    ready(ws)
    return ws


def in_thread(fn: Callable[[], object], timeout_s: float = 5.0) -> object:
    """fn() on a daemon thread: its result, or AssertionError when it has not returned in time
    (a blocked read stays blocked there, not in the test)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"still blocked after {timeout_s} s"
    return out[0]


def unblock(fifos: list[Path]) -> None:
    """Give a reader stuck on a FIFO its end of file (a no-op when no one reads)."""
    for f in fifos:
        try:
            os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


# ---- reads that would leave the workspace -----------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_watched_file_event_through_a_linked_folder_indexes_nothing(tmp_path: Path):
    root = tmp_path / "ws"
    write(root, "app/main.py")
    ssh = write(tmp_path / "home" / ".ssh", "x.py", "PRIVATE = 'ssh stuff'\n").parent
    outside = write(tmp_path / "outside", "y.py", "OUTSIDE = 'not the project'\n").parent
    (root / "ssh").symlink_to(ssh, target_is_directory=True)  # ws/ssh -> ~/.ssh
    (root / "lib").symlink_to(outside, target_is_directory=True)
    ws = indexed(root)
    try:
        assert sorted(ws.memory.texts) == ["app/main.py"]  # the walk follows no link
        ws.files_changed([(str(root / "ssh" / "x.py"), 1), (str(root / "lib" / "y.py"), 2)])
        write(root, "app/new.py", "NEW = 1\n")
        ws.files_changed([(str(root / "app" / "new.py"), 1)])  # handled with or after the others
        wait_until(lambda: "app/new.py" in ws.memory.texts, what="the inside event")
        assert sorted(ws.memory.texts) == ["app/main.py", "app/new.py"]
        assert not any("ssh stuff" in t or "not the project" in t for t in ws.memory.texts.values())
    finally:
        ws.close()


@pytest.mark.timeout(30)
def test_a_folder_replaced_by_a_link_after_the_walk_indexes_none_of_its_outside_files(
    tmp_path: Path, monkeypatch
):
    root, outside = tmp_path / "ws", tmp_path / "outside"
    write(root, "app/main.py")
    for i in range(30):
        write(root, f"pkg/m{i}.py", f"inside_{i} = {i}\n")
        write(outside, f"m{i}.py", f"outside_{i} = 'not the project'\n")
    real_walk = discovery.walk

    def walk_then_swap(*args, **kwargs):
        walked = real_walk(*args, **kwargs)
        os.rename(root / "pkg", tmp_path / "pkg-moved")  # after the walk, before the reads
        (root / "pkg").symlink_to(outside, target_is_directory=True)
        return walked

    monkeypatch.setattr(discovery, "walk", walk_then_swap)
    ws = indexed(root)
    try:
        assert sorted(ws.memory.texts) == ["app/main.py"]
        assert not any("not the project" in t for t in ws.memory.texts.values())
    finally:
        ws.close()


def test_the_one_reader_refuses_links_at_any_depth_and_paths_out_of_the_root(tmp_path: Path):
    root = tmp_path / "ws"
    write(root, "a/b/ok.py", "ok = 1\n")
    write(tmp_path / "outside", "deep/x.py")
    (root / "a" / "out").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "a" / "b" / "file_link.py").symlink_to(root / "a" / "b" / "ok.py")
    read = discovery.read_workspace_file
    assert read(str(root), "a/b/ok.py", 1000).text == "ok = 1\n"
    assert read(str(root), str(root / "a" / "b" / "ok.py"), 1000).text == "ok = 1\n"
    assert read(str(root), "a/out/deep/x.py", 1000) == "symlink"
    assert read(str(root), "a/b/file_link.py", 1000) == "symlink"  # even a link that stays inside
    assert read(str(root), "../outside/deep/x.py", 1000) == "outside_root"
    assert read(str(root), str(tmp_path / "outside" / "deep" / "x.py"), 1000) == "outside_root"
    write(root, "big.py", "x = 1\n" * 100)
    assert read(str(root), "big.py", 599) == "too_large"


# ---- reads that would block ---------------------------------------------------------------------


def fake_server(ws: WorkspaceIndex, tmp_path: Path, memory=None, **next_edit_opts) -> SimpleNamespace:
    """What lsp.next_edits' scan reads of the server: its options, edit memory, index, documents."""
    ne = next_edits.NextEdits()
    if memory is not None:
        ne.memory = memory
    opened: dict[str, object] = {}
    return SimpleNamespace(
        options=SimpleNamespace(next_edits=NextEditOptions(**next_edit_opts), index=IndexOptions()),
        next_edits=ne, workspace_index=ws, documents=SimpleNamespace(get=opened.get, encoding="utf-16"),
        path_of=lambda uri: uri.rsplit("/", 1)[-1],
    )


def renamed_twice():
    """An edit memory that has seen `count` renamed to `tally` twice (a jump needs an edit made
    twice), so that a file using `count` is a place for the next edit."""
    from dlm.coder_model.edit_memory import Edit, EditMemory

    mem, t0 = EditMemory(), time.monotonic() - 5.0  # the scan proposes at time.monotonic()
    stats = ["n = count(rows)\n", "m = count(rows)\n"]
    for k in range(2):
        old, stats[k] = stats[k], stats[k].replace("count", "tally")
        mem.observe("stats.py", Edit(k, (old,), (stats[k],), t0 + 2.0 * k), stats)
    return mem


USES = "from .stats import count\n\n\nprint(count([1, 2]))\n"


def scan(ls, opened: list[tuple[str, list[str]]], here: str = "file:///nowhere/stats.py"):
    return next_edits.scan_elsewhere(ls, here, opened, ["count"], [], False, time.monotonic() + 5.0)


@pytest.mark.timeout(30)
def test_the_jump_scan_does_not_block_on_a_fifo(tmp_path: Path):
    root = tmp_path / "ws"
    for name in ("a.py", "b.py", "c.py"):
        write(root, f"pkg/{name}", USES)
    ws = indexed(root)
    fifos = [root / "pkg" / n for n in ("a.py", "b.py", "c.py")]
    try:
        for f in fifos:  # indexed files turned into FIFOs: no writer will ever come
            f.unlink()
            os.mkfifo(f)
        ls = fake_server(ws, tmp_path, renamed_twice(), min_confidence_jump=0.0)
        assert in_thread(lambda: scan(ls, [])) is None
        assert in_thread(lambda: next_edits.current(ls, fifos[0].as_uri())) is None
    finally:
        unblock(fifos)
        ws.close()


@pytest.mark.timeout(30)
def test_a_link_to_dev_zero_is_refused(tmp_path: Path):
    root = tmp_path / "ws"
    write(root, "pkg/zero.py", USES)
    ws = indexed(root)
    try:
        zero = root / "pkg" / "zero.py"
        zero.unlink()
        zero.symlink_to("/dev/zero")  # the size of the link's target is 0: no size check stops it
        assert discovery.read_workspace_file(str(root), "pkg/zero.py", 1000) == "symlink"
        ls = fake_server(ws, tmp_path, renamed_twice(), min_confidence_jump=0.0)
        assert in_thread(lambda: next_edits.current(ls, zero.as_uri())) is None
        assert in_thread(lambda: scan(ls, [])) is None
        ws.files_changed([(str(zero), 2)])
        wait_until(lambda: "pkg/zero.py" not in ws.memory.texts, what="the link dropped from the index")
    finally:
        ws.close()


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_edit_predictions_are_answered_with_indexed_files_turned_into_fifos(tmp_path: Path):
    # through a real server: the jump scan reads the indexed files on the pool threads
    from lsp_helpers import SERVER, change, edit_prediction, open_document, request, server_env, wait_state
    from lsprotocol import types
    from pytest_lsp import ClientServerConfig, client_capabilities

    root = tmp_path / "proj"
    write(root, "pkg/stats.py", "def total(rows):\n    n = count(rows)\n    return n\n\n\n"
                                "def mean(rows):\n    return sum(rows) / count(rows)\n")  # fmt: skip
    fifos = [write(root, f"pkg/r{i}.py", USES) for i in range(3)]
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "DLM_ENGINE_FACTORY": "fake_engine:echo_proposals", "FAKE_STEP_S": "0.01", "FAKE_STEPS": "1"}  # fmt: skip
    client = await ClientServerConfig(server_command=[*SERVER, "--device", "cpu"],
                                      server_env=server_env(**env)).start()  # fmt: skip
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
            initialization_options={"editPredictions": True, "nextEdits": {
                "gitCommits": 0, "minConfidence": 0, "checkWithModel": False}}))  # fmt: skip
        await wait_state(client, timeout_s=20)
        for _ in range(400):
            if (await request(client, "dlm/stats", {}))["index"]["files"] == 4:
                break
            await asyncio.sleep(0.05)
        for f in fifos:
            f.unlink()
            os.mkfifo(f)
        uri = (root / "pkg" / "stats.py").as_uri()
        open_document(client, uri, (root / "pkg" / "stats.py").read_text())
        change(client, uri, 2, (1, 8), (1, 13), "tally")
        await asyncio.sleep(1.6)  # a pause: the second rename is a second edit (a jump needs two)
        change(client, uri, 3, (6, 23), (6, 28), "tally")
        for _ in range(10):
            assert await asyncio.wait_for(edit_prediction(client, uri, 6, 28), 10.0) is None
    finally:
        unblock(fifos)
        await client.shutdown_session()


# ---- a file name that is not UTF-8 ---------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_non_utf8_file_name_does_not_break_completion(tmp_path: Path):
    from dlm.coder_model.layout import decode_context, encode_prompt
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.coder_model.types import Prompt
    from dlm.lsp import context

    root = tmp_path / "ws"
    root.mkdir()
    body = "".join(f"def compute_total_{i}(rows, weights):\n    return sum(rows) * weights[{i}]\n\n"
                   for i in range(6))  # fmt: skip
    with open(os.path.join(os.fsencode(root), b"caf\xe9.py"), "w") as f:  # a Latin-1 name
        f.write(body)
    ws = indexed(root, memory_class=_memory_class)  # the real repository memory
    try:
        memory, _ = ws.memory_for(str(root / "main.py"))
        assert memory is not None and memory.files == 1
        prefix = "def compute_total(rows, weights):\n    return sum(rows) * weights[0]\n"
        prompt = Prompt(prefix=prefix, region="\n", cursor=0, suffix="", language="python", path="main.py",
                        insert=True)  # fmt: skip
        built = context.with_snippets(context.BuiltContext(prompt, 2, 2, "typing"), memory, "main.py")
        assert [s.path for s in built.prompt.snippets] == ["caf\ufffd.py"]  # shown as text, not bytes
        tok = Tokenizer.from_file(Path(__file__).resolve().parents[2] / "coder_model" / "checkpoints" /
                                  "default" / "tokenizer.json")  # fmt: skip
        ids = encode_prompt(tok, built.prompt)
        assert "caf\ufffd.py" in decode_context(tok, ids)["snippets"]
        # the layout renders any path it is given: a prompt built elsewhere with the raw name too
        raw = Prompt(prefix=prefix, region="\n", cursor=0, suffix="", path="caf\udce9.py", insert=True)
        assert decode_context(tok, encode_prompt(tok, raw))["file"].endswith(":caf\ufffd.py\n")
        # and the name still reads the file (the path is kept as os.fsdecode makes it)
        assert discovery.read_workspace_file(str(root), "caf\udce9.py", 100_000).text == body
    finally:
        ws.close()


@pytest.mark.timeout(30)
def test_a_failure_to_build_a_prompt_is_one_warning_not_an_error_per_keystroke(caplog):
    from dlm.lsp.latest_wins import LatestWins
    from dlm.lsp.stats import Stats

    def start(cancel):
        raise TypeError("TextInputSequence must be str")

    async def keystrokes(s: LatestWins) -> list:
        return [await s.submit("d", k, None, lambda: True, start=start) for k in range(5)]

    caplog.set_level(logging.DEBUG, logger="dlm.lsp.latest_wins")
    stats = Stats()
    with ThreadPoolExecutor(2) as pool:
        results = asyncio.run(keystrokes(LatestWins(pool, stats, throttle_ms=0)))
    assert results == [None] * 5 and stats.counts["failed"] == 5
    said = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "TextInputSequence" in said[0].getMessage()


# ---- jumps only to files the index takes ---------------------------------------------------------


@pytest.mark.timeout(30)
def test_no_jump_to_an_open_document_outside_the_workspace(tmp_path: Path):
    root = tmp_path / "ws"
    write(root, ".gitignore", "generated/\n")
    write(root, "pkg/stats.py", "n = tally(rows)\n")
    ws = indexed(root)
    ls = fake_server(ws, tmp_path, renamed_twice(), min_confidence_jump=0.0)
    places = {
        "outside": write(tmp_path / "outside", "x.py", USES).as_uri(),
        "~/.ssh": write(tmp_path / "home" / ".ssh", "x.py", USES).as_uri(),
        "credentials.py": write(root, "deploy/credentials.py", USES).as_uri(),
        "git-ignored": write(root, "generated/g.py", USES).as_uri(),
        "../": root.as_uri() + "/../outside/x.py",
        "through a link": "",
    }
    (root / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    places["through a link"] = (root / "linked" / "x.py").as_uri()
    here = (root / "pkg" / "stats.py").as_uri()
    try:
        for what, uri in places.items():
            assert scan(ls, [(uri, USES.splitlines(keepends=True))], here) is None, what
        # an open document the index takes is where the jump leads (the memory proposes there)
        report = write(root, "pkg/report.py", USES).as_uri()
        found = scan(ls, [(report, USES.splitlines(keepends=True))], here)
        assert found is not None and found[0] == report
    finally:
        ws.close()


# ---- the index cache follows no link -------------------------------------------------------------


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.timeout(30)
def test_a_cache_folder_that_is_a_link_is_refused(tmp_path: Path):
    root = write(tmp_path / "ws", "app/main.py").parent.parent
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    cache_dir = index_store.cache_dir_for(str(root))
    cache_dir.parent.mkdir(parents=True)
    cache_dir.symlink_to(target, target_is_directory=True)
    ws = indexed(root)
    try:
        st = ws.status()
        assert st["files"] == 1  # the index runs, without persistence
        assert f"{cache_dir} {LINK_REFUSED}" in st["message"]
    finally:
        ws.close()
    assert mode(target) == 0o755 and list(target.iterdir()) == []  # no chmod, no index.bin, no lock


@pytest.mark.timeout(30)
def test_an_index_bin_link_is_refused(tmp_path: Path):
    root = write(tmp_path / "ws", "app/main.py").parent.parent
    target = write(tmp_path, "precious.txt", "the user's file\n")
    os.chmod(target, 0o644)
    cache_dir = index_store.cache_dir_for(str(root))
    cache_dir.mkdir(parents=True, mode=0o700)
    (cache_dir / "index.bin").symlink_to(target)
    ws = indexed(root)
    try:
        st = ws.status()
        assert st["files"] == 1 and f"{cache_dir / 'index.bin'} {LINK_REFUSED}" in st["message"]
    finally:
        ws.close()
    assert mode(target) == 0o644 and target.read_text() == "the user's file\n"
    assert (cache_dir / "index.bin").is_symlink()  # left for the user to remove, as the message says
    store = index_store.IndexStore(str(root))
    assert store.load(TextMemory.load) is None  # not read through the link either


@pytest.mark.timeout(30)
def test_a_dangling_lock_link_creates_nothing(tmp_path: Path):
    root = write(tmp_path / "ws", "app/main.py").parent.parent
    (tmp_path / "nowhere").mkdir()
    made = tmp_path / "nowhere" / "made"
    cache_dir = index_store.cache_dir_for(str(root))
    cache_dir.mkdir(parents=True, mode=0o700)
    (cache_dir / "lock").symlink_to(made)
    store = index_store.IndexStore(str(root))
    store.open()
    try:
        assert not store.writable and not store.persist
        assert f"{cache_dir / 'lock'} {LINK_REFUSED}" in store.message
        assert not store.save(lambda fh: fh.write(b"{}"), {})
    finally:
        store.close()
    assert not os.path.lexists(made) and not (cache_dir / "index.bin").exists()
