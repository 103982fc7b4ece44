"""The edit memory (coder_model.edit_memory): patterns, sites, ranking, undo and caps."""

from __future__ import annotations

import subprocess
import time

import pytest
from dlm.coder_model.edit_memory import (
    BurstTracker,
    Edit,
    EditMemory,
    block_pattern,
    extract,
    find_sites,
    line_pattern,
    mine,
    rank,
)
from dlm.coder_model.regions import split_lines
from dlm.lsp.documents import Change  # what the server reports (lsp imports no torch)


def apply(line: str, site) -> str:
    return line[: site.start] + site.new_text + line[site.end :]


def pattern_of(before: list[str], after: list[str]):
    """The pattern of the one edit `before` -> `after`."""
    (x,) = extract(before, after)
    return x.pattern


def applied(p, lines: list[str]) -> list[tuple[int, str]]:
    """(line, the line with the edit made) of each site of `p` in `lines`, in find_sites' order."""
    return [(s.line, apply(lines[s.line].rstrip("\n"), s)) for s in find_sites(p, lines, 0)]


def test_a_rename_is_a_rename_and_applies_to_whole_names_and_name_parts():
    p = pattern_of(["total = count_items(rows)\n"], ["total = count_rows(rows)\n"])
    assert (p.kind, p.old, p.new) == ("rename", "count_items", "count_rows")
    lines = ["n = count_items(a) + count_items_fast(b)\n", "count_itemsx = 1\n", "discount_items = 2\n"]
    assert [text for _, text in applied(p, lines)] == [
        "n = count_rows(a) + count_items_fast(b)",
        "n = count_items(a) + count_rows_fast(b)",  # the renamed name as a part of a longer one
    ]  # count_itemsx and discount_items are other names


def test_an_affix_rename_renames_whole_names_only_never_a_use_already_renamed():
    p = pattern_of(["        self.cookies = cookies\n"], ["        self._cookies = cookies\n"])
    assert (p.kind, p.old, p.new) == ("rename", "cookies", "_cookies")
    lines = ["        return self._cookies\n", "    def prepare_cookies(self, jar):\n", "        c = self.cookies\n"]
    assert [text for _, text in applied(p, lines)] == ["        c = self._cookies"]


def test_an_inserted_argument_goes_to_every_call_that_lacks_it_whatever_its_arguments():
    p = pattern_of(["r = fetch(url)\n"], ["r = fetch(url, timeout=5)\n"])
    assert p.kind == "append_arg" and p.before == ("fetch",) and p.text == ", timeout=5"
    lines = ["a = fetch(other, retries=2)\n", "b = fetch()\n", "c = fetch(u, timeout=5)\n",
             "def fetch(url):\n", "d = prefetch(u)\n"]
    assert dict(applied(p, lines)) == {0: "a = fetch(other, retries=2, timeout=5)", 1: "b = fetch(timeout=5)"}


def test_an_added_decorator_goes_to_the_sibling_defs_most_alike_first():
    (x,) = extract(["def test_parse_int():\n"], ["@pytest.mark.slow\n", "def test_parse_int():\n"])
    p = x.pattern
    assert p.kind == "insert_line" and p.text == "@pytest.mark.slow" and x.name == "test_parse_int"
    lines = split_lines("@pytest.mark.slow\ndef test_parse_int():\n    pass\n\n"
                        "def helper():\n    pass\n\n"
                        "    def test_parse_float():\n        pass\n\n"
                        "@pytest.mark.slow\ndef test_parse_str():\n    pass\n")
    sites = find_sites(p, lines, 1)
    assert sorted(s.line for s in sites) == [4, 7]  # test_parse_str already has it
    best = rank(sites, x.context, 1, x.name)[0][1]
    assert best.line == 7 and best.new_text == "    @pytest.mark.slow\n"  # at the def's indentation


@pytest.mark.parametrize("old,new,site_line,want", [
    ("t = connect(host, 10)", "t = connect(host, 30)", "u = connect(host, 10)", "u = connect(host, 30)"),
    ("    return d.keys()", "    return list(d.keys())", "x = d.keys()", "x = list(d.keys())"),
    ("def run(x):", "async def run(x):", "def run(y):", "async def run(y):"),
])
def test_changed_literals_wrapped_calls_and_keywords_replay_with_context(old, new, site_line, want):
    p = line_pattern(old, new)
    assert p is not None and p.kind == "replace"
    (s,) = find_sites(p, [site_line], 0)
    assert apply(site_line, s) == want


def test_a_changed_literal_alone_does_not_match_every_equal_literal():
    p = line_pattern("retries = 3", "retries = 5")
    assert find_sites(p, ["x = 3\n", "size = 3\n"], 0) == []


def test_sites_rank_by_context_then_distance():
    (x,) = extract(["value = parse(raw, strict)\n"], ["value = decode(raw, strict)\n"])
    lines = ["a = parse(text)\n"] * 3 + ["value = parse(raw, strict)\n"] + ["b = parse(text)\n"] * 40
    ranked = rank(find_sites(x.pattern, lines, 0), x.context, 0)
    assert ranked[0][1].line == 3  # same context wins over nearer lines
    assert [s.line for _, s in ranked[1:4]] == [0, 1, 2]  # then the nearest


