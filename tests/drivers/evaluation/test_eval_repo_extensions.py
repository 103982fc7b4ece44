"""`dlm-lsp eval --repo DIR --extensions`: which files the cases come from, how they are opened, what
a bad value says, and a report without Python cases saying that syntax was not checked. No server."""

from __future__ import annotations

import pytest
from dlm.drivers.evaluation import eval_repo
from dlm.drivers.evaluation.eval_repo import (
    Shown,
    judge_cases,
    render_repo,
    run_repo,
    summarize_repo,
    typing_cases,
)
from dlm.drivers.evaluation.eval_typing import Answer
from dlm.drivers.evaluation.repo_cases import EXTENSIONS_EXAMPLE, SOURCE_EXTENSIONS, make_cases
from dlm.lsp import cli, discovery


def make_repo(root, n_files: int = 60) -> None:
    """JavaScript files under web/ and Python files under pkg/, enough of each that some are held out."""
    (root / "web").mkdir(parents=True)
    (root / "pkg").mkdir()
    for i in range(n_files):
        js = "".join(f"export function handler_{i}_{j}(request) {{\n  return respond(request, {j});\n}}\n\n"
                     for j in range(3))
        (root / "web" / f"view{i}.js").write_text("import { respond } from './core.js';\n\n" + js)
        py = "".join(f"def handler_{i}_{j}(request):\n    return respond(request, {j})\n\n\n"
                     for j in range(3))
        (root / "pkg" / f"mod{i}.py").write_text("from core import respond\n\n\n" + py)


def eval_args(*argv: str):
    """The arguments as `dlm-lsp eval` parses them."""
    _, parser, rest = cli.parser_for(["eval", *argv])
    args = parser.parse_args(rest)
    args.cases = args.cases or 20
    return args


@pytest.fixture
def no_replay(monkeypatch):
    """A run that got past its checks fails here, before a workspace is copied or a server started."""

    def drawn(*_args, **_kwargs):
        raise AssertionError("cases were drawn: the run should have stopped before the replay")

    monkeypatch.setattr(eval_repo, "workspace_copy", drawn)


def replayed(rcases) -> list:
    """Each case answered right and shown, as the replay would record it."""
    right = Answer("repo", latency_ms=10.0, shown=True, confidence=0.9, exact=True, final=True)
    return [(c, right) for c in rcases]


def test_the_option_defaults_to_the_one_declaration_and_takes_a_list():
    assert eval_args("--repo", "x").extensions == SOURCE_EXTENSIONS == (".py",)
    assert eval_args("--repo", "x", "--extensions", ".js, .ts,.mjs,.tsx,.js").extensions == (
        ".js", ".ts", ".mjs", ".tsx")


@pytest.mark.parametrize(("value", "why"), [("js,ts", "'js' does not start with '.'"),
                                            ("*.ts", "'*.ts' does not start with '.'"),
                                            (".t?", "'.t?' is not a plain file suffix")])
def test_a_bad_value_fails_saying_what_is_wrong_and_what_to_pass(capsys, value, why):
    with pytest.raises(SystemExit) as exc:
        eval_args("--repo", "x", "--extensions", value)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"dlm-lsp eval: error: argument --extensions: {why}" in err, err
    assert f"e.g. --extensions {EXTENSIONS_EXAMPLE}" in err


def test_a_suffix_the_server_has_no_language_for_is_refused_before_anything_runs(tmp_path, no_replay):
    make_repo(tmp_path / "repo")
    args = eval_args("--repo", str(tmp_path / "repo"), "--extensions", ".js,.vue,.txt",
                     "--out", str(tmp_path / "out"))
    with pytest.raises(SystemExit, match=r"--extensions \.vue,\.txt: the server has no language for these "):
        run_repo(args, [0.0])


def test_no_held_out_lines_names_the_suffixes_and_the_option(tmp_path, no_replay):
    make_repo(tmp_path / "repo")
    args = eval_args("--repo", str(tmp_path / "repo"), "--extensions", ".ts,.tsx",
                     "--out", str(tmp_path / "out"))
    with pytest.raises(SystemExit, match=r"no held-out lines in files ending in \.ts, \.tsx; "
                                         r"for another language pass --extensions"):
        run_repo(args, [0.0])


