"""`dlm-lsp predict` from the command line: odd files and positions, the diff it prints
(applied with the real `patch`), binary and oversized input.

The model is a tiny random checkpoint: the tests check what predict does with its
answer (windowing, the diff, errors), not what the answer says.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from dlm.coder_model.types import LayoutBudget, Prompt
from dlm.lsp.predict_cli import fit_prompt, unified_diff

needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="needs the `patch` program")


@pytest.fixture(autouse=True)
def _index_cache(tmp_path_factory, monkeypatch):
    """The index predict builds of each test's folder goes to a cache of the test session's, never
    the user's (the subprocesses inherit the variable)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("index-cache")))


def _predict(path, line, col, model, *extra, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "predict", str(path), "--line", str(line), "--col", str(col),
         "--model", model, "--device", "cpu", "--steps", "4", "--block-len", "8", *extra],
        capture_output=True, text=True, timeout=240, cwd=cwd, check=False,
    )


def test_predict_prints_region_diff_and_timings(tmp_path, tiny_checkpoint):
    f = tmp_path / "a.py"
    f.write_text("def add(a, b):\n    return a + b\n")
    r = _predict(f, 1, 4, tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "== predicted region (0-based line 1)" in r.stdout and "== edit" in r.stdout
    assert "== timings" in r.stdout and "steps" in r.stdout


def test_predict_on_an_empty_file(tmp_path, tiny_checkpoint):
    f = tmp_path / "empty.py"
    f.write_text("")
    r = _predict(f, 0, 0, tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "== predicted region (0-based line 0)" in r.stdout


def test_predict_on_a_2mb_file_at_the_last_column(tmp_path, tiny_checkpoint):
    f = tmp_path / "big.py"
    line = "value_{i} = compute({i}, 'some text to make the line longer')\n"
    f.write_text("".join(line.format(i=i) for i in range(32_000)))
    assert f.stat().st_size > 2_000_000
    last = f.read_text().split("\n")[20_000]
    r = _predict(f, 20_000, len(last), tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "context" in r.stdout  # windowed: the context stays bounded whatever the file size


@pytest.mark.parametrize("line,col,message", [
    (5, 0, "--line 5 is outside the file, which has 2 line(s)"),
    (-1, 0, "--line -1 is outside the file"),
    (0, 99, "--col 99 is outside line 0, which has 5 character(s)"),
])
def test_out_of_range_position_is_a_clear_error_with_exit_code_2(tmp_path, tiny_checkpoint, line, col, message):
    f = tmp_path / "s.py"
    f.write_text("x = 1\n")
    r = _predict(f, line, col, tiny_checkpoint)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_missing_file_and_bad_model(tmp_path, tiny_checkpoint):
    r = _predict(tmp_path / "nope.py", 0, 0, tiny_checkpoint)
    assert r.returncode == 2 and "no such file" in r.stderr
    f = tmp_path / "s.py"
    f.write_text("x = 1\n")
    r = _predict(f, 0, 0, str(tmp_path / "no-model"))
    assert r.returncode == 3 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_binary_and_non_utf8_files_are_refused_with_exit_code_2(tmp_path, tiny_checkpoint):
    binary = tmp_path / "prog"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 30)
    r = _predict(binary, 0, 0, tiny_checkpoint)
    assert r.returncode == 2 and "is a binary file (NUL byte at offset 7)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    latin1 = tmp_path / "cafe.py"
    latin1.write_bytes("x = 1\ncaf\u00e9 = 2\n".encode("latin-1"))
    r = _predict(latin1, 0, 0, tiny_checkpoint)
    assert r.returncode == 2 and "is not UTF-8 text: byte 0xe9 at offset 9 (0-based line 1)" in r.stderr
    assert "iconv" in r.stderr and "Traceback" not in r.stderr


def test_a_line_too_long_for_the_model_is_cut_around_the_cursor(tmp_path, tiny_checkpoint):
    # 1,900 emoji are 7,600 byte tokens for the tiny tokenizer: more than the 4,096 positions
    # the model has, and far more than its 2,048-token window
    f = tmp_path / "wide.py"
    f.write_text("import os\n\nx = '" + "\U0001F600" * 1900 + "'\ny = 2\n")
    r = _predict(f, 2, 1000, tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "exceeds" not in r.stderr
    assert "does not fit the model's window of 2048 tokens" in r.stderr
    assert "cut around the cursor" in r.stdout
    context_tokens = int(re.search(r"context (\d+) tokens", r.stdout).group(1))
    assert context_tokens <= 2048


def test_fit_prompt_keeps_a_prompt_that_fits_and_cuts_one_that_does_not():
    count = len  # one token per character
    budget = LayoutBudget(max_context=100, max_history=20, max_suffix=20)
    small = Prompt(prefix="p" * 500, region="abcdef", cursor=3, suffix="s" * 10, history=(), language="", path="")
    assert fit_prompt(small, budget, count) == (small, 0, 6)  # the layout cuts the long prefix itself
    big = Prompt(prefix="p", region="L" * 300 + "R" * 300, cursor=300, suffix="s" * 30, history=(),
                 language="", path="")
    cut, first, last = fit_prompt(big, budget, count)
    header = len(":\n") + 8  # "language:path\n" and the layout's special tokens
    assert cut.region == big.region[first:last] and cut.region[cut.cursor - 1 : cut.cursor + 1] == "LR"
    assert len(cut.region) >= 50  # at least half the window for the region
    assert header + len(cut.region) + len(cut.suffix) <= 100
    # nothing is lost from the order of the text: what left the region is in prefix and suffix
    assert cut.prefix == big.prefix + big.region[:first]
    assert (big.region[last:] + big.suffix).startswith(cut.suffix)


CASES = [
    # (old, new): a change mid-file, at the start, at the end without a final newline,
    # a deleted last line, an insertion into an empty file, CRLF lines
    ("".join(f"line {i}\n" for i in range(20)), "".join(f"line {i}\n" for i in range(20)).replace("line 12", "LINE 12!")),
    ("a\nb\nc\n", "new first\na\nb\nc\n"),
    ("a\nb\nlast", "a\nb\nlast line"),
    ("a\nb\nlast", "a\nb\n"),
    ("", "x = 1\n"),
    ("a = 1\r\nb = 2\r\nc = 3\r\n", "a = 1\r\nb = 20\r\nc = 3\r\n"),
]


@needs_patch
@pytest.mark.parametrize("old,new", CASES)
def test_unified_diff_applies_with_the_patch_program(tmp_path, old, new):
    f = tmp_path / "src" / "m.py"
    f.parent.mkdir()
    f.write_bytes(old.encode())
    diff = unified_diff(old, new, "src/m.py")
    r = subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch"], input=diff.encode(),
                       cwd=tmp_path, capture_output=True, timeout=60, check=False)
    assert r.returncode == 0, (diff, r.stdout, r.stderr)
    assert f.read_bytes() == new.encode()


def test_unified_diff_numbers_lines_of_the_file():
    old = "".join(f"line {i}\n" for i in range(20))
    diff = unified_diff(old, old.replace("line 12\n", "line twelve\n"), "m.py")
    # 0-based line 12 is line 13 of the file; three lines of context from line 10
    assert diff.splitlines()[:3] == ["--- a/m.py", "+++ b/m.py", "@@ -10,7 +10,7 @@"]
    assert unified_diff(old, old, "m.py") == ""


@needs_patch
def test_printed_diff_applies_to_the_file_with_patch(tmp_path, tiny_checkpoint):
    """`dlm-lsp predict F --diff | patch -p1`, and the default output through patch as well."""
    text = "".join(f"value_{i} = compute({i})\n" for i in range(30))
    src = tmp_path / "pkg" / "calc.py"
    src.parent.mkdir()
    src.write_text(text)
    # The tiny random model never writes <eom>, and an answer that never ends is not shown; an
    # end planned at the first slot (length-aware decoding) makes an edit-mode answer "delete the
    # region": a change to diff, whatever the random weights are. (While typing the answer is an
    # insertion at the cursor, which an end at once leaves empty: no change, nothing to diff.)
    plain = ("--end-threshold", "1e-9", "--mode", "wide")
    r = _predict("pkg/calc.py", 17, 8, tiny_checkpoint, "--diff", "--min-confidence", "0", *plain, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    diff = r.stdout
    assert diff.startswith("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n"), diff
    # the hunk is in file line numbers: 0-based line k (value_k) is file line k + 1, 3 lines of context
    removed = [int(m) for m in re.findall(r"^-value_(\d+) ", diff, re.MULTILINE)]
    assert removed and min(removed) <= 17 <= max(removed), diff
    assert re.search(rf"^@@ -{min(removed) + 1 - 3},", diff, re.MULTILINE), diff
    for output in (diff, _predict("pkg/calc.py", 17, 8, tiny_checkpoint, *plain, cwd=tmp_path).stdout):
        src.write_text(text)
        p = subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch"], input=output, text=True,
                           cwd=tmp_path, capture_output=True, timeout=60, check=False)
        assert p.returncode == 0, (output, p.stdout, p.stderr)
        patched = src.read_text().split("\n")
        original = text.split("\n")
        assert patched[: min(removed)] == original[: min(removed)]  # only the region changed
        assert patched[-(30 - max(removed)) :] == original[-(30 - max(removed)) :]
        assert src.read_text() != text


def test_predict_says_the_confidence_and_diff_holds_back_what_the_editor_would_hide(tmp_path, tiny_checkpoint):
    """`predict --diff | patch -p1` once applied a garbage suggestion to the user's file."""
    f = tmp_path / "a.py"
    f.write_text("def add(a, b):\n    return a + b\n")
    r = _predict(f, 1, 4, tiny_checkpoint)
    m = re.search(r"== confidence ([0-9.]+); the editor would (show|hide) it", r.stdout)
    assert r.returncode == 0 and m, r.stdout
    # the tiny random model never ends its answer; the edit mode's answer ended at once is a change
    # (see above)
    plain = ("--end-threshold", "1e-9", "--mode", "wide")
    hidden = _predict(f, 1, 4, tiny_checkpoint, "--diff", "--min-confidence", "1.0", *plain)
    assert hidden.returncode == 0 and hidden.stdout == ""
    assert "held back, as the editor would" in hidden.stderr and "--min-confidence 0" in hidden.stderr
    forced = _predict(f, 1, 4, tiny_checkpoint, "--diff", "--min-confidence", "0", *plain)
    assert forced.returncode == 0 and forced.stdout.startswith("--- a/"), forced.stdout + forced.stderr


def test_paths_expand_home_and_variables(tmp_path, tiny_checkpoint):
    """`--model ~/models/x` from an editor's settings (no shell to expand it) once failed."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "x").symlink_to(tiny_checkpoint)
    (tmp_path / "src").mkdir()
    f = tmp_path / "src" / "a.py"
    f.write_text("x = 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "predict", "$SRC/a.py", "--line", "0", "--col", "1",
         "--model", "~/models/x", "--device", "cpu", "--steps", "2", "--block-len", "4"],
        capture_output=True, text=True, timeout=240, check=False,
        env={**__import__("os").environ, "HOME": str(home), "SRC": str(tmp_path / "src")},
    )
    assert r.returncode == 0, r.stderr
    assert "== predicted region" in r.stdout


def test_the_source_says_whether_the_model_checked_the_memorys_proposal():
    from dlm.coder_model.types import MemoryProposal, Prompt
    from dlm.lsp.predict_cli import answer_source

    p = Prompt(prefix="", region="x = ", cursor=4, suffix="", proposals=(MemoryProposal("1", 0.97),))
    assert "checked by the model" in answer_source(p, "x = 1", "")
    alone = answer_source(p, "x = 1", "", checked=False, passes=2)
    assert "no check ran" in alone and "checked by the model" not in alone
    unasked = answer_source(p, "x = 1", "", checked=False, passes=0, ranked=True)
    assert "verifyPasses is 0" in unasked and "the line ranker's probability 0.970" in unasked