class Doc:
    """A minimal document: changes as lsp.documents reports them."""

    def __init__(self, text: str) -> None:
        self.lines = split_lines(text)
        self.tracker = BurstTracker(max_lines=20)
        self.t = 0.0

    def edit(self, row: int, c1: int, c2: int, text: str, dt: float = 0.1) -> list[Edit]:
        self.t += dt
        old = self.lines[row]
        self.lines[row] = old[:c1] + text + old[c2:]
        ch = Change(row, c1, row, row, old[c1:c2], text, (old,), self.t)
        return self.tracker.after_change(ch, self.lines)

    def paste(self, row: int, text: str) -> list[Edit]:
        self.t += 0.1
        old = self.lines[row]
        new = split_lines(text + old)
        self.lines[row : row + 1] = new
        return self.tracker.after_change(Change(row, 0, row, row + len(new) - 1, "", text, (old,), self.t), self.lines)


TEXT = "def f(rows):\n    n = count(rows)\n    m = count(rows) + 1\n    return count(n)\n"


def test_a_rename_typed_key_by_key_becomes_one_pattern_and_proposes_the_other_uses():
    doc, mem = Doc(TEXT), EditMemory()
    for k, ch in enumerate("tally"):  # select "count" on line 1 and type over it
        doc.edit(1, 8, 8 + (5 if k == 0 else k), "tally"[: k + 1])
    assert doc.lines[1] == "    n = tally(rows)\n"
    pending = mem.entries_of("f.py", doc.tracker.peek(doc.lines), doc.lines)
    props = mem.propose("f.py", doc.lines, 1, now=doc.t, pending=pending)
    # the uses on lines 2 and 3 are one block of neighbouring lines: one proposal of both
    (p,) = props
    assert [(s.line, s.old_text, s.new_text) for s in p.sites] == [(2, "count", "tally"), (3, "count", "tally")]
    assert 0 < props[0].support < 1


def test_an_undo_makes_the_memory_forget_the_pattern():
    doc, mem = Doc(TEXT), EditMemory()
    doc.edit(1, 8, 13, "tally")
    for e in doc.edit(3, 0, 0, "", dt=5.0):  # a pause and an edit elsewhere close the rename
        mem.observe("f.py", e, doc.lines)
    assert [e.pattern.label() for e in mem.patterns()] == ["rename count → tally"]
    assert mem.propose("f.py", doc.lines, 1, now=doc.t)
    for e in doc.edit(1, 8, 13, "count", dt=5.0):  # undo: the text goes back
        mem.observe("f.py", e, doc.lines)
    for e in doc.edit(3, 0, 0, "", dt=5.0):
        mem.observe("f.py", e, doc.lines)
    assert mem.patterns() == [] and mem.forgotten == 1
    assert mem.propose("f.py", doc.lines, 1, now=doc.t) == []


def test_a_ten_thousand_line_paste_is_not_a_pattern_and_copies_nothing():
    doc, mem = Doc(TEXT), EditMemory()
    t0 = time.perf_counter()
    doc.paste(1, "x = count(rows)\n" * 10_000)
    assert doc.tracker.open is not None and doc.tracker.open.old_lines is None  # marked big, nothing kept
    doc.edit(5, 0, 0, "y", dt=0.1)  # more typing inside the paste: still big
    assert doc.tracker.peek(doc.lines) is None
    for e in doc.edit(10_003, 0, 0, "", dt=5.0):
        mem.observe("f.py", e, doc.lines)
    assert mem.patterns() == []
    # an edit of many lines handed over directly is refused too
    assert extract(["a = 1\n"] * 10_000, ["a = 2\n"] * 10_000) == []
    assert time.perf_counter() - t0 < 30  # not a timing claim: only that it ends


def test_a_pattern_with_5000_sites_is_capped_and_ranked_nearest_first():
    lines = ["v = compute(x)\n"] * 5000
    p = line_pattern("v = compute(x)", "v = compute_fast(x)")
    sites = find_sites(p, lines, 2500, max_scan=300)
    assert len(sites) == 300
    assert max(abs(s.line - 2500) for s in sites) <= 150  # the cap keeps the nearest
    mem = EditMemory()
    (e,) = mem.entries_of("f.py", Edit(0, ("v = compute(x)\n",), ("v = compute_fast(x)\n",), 0.0), lines)
    props = mem.propose("f.py", lines, 2500, now=0.0, pending=[e], max_scan=300, limit=8)
    # only sites the cap kept, best first (the calibrated confidence, then the nearest the cursor)
    assert len(props) == 8 and all(abs(pr.site.line - 2500) <= 150 for pr in props)
    order = [(-pr.support, abs(pr.site.line - 2500)) for pr in props]
    assert order == sorted(order) and abs(props[0].site.line - 2500) <= 8


