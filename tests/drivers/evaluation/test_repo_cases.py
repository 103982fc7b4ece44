"""repo_cases: held-out cases from a repository, deterministic, and the memory measured on them."""

from __future__ import annotations

import json

from dlm.drivers.evaluation import repo_cases
from dlm.drivers.evaluation.repo_cases import build_memory, held_out, make_cases, measure, wilson


def make_repo(root, n_files: int = 150) -> None:
    for i in range(n_files):
        pkg = root / f"pkg{i % 3}"
        pkg.mkdir(parents=True, exist_ok=True)
        body = "".join(
            f"def handler_{i}_{j}(request, value):\n    result = compute(value, {j})\n"
            f"    return respond(request, result)\n\n\n"
            for j in range(4)
        )
        (pkg / f"mod{i}.py").write_text("import os\nfrom core import compute, respond\n\n\n" + body)
    (root / "notes.txt").write_text("not python\n")
    (root / ".git").mkdir()
    (root / ".git" / "x.py").write_text("hidden = True\n")


def test_cases_are_deterministic_held_out_and_well_formed(tmp_path):
    make_repo(tmp_path)
    workspace, cases = make_cases(str(tmp_path), 120, seed=3)
    again_ws, again = make_cases(str(tmp_path), 120, seed=3)
    assert cases == again and workspace == again_ws
    assert make_cases(str(tmp_path), 120, seed=4)[1] != cases
    assert len(cases) == 120
    assert not any(p.endswith(".txt") or p.startswith(".git") for p in workspace)
    held = {c.path for c in cases}
    assert held and not held & set(workspace)
    assert all(held_out(p) for p in held) and not any(held_out(p) for p in workspace)
    for case in cases:
        text = (tmp_path / case.path).read_text()
        lines = text.split("\n")
        line = lines[case.line]
        assert case.answer and case.answer == case.answer.rstrip()
        assert case.before + case.answer == "\n".join(lines[: case.line] + [line.rstrip()])
        assert case.after == text[len("\n".join(lines[: case.line + 1])) :]
        typed = case.before[len(case.before) - (len(line) - len(case.answer)) :]
        assert (typed.strip() != "") == case.typed
    not_typed = sum(not c.typed for c in cases) / len(cases)
    assert 0.15 < not_typed < 0.45


def test_wilson_interval():
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and abs((lo + hi) / 2 - 0.5) < 1e-9 and 0.09 < hi - lo < 0.21
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def test_measure_on_a_repetitive_repository(tmp_path):
    make_repo(tmp_path)
    workspace, cases = make_cases(str(tmp_path), 60, seed=0)
    memory, cost = build_memory(workspace)
    assert cost["files"] == len(workspace) and cost["tokens"] == memory.tokens > 0
    result = measure(memory, cases)
    assert result["cases"] == 60
    # every line shape repeats across files: the memory knows most of them
    assert result["top8"]["rate"] >= result["top1"]["rate"] > 0.3
    assert set(result["by_length"]) == {"1-2", "3-10", "11-30", ">30"}
    assert sum(r["top1"]["n"] for r in result["by_length"].values()) == 60
    shown = [c["shown"]["rate"] for c in result["cuts"]]
    assert shown == sorted(shown, reverse=True)


def test_main_reports_each_repository(tmp_path, capsys):
    make_repo(tmp_path / "r")
    out = tmp_path / "figures.json"
    argv = ["--repo", str(tmp_path / "r"), "--cases", "20", "--json", str(out), "--typing-lines", "2"]
    assert repo_cases.main(argv) == 0
    printed = capsys.readouterr().out
    assert "top-1 exact" in printed and "score cut" in printed and "every keystroke" in printed
    figures = json.loads(out.read_text())["r"]
    assert figures["cases"] == 20 and figures["result"]["typing_ms"]["lines"] == 2
    assert repo_cases.main(["--repo", str(tmp_path / "missing")]) == 2


def test_index_file_is_built_once_then_loaded_and_rebuilt_for_another_workspace(tmp_path, capsys):
    make_repo(tmp_path / "r")
    index = tmp_path / "{repo}.bin"
    argv = ["--repo", str(tmp_path / "r"), "--cases", "20", "--index-file", str(index), "--json", str(tmp_path / "a.json")]
    assert repo_cases.main(argv) == 0
    assert "index: build" in capsys.readouterr().out and (tmp_path / "r.bin").exists()
    assert repo_cases.main(argv[:-1] + [str(tmp_path / "b.json")]) == 0
    assert "index: loaded from" in capsys.readouterr().out
    first, second = (json.loads((tmp_path / f).read_text())["r"]["result"] for f in ("a.json", "b.json"))
    assert first["top1"] == second["top1"] and first["top8"] == second["top8"]  # the same index either way
    (tmp_path / "r" / "pkg0" / "new.py").write_text("x = 1\n" * 5)  # another workspace (or a held-out file)
    assert repo_cases.main(argv) == 0
    assert "index: build" in capsys.readouterr().out
    (tmp_path / "r.bin").write_bytes(b"garbage")
    assert repo_cases.main(argv) == 0
    assert "index: build" in capsys.readouterr().out
