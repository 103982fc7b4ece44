"""Real edits: the hunks of real commits (the edit-histories records).

`real_edit`: the hunks of one real commit to one file; earlier hunks are the
history, a later hunk is the target (`training.hunks.build_next_edit`). The
test split (by the edit-histories README's commit-sha rule) is held out for
`dlm.drivers.evaluation`: training code cannot read it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from dlm.drivers.training.examples import Example
from dlm.drivers.training.hunks import (
    DEFAULT_OPTIONS,
    EditOptions,
    Hunk,
    NextEdit,
    build_finished_noop,
    build_next_edit,
)

# ---------------------------------------------------------------------------
# real edits: the edit-histories records

SPLITS = ("train", "valid", "test")


def edit_histories_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the edit-histories `.jsonl.gz` files are: the argument (--edit-histories),
    or $DLM_EDIT_HISTORIES."""
    cands = [data_dir, os.environ.get("DLM_EDIT_HISTORIES")]
    for c in cands:
        if c and Path(c).is_dir() and any(Path(c).glob("*.jsonl.gz")):
            return Path(c)
    raise FileNotFoundError(
        "edit-histories data not found: pass --edit-histories DIR (a folder of edit-history records, "
        "*.jsonl.gz with one JSON object per commit file: repo, commit, path, before, after) or set "
        "DLM_EDIT_HISTORIES"
    )


def split_of_commit(commit: str) -> str:
    """The edit-histories README's split rule (depends only on the commit sha)."""
    v = int(hashlib.sha256(commit.encode()).hexdigest(), 16) % 100
    return "train" if v < 90 else "valid" if v < 95 else "test"


def iter_edit_records(
    split: str, data_dir: str | os.PathLike | None = None, *, allow_test: bool = False,
    repos: Iterable[str] | None = None,
) -> Iterator[dict]:
    """Records of one split, file by file, in the files' order.

    The test split is held out for `dlm.drivers.evaluation.evaluate`: reading it
    needs `allow_test=True`, which no training code passes.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}")
    if split == "test" and not allow_test:
        raise ValueError(
            "the edit-histories test split is held out for evaluation; train on 'train' (and "
            "validate on 'valid'), or pass allow_test=True from evaluation code only"
        )
    d = edit_histories_dir(data_dir)
    files = sorted(d.glob("*.jsonl.gz"))
    if repos is not None:
        want = {r.replace("/", "__") for r in repos}
        files = [f for f in files if f.name[: -len(".jsonl.gz")] in want]
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                # the split is a property of the commit: recompute rather than trust the field
                if rec["split"] != split_of_commit(rec["commit"]):
                    raise ValueError(f"{f}: record of commit {rec['commit']} has a split field that "
                                     "disagrees with the edit-histories README's sha rule; the data file is damaged")
                if rec["split"] == split:
                    yield rec


def record_hunks(rec: dict) -> list[Hunk]:
    return [Hunk.from_record(h) for h in rec["hunks"]]


def real_edit_from_record(
    rec: dict, rng: random.Random, k: int | None = None, opts: EditOptions = DEFAULT_OPTIONS
) -> NextEdit | None:
    """The next-edit example of a record with >= 2 hunks: history = hunks[:k] (file
    order), target = hunks[k]; k is random in 1..n-1 unless given."""
    hunks = record_hunks(rec)
    if len(hunks) < 2:
        return None
    if k is None:
        k = rng.randint(1, len(hunks) - 1)
    source = f"{rec['repo']}@{rec['commit'][:12]}:{rec['path']}#{k}"
    return build_next_edit(rec["before"], hunks, list(range(len(hunks))), k, rng, rec["path"],
                           "real_edit", opts, "python", source)


def real_noop_from_record(rec: dict, rng: random.Random, opts: EditOptions = DEFAULT_OPTIONS) -> Example | None:
    hunks = record_hunks(rec)
    if not hunks:
        return None
    return build_finished_noop(rec["before"], hunks, list(range(len(hunks))), rng, rec["path"], opts,
                               "python", f"{rec['repo']}@{rec['commit'][:12]}:{rec['path']}#done")


def real_edit_examples(
    split: str, rng: random.Random, *, data_dir: str | os.PathLike | None = None,
    opts: EditOptions = DEFAULT_OPTIONS, noop_rate: float = 0.1, repeat: bool = True,
    shuffle_buffer: int = 4096, repos: Iterable[str] | None = None,
) -> Iterator[Example]:
    """Endless (if `repeat`) shuffled stream of `real_edit` examples, with a share
    `noop_rate` of finished-commit `noop` examples. Refuses the test split."""
    if split == "test":
        raise ValueError("real_edit_examples is for training; evaluate the test split with "
                         "dlm.drivers.evaluation.evaluate (next_edit_eval_cases)")
    d = edit_histories_dir(data_dir)
    buf: list[dict] = []
    while True:
        names = sorted(f.name[: -len(".jsonl.gz")].replace("__", "/", 1) for f in d.glob("*.jsonl.gz"))
        if repos is not None:
            names = [n for n in names if n in set(repos)]
        rng.shuffle(names)
        produced = False
        for name in names:
            for rec in iter_edit_records(split, d, repos=[name]):
                buf.append(rec)
                if len(buf) < shuffle_buffer:
                    continue
                rec = buf.pop(rng.randrange(len(buf)))
                ex = _real_example(rec, rng, opts, noop_rate)
                if ex is not None:
                    produced = True
                    yield ex
        while buf:
            ex = _real_example(buf.pop(rng.randrange(len(buf))), rng, opts, noop_rate)
            if ex is not None:
                produced = True
                yield ex
        if not repeat or not produced:
            return


def _real_example(rec: dict, rng: random.Random, opts: EditOptions, noop_rate: float) -> Example | None:
    if rng.random() < noop_rate:
        return real_noop_from_record(rec, rng, opts)
    got = real_edit_from_record(rec, rng, opts=opts)
    return got.example if got else None


def next_edit_eval_cases(
    limit: int | None = None, data_dir: str | os.PathLike | None = None, opts: EditOptions = DEFAULT_OPTIONS,
    seed: int = 0,
) -> Iterator[NextEdit]:
    """Deterministic next-edit cases from the test split (for evaluation only):
    for each record with >= 2 hunks, the last hunk is the target and the earlier
    ones the history (context sizes from a per-record seeded rng)."""
    n = 0
    for rec in iter_edit_records("test", data_dir, allow_test=True):
        if len(rec["hunks"]) < 2:
            continue
        rng = random.Random(f"{seed}:{rec['commit']}:{rec['path']}")
        got = real_edit_from_record(rec, rng, k=len(rec["hunks"]) - 1, opts=opts)
        if got is None:
            continue
        yield got
        n += 1
        if limit is not None and n >= limit:
            return
