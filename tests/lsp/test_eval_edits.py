"""`dlm-lsp eval --next-edits`: the metric functions (overlap, exact, kept lines deleted, characters
saved) on hand-made proposals, the replay's steps and truth, the record sample, the git walk's
workspace (never a later state), and the whole harness through the real server with the embedded
checkpoint on records built here. The server's answers are whatever the model writes: the end-to-end
tests check the replay and the report, never the model's quality."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dlm.drivers.evaluation.eval_edits import (
    EditRecord,
    Hunk,
    Opportunity,
    ParentWorkspace,
    Span,
    apply_edits,
    git_commit_records,
    git_history,
    git_lines,
    judge,
    overlaps,
    render_markdown,
    replay_steps,
    select_records,
    sessions,
    summarize,
)
from lsp_helpers import server_env

DOC = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n"


def _edit(l1: int, c1: int, l2: int, c2: int, text: str) -> dict:
    return {"range": {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}, "newText": text}


def test_overlaps_line_ranges_and_insertion_points():
    assert overlaps(0, 2, 1, 3) and not overlaps(0, 2, 2, 4)  # [0,2) and [2,4) only touch
    assert overlaps(2, 2, 0, 2) and overlaps(2, 2, 2, 4)  # an insertion point touches the lines on either side
    assert not overlaps(5, 5, 0, 2) and not overlaps(0, 2, 5, 5)
    assert overlaps(3, 3, 3, 3) and not overlaps(3, 3, 4, 4)


def test_exact_is_the_next_hunk_byte_for_byte():
    lines = git_lines(DOC)
    remaining = [Span(4, 1, "def volume(width, h, d):\n"), Span(5, 1, "    return width * h * d\n")]
    right = judge(lines, [_edit(4, 11, 4, 12, "width")], remaining)
    assert right.changes and right.location and right.exact and right.exact_any
    assert right.chars_saved == 4  # "w" -> "width": "idth" typed
    assert right.kept_deleted == right.kept_changed == 0
    # one character off: right place, not exact
    off = judge(lines, [_edit(4, 11, 4, 12, "widht")], remaining)
    assert off.location and not off.exact and not off.exact_any and off.chars_saved == 0
    # the remaining hunk after the next, exactly: exact among the remaining, not the next
    later = judge(lines, [_edit(5, 11, 5, 12, "width")], remaining)
    assert later.location and not later.exact and later.exact_any
    # both at once: the hunks it overlaps, exactly
    both = judge(lines, [_edit(4, 11, 4, 12, "width"), _edit(5, 11, 5, 12, "width")], remaining)
    assert both.exact_any and not both.exact and both.chars_saved == 8
    # a trailing space more is not exact
    assert not judge(lines, [_edit(4, 11, 4, 12, "width"), _edit(4, 24, 4, 24, " ")], remaining).exact


def test_a_proposal_elsewhere_has_no_location_and_a_noop_changes_nothing():
    lines = git_lines(DOC)
    remaining = [Span(4, 1, "def volume(width, h, d):\n")]
    away = judge(lines, [_edit(0, 9, 0, 10, "width")], remaining)
    assert away.changes and not away.location and not away.exact
    assert away.kept_changed == 1 and away.kept_deleted == 0  # a kept line rewritten, not deleted
    noop = judge(lines, [_edit(1, 4, 1, 10, "return")], remaining)
    assert not noop.changes and not noop.location
    assert not judge(lines, [], remaining).changes


def test_deleting_kept_lines_is_caught_even_at_the_right_location():
    lines = git_lines(DOC)
    remaining = [Span(4, 1, "def volume(width, h, d):\n")]
    # a region rewrite the model makes: the right line among many deleted ones
    wipe = judge(lines, [_edit(1, 0, 6, 0, "def volume(width, h, d):\n")], remaining)
    assert wipe.location and not wipe.exact
    assert wipe.kept_deleted == 2  # "return w * h" and "return w * h * d" (blank lines do not count)
    # deleting the line the next hunk replaces is not deleting a kept line
    own = judge(lines, [_edit(4, 0, 5, 0, "")], remaining)
    assert own.location and own.kept_deleted == 0 and own.kept_changed == 0
    # a pure insertion that keeps everything
    ins = judge(lines, [_edit(4, 0, 4, 0, "# note\n")], remaining)  # just above the next hunk's line
    assert not judge(lines, [_edit(3, 0, 3, 0, "# note\n")], remaining).location  # a line further up
    assert ins.location and ins.kept_deleted == 0 and ins.lines_removed == 0 and ins.lines_added == 1


def test_apply_edits_counts_utf16_columns():
    text = "s = '\U0001f600x'\n"
    assert apply_edits(text, [_edit(0, 7, 0, 8, "y")]) == "s = '\U0001f600y'\n"  # the emoji is 2 UTF-16 units


def _record(before: str, hunks: list[tuple[int, int, str]], split: str = "valid", repo: str = "o/r",
            commit: str = "c" * 40) -> EditRecord:
    return EditRecord(split, repo, commit, "2020-01-01", "m.py", before, [Hunk(*h) for h in hunks])


def test_replay_steps_file_order_cursor_and_remaining_truth():
    before = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"
    # line 0 -> two lines; delete line 2; line 4 -> "e = 50"; (start, n_del, add) in before's coordinates
    rec = _record(before, [(0, 1, "a = 1\na2 = 1\n"), (2, 1, ""), (4, 1, "e = 50\n")])
    steps = list(replay_steps(rec))
    assert len(steps) == 3 and rec.opportunities == 2  # the last hunk is typed, not asked about
    assert steps[2][0] == (4, 5, "e = 50\n") and steps[2][3] == []  # nothing remains after it
    change, lines, cursor, remaining = steps[0]
    assert change == (0, 1, "a = 1\na2 = 1\n") and cursor == (1, 6)  # end of the last line it wrote
    assert [(s.start, s.n_del) for s in remaining] == [(3, 1), (5, 1)]  # shifted by the added line
    change, lines, cursor, remaining = steps[1]
    assert change == (3, 4, "") and cursor == (3, 0)  # a deletion: where its line was
    assert "".join(lines) == "a = 1\na2 = 1\nb = 2\nd = 4\ne = 5\n"
    from dlm.drivers.evaluation.eval_edits import apply_spans

    assert apply_spans(lines, remaining) == "a = 1\na2 = 1\nb = 2\nd = 4\ne = 50\n"


def test_select_records_cuts_steps_not_the_truth_and_covers_repositories():
    recs = [_record("x\n" * 20, [(i, 1, "y\n") for i in range(0, 12, 2)], repo=f"o/r{k}", commit=f"{k}{n}" * 20)
            for k in range(3) for n in range(2)]
    recs.append(_record("x\n", [(0, 1, "y\n")]))  # one hunk: no opportunity
    got = select_records(recs, 12, seed=0)
    assert sum(r.opportunities for r in got) == 12
    assert {r.repo for r in got} == {"o/r0", "o/r1", "o/r2"}  # round-robin: each repository in a small run
    assert [r.opportunities for r in got] == [5, 5, 2]  # one record per repository, the last cut to 2 steps
    assert all(len(r.hunks) == 6 for r in got)  # the truth keeps every hunk
    last = got[-1]
    steps = list(replay_steps(last))  # every hunk typed; the first 2 are the opportunities
    assert len(steps) == 6 and len(steps[last.opportunities - 1][3]) == 4  # 4 hunks remain after the 2nd


def test_sessions_never_cross_a_repository():
    recs = [_record("x\n", [], repo=repo, commit=c * 40) for repo, c in (("o/a", "1"), ("o/a", "1"), ("o/a", "2"),
                                                                          ("o/b", "3"))]
    assert [[r.commit[0] for r in s] for s in sessions(recs, "repository")] == [["1", "1", "2"], ["3"]]
    assert [[r.commit[0] for r in s] for s in sessions(recs, "commit")] == [["1", "1"], ["2"], ["3"]]
    with pytest.raises(SystemExit, match="repository, commit"):
        sessions(recs, "file")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}).stdout


def _git_repo(tmp_path: Path) -> tuple[Path, list[str]]:
    repo = tmp_path / "proj"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    versions = [
        "def f(a):\n    return a\n\n\ndef g(a):\n    return a\n\n\nf(1)\ng(1)\n",
        "def f(a, b=0):\n    return a + b\n\n\ndef g(a):\n    return a\n\n\nf(1)\ng(1)\n",
        "def f(a, b=0):\n    return a + b\n\n\ndef g(a, b=0):\n    return a + b\n\n\nf(1, 2)\ng(1, 2)",
    ]
    shas = []
    for n, text in enumerate(versions):
        (repo / "m.py").write_text(text)
        _git(repo, "add", "m.py")
        _git(repo, "commit", "-qm", f"v{n}")
        shas.append(_git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def test_git_walk_mines_hunks_and_the_workspace_never_holds_a_later_commit(tmp_path):
    repo, shas = _git_repo(tmp_path)
    hist = git_history(repo, 10)
    assert [(p, c) for p, c, _ in hist] == [(shas[0], shas[1]), (shas[1], shas[2])]  # oldest first, no root
    recs = git_commit_records(repo, shas[1], shas[2], hist[1][2])
    assert len(recs) == 1 and len(recs[0].hunks) == 2
    rec = recs[0]
    after = "".join(git_lines(rec.before)[:4]) + "def g(a, b=0):\n    return a + b\n\n\nf(1, 2)\ng(1, 2)"
    from dlm.drivers.evaluation.eval_edits import apply_spans

    assert apply_spans(git_lines(rec.before), [Span(h.start, h.n_del, h.add) for h in rec.hunks]) == after
    ws = ParentWorkspace(repo)
    try:
        assert ws.advance(shas[0]) == []
        assert (ws.root / "m.py").read_text().startswith("def f(a):")
        assert ws.advance(shas[1]) == ["m.py"]
        log = _git(ws.root, "log", "--all", "--format=%H").split()
        assert shas[2] not in log and set(log) == {shas[0], shas[1]}
        objects = subprocess.run(["git", "-C", str(ws.root), "cat-file", "-e", shas[2]],
                                 capture_output=True, check=False)
        assert objects.returncode != 0  # not even the object of the later commit
    finally:
        ws.close()
    assert not ws.root.exists()
    assert _git(repo, "rev-parse", "HEAD").strip() == shas[2]  # the repository itself untouched


def _opp(conf, location, exact, kept_deleted=0, split="valid", repo="o/r", latency=10.0) -> Opportunity:
    o = Opportunity(split, repo, "c", "m.py", 1, 2, latency_ms=latency, confidence=conf)
    o.judgement.changes = conf is not None or location
    o.judgement.location, o.judgement.exact, o.judgement.exact_any = location, exact, exact
    o.judgement.kept_deleted = kept_deleted
    o.judgement.chars_saved = 6 if exact else 0
    return o


def test_summary_sweeps_thresholds_and_finds_the_target_threshold():
    opps = [_opp(0.9, True, True) for _ in range(4)] + [_opp(0.4, True, False, kept_deleted=3) for _ in range(4)]
    opps += [Opportunity("valid", "o/r", "c", "m.py", 1, 2, latency_ms=5.0) for _ in range(12)]  # nothing proposed
    s = summarize(opps, [0.0, 0.5], rewrite_recent=0.98)
    r0, r5 = s["rows"]
    assert r0["shown"]["k"] == 8 and r0["exact"]["rate"] == 0.5 and r0["deletes_kept"]["rate"] == 0.5
    assert r5["shown"]["k"] == 4 and r5["exact"]["rate"] == 1.0 and r5["location"]["rate"] == 1.0
    assert r5["chars_saved_per_opportunity"]["mean"] == pytest.approx(24 / 20)
    lo, hi = r5["exact"]["ci"]
    assert lo < 1.0 and hi == 1.0  # a Wilson interval, not a point
    assert s["target_threshold"] == 0.5  # 20% shown, all exact, none deleting kept lines
    md = render_markdown(s, {"model": "m", "device": "cpu", "date": "d", "records": 20})
    assert "| 0.5 | 4 of 20: 20.0% " in md and "meets the Targets" in md and "| **valid** |" in md


def _valid_commit(i0: int = 0) -> str:
    for i in range(i0, i0 + 10000):
        c = f"{i:040x}"
        if 90 <= int(hashlib.sha256(c.encode()).hexdigest(), 16) % 100 < 95:  # the edit-histories README's sha rule: valid
            return c
    raise AssertionError("no valid-split commit")


def test_next_edits_through_the_server_with_the_embedded_checkpoint(tmp_path):
    data = tmp_path / "edits"
    data.mkdir()
    before = "def area(w, h):\n    return w * h\n\n\ndef volume(w, h, d):\n    return w * h * d\n\n\nprint(area(2, 3))\n"
    rec = {"repo": "o/r", "license": "MIT", "commit": _valid_commit(), "date": "2020-01-01", "subject": "s",
           "path": "geo.py", "before": before, "split": "valid",
           "hunks": [{"at": 1, "del": 1, "add": "def area(width, h):\n"},
                     {"at": 5, "del": 1, "add": "def volume(width, h, d):\n"},
                     {"at": 9, "del": 1, "add": "print(area(20, 3))\n"}]}
    other = dict(rec, repo="o/s", path="s.py", hunks=rec["hunks"][:2])  # another repository: its own session
    with gzip.open(data / "o__r.jsonl.gz", "wt") as f:
        f.write(json.dumps(rec) + "\n" + json.dumps(other) + "\n")
    repo, _ = _git_repo(tmp_path)
    out, records = tmp_path / "out", tmp_path / "records.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "eval", "--next-edits", "--device", "cpu", "--edit-histories", str(data),
         "--split", "valid", "--git", str(repo), "--cases", "5", "--edit-gap-s", "0", "--thresholds", "0,0.5", "--jobs", "2",
         "--rewrite-recent", "0", "--records", str(records), "--out", str(out)],
        env=server_env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "eval-edits.md").read_text()
    assert "| min confidence | shown (of opportunities) | location | exact (next hunk) |" in md
    assert "| **valid** |" in md and "| **git** |" in md and "| git: proj |" in md
    assert (out / "eval-edits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(x) for x in records.read_text().splitlines()]
    # 2 steps of the 3-hunk record, 1 of the other repository's (2 hunks; its session ran beside the first, and
    # its rows still come in session order), 1 of the last commit (2 hunks); the first commit changes 1 line in 1 hunk
    assert [(r["split"], r["repo"], r["step"]) for r in rows] == [("valid", "o/r", 1), ("valid", "o/r", 2),
                                                                   ("valid", "o/s", 1), ("git", "proj", 1)]
    assert all(r["latency_ms"] is not None and not r["error"] for r in rows)
    assert rows[0]["cursor"] == [0, len("def area(width, h):")]
    assert rows[0]["next_hunk"] == {"line": 4, "del": "def volume(w, h, d):\n", "add": "def volume(width, h, d):\n"}
    report = json.loads((out / "eval-edits.json").read_text())
    assert report["meta"]["server_runs"] == 3  # one session per records' repository, one for the git walk
    assert report["meta"]["index"]["files"] == 1  # the git walk's workspace (m.py at the parent) was indexed
    summary = report["summary"]
    assert summary["rows"][0]["opportunities"] == 4 and summary["latency"]["requests"] == 4
    shown_at_0 = sum(1 for r in rows if r["judgement"]["changes"])  # --rewrite-recent 0: every change shows
    assert summary["rows"][0]["shown"]["k"] == shown_at_0
    # the same proposals reported again without a replay, with the server's rewrite-recent bar
    again = subprocess.run(
        [sys.executable, "-m", "dlm.lsp.cli", "eval", "--next-edits", "--from-records", str(records),
         "--thresholds", "0", "--rewrite-recent", "1", "--no-plot", "--out", str(tmp_path / "again")],
        env=server_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((tmp_path / "again" / "eval-edits.json").read_text())["summary"]
    unsure = sum(1 for r in rows if r["judgement"]["changes"] and (not r["rewrites_recent"] or r["confidence"] is None))
    assert summary["rows"][0]["opportunities"] == 4 and summary["rows"][0]["shown"]["k"] == unsure


def test_next_edits_refuses_a_bad_split_and_a_folder_that_is_not_a_repository(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", "eval", "--next-edits", "--split", "train"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0 and "held-out" in bad.stderr and "valid" in bad.stderr
    nogit = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", "eval", "--next-edits", "--git", str(tmp_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert nogit.returncode != 0 and "not a git repository" in nogit.stderr