def test_a_rename_to_a_name_that_exists_is_flagged_and_never_names_a_parameter_twice():
    text = ("def area(width, height):\n    size = width * height\n    return size\n\n"
            "def volume(width, depth):\n    size = width * depth\n    return size\n")
    doc, mem = Doc(text), EditMemory()
    # `width` becomes `height` on line 1: `height` exists already, so this is not a blind rename
    doc.edit(1, 11, 16, "height")
    pending = mem.entries_of("f.py", doc.tracker.peek(doc.lines), doc.lines)
    assert pending[0].ambiguous
    props = mem.propose("f.py", doc.lines, 1, now=doc.t, pending=pending)
    # `def area(height, height)` would be a SyntaxError: never proposed
    assert props and all(s.line != 0 for p in props for s in p.sites)
    # the other function's `width` may be another variable: the trees are told (`ambiguous`), and a
    # proposal there renames that token only
    assert all(p.ambiguous for p in props)
    assert all((s.old_text, s.new_text) == ("width", "height") and doc.lines[s.line][s.start : s.end] == "width"
               for p in props for s in p.sites)
    # the same rename to a fresh name proposes them
    doc2, mem2 = Doc(text), EditMemory()
    doc2.edit(1, 11, 16, "span")
    pending2 = mem2.entries_of("f.py", doc2.tracker.peek(doc2.lines), doc2.lines)
    assert not pending2[0].ambiguous
    props2 = mem2.propose("f.py", doc2.lines, 1, now=doc2.t, pending=pending2)
    assert {s.line for p in props2 for s in p.sites} >= {0, 4, 5}


def test_git_history_up_to_head_gives_support(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})

    git("init", "-q")
    f = tmp_path / "m.py"
    f.write_text("a = load(p)\nb = 1\nc = load(q)\n")
    git("add", "m.py")
    git("commit", "-qm", "one")
    f.write_text("a = load(p, cache=True)\nb = 1\nc = load(q, cache=True)\n")
    git("commit", "-qam", "two")
    stats = mine(str(tmp_path), 10, 1_000_000)
    assert stats is not None and stats.commits == 2
    assert stats.kinds["append_arg"] == [1, 1]  # one pattern, repeated within its commit
    mem = EditMemory()
    before = mem.prior("append_arg")
    mem.learn_git(stats)
    assert mem.prior("append_arg") > before
    assert mine(str(tmp_path / "nowhere"), 10, 1_000_000) is None


def test_uses_the_pattern_renamed_itself_do_not_make_the_rename_ambiguous():
    doc, mem = Doc(TEXT), EditMemory()
    doc.edit(1, 8, 13, "tally")
    pending = mem.entries_of("f.py", doc.tracker.peek(doc.lines), doc.lines)
    (first,) = [s for p in mem.propose("f.py", doc.lines, 1, now=doc.t, pending=pending) for s in p.sites
                if s.line == 2]
    line = doc.lines[2]
    closed = doc.edit(2, first.start, first.end, "tally", dt=3.0)  # the proposal accepted (line 2 of it)
    assert line != doc.lines[2] and len(closed) == 1
    (e,) = mem.observe("f.py", closed[0], doc.lines, skip=(2, 3))
    assert not e.ambiguous
    assert [p.site.line for p in mem.propose("f.py", doc.lines, 2, now=doc.t)] == [3]


def test_a_deleted_span_takes_its_whitespace_with_it():
    (x,) = extract(["    with Live(table, console=c) as live:\n"], ["    with Live(table, console=c):\n"])
    lines = ["    with Live(t, console=c) as live:\n"]
    (s,) = find_sites(x.pattern, lines, 0)
    assert apply(lines[0].rstrip("\n"), s) == "    with Live(t, console=c):"  # not `...c) :`
    (y,) = extract(["def put(url, *, data=None, **kwargs):\n"], ["def put(url, **kwargs):\n"])
    lines = ["def patch(url, *, data=None, **kwargs):\n"]
    (s,) = find_sites(y.pattern, lines, 0)
    assert apply(lines[0].rstrip("\n"), s) == "def patch(url, **kwargs):"


def _prop(kind, applied, offset, between=0, age=0, **fields):
    """A proposal's fields as the calibration reads them (memory.Proposal has them all)."""
    from types import SimpleNamespace

    pattern = SimpleNamespace(kind=kind, old="count", new="total", before=("count",), where=fields.pop("where", ""))
    return SimpleNamespace(pattern=pattern, applied=applied, age=age, offset=offset, between=between,
                           cursor_distance=abs(offset), **fields)


def test_the_shipped_calibration_ranks_what_the_train_split_says_is_usually_right():

    from dlm.coder_model.edit_memory.edit_calibration import KINDS, load
    from dlm.coder_model.edit_memory.patterns import BLOCK_KINDS

    cal = load()
    assert cal is not None and cal.meta["split"] == "train"
    prop = _prop
    # a rename applied three times against a lone one, near against far, the nearest site of the
    # pattern against one with two of its sites in between, a lone rename against an argument
    # appended once an edit ago
    assert cal(prop("rename", 3, 4)) > cal(prop("rename", 1, 4)) > cal(prop("rename", 1, 200))
    assert cal(prop("rename", 1, 4)) > cal(prop("rename", 1, 4, between=2))
    assert cal(prop("rename", 1, 4)) > cal(prop("append_arg", 1, 4, age=1))
    assert cal(prop("rename", 1, -4)) == cal(prop("rename", 1, 4))  # no side of the edit (calibration.features)
    # a rename's site inside a longer name (count_rows for count) is its own kind, and less often
    # right than a whole name in the same place (real proposals of the memory, one document each)
    def next_use(use: str):
        lines = ["def f(rows):\n", "    n = tally(rows)\n", f"    m = {use}(rows)\n", "    return n + m\n"]
        mem = EditMemory()
        mem.observe("f.py", Edit(1, ("    n = count(rows)\n",), ("    n = tally(rows)\n",), 0.0), lines)
        (p,) = mem.propose("f.py", lines, 1, now=1.0, limit=8)
        return p

    part, whole = next_use("count_rows"), next_use("count")
    assert part.site.part and not whole.site.part
    assert cal(part) < 0.75 * cal(whole)
    assert all(0.0 <= cal(prop(k, n, o)) <= 1.0 for k in ("rename", "replace", "append_arg", "insert_line")
               for n in (1, 5) for o in (-200, 1, 200))
    # every block kind has its own feature, and a block made three times at the next site is more
    # likely than one made once
    assert BLOCK_KINDS <= set(KINDS)
    assert cal(prop("lines", 3, 2)) > cal(prop("lines", 1, 2))


