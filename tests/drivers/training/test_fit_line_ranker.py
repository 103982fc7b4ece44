"""The line ranker's fit (drivers.training.fit_line_ranker) on two small repositories: cases from
the training-split files only, a leave-one-repository-out table, and a ranker file that loads."""

from __future__ import annotations

from pathlib import Path

from dlm.coder_model.memory import line_ranker
from dlm.drivers.evaluation.repo_cases import HOLDOUT, held_out
from dlm.drivers.training import fit_line_ranker


def _repo(root: Path, name: str) -> Path:
    repo = root / name
    repo.mkdir()
    for k in range(80):
        (repo / f"mod_{k}.py").write_text(
            f"def handler_{k}(registry, name):\n    value = registry.get(name)\n    if value is None:\n"
            f"        return {k}\n    registry.close(name, strict=True)\n    return value + {k}\n")
    return repo


def test_cases_come_from_the_training_split_and_the_fitted_ranker_loads(tmp_path: Path, capsys):
    a, b = _repo(tmp_path, "alpha"), _repo(tmp_path, "beta")
    rows = fit_line_ranker.collect(str(a), 15, seed=1)
    assert rows and all(r["drafts"] for r in rows[:3])
    assert all(len(d["x"]) == len(line_ranker.FEATURES) for r in rows for d in r["drafts"])
    # every case is a line of a training-split file: never one `eval --repo` types
    assert all(held_out(r["path"], 2 * HOLDOUT) and not held_out(r["path"], HOLDOUT) for r in rows)
    out = tmp_path / "ranker.json"
    assert fit_line_ranker.main(["--repo", str(a), "--repo", str(b), "--cases", "15", "--trees", "5",
                                 "--depth", "2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| alpha | 15 |" in table and "| all | 30 |" in table
    ranker = line_ranker.load(out)
    assert ranker is not None and len(ranker.trees.trees) == 5


def test_one_repository_is_refused(tmp_path: Path):
    assert fit_line_ranker.main(["--repo", str(_repo(tmp_path, "alpha"))]) == 2
