"""Edit examples (training.hunks, synthetic_edits, commit_edits): hunks and diffs, consistent synthetic edits, real next-edit records, no-ops."""

from __future__ import annotations

import ast
import collections
import contextlib
import io
import itertools
import random
import tokenize

import pytest
from dlm.coder_model.edit_history import render_event
from dlm.drivers.training import commit_edits as ce
from dlm.drivers.training import hunks as hk
from dlm.drivers.training import synthetic_edits as se

# A small program whose output must not change under the behaviour-preserving
# synthetic edits (rename, add/remove parameter, add field): running it before
# and after all hunks of an edit checks that the edit is consistent.
PROGRAM = '''\
import math


def scale_values(values, factor, unused_flag):
    total = 0
    for value in values:
        total += value * factor
    return total


def describe(shape_name, area_value):
    label = shape_name.upper()
    return label + ": " + str(round(area_value, 2))


class Circle:
    def __init__(self, radius):
        self.radius = radius
        self.kind = "circle"

    def area(self):
        return math.pi * self.radius * self.radius

    def report(self, digits):
        return describe(self.kind, round(self.area(), digits))


def main():
    circle = Circle(3)
    other = Circle(5)
    print(circle.report(3))
    print(other.report(2))
    print(scale_values([1, 2, 3], 7, None))
    print(scale_values([4, 5], 7, True))
    print(describe("square", 16.0))


main()
'''


def run_program(src: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(src, "<edit>", "exec"), {"__name__": "edited"})  # noqa: S102 - our own test program
    return out.getvalue()


def apply_all(text: str, hunks: list[hk.Hunk]) -> str:
    return "".join(hk.apply_hunks(hk.split_lines(text), hunks))


def plans(text: str, edit: str, n: int = 60):
    seen = []
    for seed in range(n):
        plan = se.synthetic_edit_plan(text, random.Random(seed), edit=edit)
        if plan is not None:
            seen.append(plan)
    return seen


# ---------------------------------------------------------------------------
# lines, hunks, diffs


def test_split_lines_is_git_lines():
    assert hk.split_lines("a\r\nb\x0cc\nlast") == ["a\r\n", "b\x0cc\n", "last"]
    assert hk.split_lines("") == []
    assert hk.split_lines("x\n") == ["x\n"]


def test_hunks_from_records_apply_like_the_readme():
    before = "a\nb\nc\nd\n"
    rec_hunks = [
        {"at": 0, "del": 0, "add": "top\n"},  # insert at the top
        {"at": 2, "del": 1, "add": "B\nB2\n"},  # replace line 2
        {"at": 4, "del": 1, "add": ""},  # delete line 4
    ]
    hunks = [hk.Hunk.from_record(h) for h in rec_hunks]
    assert apply_all(before, hunks) == "top\na\nB\nB2\nc\n"


def test_history_events_are_rendered_by_the_shared_renderer():
    # training writes every event with dlm.coder_model.edit_history, as the server does
    before = "".join(f"line{i}\n" for i in range(12))
    hunks = [hk.Hunk(2, 1, ("LINE2\n",)), hk.Hunk(8, 0, ("new8\n",)), hk.Hunk(10, 1, ("L10\n",))]
    ne = hk.build_next_edit(before, hunks, [0, 1, 2], 2, random.Random(0), "p.py", "real_edit")
    assert ne.example.prompt.history == (
        render_event("p.py", 2, ["line2\n"], ["LINE2\n"]),
        render_event("p.py", 8, [], ["new8\n"]),
    )
    assert ne.example.prompt.history[0] == "--- a/p.py\n+++ b/p.py\n@@ -3 +3 @@\n-line2\n+LINE2\n"
    # an event given with unchanged lines around it renders as the minimal hunk
    wide = hk.build_next_edit(before, [hk.Hunk(1, 3, ("line1\n", "X\n", "line3\n")), hunks[2]], [0, 1], 1,
                              random.Random(0), "p.py", "real_edit")
    assert wide.example.prompt.history == ("--- a/p.py\n+++ b/p.py\n@@ -3 +3 @@\n-line2\n+X\n",)


def test_next_edit_history_region_and_target_line_up():
    before = "".join(f"line{i}\n" for i in range(20))
    hunks = [hk.Hunk(2, 1, ("LINE2\n",)), hk.Hunk(8, 0, ("new8\n",)), hk.Hunk(15, 2, ("L15\n",))]
    for seed in range(20):
        ne = hk.build_next_edit(before, hunks, [0, 1, 2], 2, random.Random(seed), "f.py", "real_edit")
        assert ne is not None
        p = ne.example.prompt
        after_two = apply_all(before, hunks[:2])
        after_all = apply_all(before, hunks)
        assert p.prefix + p.region + p.suffix in after_two
        assert p.prefix + ne.example.target + p.suffix in after_all
        assert len(p.history) == 2
        # second event was made after the first inserted nothing before it: line 8 is still line 8
        assert "@@ -8,0 +9 @@\n+new8\n" in p.history[1]
        assert "LINE2" not in p.region and "new8" not in p.region
        # the previous hunk (line 8) is far from the region: the cursor is at the change
        assert p.region[: p.cursor].count("\n") == ne.hunk_line