def test_a_rename_of_an_attribute_is_not_carried_to_the_bare_name_in_its_file():
    # self.data -> self._enc_data: the local `data` beside it is another thing; another file's
    # `req.data` and a def of the name are uses of the same thing
    before = ["class R:\n", "    def prepare(self, data):\n", "        self.data = encode(data)\n",
              "        send(self.data, data)\n", "\n", "    def data(self):\n", "        return 1\n"]
    lines = list(before)
    lines[2] = "        self._enc_data = encode(data)\n"
    mem = EditMemory()
    (entry,) = mem.observe("r.py", Edit(2, (before[2],), (lines[2],), 0.0), lines)
    assert entry.pattern.kind == "rename" and entry.pattern.where == "attr"
    sites = {(s.line, s.start) for p in mem.propose("r.py", lines, 2, now=1.0, limit=8) for s in p.sites}
    assert sites == {(3, 18), (5, 8)}  # `self.data` and `def data`, not the parameter nor `data)`
    other = ["def go(req, data):\n", "    return req.data + data\n"]
    (p,) = mem.propose("o.py", other, 0, now=1.0, limit=8)
    assert [(s.line, s.start) for s in p.sites] == [(0, 12), (1, 15), (1, 22)]  # another file: any use
    # a bare rename (a local) is not carried to an attribute of that name in its file
    (bare,) = extract(["    n = count(rows)\n"], ["    n = tally(rows)\n"])
    assert bare.pattern.where == "name"
    assert [s.start for s in find_sites(bare.pattern, ["    k = self.count + count(rows)\n"], 0)] == [21]


def test_boosted_trees_learn_a_rule_and_read_back_what_they_wrote():
    import random

    from dlm.coder_model.edit_memory import boosting
    from dlm.coder_model.edit_memory.edit_calibration import Calibration

    rng = random.Random(0)
    rows = [[rng.random(), rng.random()] for _ in range(2000)]
    # right when x0 > 0.6 (90% of the time) and x1 does nothing
    labels = [float((x[0] > 0.6) == (rng.random() < 0.9)) for x in rows]
    trees = boosting.fit(rows, labels, trees=30, depth=2, min_leaf=20)
    assert trees([0.9, 0.1]) > 0.8 and trees([0.2, 0.1]) < 0.2
    assert abs(trees([0.9, 0.1]) - trees([0.9, 0.9])) < 0.1
    back = boosting.Trees.from_json(trees.to_json())
    assert abs(back([0.7, 0.5]) - trees([0.7, 0.5])) < 1e-5
    with pytest.raises(ValueError, match="neither"):
        boosting.Trees.from_json({"base": 0.0, "trees": [[[0, 0.5, 1, 7], [0.1], [0.2]]]})
    # a calibration file of another format is refused with what to run
    with pytest.raises(ValueError, match="re-fit it"):
        Calibration.from_json({"format": 1, "levels": []})


def test_a_site_in_a_file_without_the_cursor_is_calibrated_without_its_distance():

    from dlm.coder_model.edit_memory.edit_calibration import load, place

    cal = load()

    def prop(offset, cursor_here=True):
        return _prop("rename", 1, offset, cursor_here=cursor_here)

    near, far = cal(prop(2)), cal(prop(400))
    assert near > far
    # another file (a pattern of this document, a site there): the same confidence wherever its
    # site lies, from the trees fitted on the jump replay (calibration.place)
    elsewhere = {cal(_prop("rename", 1, o, cursor_here=False, same_file=False)) for o in (2, 40, 400)}
    assert len(elsewhere) == 1 and 0.0 < elsewhere.pop() < 1.0
    assert place(_prop("rename", 1, 40, cursor_here=False, same_file=False)) == "elsewhere"
    # in the cursor's document, a site of another document's pattern is a next edit like the others
    assert place(_prop("rename", 1, 5, same_file=False)) == place(prop(5)) == "here"


def test_the_shipped_elsewhere_trees_let_a_rename_made_twice_jump_at_the_default_gate():
    # one set of trees for both places sees 111 proposals of another document and gives this
    # jump 0.14-0.20, under the gate: the `elsewhere` trees are fitted on the jump replay's own
    from dlm.coder_model.edit_memory.edit_calibration import load, place
    from dlm.lsp.next_edits import JUMP_MIN_APPLIED
    from dlm.lsp.options import NextEditOptions

    stats = ["def total(rows):\n", "    n = count(rows)\n", "    return n\n", "\n", "\n", "def mean(rows):\n",
             "    return sum(rows) / count(rows)\n"]
    report = ["from .stats import count\n", "\n", "\n", "print(count([1, 2]))\n"]

    def jump_after(renames: int):
        mem, lines = EditMemory(), list(stats)
        for k, row in enumerate((1, 6)[:renames]):
            old = lines[row]
            lines[row] = old.replace("count", "tally")
            mem.observe("stats.py", Edit(row, (old,), (lines[row],), 2.0 * k), lines)
        (p,) = mem.propose("report.py", report, 0, now=5.0, limit=1, cursor_here=False)
        return p

    twice = jump_after(2)
    assert place(twice) == "elsewhere" and load().meta["elsewhere"]["proposals"] > 10_000
    assert twice.applied == 2 and report[twice.site.line][twice.site.start :].startswith("count")
    assert twice.support >= NextEditOptions().min_confidence
    assert jump_after(1).applied < JUMP_MIN_APPLIED  # made once: no jump, whatever its confidence


