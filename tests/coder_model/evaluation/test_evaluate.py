"""Evaluator: metrics, the SAFIM harness and its sandbox, and an end-to-end run on a tiny model."""

from __future__ import annotations

import gzip
import json

import pytest
from dlm.coder_model.evaluation import evaluate as ev

# ---------------------------------------------------------------------------
# metrics


def test_levenshtein_and_edit_similarity():
    assert ev.levenshtein("kitten", "sitting") == 3
    assert ev.levenshtein("", "abc") == 3 and ev.levenshtein("abc", "") == 3
    assert ev.edit_similarity("abc", "abc") == 1.0
    assert ev.edit_similarity("", "abcd") == 0.0
    assert ev.edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    # the difflib fallback for long strings stays in range and ranks similar above different
    long_a, long_b = "x = 1\n" * 500, "x = 1\n" * 499 + "y = 2\n"
    assert 0.9 < ev.edit_similarity(long_a, long_b, max_cells=10) < 1.0
    assert ev.edit_similarity(long_a, "z" * 3000, max_cells=10) < 0.1


def test_location_correct():
    region = "a = 1\nb = 2\nc = 3\n"
    target = "a = 1\nb = 20\nc = 3\n"
    assert ev.location_correct(region, "a = 1\nb = 21\nc = 3\n", target)  # right line, wrong text
    assert not ev.location_correct(region, "a = 10\nb = 2\nc = 3\n", target)  # wrong line
    assert not ev.location_correct(region, region, target)  # no edit at all
    assert not ev.location_correct(region, region, region)  # nothing to locate


def test_output_matches_like_codeforces_checkers():
    assert ev.output_matches("29 23 35\n", "29\n23\n35")
    assert ev.output_matches("YES\nno\n", "Yes\nNO")
    assert ev.output_matches("0.3333333", "0.33333333")
    assert not ev.output_matches("1 2", "1 2 3")
    assert not ev.output_matches("0.34", "0.33333333")
    assert not ev.output_matches("12", "13")


# ---------------------------------------------------------------------------
# sandbox


def test_sandbox_kills_an_infinite_loop_and_counts_it_as_a_fail():
    r = ev.run_sandboxed("while True:\n    pass\n", timeout_s=1.0)
    assert r.timed_out and not r.ok
    assert r.wall_s < 10  # killed, not waited for
    tests = ((("", ("done",)),))
    assert not ev.passes_tests("while True:\n    pass\nprint('done')\n", tests, timeout_s=1.0)
    assert ev.passes_tests("print('done')\n", tests, timeout_s=5.0)


def test_sandbox_limits_memory_and_isolates_cwd(tmp_path):
    r = ev.run_sandboxed("x = bytearray(4 << 30)\nprint('allocated')\n", memory_mb=256)
    assert not r.ok and "allocated" not in r.stdout and "MemoryError" in r.stderr
    r = ev.run_sandboxed("import os\nprint(os.listdir('.'))\nopen('junk.txt', 'w').write('x')\n")
    assert r.ok and "'main.py'" in r.stdout  # a fresh temp dir, removed afterwards
    r = ev.run_sandboxed("import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)\n", "abc")
    assert r.stdout == "ABC" and r.returncode == 3 and not r.ok


# ---------------------------------------------------------------------------
# SAFIM cases

RECORD = {
    "lang": "python",
    "task_id": "block_completion_test",
    "eval_prompt": "n = int(input())\r\nfor i in range(n):\r\n    if i % 2 == 0:\r\n        {{completion}}\r\nprint('end')",
    "ground_truth": "print(i)",
    "unit_tests": [{"input": "3", "output": ["0\n2\nend"]}, {"input": "1", "output": ["0\nend"]}],
}


def test_safim_case_region_is_the_hole_line():
    case = ev.safim_case(RECORD)
    p = case.prompt
    assert p.region == "        \n" and p.cursor == 8
    assert p.prefix.endswith("    if i % 2 == 0:\n") and p.suffix == "print('end')"
    assert case.target == "        print(i)\n"
    assert ev.passes_tests(case.program(case.target), case.tests)
    assert ev.passes_tests(case.program("        print(i)"), case.tests)  # missing newline is restored
    assert not ev.passes_tests(case.program("        print(i + 1)\n"), case.tests)
    assert not ev.passes_tests(case.program(p.region), case.tests)  # an empty block is a syntax error
    assert ev.safim_case({**RECORD, "unit_tests": []}) is None


def test_safim_ground_truth_passes_on_real_records():
    try:
        cases = list(ev._take(ev.iter_safim("control"), 2))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert len(cases) == 2
    for c in cases:
        assert hole_free(c.program(c.target))
        assert ev.passes_tests(c.program(c.target), c.tests)


def hole_free(program: str) -> bool:
    return ev.HOLE not in program


# ---------------------------------------------------------------------------
# end to end on the tiny random checkpoint

PROGRAM = "def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return add(x, x)\n\n\nprint(twice(add(1, 2)))\n"


def test_evaluate_end_to_end_on_a_tiny_checkpoint(tiny_checkpoint, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with gzip.open(corpus / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(3):
            f.write(json.dumps({"path": f"/src/m{i}.py", "language": "python", "text": PROGRAM * (i + 1)}) + "\n")
    out = tmp_path / "report.json"
    argv = ["--model", tiny_checkpoint, "--device", "cpu", "--limit", "1", "--corpus", str(corpus),
            "--kinds", "completion,noop", "--json", str(out)]
    safim_ok = True
    try:
        ev.safim_dir()
        argv += ["--safim", "--safim-tasks", "block", "--safim-limit", "1", "--safim-max-blocks", "1",
                 "--timeout", "2"]
    except FileNotFoundError:
        safim_ok = False
    assert ev.main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["kinds"]) == {"completion", "noop"}
    for entry in report["kinds"].values():
        d, ar = entry["diffusion"], entry["ar"]
        assert d["n"] == 1 and ar["n"] == 1
        for m in (d, ar):
            assert 0.0 <= m["exact_match"] <= 1.0 and 0.0 <= m["edit_similarity"] <= 1.0
            assert m["forward_passes_mean"] >= 1
        # the autoregressive baseline commits at most one slot per forward pass
        assert ar["tokens_per_pass"] <= 1.0 + 1e-9
        assert entry["examples"] and "prediction" in entry["examples"][0]
    if safim_ok:
        s = report["safim"]["block"]
        assert s["diffusion"]["n"] == 1 and 0.0 <= s["diffusion"]["pass@1"] <= 1.0


def test_real_edit_cases_come_from_the_test_split():
    from dlm.coder_model.training import edit_examples as ee

    try:
        cases = ev.real_edit_cases(3)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert len(cases) == 3 and all(c.kind == "real_edit" for c in cases)
    test_commits = {r["commit"][:12] for r in ee.iter_edit_records("test", allow_test=True,
                                                                    repos=["Textualize/rich"])}
    for c in cases:
        assert c.source.split("@")[1].split(":")[0] in test_commits
        assert c.target != c.prompt.region and c.prompt.history
    assert [c.source for c in ev.real_edit_cases(3)] == [c.source for c in cases]  # deterministic


def test_evaluate_rejects_unknown_kinds(capsys):
    assert ev.main(["--kinds", "completion,bogus"]) == 2
    assert "unknown bogus" in capsys.readouterr().err
