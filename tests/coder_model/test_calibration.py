"""coder_model.confidence_calibration (the monotone map, its file) and the fitting command
(evaluation.calibrate) on a tiny random model: what it writes and when it refuses. Nothing
here claims model quality: the tiny model's answers are noise."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json

import pytest
from dlm.coder_model.confidence_calibration import Calibration, CalibrationError, auroc, isotonic_fit
from dlm.coder_model.types import Prompt
from dlm.drivers.evaluation import calibrate


def test_identity_without_a_file(tmp_path):
    cal = Calibration.load(tmp_path)
    assert cal.is_identity and cal(0.37) == 0.37 and cal(1.5) == 1.0


def test_isotonic_fit_is_monotone_and_pools_violators():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    labels = [0, 1, 1, 0, 0, 0, 1, 1]
    cal = isotonic_fit(scores, labels, bins=4)
    # bins of two: 1/2, 1/2, 0, 1; the 0 breaks monotonicity and is pooled with both 1/2 bins
    assert cal.ys == pytest.approx((1 / 3, 1.0))
    assert cal.xs == pytest.approx((0.35, 0.75))
    ys = [cal(x / 100) for x in range(101)]
    assert all(b >= a for a, b in itertools.pairwise(ys))


def test_save_load_roundtrip_and_clear_errors(tmp_path):
    cal = Calibration(kind="min", xs=(0.2, 0.8), ys=(0.1, 0.6), meta={"answers": 10})
    cal.save(tmp_path / "calibration.json")
    back = Calibration.load(tmp_path)
    assert back == cal and back(0.5) == pytest.approx(0.35)
    (tmp_path / "calibration.json").write_text('{"format": "dlm-calibration", "version": 1, "x": [0.5, 0.2], '
                                               '"y": [0.1, 0.2]}')
    with pytest.raises(CalibrationError, match="non-decreasing.*calibrate --model"):
        Calibration.load(tmp_path)
    (tmp_path / "calibration.json").write_text("not json")
    with pytest.raises(CalibrationError, match="cannot be read.*or delete it"):
        Calibration.load(tmp_path)


def test_auroc_ranks():
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert auroc([0.5, 0.5], [1, 0]) == 0.5
    assert auroc([0.5], [1]) is None


def test_acceptable_and_showable():
    p = Prompt(prefix="", region="x = foo(\n", cursor=8, suffix="")
    target = "x = foo(a, b)\n"
    assert calibrate.acceptable(p, target, target)
    assert calibrate.acceptable(p, "x = foo(a, \n", target)  # a correct prefix of the insertion
    assert not calibrate.acceptable(p, "x = foo(c)\n", target)
    assert not calibrate.showable(p, p.region) and not calibrate.showable(p, "")


def _valid_commit() -> str:
    for i in range(2000):  # the edit-histories README's rule: 90 <= sha256 % 100 < 95 is valid
        c = f"{i:040x}"
        if 90 <= int(hashlib.sha256(c.encode()).hexdigest(), 16) % 100 < 95:
            return c
    raise AssertionError("no valid-split commit found")


def _records(n_right: int, n_wrong: int) -> list[dict]:
    """Right answers score high on `min` and at random on `geo_mean`: min ranks them best."""
    right = [{"kind": "k", "right": True, "min": 0.6 + 0.01 * i, "geo_mean": 0.5 + 0.02 * (i % 3),
              "product": 0.3} for i in range(n_right)]
    wrong = [{"kind": "k", "right": False, "min": 0.1 + 0.01 * i, "geo_mean": 0.5 + 0.02 * (i % 4),
              "product": 0.3} for i in range(n_wrong)]
    return right + wrong


def test_fit_keeps_the_kind_that_ranks_right_answers_best():
    report, cal = calibrate.fit(_records(12, 30), bins=5, min_positives=10, meta={})
    assert report["kind"] == "min" and report["auroc"]["min"] == 1.0 and report["fitted"]
    assert cal.kind == "min" and cal(0.05) == 0.0 and cal(0.9) == 1.0
    report, cal = calibrate.fit(_records(3, 30), bins=5, min_positives=10, meta={})
    assert cal is None and not report["fitted"] and "too few" in report["why"]


def _edit_data(tmp_path):
    data = tmp_path / "edits"
    data.mkdir()
    before = "".join(f"v{i} = {i}\n" for i in range(12))
    with gzip.open(data / "o__r.jsonl.gz", "wt") as f:
        for j in range(3):
            f.write(json.dumps({"repo": "o/r", "commit": _valid_commit(), "path": f"m{j}.py", "before": before,
                                "split": "valid", "hunks": [{"at": 2, "del": 1, "add": "v1 = 10\n"},
                                                            {"at": 8, "del": 1, "add": "v7 = 70\n"}]}) + "\n")
    return data


def test_collect_decodes_held_out_examples_with_the_sampler(tiny_model, tmp_path):
    from dlm.coder_model.types import SamplerParams

    model, tok = tiny_model
    examples = list(calibrate.edit_examples(str(_edit_data(tmp_path)), limit=3, seed=0))
    assert len(examples) == 3 and all(kind == "real_edit" for kind, _, _ in examples)
    records = calibrate.collect(model, tok, examples, SamplerParams(block_len=8, steps=8, max_blocks=1),
                                log=lambda m: None)
    for r in records:  # only showable answers are kept; the random model's may be none
        assert set(r) == {"kind", "right", "geo_mean", "min", "product"}
        assert all(0.0 <= r[k] <= 1.0 for k in ("geo_mean", "min", "product"))


def test_command_writes_the_map_next_to_the_checkpoint_or_says_why_not(tiny_checkpoint, tmp_path, capsys,
                                                                        monkeypatch):
    # the decoding is test_collect's; here the records are given, so the outcome is known
    monkeypatch.setattr(calibrate, "collect", lambda *a, **k: _records(12, 30))
    args = ["--model", tiny_checkpoint, "--edit-histories", str(_edit_data(tmp_path)),
            "--corpus", str(tmp_path / "none"), "--limit", "3"]
    out = tmp_path / "cal.json"
    assert calibrate.main([*args, "--out", str(out), "--dry-run"]) == 0 and not out.exists()
    assert json.loads(capsys.readouterr().out)["fitted"]
    assert calibrate.main([*args, "--out", str(out)]) == 0
    assert Calibration.from_json(json.loads(out.read_text())).kind == "min"
    monkeypatch.setattr(calibrate, "collect", lambda *a, **k: _records(2, 30))
    out.unlink()
    capsys.readouterr()
    assert calibrate.main([*args, "--out", str(out)]) == 0 and not out.exists()
    assert "too few" in json.loads(capsys.readouterr().out)["why"]
    assert calibrate.main(["--model", str(tmp_path), "--edit-histories", str(tmp_path)]) == 2  # no checkpoint