def test_calibration_is_never_fitted_on_valid_or_test(tmp_path):
    from dlm.drivers.evaluation.edit_memory_tuning import main

    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path), "--split", "valid", "--fit-calibration", str(tmp_path / "t.json")])
    assert not (tmp_path / "t.json").exists()


def test_cross_validation_judges_each_fold_by_a_model_fitted_on_the_others(tmp_path, capsys):
    import gzip
    import json

    from dlm.drivers.evaluation.edit_memory_tuning import cross_validate, main

    # commits that each rename `count` on one line and then on the next use: the second hunk is the
    # proposal's, byte for byte; and the import in a second file of the commit (one hunk: no
    # opportunity of its own), where the rename made twice is a jump, and an exact one; the files
    # of earlier commits, which this one leaves alone, are asked too: a jump there is wrong
    body = "".join(f"def f{i}(rows):\n    n = count(rows)\n    m = count(rows)\n    return n + m\n\n" for i in range(3))
    with gzip.open(tmp_path / "o__r.jsonl.gz", "wt") as f:
        for c in range(40):
            split = "train" if c < 36 else "valid"
            rec = {"repo": "o/r", "commit": f"{c:040x}", "path": f"m{c}.py", "split": split, "date": f"2024-{c:04d}",
                   "before": body, "hunks": [{"at": 2, "del": 1, "add": "    n = tally(rows)\n"},
                                             {"at": 3, "del": 1, "add": "    m = tally(rows)\n"}]}
            f.write(json.dumps(rec) + "\n")
            f.write(json.dumps({**rec, "path": f"x{c}.py", "before": f"from m{c} import count\n",
                                "hunks": [{"at": 1, "del": 1, "add": f"from m{c} import tally\n"}]}) + "\n")
    out = cross_validate(tmp_path, None, folds=3)
    opportunities, shown, exact, location, _ = out[0.0]
    assert opportunities == 36  # the train records only, one opportunity each
    assert shown == 36 and exact == location == 36  # the nearest use is the next hunk, every time
    printed = capsys.readouterr().out
    assert "3 folds by commit: 36 opportunities" in printed
    # each file is asked about the other and the 4 nearest untouched files (commit 0 has none, commit
    # 1 two): 2 + 2 * 3 + 34 * 2 * 5 pairs. m -> x is an exact jump (made twice in m), m -> an earlier
    # m or x a wrong one, x -> anything none (made once in x): 1 + 3 + 34 * 5 jumps, 36 exact
    assert "jumps, the same folds: 348 (file edited, other file: of its commit, or one of the 4 nearest it did " \
           "not change) pairs" in printed
    assert "  0.000 | 174 (50.0%) | 20.7 | 20.7" in printed
    # the elsewhere trees, fitted on the other folds, tell the import to come from the files left
    # alone (min_leaf 40 on 200-odd proposals a fold: not perfectly)
    jump_rows = printed.split("jumps, the same folds")[1]
    at_half = next(line for line in jump_rows.splitlines() if line.startswith("  0.500 |"))
    assert float(at_half.split("|")[2]) >= 80.0
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path), "--split", "valid", "--cross-validate", "3"])


def test_the_jump_replay_asks_the_other_files_of_a_commit_and_judges_against_their_hunks(tmp_path, capsys):
    import gzip
    import json

    from dlm.drivers.evaluation.edit_memory_tuning import jumps, main

    # one commit renames `count` twice in a.py (a jump needs an edit made twice), and in b.py: b.py's
    # first use is a jump, and exactly one of b.py's hunks; c.py has no use; d.py's use the commit keeps
    a = "def f(rows):\n    n = count(rows)\n    m = count(rows)\n    return n + m\n"
    recs = [("a.py", a, [{"at": 2, "del": 1, "add": "    n = tally(rows)\n"},
                         {"at": 3, "del": 1, "add": "    m = tally(rows)\n"}]),
            ("b.py", "from a import count\n\nprint(count([1]))\n", [{"at": 1, "del": 1, "add": "from a import tally\n"},
                                                                   {"at": 3, "del": 1, "add": "print(tally([1]))\n"}]),
            ("c.py", "x = 1\n", [{"at": 1, "del": 1, "add": "x = 2\n"}]),
            ("d.py", "y = count\n\n\nz = 1\n", [{"at": 4, "del": 1, "add": "z = 2\n"}])]
    with gzip.open(tmp_path / "o__r.jsonl.gz", "wt") as f:
        for path, before, hunks in recs:
            f.write(json.dumps({"repo": "o/r", "commit": "ab" * 20, "path": path, "split": "valid",
                                "before": before, "hunks": hunks}) + "\n")
    pairs, made, exact, location = jumps(tmp_path, "valid", None)[0.0]
    assert pairs == 12  # 4 files, each asked about the 3 others
    # a.py's and b.py's renames were made twice: a.py -> b.py (its import line: its first hunk) and b.py
    # -> a.py (both uses, neighbours: one proposal, the two one-line hunks) are exact; each -> d.py is not
    assert (made, exact, location) == (4, 2, 2)
    # (no file of the repository is left out of the commit: no untouched file to ask)
    assert "12 (file edited, other file: of its commit, or one of the 4 nearest it did not change) pairs" \
        in capsys.readouterr().out
    main(["--data", str(tmp_path), "--split", "valid", "--jumps"])
    assert "| 4 (33.3%) | 50.0 | 50.0" in capsys.readouterr().out


