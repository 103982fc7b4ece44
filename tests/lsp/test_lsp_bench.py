"""`dlm-lsp bench` end to end (with the slow fake engine: this checks the bench's
bookkeeping, not model speed; no timing is asserted)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest
from lsp_helpers import (
    change,
    inline_params,
    open_document,
    run_cli,
    server_env,
    start_in_workspace,
)
from lsprotocol import types


def test_bench_json_with_fake_engine(tmp_path):
    src = tmp_path / "sample.py"
    src.write_text("".join(f"def f{i}(x):\n    y = x * {i} + 1\n    return y - {i}\n\n" for i in range(30)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlm.lsp.cli",
            "bench",
            "--engine-factory",
            "fake_engine:slow",
            "--files",
            str(src),
            "--keystrokes",
            "25",
            "--cps",
            "30",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        # the file's folder is the workspace the server indexes: its cache in the test's folder
        env=server_env(FAKE_STEP_S="0.005", HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache")),
        check=True,
    )
    summary = json.loads(out.stdout)
    assert summary["keystrokes"] == 25
    assert summary["model"].startswith("slow-fake")
    srv = summary["server"]
    assert srv["model_runs"] >= srv["completed"] >= 1
    assert srv["cancelled"] <= srv["model_runs"]
    assert summary["latency_at_pauses"]["n"] >= 1 and summary["latency"]["p50_ms"] is not None
    from dlm.drivers.bench.typing_latency import render

    table = render(summary)  # the human-readable form of the same numbers
    assert "keystroke->suggestion" in table and "steps per completed run" in table


def test_bench_rejects_bad_arguments(tmp_path):
    out = run_cli("bench", "--files", str(tmp_path / "missing.py"))
    assert out.returncode == 2 and "is not a file" in out.stderr


def test_bench_jump_finds_the_other_file_and_times_the_scan(tmp_path):
    # the fake engine: the edit memory needs no model; this checks what the driver reports (at a gate
    # under the site's confidence, whatever a re-fit of the calibration makes of it)
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "report.py").write_text("from .stats import count\n\nprint(count([1, 2]))\n")
    out = subprocess.run(
        [sys.executable, "-m", "dlm.drivers.bench.jump_latency", "--root", str(root), "--name", "count", "--new", "tally",
         "--requests", "3", "--gap-s", "0", "--min-confidence", "0.1", "--engine-factory", "fake_engine:slow"],
        capture_output=True, text=True, timeout=240, check=True,
        env=server_env(FAKE_STEP_S="0.005", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert "jump: pkg/report.py line 3 (rename count → tally" in out.stdout, out.stdout + out.stderr
    assert "| the first (the scan) | 1 |" in out.stdout and "| the next (the scan kept) | 2 |" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "dlm.drivers.bench.jump_latency", "--root", str(tmp_path / "nowhere"),
                          "--name", "a", "--new", "b"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "is not a folder" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dlm.drivers.bench.jump_latency", "--root", str(root), "--name", "a", "--new", "b",
                          "--min-confidence", "2"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--min-confidence 2.0: give a number in [0, 1]" in bad.stderr


def _memory_project(root):
    """A project whose lines repeat from file to file: whatever the replay types, the repository
    memory has seen it in the other files."""
    root.mkdir(parents=True)
    body = "".join(f"def handler_{i}(registry, widget):\n    registry.frobnicate(widget, strict=True, depth={i})\n"
                   f"    return registry.lookup(widget.name)\n\n" for i in range(12))
    for name in ("a", "b", "c"):
        (root / f"{name}.py").write_text(body)
    return root


def _bench_memory(tmp_path, *extra):
    """`dlm-lsp bench` typing a.py of the project with the fake that answers the memory's first
    proposal (none: no change), so a suggestion shows only where the memory proposed."""
    proj = _memory_project(tmp_path / "proj")
    out = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "bench", "--engine-factory", "fake_engine:echo_proposals",
         "--files", str(proj / "a.py"), "--keystrokes", "30", "--cps", "30", "--json", *extra],
        capture_output=True, text=True, timeout=240, check=False,
        env=server_env(FAKE_STEP_S="0.002", HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert out.returncode == 0, out.stderr
    return proj, json.loads(out.stdout)


def test_bench_replays_with_the_memory_of_the_typed_files_project_by_default(tmp_path):
    proj, summary = _bench_memory(tmp_path)
    memory = summary["memory"]
    assert memory["workspace"] == str(proj.resolve()) and memory["state"] == "ready" and memory["files"] == 3
    assert summary["shown"] >= 1, summary  # the memory's proposals reached the editor
    from dlm.drivers.bench.typing_latency import render

    row = rf"^repository memory +on: {re.escape(str(proj.resolve()))} \(3 files"
    assert re.search(row, render(summary), re.MULTILINE)


def test_bench_no_index_replays_the_model_alone(tmp_path):
    _, summary = _bench_memory(tmp_path, "--no-index")
    assert summary["memory"]["workspace"] is None and summary["memory"]["state"] == "off"
    assert summary["memory"]["note"].startswith("--no-index")
    assert summary["shown"] == 0, summary  # no memory, no proposal: the fake changes nothing


def test_bench_refuses_contradicting_options_and_a_missing_workspace(tmp_path):
    out = run_cli("bench", "--no-index", "--workspace", str(tmp_path))
    assert out.returncode == 2 and "pass one of them" in out.stderr
    out = run_cli("bench", "--workspace", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "is not a folder" in out.stderr


SOLO = "    quantum_flux = recalibrate_capacitor(gigawatts=121, year=1985)"
SOLO_TYPED = "    quantum_flux = reca"


@pytest.mark.asyncio
@pytest.mark.parametrize("elsewhere", [False, True])
async def test_the_typed_file_is_the_buffer_as_typed_never_its_indexed_copy(tmp_path, elsewhere):
    """The bench opens a file at its own path in the workspace with the lines to type cut out: the
    server must answer from the buffer as typed, never from the indexed copy of the file on disk,
    which holds those lines (before the buffer replaces it in the index, and after)."""
    from dlm.drivers.bench.typing_latency import document_uri

    root = tmp_path / "proj"
    root.mkdir()
    path = root / "solo.py"
    path.write_text(f"def flux():\n{SOLO}\n    return quantum_flux\n")
    if elsewhere:  # the control: the same line in another file is the memory's to propose
        (root / "other.py").write_text(f"def other():\n{SOLO}\n")
    client = await start_in_workspace(tmp_path, root, {"deadlineMs": 5000}, folders=False,
                                      DLM_ENGINE_FACTORY="fake_engine:echo_proposals")
    try:
        uri = document_uri(path, 1)
        open_document(client, uri, "def flux():\n\n    return quantum_flux\n")
        change(client, uri, 2, (1, 0), (1, 0), SOLO_TYPED)
        answers = []
        for wait_s in (0.0, 1.5):  # the disk's copy indexed; then the buffer (after the index's debounce)
            await asyncio.sleep(wait_s)
            res = await client.text_document_inline_completion_async(
                inline_params(uri, 1, len(SOLO_TYPED), types.InlineCompletionTriggerKind.Automatic))
            answers.append([i.insert_text for i in res.items])
        rest = SOLO[len(SOLO_TYPED):]
        if elsewhere:
            assert answers == [[rest], [rest]]
        else:
            assert not any("gigawatts" in text for items in answers for text in items), answers
    finally:
        await client.shutdown_session()


def test_the_default_workspace_is_the_typed_files_project_and_never_the_home_folder(tmp_path, monkeypatch):
    from dlm.drivers.bench.typing_latency import default_files, default_workspace, own_root

    home = tmp_path / "home"
    (home / "repo" / ".git").mkdir(parents=True)
    (home / "repo" / "pkg").mkdir()
    monkeypatch.setenv("HOME", str(home))
    inside = home / "repo" / "pkg" / "m.py"
    assert default_workspace([inside], own=False) == (str((home / "repo").resolve()), "")
    root, why = default_workspace([home / "loose.py"], own=False)
    assert root is None and f"not indexing {home.resolve()}" in why and "--workspace DIR" in why
    # dlm's own files: the folder holding them
    assert default_workspace(default_files(), own=True) == (str(own_root()), "")