def test_the_example_suffixes_are_files_the_server_indexes():
    for suffix in EXTENSIONS_EXAMPLE.split(","):
        assert discovery.is_source_name(f"web/app{suffix}"), suffix


def test_cases_are_drawn_from_the_suffixes_asked_and_opened_in_their_language(tmp_path):
    make_repo(tmp_path)
    args = eval_args("--repo", str(tmp_path), "--extensions", ".js")
    workspace, cases = make_cases(str(tmp_path), 20, extensions=args.extensions)
    assert len(cases) == 20 and all(c.path.startswith("web/") and c.path.endswith(".js") for c in cases)
    assert workspace and all(p.endswith(".js") for p in workspace)
    assert {c.typing.language_id for c in typing_cases(cases)} == {"javascript"}
    _, mixed = make_cases(str(tmp_path), 10_000, extensions=(".js", ".py"))
    languages = {(c.typing.name.rsplit(".", 1)[1], c.typing.language_id) for c in typing_cases(mixed)}
    assert languages == {("js", "javascript"), ("py", "python")}


def test_a_run_without_python_cases_says_syntax_was_not_checked(tmp_path):
    make_repo(tmp_path)
    _, cases = make_cases(str(tmp_path), 12, extensions=(".js",))
    finals = replayed(typing_cases(cases))
    # a shown suggestion that would not parse as Python: a JavaScript case is never judged by ast.parse
    shown = {i: Shown(c.before + c.after, len(c.before), "));", len(c.before))
             for i, (c, _) in enumerate(finals)}
    summary = summarize_repo(finals, [0.0, 0.5], judge_cases(finals, shown), {"held_back_syntax": 4})
    assert summary["syntax"]["python_cases"] == 0 and not any("broken" in r for r in summary["rows"])
    md = render_repo("web", "trees", summary, {"extensions": [".js"]})
    assert md.startswith("`dlm-lsp eval --repo web --config trees --extensions .js`")
    assert "Syntax in web: not checked. The broken-when-accepted and held-back figures parse Python" in md
    assert f"none of the {len(finals)} cases is in a Python file" in md
    assert "the server held back 4 answers for syntax" in md
    assert "Python cases shown" not in md and "0 of 0" not in md


def test_a_python_run_keeps_its_syntax_table(tmp_path):
    make_repo(tmp_path)
    _, cases = make_cases(str(tmp_path), 12)
    finals = replayed(typing_cases(cases))
    shown = {i: Shown(c.before + c.after, len(c.before), c.answer, len(c.before))
             for i, (c, _) in enumerate(finals)}
    summary = summarize_repo(finals, [0.0], judge_cases(finals, shown))
    md = render_repo("proj", "trees", summary, {"extensions": list(SOURCE_EXTENSIONS)})
    assert md.startswith("`dlm-lsp eval --repo proj --config trees`")  # the default needs no flag
    assert f"Syntax in proj (Python files, {len(finals)} of {len(finals)} cases;" in md
    assert "| min confidence | Python cases shown | broken when accepted |" in md
    assert f"| 0 | {len(finals)} | 0 (0.0%) |" in md  # the right answers, accepted, break nothing


def test_the_report_gives_the_models_tokens_per_denoising_step_when_it_ran(tmp_path):
    make_repo(tmp_path)
    _, cases = make_cases(str(tmp_path), 6)
    finals = replayed(typing_cases(cases))
    summary = summarize_repo(finals, [0.0], None)
    ran = render_repo("proj", "drafts", summary, {"server": {"steps": 40, "tokens": 130, "tokens_per_step": 3.25}})
    assert "the model committed 3.25 tokens per denoising step (40 steps)" in ran.splitlines()[0]
    idle = render_repo("proj", "trees", summary, {"server": {"steps": 0, "tokens": 0, "tokens_per_step": None}})
    assert "denoising step" not in idle