def test_a_rename_to_a_name_that_exists_made_twice_is_a_systematic_one():
    text = ("def area(width, height):\n    size = width * height\n    return size\n\n"
            "def volume(width, depth):\n    size = width * depth\n    q = width\n    return size\n")
    doc, mem = Doc(text), EditMemory()
    doc.edit(1, 11, 16, "height")  # `height` exists: ambiguous, only like uses in area()
    (closed,) = doc.edit(5, 11, 16, "height", dt=3.0)  # ...and the user makes it again in volume()
    mem.observe("f.py", closed, doc.lines, skip=(5, 6))
    pending = mem.entries_of("f.py", doc.tracker.peek(doc.lines), doc.lines)
    props = mem.propose("f.py", doc.lines, 5, now=doc.t, pending=pending)
    assert 6 in {s.line for p in props for s in p.sites}  # now proposed outside area() too


# ---- whole-line blocks (patterns.block_pattern): edit shapes taken from the edit-histories train split ----


def apply_block(lines: list[str], site) -> list[str]:
    """The document's lines after a block site's edit (its span: lines site.line .. site.end_line)."""
    assert site.end_line >= site.line and site.start == site.end == 0
    return lines[: site.line] + split_lines(site.new_text)[:-1] + lines[site.end_line :]


def test_a_signature_split_over_lines_is_replayed_at_the_same_signature_at_its_own_indentation():
    # rich 65fc2f9d: `def __console__(...)` became `def __rich_console__(` over three lines, class after class
    old = ["    def __console__(self, console: Console, options: ConsoleOptions) -> RenderResult:\n"]
    new = ["    def __rich_console__(\n", "        self, console: Console, options: ConsoleOptions\n",
           "    ) -> RenderResult:\n"]
    doc = split_lines("class Panel:\n" + "".join(new) + "        yield self.text\n\n\n"
                      "class Padding:\n    class Inner:\n        def __console__(self, console: Console, "
                      "options: ConsoleOptions) -> RenderResult:\n            yield self.inner\n\n"
                      "    def __console__(self, console: Console, options: ConsoleOptions):\n        pass\n")
    mem = EditMemory()
    e, adapted = mem.observe("rich/panel.py", Edit(1, tuple(old), tuple(new), 0.0), doc)
    assert e.pattern.kind == "lines" and e.pattern.label() == "change to def __rich_console__( (+2 lines)"
    assert adapted.pattern.kind == "adapted"  # it has no site here: no look-alike signature
    (p,) = mem.propose("rich/panel.py", doc, 3, now=1.0)
    s = p.site
    assert (s.line, s.end_line) == (9, 10) and p.sites == (s,)  # the other signature (no return type) is no site
    assert apply_block(doc, s)[9:12] == ["        def __rich_console__(\n",
                                         "            self, console: Console, options: ConsoleOptions\n",
                                         "        ) -> RenderResult:\n"]  # one level deeper, as the site is
    assert "".join(doc[9:10]) == s.old_text


def test_a_deleted_guard_is_proposed_where_the_same_guard_is_and_nowhere_else():
    # aiohttp b7a9f4b2: the same two-line guard deleted from one method after another
    guard = ["        if self._closed:\n", "            raise RuntimeError('websocket connection is closed')\n"]
    doc = split_lines("class WS:\n    def send_str(self, data):\n        self._writer.send(data)\n\n"
                      "    def send_bytes(self, data):\n" + "".join(guard) + "        self._writer.send(data)\n\n"
                      "    def ping(self):\n        if self._closed:\n            raise RuntimeError('closed')\n"
                      "        self._writer.ping()\n")
    mem = EditMemory()
    (e,) = mem.observe("aiohttp/ws.py", Edit(2, tuple(guard), (), 0.0), doc)
    assert e.pattern.kind == "delete_lines"
    props = mem.propose("aiohttp/ws.py", doc, 2, now=1.0)
    assert [(p.site.line, p.site.end_line) for p in props] == [(5, 7)]  # ping's guard raises another message
    after = apply_block(doc, props[0].site)
    assert after[4:6] == ["    def send_bytes(self, data):\n", "        self._writer.send(data)\n"]
    assert props[0].site.new_text == "" and props[0].site.old_text == "".join(guard)


