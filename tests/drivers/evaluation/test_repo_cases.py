"""repo_cases: held-out cases from a repository, deterministic, and the memory measured on them."""

from __future__ import annotations

import hashlib
import json

import pytest
from dlm.drivers.evaluation import repo_cases
from dlm.drivers.evaluation.repo_cases import (
    build_memory,
    held_out,
    make_cases,
    measure,
    parse_extensions,
    source_files,
    wilson,
)


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


def make_js_files(root, n_files: int = 60) -> None:
    web = root / "web"
    web.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        body = "".join(
            f"export function handler_{i}_{j}(request, value) {{\n  const result = compute(value, {j});\n"
            f"  return respond(request, result);\n}}\n\n"
            for j in range(4)
        )
        (web / f"view{i}.js").write_text("import { compute, respond } from './core.js';\n\n" + body)


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


# make_repo's 50 cases at seed 0
FROZEN_DIGEST = "ebd41297162558cae0e5ea33b5cabdc753eec8f8951c9a40b2a218effc4e3182"


def test_python_cases_with_the_default_suffixes_are_frozen(tmp_path):
    # the digest of the cases this repository gave before --extensions existed: a change of the
    # Python selection (which files, which lines, where the cut falls) shows here
    make_repo(tmp_path)
    workspace, cases = make_cases(str(tmp_path), 50, seed=0)
    assert make_cases(str(tmp_path), 50, seed=0, extensions=parse_extensions(".py")) == (workspace, cases)
    drawn = repr([(c.path, c.line, c.before, c.after, c.answer, c.typed) for c in cases])
    assert hashlib.sha256(drawn.encode()).hexdigest() == FROZEN_DIGEST


def test_extensions_draw_cases_from_javascript_files_and_keep_the_split_by_path(tmp_path):
    make_repo(tmp_path, n_files=60)
    make_js_files(tmp_path)
    py_workspace, py_cases = make_cases(str(tmp_path), 40)
    assert py_cases and all(c.path.endswith(".py") for c in py_cases)
    assert all(p.endswith(".py") for p in py_workspace)
    js_workspace, js_cases = make_cases(str(tmp_path), 40, extensions=parse_extensions(".js"))
    assert len(js_cases) == 40 and all(c.path.endswith(".js") and held_out(c.path) for c in js_cases)
    assert js_workspace and all(p.endswith(".js") for p in js_workspace)
    assert not {c.path for c in js_cases} & set(js_workspace)
    assert js_cases[0].before.startswith("import { compute, respond } from './core.js';")
    both_workspace, both = make_cases(str(tmp_path), 10_000, extensions=parse_extensions(".js,.py"))
    # the same files held out per suffix whatever else is read: the split is a hash of the path
    assert set(both_workspace) == set(py_workspace) | set(js_workspace)
    held = {p for p in source_files(str(tmp_path), (".js", ".py")) if held_out(p)}
    assert {c.path for c in both} == held and {p[p.rfind("."):] for p in held} == {".js", ".py"}


def test_parse_extensions():
    assert parse_extensions(".js,.ts, .mjs ,.tsx,.js,") == (".js", ".ts", ".mjs", ".tsx")
    assert parse_extensions(".d.ts") == (".d.ts",)
    assert parse_extensions(",".join(repo_cases.SOURCE_EXTENSIONS)) == repo_cases.SOURCE_EXTENSIONS


@pytest.mark.parametrize(
    ("value", "why"),
    [("js,.ts", "'js' does not start with '.'"), (".j*", "'.j*' is not a plain file suffix"),
     ("./src/.js", "'./src/.js' is not a plain file suffix"), (".", "'.' is not a plain file suffix"),
     (" , ", "no file suffix in ' , '")],
)  # fmt: skip
def test_a_bad_extensions_value_fails_saying_what_is_wrong_and_what_to_pass(tmp_path, capsys, value, why):
    make_repo(tmp_path, n_files=3)
    with pytest.raises(SystemExit) as exc:
        repo_cases.main(["--repo", str(tmp_path), "--extensions", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --extensions: {why}" in err, err
    assert "pass suffixes with their dot, comma-separated, e.g. --extensions .js,.ts,.mjs,.tsx" in err


def test_main_reports_a_javascript_repository_with_extensions(tmp_path, capsys):
    make_repo(tmp_path / "r", n_files=30)
    make_js_files(tmp_path / "r")
    out = tmp_path / "figures.json"
    argv = ["--repo", str(tmp_path / "r"), "--cases", "20", "--extensions", ".js,.mjs", "--json", str(out)]
    assert repo_cases.main(argv) == 0
    assert "top-1 exact" in capsys.readouterr().out
    figures = json.loads(out.read_text())["r"]
    assert figures["cases"] == 20 and figures["extensions"] == [".js", ".mjs"]
    js_files = [p for p in source_files(str(tmp_path / "r"), (".js",)) if not held_out(p)]
    assert figures["cost"]["files"] == len(js_files)
    assert repo_cases.main(["--repo", str(tmp_path / "r"), "--extensions", ".ts"]) == 2
    err = capsys.readouterr().err
    assert "no held-out lines" in err and "files ending in .ts" in err and "--extensions" in err
