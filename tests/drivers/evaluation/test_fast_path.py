"""The fast-path table (drivers/evaluation/fast_path.py) from paired eval records."""

from __future__ import annotations

import json

import pytest
from dlm.drivers.evaluation import fast_path


def case(suggestion, confidence, exact, latency=50.0):
    return {"path": "a.py", "answer": "x", "shown": suggestion is not None, "suggestion": suggestion,
            "confidence": confidence, "exact": exact, "latency_ms": latency}


def test_a_confident_memory_answer_takes_the_fast_path_and_the_rest_stay_checked():
    pairs = [
        (case("x", 0.9, True, 80.0), case("x", 0.95, True, 5.0)),  # fast, the same answer
        (case("y", 0.8, True, 90.0), case("z", 0.91, False, 6.0)),  # fast, another answer (wrong)
        (case("w", 0.6, True, 70.0), case("w", 0.4, True, 4.0)),  # checked
    ]
    r = fast_path.row(pairs, 0.9)
    assert (r["fast"], r["fast_same"]) == (2, 0.5)
    assert r["exact"] == pytest.approx(2 / 3)
    assert r["shown"] == 1.0 and r["precision"] == pytest.approx(2 / 3)
    never = fast_path.row(pairs, fast_path.NEVER)
    assert never["fast"] == 0 and never["exact"] == 1.0


def test_runs_of_other_cases_are_refused(tmp_path, capsys):
    for name, cases in (("v", [case("x", 0.9, True)]), ("m", [dict(case("x", 0.9, True), answer="y")])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval-repo.json").write_text(json.dumps({"cases": cases}))
    with pytest.raises(SystemExit):
        fast_path.main(["--verify", str(tmp_path / "v"), "--memory", str(tmp_path / "m")])
    assert "not runs of the same cases" in capsys.readouterr().err