def test_an_inserted_keyword_argument_line_goes_between_the_same_two_lines_where_it_is_missing():
    # rich 2f752afa: `_environ={},` added to one Console(...) call of a test after another
    call = ["    console = Console(\n", "        file=io.StringIO(),\n", "        color_system=\"truecolor\",\n"]
    doc = split_lines("def test_a():\n" + "".join(call) + "        _environ={},\n    )\n\n"
                      "def test_b():\n" + "".join(call) + "    )\n\n"
                      "def test_c():\n" + "".join(call) + "        _environ={},\n    )\n\n"
                      "def test_d():\n    console = Console(\n        file=io.StringIO(),\n    )\n")
    mem = EditMemory()
    (e,) = mem.observe("tests/test_console.py", Edit(4, (), ("        _environ={},\n",), 0.0), doc)
    p = e.pattern
    assert p.kind == "insert_lines" and p.before == ('color_system="truecolor",', ")") and p.indents == (0,)
    props = mem.propose("tests/test_console.py", doc, 4, now=1.0)
    # test_b lacks it; test_c has it already, test_d's call has other lines
    assert [(x.site.line, x.site.end_line) for x in props] == [(11, 11)]
    assert apply_block(doc, props[0].site)[10:13] == ["        color_system=\"truecolor\",\n",
                                                      "        _environ={},\n", "    )\n"]


@pytest.mark.parametrize("old,new,above,below", [
    ([], ["    log.debug('x')\n"], "\n", "    return x\n"),  # below a blank line: it would go everywhere
    (["        pass\n"], [], "    def f(self):\n", "\n"),  # a deleted block without a name
    (["\n"], ["    x = 1\n"], "def f():\n", "    return x\n"),  # a blank line changed: every blank line
    (["    if x:\n", "        y()\n"], ["    if x: y()\n"], "def f(x):\n", "\n"),  # line breaks only: a reformat
    (["    a = 1\n"] * 13, ["    a = 2\n"] * 13, "def f():\n", "\n"),  # over MAX_BLOCK_LINES
])
def test_blocks_that_say_nothing_or_are_reformats_are_not_patterns(old, new, above, below):
    assert block_pattern(old, new, above, below) is None


def test_a_changed_line_without_a_name_is_a_block_for_the_trees_to_judge():
    # rich 89066d9d: `):` closing one signature became `) -> None:`, then the next one's did
    doc = split_lines("def a(\n    x,\n) -> None:\n    pass\n\ndef b(\n    y,\n):\n    pass\n\n"
                      "f(\n    z,\n)\n")
    mem = EditMemory()
    (e,) = mem.observe("rich/__init__.py", Edit(2, ("):\n",), (") -> None:\n",), 0.0), doc)
    assert e.pattern.kind == "lines" and e.pattern.before == ("):",)
    props = mem.propose("rich/__init__.py", doc, 2, now=1.0)
    assert [(p.site.line, p.site.new_text) for p in props] == [(7, ") -> None:\n")]  # not the call's `)`
    assert 0.0 < props[0].support < 1.0


def test_a_rename_has_no_block_and_an_edit_the_token_patterns_name_keeps_its_block_apart():
    doc = split_lines("x = load(path)\ny = load(path)\n")
    mem = EditMemory()
    assert [e.pattern.kind for e in mem.observe("a.py", Edit(0, ("x = fetch(path)\n",), ("x = load(path)\n",), 0.0),
                                                doc)] == ["rename"]
    kinds = [e.pattern.kind for e in mem.observe("a.py", Edit(0, ("x = load(path)\n",),
                                                              ("x = load(path, strict=True)\n",), 5.0), doc)]
    assert kinds == ["append_arg", "same_lines", "adapted"]  # adapted: the same change at `y = load(path)`
    # a one-line deletion: its undo marker (delete_line) names nothing, the block is a deletion
    kinds = [e.pattern.kind for e in mem.observe("a.py", Edit(1, ("y = load(path)\n",), (), 9.0), doc[:1])]
    assert kinds == ["delete_lines"]


def test_an_adapted_block_carries_the_change_to_a_line_that_differs_in_a_name_or_two():
    # aiohttp's tests: `def test_x(self):` -> `def test_x(self) -> None:`, then the next test's
    doc = split_lines("class T:\n    def test_a(self):\n        pass\n\n    def test_b(self):\n        pass\n\n"
                      "    def test_c(self, loop):\n        pass\n\n    async def test_d(self):\n        pass\n")
    doc[1] = "    def test_a(self) -> None:\n"
    mem = EditMemory(calibration=None)
    kinds = [e.pattern.kind for e in mem.observe("t.py", Edit(1, ("    def test_a(self):\n",), (doc[1],), 0.0), doc)]
    assert kinds == ["lines", "adapted"]
    props = [p for p in mem.propose("t.py", doc, 1, now=1.0, limit=10) if p.pattern.kind == "adapted"]
    # test_b only: test_c has another parameter (another shape), test_d is async, test_a is the edit itself
    assert [(p.site.line, p.site.end_line, p.site.new_text, p.site.holes) for p in props] == \
        [(4, 5, "    def test_b(self) -> None:\n", 1)]
    assert props[0].site.old_text == "    def test_b(self):\n"
    # a look-alike in another document is no reason to jump there: proposed in its own document only
    assert not [p for p in mem.propose("other.py", doc, 0, now=1.0, limit=10) if p.pattern.kind == "adapted"]