def test_cursor_sits_after_the_previous_hunk_when_it_is_in_the_region():
    before = "".join(f"x{i} = {i}\n" for i in range(10))
    hunks = [hk.Hunk(4, 1, ("x4 = 40\n",)), hk.Hunk(5, 1, ("x5 = 50\n",))]
    opts = hk.EditOptions(max_context_lines=2)
    found = False
    for seed in range(30):
        ne = hk.build_next_edit(before, hunks, [0, 1], 1, random.Random(seed), "f.py", "real_edit", opts)
        p = ne.example.prompt
        if "x4 = 40\n" in p.region:
            found = True
            assert p.region[: p.cursor].endswith("x4 = 40")
    assert found


# ---------------------------------------------------------------------------
# synthetic edits


@pytest.mark.parametrize("edit", ["rename", "add_param", "remove_param", "add_field"])
def test_synthetic_edits_are_consistent(edit):
    expected = run_program(PROGRAM)
    got = plans(PROGRAM, edit)
    assert got, f"no {edit} edit found in the test program"
    for name, hunks, order in got:
        assert name == edit
        assert sorted(order) == list(range(len(hunks))) and len(hunks) >= 2
        after = apply_all(PROGRAM, hunks)
        assert after != PROGRAM
        # behaviour-preserving edits: the edited program still runs and prints the same
        assert run_program(after) == expected, f"{edit} changed behaviour:\n{after}"


def test_rename_replaces_every_use():
    for _, hunks, _ in plans(PROGRAM, "rename"):
        after = apply_all(PROGRAM, hunks)
        before_names = {n.id for n in ast.walk(ast.parse(PROGRAM)) if isinstance(n, ast.Name)}
        after_names = {n.id for n in ast.walk(ast.parse(after)) if isinstance(n, ast.Name)}
        assert len(before_names - after_names) <= 1  # the renamed name is gone everywhere
        assert "math" in after_names and "print" in after_names  # imports and builtins are kept


def _literals(src: str) -> collections.Counter:
    toks = tokenize.generate_tokens(io.StringIO(src).readline)
    return collections.Counter(t.string for t in toks if t.type in (tokenize.NUMBER, tokenize.STRING))


def test_literal_edit_changes_every_occurrence():
    got = plans(PROGRAM, "literal")
    assert got
    before = _literals(PROGRAM)
    for _, hunks, _ in got:
        after = _literals(apply_all(PROGRAM, hunks))
        gone = [lit for lit in before if lit not in after]
        # exactly one literal changed, at all its (>= 2) occurrences, to one new value
        assert len(gone) == 1 and before[gone[0]] >= 2
        new = [lit for lit in after if lit not in before]
        assert len(new) <= 1
        if new:
            assert after[new[0]] == before[gone[0]]


def test_synthetic_examples_apply_the_next_hunk_only():
    for seed in range(40):
        rng = random.Random(seed)
        plan = se.synthetic_edit_plan(PROGRAM, rng)
        if plan is None:
            continue
        _, hunks, order = plan
        k = rng.randint(1, len(hunks) - 1)
        ne = hk.build_next_edit(PROGRAM, hunks, order, k, rng, "prog.py", "synthetic_edit")
        if ne is None:
            continue
        ex = ne.example
        p = ex.prompt
        done = apply_all(PROGRAM, [hunks[i] for i in order[:k]])
        nxt = apply_all(PROGRAM, [hunks[i] for i in order[: k + 1]])
        assert p.prefix + p.region + p.suffix in done
        assert p.prefix + ex.target + p.suffix in nxt
        assert ex.target != p.region
        assert 1 <= len(p.history) <= k and all(h.startswith("--- a/prog.py\n+++ b/prog.py\n@@ -") for h in p.history)


def test_examples_are_deterministic_given_the_seed():
    def batch(seed):
        rng = random.Random(seed)
        return [se.synthetic_edit_example(PROGRAM, rng, "p.py") for _ in range(10)] + [
            se.noop_example(PROGRAM, rng, "p.py") for _ in range(5)
        ]

    assert batch(3) == batch(3)
    assert any(x is not None for x in batch(3))


def test_non_python_gets_no_synthetic_edit():
    assert se.synthetic_edit_example("function f(a) { return a; }\nf(1); f(2);\n", random.Random(0),
                                     "f.js", language="javascript") is None


