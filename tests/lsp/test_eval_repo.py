"""`dlm-lsp eval --repo`: the cases it replays, the rows it reports, and one small run through the
real server (a tiny repository in which held-out lines repeat lines of other files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dlm.drivers.evaluation.eval_repo import config_options, summarize_repo, typing_cases
from dlm.drivers.evaluation.eval_typing import Answer
from dlm.drivers.evaluation.repo_cases import Case


def test_typing_cases_type_the_last_characters_or_enter_and_judge_the_whole_line():
    typed = Case("a.py", 1, "def f(x):\n    return ma", "\nprint(1)\n", "x(x, 1)", True)
    fresh = Case("a.py", 1, "def f(x):\n    ", "\nprint(1)\n", "return x", False)
    a, b = typing_cases([typed, fresh])
    assert a.typing.typed == " ma"  # the last 3 typed characters, typed through the server
    assert a.typing.text == "def f(x):\n    return\nprint(1)\n" and (a.typing.row, a.typing.col) == (1, 10)
    assert a.typing.final_target == "def f(x):\n    return max(x, 1)\nprint(1)\n"
    assert b.typing.typed == "\n    " and b.typing.row == 0  # Enter and the indentation, on the line above
    assert b.typing.text == "def f(x):\nprint(1)\n"
    assert b.typing.final_target == "def f(x):\n    return x\nprint(1)\n"


def test_configs_are_the_ablation_rows():
    assert config_options("model")["index"] == {"enabled": False}
    assert config_options("memory")["sampler"]["verifyPasses"] == 0
    assert config_options("memory")["index"] == {"rankDrafts": False}
    assert config_options("trees")["index"] == {"rankDrafts": True}
    assert config_options("trees")["sampler"]["verifyPasses"] == 0
    assert config_options("verify")["index"] == {"rankDrafts": False}
    assert config_options("verify")["sampler"]["verifyPasses"] == config_options("all")["sampler"]["verifyPasses"] > 0
    assert config_options("verify")["minConfidence"] == 0


def test_summary_counts_exact_of_all_cases_per_threshold_and_by_length():
    cases = typing_cases([Case("a.py", 1, "x = f(\n    1", "\n", ")", True),
                          Case("a.py", 2, "y = g", "\n", "(2, 3)", True)])
    right = Answer("repo", latency_ms=50.0, shown=True, confidence=0.8, exact=True, final=True)
    wrong = Answer("repo", latency_ms=400.0, shown=True, confidence=0.2, exact=False, final=True)
    s = summarize_repo(list(zip(cases, [right, wrong])), [0.0, 0.5])
    at0, at5 = s["rows"]
    assert (at0["shown"], at0["exact"], at0["precision"]) == (2, 1, 0.5)
    assert (at5["shown"], at5["exact"], at5["precision"]) == (1, 1, 1.0)
    assert s["by_answer_length"]["1-2"] == {"cases": 1, "exact": 1, "exact_share": 1.0}
    assert s["latency"]["in_time_share"] == 0.5


def test_eval_repo_through_the_real_server(tmp_path):
    repo = tmp_path / "proj"
    (repo / "pkg").mkdir(parents=True)
    body = "".join(f"def handler_{i}(registry):\n    frobnicate_widget(registry, widget_id={i})\n"
                   f"    return registry\n\n\n" for i in range(8))
    for i in range(40):  # enough files that the hash holds some out
        (repo / "pkg" / f"mod{i}.py").write_text(body)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", "eval", "--repo", str(repo), "--cases", "6",
                        "--config", "verify", "--out", str(out), "--no-plot", "--device", "cpu",
                        "--deadline-ms", "10000"],  # the memory is judged here, not the machine's speed
                       capture_output=True, text=True, timeout=600, env=env, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "eval-repo.json").read_text())
    assert report["meta"]["cases"] == 6 and report["meta"]["config"] == "verify"
    assert report["meta"]["index"]["state"] == "ready"
    # every line of the held-out files repeats lines of the indexed ones: the memory knows them
    assert sum(c["exact"] for c in report["cases"]) >= 3, report["cases"]
    assert "| min confidence | shown | exact (of all cases)" in (out / "eval-repo.md").read_text()