def test_a_pattern_that_cannot_propose_in_another_document_leaves_its_place_to_an_older_one():
    doc = split_lines("x = load(path)\ny = load(path)\nsize = count(items)\n")
    mem = EditMemory(calibration=None)
    mem.observe("a.py", Edit(2, ("size = total(items)\n",), ("size = count(items)\n",), 0.0), doc)  # a rename
    mem.observe("a.py", Edit(0, ("x = load(path)\n",), ("x = load(path, strict=True)\n",), 5.0), doc)
    kinds = {p: [e.pattern.kind for e in mem.live_patterns(now=6.0, max_patterns=3, path=p)]
             for p in ("a.py", "other.py", None)}
    assert kinds["a.py"] == ["adapted", "same_lines", "append_arg"]  # the 3 newest, in the edit's document
    # elsewhere the adapted block proposes nothing, so the older rename takes its place (a jump's target too)
    assert kinds["other.py"] == kinds[None] == ["same_lines", "append_arg", "rename"]


def test_an_adapted_block_substitutes_each_name_one_way_and_at_most_two():
    doc = split_lines("        resp.release()\n"
                      "        other.release()\n"          # one name: a site
                      "        other.release(other)\n"     # another shape: not a site
                      "        a.b(c)\n")
    mem = EditMemory(calibration=None)
    new = "        yield from resp.release()\n"
    edited = [new] + doc[1:]
    entries = mem.observe("t.py", Edit(0, (doc[0],), (new,), 0.0), edited)
    (adapted,) = [e.pattern for e in entries if e.pattern.kind == "adapted"]
    assert [(s.line, s.new_text) for s in find_sites(adapted, edited, 0)] == [(1, "        yield from other.release()\n")]
    # two lines of the block: `x` must become the same name on both, and three names are too many
    block, _, _ = block_pattern(["    x = f(a)\n", "    g(x)\n"], ["    x = f(a, 1)\n", "    g(x, 1)\n"], "def k():", None)
    from dlm.coder_model.edit_memory.patterns import adapted_pattern
    p = adapted_pattern(block)
    text = split_lines("    y = f(a)\n    g(y)\n\n    y = f(a)\n    g(z)\n\n    y = u(v)\n    g(y)\n")
    assert [(s.line, s.end_line, s.new_text) for s in find_sites(p, text, 0)] == [(0, 2, "    y = f(a, 1)\n    g(y, 1)\n")]


def test_an_adapted_block_is_no_site_where_the_line_differs_in_the_value_the_edit_changed():
    # `beat(20)` -> `beat(10)` says nothing of `beat(30)` (another setting), and `beat(10)` is done
    doc = split_lines("    with beat(20):\n    with beat(30):\n    with beat(10):\n    with pace(20):\n")
    new = "    with beat(10):\n"
    edited = [new] + doc[1:]
    mem = EditMemory(calibration=None)
    (adapted,) = [e.pattern for e in mem.observe("t.py", Edit(0, (doc[0],), (new,), 0.0), edited)
                  if e.pattern.kind == "adapted"]
    # the site that differs in a name the edit kept (`beat` -> `pace`) is one
    assert [(s.line, s.new_text) for s in find_sites(adapted, edited, 0)] == [(3, "    with pace(10):\n")]


@pytest.mark.parametrize(("old", "new"), [
    (["    import string\n"], []),                 # a deletion: a wrong one at a look-alike is the worst guess
    (["    x,\n"], ["    abs(x),\n"]),             # one other token: every line of a list would be a site
    (["):\n"], [") -> None:\n"]),                 # no name or literal to stand for another
])
def test_no_adapted_pattern_where_it_would_say_too_little(old, new):
    from dlm.coder_model.edit_memory.patterns import adapted_pattern
    found = block_pattern(old, new, "def f(", None)
    assert found is None or adapted_pattern(found[0]) is None


def test_an_undone_block_is_forgotten():
    doc = split_lines("def f():\n    check()\n    run()\n\ndef g():\n    check()\n    run()\n")
    edited = split_lines("def f():\n    check()\n    audit()\n    run()\n\ndef g():\n    check()\n    run()\n")
    mem = EditMemory()
    mem.observe("a.py", Edit(1, ("    check()\n",), ("    check()\n", "    audit()\n"), 0.0), edited)
    (p,) = mem.propose("a.py", edited, 2, now=1.0)
    assert (p.site.line, p.site.new_text) == (7, "    audit()\n")  # between g's check() and run()
    mem.observe("a.py", Edit(2, ("    audit()\n",), (), 2.0), doc)  # the user deletes it again
    assert mem.propose("a.py", doc, 1, now=3.0) == [] and mem.forgotten == 1


def test_a_block_with_5000_sites_is_capped_and_ranked_nearest_first():
    lines = ["    log.debug(state)\n", "    step()\n"] * 2500
    mem = EditMemory()
    marker, e = mem.entries_of("f.py", Edit(0, ("    log.debug(state)\n", "    step()\n"), ("    step()\n",), 0.0),
                               lines[2:])
    assert (marker.pattern.kind, e.pattern.kind) == ("delete_line", "delete_lines")  # an undo marker, the block
    sites = find_sites(e.pattern, lines, 2500, max_scan=300)
    assert len(sites) == 300 and all(s.end_line == s.line + 1 and s.new_text == "" for s in sites)
    assert max(abs(s.line - 2500) for s in sites) <= 600  # the cap keeps the nearest
    props = mem.propose("f.py", lines, 2500, now=0.0, pending=[e], max_scan=300, limit=8)
    assert len(props) == 8 and all(abs(pr.site.line - 2500) <= 20 for pr in props)
