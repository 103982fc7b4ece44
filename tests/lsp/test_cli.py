"""The `dlm-lsp` command line: the hint on a terminal, one --log-level spelling for every
command, and `dlm-lsp bench` saying why a run measured nothing."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest
from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams
from dlm.drivers.bench import typing_latency as bench
from dlm.lsp import cli
from fake_engine import FakeEngineBase
from lsp_helpers import SERVER, server_env


class RaisingEngine(FakeEngineBase):
    """Loaded in the server subprocess (--engine-factory test_cli:raising): every prediction
    fails, so the bench has a run with no completed request to report."""

    model_name = "raising-fake (bench report test)"

    def predict(self, prompt: Prompt, params: SamplerParams, cancel: CancelToken, deadline=None) -> Prediction:
        raise RuntimeError("this engine fails every prediction (test of the bench's report)")


def raising(model, device):
    return RaisingEngine()


# -- bare dlm-lsp on a terminal ------------------------------------------------------------------


def test_bare_dlm_lsp_on_a_terminal_prints_the_hint_and_serves():
    master, slave = pty.openpty()
    proc = subprocess.Popen(SERVER[:-1], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow"))
    os.close(slave)
    try:
        first = proc.stderr.readline().decode()
        assert first.startswith("dlm-lsp is a language server that talks LSP on stdin/stdout; your editor starts it.")
        assert "dlm-lsp predict FILE --line N --col M" in first and "dlm-lsp --help" in first
        os.write(master, b"\x04")  # Ctrl-D: end of input on the terminal; a serving server then exits
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_no_hint_when_an_editor_starts_it_on_a_pipe():
    proc = subprocess.run(SERVER, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                          env=server_env(DLM_ENGINE_FACTORY="fake_engine:slow"), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "your editor starts it" not in proc.stderr


# -- --log-level -----------------------------------------------------------------------------------

COMMANDS = [
    [],
    ["--stdio"],
    ["predict", "f.py", "--line", "0", "--col", "0"],
    ["bench"],
    ["serve"],
    ["http"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:1]) or "server")
@pytest.mark.parametrize("spelling", ["debug", "Warning", "ERROR", "info"])
def test_every_command_takes_log_level_in_any_case(command, spelling):
    _, parser, rest = cli.parser_for(command)
    args = parser.parse_args(rest + ["--log-level", spelling])
    assert args.log_level == spelling.upper()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:1]) or "server")
def test_a_wrong_log_level_names_the_choices(command, capsys):
    _, parser, rest = cli.parser_for(command)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(rest + ["--log-level", "verbose"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'VERBOSE'" in err and "'DEBUG', 'INFO', 'WARNING', 'ERROR'" in err


# -- bench: an empty run says why ------------------------------------------------------------------


def summary(measured: int, shown: int, **server) -> dict:
    counters = dict.fromkeys(["requests", "model_runs", "completed", "steps", "tokens", "cancelled",
                              "superseded", "skipped", "cache_hits", "empty", "outdated", "failed", "late",
                              "gated_late", "gated_low_confidence", "gated_rewrites_recent"], 0)
    counters.update(tokens_per_step=None, stages_p50_ms={}, p50_ms=None, p95_ms=None, p99_ms=None)
    counters.update(server)
    none = {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    return {"model": "m", "device": "cpu", "keystrokes": 40, "measured": measured, "latency": dict(none),
            "latency_at_pauses": none | {"n": 0}, "shown": shown, "superseded_client": 0, "jumps": 1,
            "typos": 0, "server": counters, "wall_s": 1.0, "server_log": "/tmp/dlm-bench-x.log", "cps": 8.0,
            "seed": 0}


def test_bench_explains_a_run_where_every_request_was_cancelled():
    s = summary(0, 0, requests=40, model_runs=12, cancelled=12, superseded=28)
    why = bench.explain(s)
    assert "No request completed" in why and "12 cancelled, 28 superseded" in why
    assert "--cps" in why and "--device cuda" in why
    table = bench.render(s)
    assert "None / None / None ms" in table and table.endswith(why)  # the Nones come with the reason


def test_bench_explains_failed_runs_and_a_model_that_never_ran():
    why = bench.explain(summary(0, 0, requests=40, model_runs=5, failed=5))
    assert "all 5 model runs failed" in why and "/tmp/dlm-bench-x.log" in why
    why = bench.explain(summary(0, 0, requests=40, empty=40))
    assert "the model never ran" in why and "40 answered empty" in why


def test_bench_explains_suggestions_held_back_by_the_gate():
    why = bench.explain(summary(30, 0, requests=40, model_runs=30, completed=30, gated_late=20,
                                gated_low_confidence=10))
    assert "20 held back as late" in why and "10 held back below the confidence threshold" in why
    assert "--device cuda" in why  # late answers: a faster device helps
    assert bench.explain(summary(30, 3, requests=40, model_runs=30, completed=30)) == ""  # nothing to explain


def test_bench_accounts_for_every_completed_run_and_advises_only_what_applies():
    """It once accounted for 1 of 18 completed runs and advised a faster device with 0 late answers."""
    why = bench.explain(summary(18, 0, requests=40, model_runs=18, completed=18, gated_low_confidence=1,
                                no_change=17, no_steps=2))
    assert "Of 18 completed runs: 1 held back below the confidence threshold" in why
    assert "17 proposed no change at the cursor" in why and "2 of the runs that proposed nothing" in why
    assert "a bigger --model" in why and "minConfidence" in why
    assert "--device cuda" in why  # 2 runs had no time for a step
    quiet = bench.explain(summary(18, 0, requests=40, model_runs=18, completed=18, no_change=18))
    assert "--device cuda" not in quiet and "18 proposed no change" in quiet


def test_bench_with_an_engine_that_fails_says_so(tmp_path):
    src = tmp_path / "sample.py"
    src.write_text("".join(f"def f{i}(x):\n    y = x * {i} + 1\n    return y - {i}\n\n" for i in range(30)))
    out = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "bench", "--engine-factory", "test_cli:raising", "--files", str(src),
         "--keystrokes", "6", "--cps", "30", "--log-level", "warning", "--json"],
        capture_output=True, text=True, timeout=240, check=True,
        env=server_env(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache")),  # the index's cache
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["server"]["completed"] == 0 and result["server"]["failed"] >= 1
    assert "model runs failed" in result["explanation"] and result["server_log"] in result["explanation"]
