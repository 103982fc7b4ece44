"""`dlm-lsp predict` from the command line: odd files and positions."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _predict(path, line, col, model, *extra):
    return subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "predict", str(path), "--line", str(line), "--col", str(col),
         "--model", model, "--device", "cpu", "--steps", "4", "--block-len", "8", *extra],
        capture_output=True, text=True, timeout=240,
    )


def test_predict_prints_region_diff_and_timings(tmp_path, tiny_checkpoint):
    f = tmp_path / "a.py"
    f.write_text("def add(a, b):\n    return a + b\n")
    r = _predict(f, 1, 4, tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "--- predicted region (line 1)" in r.stdout and "--- edit" in r.stdout
    assert "--- timings" in r.stdout and "steps" in r.stdout


def test_predict_on_an_empty_file(tmp_path, tiny_checkpoint):
    f = tmp_path / "empty.py"
    f.write_text("")
    r = _predict(f, 0, 0, tiny_checkpoint)
    assert r.returncode == 0, r.stderr
    assert "--- predicted region (line 0)" in r.stdout


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
