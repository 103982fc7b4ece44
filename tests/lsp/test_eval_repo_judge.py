"""`dlm-lsp eval --repo`'s syntax judgement of a case, on small files: whether the shown suggestion,
accepted, breaks a file that parsed (ast.parse), and whether the server's check holds back the true
rest of the line. Pure functions: no server, no model."""

from __future__ import annotations

import pytest
from dlm.drivers.evaluation.eval_repo import (
    Judged,
    Shown,
    accepted,
    broken_by,
    judge_case,
    judge_cases,
    summarize_repo,
    truth_held_back,
    typing_cases,
)
from dlm.drivers.evaluation.eval_typing import Answer, _offset
from dlm.drivers.evaluation.repo_cases import Case

BEFORE = "def f(x):\n    return g(x"
AFTER = "\n\n\nprint(f(1))\n"


def shown_at_pause(case, insert: str, replaced: int = 0) -> Shown:
    """The suggestion as the replay records it: the document at the pause, the cursor, its range."""
    text = case.before + case.after
    return Shown(text, len(case.before), insert, len(case.before) + replaced)


def repo_case(before: str = BEFORE, answer: str = ", 1)", after: str = AFTER, path: str = "pkg/a.py"):
    (case,) = typing_cases([Case(path, before.count("\n"), before, after, answer, True)])
    return case


def test_a_suggestion_that_closes_the_bracket_is_not_broken():
    case = repo_case()
    j = judge_case(case, shown_at_pause(case, ")"))
    assert j.python and j.broken is False


def test_a_stray_closing_bracket_is_broken():
    case = repo_case()
    assert judge_case(case, shown_at_pause(case, "))")).broken is True
    assert judge_case(case, shown_at_pause(case, ", 1)]")).broken is True


def test_a_file_that_does_not_parse_as_it_is_is_never_counted():
    case = repo_case(after="\n\n\nprint(f(1)\n")  # the real file misses a bracket further down
    assert judge_case(case, shown_at_pause(case, "))")).broken is None
    assert judge_case(case, shown_at_pause(case, ")")).broken is None
    assert broken_by("x = (", "x = (1") is None
    j = [judge_case(case, shown_at_pause(case, "))"))]
    answer = Answer("repo", latency_ms=10.0, shown=True, final=True)
    row = summarize_repo([(case, answer)], [0.0], j)["rows"][0]
    assert (row["shown"], row["python_shown"], row["broken"], row["broken_share"]) == (1, 0, 0, None)


def test_a_multi_line_insertion_goes_in_as_it_is_before_what_follows_its_range():
    before = "def f(x):\n    if x:\n        "
    case = repo_case(before=before, answer="return 1", after="\n    return 0\n")
    ok = "return 1\n    else:\n        x = 2"
    assert judge_case(case, shown_at_pause(case, ok)).broken is False
    assert accepted(case.before + case.after, len(before), ok, len(before)) == (
        before + ok + "\n    return 0\n")
    # a second line that dedents out of the block and leaves a stray `else` is broken
    assert judge_case(case, shown_at_pause(case, "return 1\nelse:\n    pass")).broken is True
    # a range that replaces the line break too: the insertion brings its own
    replaced = shown_at_pause(case, "return 1\n    x = 3\n", replaced=1)
    assert accepted(replaced.text, replaced.cursor, replaced.insert, replaced.replace_to) == (
        before + "return 1\n    x = 3\n    return 0\n")
    assert judge_case(case, replaced).broken is False


def test_nothing_shown_or_not_python_is_not_judged():
    case = repo_case()
    assert judge_case(case, None).broken is None and judge_case(case, None).python
    other = repo_case(path="pkg/a.js")
    assert judge_case(other, shown_at_pause(other, "))")) == Judged()


def test_the_rows_count_broken_among_the_shown_python_cases_per_threshold():
    good, bad = repo_case(), repo_case(path="pkg/b.py")
    finals = [(good, Answer("repo", latency_ms=10.0, shown=True, confidence=0.9, final=True)),
              (bad, Answer("repo", latency_ms=10.0, shown=True, confidence=0.2, final=True))]
    judged = judge_cases(finals, {0: shown_at_pause(good, ")"), 1: shown_at_pause(bad, "))")})
    s = summarize_repo(finals, [0.0, 0.5], judged, {"held_back_syntax": 7})
    at0, at5 = s["rows"]
    assert (at0["python_shown"], at0["broken"], at0["broken_share"]) == (2, 1, 0.5)
    assert (at5["python_shown"], at5["broken"], at5["broken_share"]) == (1, 0, 0.0)
    assert s["syntax"]["server_held_back_syntax"] == 7 and s["syntax"]["checked"] == 2


def test_the_check_on_the_true_rest_of_the_line():
    pytest.importorskip("tree_sitter_python")
    assert truth_held_back(BEFORE, AFTER, ", 1)") is False  # the right answer passes the check
    assert truth_held_back("def f(x):\n    ", AFTER, "return x)") is True  # the check holds it back
    assert truth_held_back(BEFORE, AFTER, "") is None
    held = repo_case(before="def f(x):\n    ", answer="return x)")
    s = summarize_repo([(held, Answer("repo"))], [0.0], judge_cases([(held, Answer("repo"))], {}))
    syn = s["syntax"]
    assert (syn["truth_held_back"], syn["checked"], syn["truth_held_back_share"]) == (1, 1, 1.0)


def test_the_replay_keeps_the_suggestion_answered_at_the_pause(tmp_path):
    """RepoReplay records the last request's first item (a fake client answers each keystroke)."""
    import argparse
    import asyncio

    from dlm.drivers.evaluation.eval_repo import RepoReplay
    from lsprotocol import types

    case = repo_case()

    class Client:
        async def text_document_inline_completion_async(self, params):
            p = params.position
            rng = types.Range(p, p)
            return types.InlineCompletionList([types.InlineCompletionItem(f"ans{p.character})", range=rng)])

    args = argparse.Namespace(seed=0, cps=1000.0, pause_ms=0, deadline_ms=250)
    replay = RepoReplay(args, [case.typing], tmp_path, {})
    text = case.typing.text

    def change(a, b, new):
        nonlocal text
        text = text[: _offset(text, *a)] + new + text[_offset(text, *b) :]

    replay.case_index = 0
    asyncio.run(replay._type(Client(), types, "file:///a.py", case.typing, change, lambda: text,
                             case.typing.final_target))
    shown = replay.shown[0]
    assert shown.text == case.before + case.after and shown.cursor == len(case.before)
    col = len(BEFORE) - BEFORE.rfind("\n") - 1
    assert shown.insert == f"ans{col})" and shown.replace_to == shown.cursor
    assert judge_case(case, shown).broken is False
