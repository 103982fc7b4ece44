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
