"""`dlm-lsp predict` with the repository memory: the file's project is indexed by the server's
own code (lsp.workspace_index), the memory is consulted while typing, and the output says which
source made the suggestion.

The embedded model runs in this process (loaded once for the module; `predict` is called
through its `run`), so each case costs an index of a few files and one prediction. The
projects repeat a distinctive line, so the memory's proposal is known; the tests claim what
predict reports and what it must never show, not how often the model agrees.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest
from dlm.lsp import predict_cli

LINE = "    frobnicate_widget(registry, widget_id=42, strict=True)"
TYPED = "    frobnicate_widget("
REST = LINE[len(TYPED):]
HF = "hf_QmZxTnWvKpLrYsHdJfGbCeUaNoIiEkMt4x"  # a Hugging Face token's shape (coder_model.secrets)


class _Kept:
    """The module's engine, handed to each run; predict's close() leaves it open."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def embedded():
    from dlm.coder_model.engine import load_engine

    engine = load_engine(None, "cpu")
    yield engine
    engine.close()


@pytest.fixture
def predict(embedded, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("dlm.coder_model.engine.load_engine", lambda model=None, device="auto": _Kept(embedded))
    monkeypatch.setattr(predict_cli, "setup_logging", lambda level: None)

    def run(path: Path, line: int, col: int, *extra: str) -> tuple[int, str, str]:
        ap = argparse.ArgumentParser()
        predict_cli.add_arguments(ap)
        args = ap.parse_args([str(path), "--line", str(line), "--col", str(col), "--device", "cpu", *extra])
        rc = predict_cli.run(args)
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _suggestion(out: str) -> str:
    m = re.search(r"^== suggestion at the cursor: (.*)$", out, re.MULTILINE)
    assert m, out
    return m.group(1)


def _suggested(out: str) -> str:
    """The suggested text itself ('' for none): the Python literal the suggestion line starts with."""
    line = _suggestion(out)
    if line.startswith("none"):
        return ""
    m = re.match(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""", line)
    assert m, line
    return ast.literal_eval(m.group(1))


def _added(out: str) -> str:
    """The lines the printed diff adds."""
    return "\n".join(x for x in out.splitlines() if x.startswith("+") and not x.startswith("+++"))


def _source(out: str) -> str:
    m = re.search(r"^== source: (\w+)", out, re.MULTILINE)
    assert m, out
    return m.group(1)


def _project(root: Path, *, repeated: bool = True) -> Path:
    """A git project: the repeated line in other files (when `repeated`), and pkg/app.py, where
    it is typed (0-based line 1), holding it once."""
    (root / ".git").mkdir(parents=True)
    (root / "pkg").mkdir()
    if repeated:
        for i in range(5):
            (root / f"mod{i}.py").write_text(f"def handler_{i}(registry):\n{LINE}\n    return registry\n")
    app = root / "pkg" / "app.py"
    app.write_text(f"def handler(registry):\n{LINE}\n    return registry\n")
    return app


def test_with_the_index_the_memory_suggests_the_repeated_line_and_says_so(tmp_path, predict):
    app = _project(tmp_path / "proj")
    rc, out, err = predict(app, 1, len(TYPED))
    assert rc == 0, err
    # the git root is the project, not the file's folder
    assert f"== repository memory: {tmp_path / 'proj'}: 6 files" in out, out
    assert f"the rest of line 1 ({REST!r}) is left out" in out
    assert _source(out) == "memory", out
    assert _suggestion(out) == f"{REST!r}, the text that follows in the file", out
    assert "(none: the suggestion is the text the file already has there)" in out

    rc, out, err = predict(app, 1, len(TYPED), "--no-index")
    assert rc == 0, err
    assert "== repository memory: off (--no-index)" in out
    assert _source(out) == "model", out
    assert "widget_id=42" not in _suggested(out), out


def test_the_typed_file_never_supplies_its_own_rest_of_line(tmp_path, predict):
    # the line exists only where it is typed: its rest is on disk and in the index's copy of the
    # file, and neither may be copied into the suggestion
    app = _project(tmp_path / "proj", repeated=False)
    rc, out, err = predict(app, 1, len(TYPED))
    assert rc == 0, err
    assert re.search(r"^== repository memory: .*proj: 1 files", out, re.MULTILINE), out
    assert "widget_id=42" not in _suggested(out), out
    assert "widget_id=42" not in _added(out), out  # the diff may show the file's line replaced, never added


@pytest.mark.parametrize("ignored", [False, True])
def test_an_ignored_file_is_never_suggested(tmp_path, predict, ignored):
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    if ignored:
        (root / ".gitignore").write_text("private/\n")
    (root / "private").mkdir()
    for i in range(5):
        (root / "private" / f"p{i}.py").write_text(f"def handler_{i}(registry):\n{LINE}\n")
    app = root / "app.py"
    app.write_text(f"def handler(registry):\n{TYPED}\n")
    rc, out, err = predict(app, 1, len(TYPED))
    assert rc == 0, err
    if ignored:  # the index never read it: nothing of it is proposed, in any section of the output
        assert "widget_id=42" not in out, out
        assert "== repository memory: " in out and ": 1 files" in out, out
    else:  # the same folder, not ignored: the memory proposes its line (the test can tell)
        assert _source(out) == "memory" and _suggested(out) == REST, out


@pytest.mark.parametrize("value", ['read_token("db")', f'"{HF}"'])
def test_a_secret_line_is_never_suggested(tmp_path, predict, value):
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    typed = '    conn = open_connection(host="db.internal", token='
    for i in range(5):
        (root / f"db{i}.py").write_text(f"def connect_{i}():\n{typed}{value})\n    return conn\n")
    app = root / "app.py"
    app.write_text(f"def connect():\n{typed}\n")
    rc, out, err = predict(app, 1, len(typed))
    assert rc == 0, err
    if value.startswith('"hf_'):  # masked where it is indexed: never proposed, never shown
        assert "hf_Qm" not in out, out
    else:  # the same line with no secret in it is proposed (the test can tell)
        assert _source(out) == "memory" and _suggested(out) == f"{value})", out


def test_a_file_in_the_home_folder_is_predicted_without_an_index(tmp_path, predict, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    f = home / "scratch.py"
    f.write_text(f"def handler(registry):\n{LINE}\n{LINE}\n")
    rc, out, err = predict(f, 2, len(TYPED))
    assert rc == 0, err
    assert f"not indexing {home}: the workspace root is the home directory" in err, err
    assert "--no-index" in err  # says what to do
    assert f"== repository memory: off ({home} is refused" in out, out
    assert _source(out) == "model", out


def test_project_root_is_the_nearest_git_folder_or_file(tmp_path):
    (tmp_path / "repo" / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    f = tmp_path / "repo" / "sub" / "deep" / "x.py"
    f.write_text("")
    assert predict_cli.project_root(f) == (tmp_path / "repo").resolve()
    (tmp_path / "repo" / "sub" / ".git").write_text("gitdir: ../.git/worktrees/sub\n")  # a worktree
    assert predict_cli.project_root(f) == (tmp_path / "repo" / "sub").resolve()
    lone = tmp_path / "lone" / "y.py"
    lone.parent.mkdir()
    lone.write_text("")
    assert predict_cli.project_root(lone) == lone.parent.resolve()
