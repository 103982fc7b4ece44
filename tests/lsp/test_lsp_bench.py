"""`dlm-lsp bench` end to end (with the slow fake engine: this checks the bench's
bookkeeping, not model speed; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from lsp_helpers import run_cli, server_env


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
        env=server_env(FAKE_STEP_S="0.005"),
        check=True,
    )
    summary = json.loads(out.stdout)
    assert summary["keystrokes"] == 25
    assert summary["model"].startswith("slow-fake")
    srv = summary["server"]
    assert srv["model_runs"] >= srv["completed"] >= 1
    assert srv["cancelled"] <= srv["model_runs"]
    assert summary["latency_at_pauses"]["n"] >= 1 and summary["latency"]["p50_ms"] is not None
    from dlm.lsp.bench import render

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
        [sys.executable, "-m", "dlm.lsp.bench_jump", "--root", str(root), "--name", "count", "--new", "tally",
         "--requests", "3", "--gap-s", "0", "--min-confidence", "0.1", "--engine-factory", "fake_engine:slow"],
        capture_output=True, text=True, timeout=240, check=True,
        env=server_env(FAKE_STEP_S="0.005", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert "jump: pkg/report.py line 3 (rename count → tally" in out.stdout, out.stdout + out.stderr
    assert "| the first (the scan) | 1 |" in out.stdout and "| the next (the scan kept) | 2 |" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "dlm.lsp.bench_jump", "--root", str(tmp_path / "nowhere"),
                          "--name", "a", "--new", "b"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "is not a folder" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dlm.lsp.bench_jump", "--root", str(root), "--name", "a", "--new", "b",
                          "--min-confidence", "2"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--min-confidence 2.0: give a number in [0, 1]" in bad.stderr