def test_noop_examples_change_nothing():
    kinds = set()
    for seed in range(30):
        ex = se.noop_example(PROGRAM, random.Random(seed), "p.py")
        if ex is None:
            continue
        assert ex.kind == "noop" and ex.target == ex.prompt.region
        assert ex.prompt.region in PROGRAM or ex.prompt.history  # after a finished edit the text differs
        kinds.add(bool(ex.prompt.history))
    assert kinds == {True, False}  # both plain and after-a-finished-edit no-ops occur


def test_new_identifier_keeps_style_and_avoids_taken_names():
    rng = random.Random(0)
    for name in ["total_count", "parseHeader", "HttpClient", "_private_value", "MAX_SIZE", "x1"]:
        new = se.new_identifier(name, rng, {"total"})
        assert new is None or (new.isidentifier() and new != name and new != "total")


# ---------------------------------------------------------------------------
# examples decode back to the native layout


def test_every_example_decodes_back_to_valid_layout():
    from dlm.coder_model.layout import LayoutBudget, decode_context, encode_prompt, encode_target
    from dlm.coder_model.tokenizer import train_tokenizer

    tok = train_tokenizer(iter([PROGRAM] * 5), vocab_size=400)
    big = LayoutBudget(max_context=1 << 20, max_history=1 << 20, max_suffix=1 << 20)
    rng = random.Random(0)
    examples = [se.synthetic_edit_example(PROGRAM, rng, "p.py") for _ in range(30)]
    examples += [se.noop_example(PROGRAM, rng, "p.py") for _ in range(10)]
    try:  # real next-edit examples too, when the edit-histories data is there
        stream = ce.real_edit_examples("valid", rng, shuffle_buffer=8, repos=["pytest-dev/pluggy"])
        examples += list(itertools.islice(stream, 10))
    except FileNotFoundError:
        pass
    examples = [e for e in examples if e is not None]
    assert any(e.kind == "synthetic_edit" for e in examples) and any(e.kind == "noop" for e in examples)
    for ex in examples:
        p = ex.prompt
        seg = decode_context(tok, encode_prompt(tok, p, big))
        assert seg["prefix"] == p.prefix and seg["suffix"] == p.suffix
        assert seg["region_before_cursor"] == p.region[: p.cursor]
        assert seg["region_after_cursor"] == p.region[p.cursor :]
        assert seg.get("history", "") == "\x00".join(p.history)
        tgt = encode_target(tok, ex.target)
        assert tgt[-1] == tok.eom_id and tok.decode(tgt[:-1]) == ex.target


# ---------------------------------------------------------------------------
# real edits (edit-histories records)


def _data_or_skip():
    try:
        return ce.edit_histories_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_test_split_is_refused_for_training():
    with pytest.raises(ValueError, match="held out"):
        next(ce.iter_edit_records("test", "/nonexistent"))
    with pytest.raises(ValueError, match="for training"):
        next(ce.real_edit_examples("test", random.Random(0), data_dir="/nonexistent"))


def test_split_rule_matches_the_readme():
    # commit shas from the data README's rule: sha256(commit) % 100
    for commit in ["0" * 40, "f" * 40, "1f6589ec3a1e" + "0" * 28]:
        v = int(__import__("hashlib").sha256(commit.encode()).hexdigest(), 16) % 100
        assert ce.split_of_commit(commit) == ("train" if v < 90 else "valid" if v < 95 else "test")


def test_real_edit_examples_from_records():
    d = _data_or_skip()
    recs = [r for r in itertools.islice(ce.iter_edit_records("valid", d, repos=["pytest-dev/pluggy"]), 200)
            if len(r["hunks"]) >= 2]
    assert recs and all(r["split"] == "valid" for r in recs)
    built = 0
    for i, rec in enumerate(recs[:60]):
        rng = random.Random(i)
        hunks = ce.record_hunks(rec)
        k = rng.randint(1, len(hunks) - 1)
        ne = ce.real_edit_from_record(rec, rng, k=k)
        if ne is None:
            continue
        built += 1
        p = ne.example.prompt
        lines = hk.split_lines(rec["before"])
        assert p.prefix + p.region + p.suffix in "".join(hk.apply_hunks(lines, hunks[:k]))
        assert p.prefix + ne.example.target + p.suffix in "".join(hk.apply_hunks(lines, hunks[: k + 1]))
        assert len(p.history) <= k and p.path == rec["path"]
    assert built >= 10


def test_real_edit_stream_reads_only_its_split():
    d = _data_or_skip()
    repos = ["pytest-dev/pluggy", "more-itertools/more-itertools"]
    stream = ce.real_edit_examples("valid", random.Random(0), data_dir=d, shuffle_buffer=16, repos=repos)
    got = list(itertools.islice(stream, 40))
    assert len(got) == 40 and {e.kind for e in got} <= {"real_edit", "noop"}
    valid_commits = {r["commit"][:12] for r in ce.iter_edit_records("valid", d, repos=repos)}
    assert all(e.source.split("@")[1].split(":")[0] in valid_commits for e in got)
