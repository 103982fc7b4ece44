"""`dlm-lsp eval`: the scoring of one suggestion, the per-threshold table, and a tiny replay
through the real server with the slow fake engine that renders the table and the PNG. The
fake makes no claim about model quality: its suggestion is a fixed marker."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys

from dlm.drivers.evaluation.eval_typing import Answer, choose_threshold, judge, render_markdown, summarize
from lsp_helpers import server_env


def test_judge_insertion_exact_prefix_and_wrong():
    current, target = "x = foo(\n", "x = foo(a, b)\n"
    cur = len("x = foo(")
    assert judge(current, cur, "a, b)", cur, target) == (True, True, 5)
    assert judge(current, cur, "a, ", cur, target) == (False, True, 3)  # a correct prefix: accepted in full
    assert judge(current, cur, "a, c)", cur, target) == (False, False, 3)  # 3 characters right, then wrong


def test_judge_replacing_the_rest_of_the_line():
    current, target = "x = foo(1)\n", "x = foo(a, b)\n"
    cur = len("x = foo(")
    assert judge(current, cur, "a, b)", cur + 2, target)[:2] == (True, True)  # replaces "1)"
    assert judge(current, cur, "a)", cur + 2, target)[:2] == (False, False)  # drops the ", b" the user types


def _answers() -> list[Answer]:
    sure_right = [Answer("corpus", 10.0, True, 0.95, False, True, True, 8) for _ in range(3)]
    unsure_wrong = [Answer("corpus", 12.0, True, 0.4, False, False, False, 0) for _ in range(5)]
    rewrite = [Answer("edits", 11.0, True, 0.96, True, False, False, 0)]  # sure, but undoes recent typing
    superseded = [Answer("safim") for _ in range(91)]  # answered after the next keystroke: never seen
    return sure_right + unsure_wrong + rewrite + superseded


def test_thresholds_are_applied_offline_to_one_replay():
    summary = summarize(_answers(), [0.0, 0.5, 0.9], rewrite_recent=0.98)
    rows = {r["threshold"]: r for r in summary["rows"]}
    assert rows[0.0]["shown"] == 8  # the rewrite of recent typing needs 0.98 even at threshold 0
    assert rows[0.0]["wrong_per_100_keys"] == 5.0
    assert rows[0.5]["shown"] == 3 and rows[0.5]["precision_accepted"] == 1.0
    assert rows[0.9]["accepted_chars_per_shown"] == 8
    assert summary["latency"]["answered"] == 9
    assert choose_threshold(summary) == 0.5
    md = render_markdown(summary, {"model": "m", "device": "cpu", "date": "d"})
    assert "| 0.5 | 3 (3.0%) | 100.0% | 100.0% |" in md


def _test_split_commit() -> str:
    for i in range(1000):  # the edit-histories README's rule: sha256(commit) % 100 >= 95 is test
        c = f"{i:040x}"
        if int(hashlib.sha256(c.encode()).hexdigest(), 16) % 100 >= 95:
            return c
    raise AssertionError("no test-split commit found")


def _material(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with gzip.open(corpus / "test.jsonl.gz", "wt") as f:
        text = "def area(w, h):\n    return w * h\n\n\nprint(area(2, 3))\n"
        f.write(json.dumps({"path": "geo.py", "language": "python", "text": text}) + "\n")
    edits = tmp_path / "edits"
    edits.mkdir()
    commit = _test_split_commit()
    before = "a = 1\nb = 2\nc = 3\nd = 4\n"
    rec = {"repo": "o/r", "commit": commit, "path": "m.py", "before": before, "split": "test",
           "hunks": [{"at": 1, "del": 1, "add": "a = 10\n"}, {"at": 3, "del": 1, "add": "c = 30\n"}]}
    with gzip.open(edits / "o__r.jsonl.gz", "wt") as f:
        f.write(json.dumps(rec) + "\n")
    safim = tmp_path / "safim"
    safim.mkdir()
    for name in ("block_completion.jsonl.gz", "control_completion.jsonl.gz"):
        with gzip.open(safim / name, "wt") as f:
            f.write(json.dumps({"task_id": "t1", "lang": "python", "ground_truth": "print(n * 2)",
                                "eval_prompt": "n = int(input())\n{{completion}}\n",
                                "unit_tests": [{"input": "2", "output": "4"}]}) + "\n")
    return corpus, edits, safim


def test_eval_through_the_server_renders_the_table_and_the_plot(tmp_path):
    corpus, edits, safim = _material(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "eval", "--device", "cpu", "--corpus", str(corpus),
         "--edit-histories", str(edits), "--safim-dir", str(safim), "--limit", "1", "--max-keys", "6",
         "--cps", "40", "--out", str(out), "--thresholds", "0,0.5"],
        env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001"),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "eval.md").read_text()
    assert "| min confidence | shown | precision exact |" in md and "| 0.5 |" in md
    assert "| corpus |" in md and "| edits |" in md and "| safim |" in md
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "eval.json").read_text())
    inline = [a for a in data["answers"] if a["kind"] == "inline"]
    per_source = {src: sum(a["source"] == src for a in inline) for src in ("corpus", "edits", "safim")}
    # every typed character sent a request: "c = 30" and "print(" are 6, the corpus line's rest 2 to 6
    assert per_source["edits"] == per_source["safim"] == 6 and 2 <= per_source["corpus"] <= 6
    assert sum(a["kind"] == "edit" for a in data["answers"]) == 1
    # the fake answers its marker, which is never what the user types: shown, never accepted
    shown = [a for a in inline if a["shown"]]
    assert shown and not any(a["correct"] for a in shown)
    assert all(a["confidence"] is None for a in shown)  # the fake computes no confidence


def test_eval_refuses_bad_thresholds_and_missing_material(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", "eval", "--thresholds", "0,2"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "[0, 1]" in bad.stderr
    none = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "eval", "--sources", "corpus", "--corpus", str(tmp_path / "nothing")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert none.returncode == 2 and "no material" in none.stderr
