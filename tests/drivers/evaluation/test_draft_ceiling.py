"""The draft ceiling's groups (drivers.evaluation.draft_ceiling): which drafts a model could
reach by renaming names visible in the window, and the leave-one-repository-out re-ranking."""

from __future__ import annotations

from dlm.drivers.evaluation import draft_ceiling as dc


def test_a_draft_two_renames_away_with_visible_names_is_reachable():
    visible = {"rows", "cols", "self", "total"}
    assert dc.swap_reachable("total = len(items)", "total = len(rows)", visible)
    assert dc.swap_reachable("n = len(items) + len(keys)", "n = len(rows) + len(cols)", visible - {"total"} | {"n"})
    # the same name renamed twice to the same name counts once
    assert dc.swap_reachable("f(a, a)", "f(rows, rows)", visible)


def test_swaps_are_names_only_visible_and_few():
    visible = {"rows", "cols", "other"}
    assert not dc.swap_reachable("x = len(items)", "x = len(unseen)", visible)  # not in the window
    assert not dc.swap_reachable("x = 1", "x = 2", visible | {"x"})  # a number is not a name
    assert not dc.swap_reachable("if a:", "for a:", visible | {"a"})  # keywords are syntax
    assert not dc.swap_reachable("f(a, b, c)", "f(rows, cols, other)", visible)  # three renames
    assert not dc.swap_reachable("f(a)", "f(a, b)", visible)  # another shape
    assert not dc.swap_reachable("f(a)", "f(a)", visible)  # identical: the draft is exact, not adapted


def test_groups_and_window():
    visible = dc.names_in_window("import os\nrows = []\n" + "pad\n" * 100 + "x = ", "\ncols = 1\n")
    assert "rows" not in visible and "pad" in visible and "cols" in visible  # 60 lines above only
    assert dc.group_of(["a", "b"], "a", visible) == "top1"
    assert dc.group_of(["a", "b"], "b", visible) == "topK"
    assert dc.group_of(["len(pad)"], "len(cols)", visible) == "swap"
    assert dc.group_of(["len(pad)"], "len(pad) + 1", visible) == "unreachable"
    assert dc.group_of([], "x", visible) == "unreachable"


def test_trees_rank_the_right_draft_first_where_the_features_say_so():
    """Leave-one-repository-out: trees fitted on two repositories whose right draft is always the
    one that parses pick it in the third, whatever its rank."""

    def row(right: int) -> dict:
        drafts = [{"x": [float(r), 0.5, 1.0, 1.0, 0.0, 10.0, 4.0, float(r == right), 0.0, 1.0, 3.0, 4.0, 0.0],
                   "y": r == right} for r in range(4)]
        return {"group": "top1" if right == 0 else "topK", "len": 10, "drafts": drafts}

    by_repo = {name: [row(i % 4) for i in range(120)] for name in ("a", "b", "c")}
    picks = dc.rerank_loro(by_repo, trees=20, depth=2)
    assert picks["c"] == [i % 4 for i in range(120)]
    s = dc.summarize(by_repo["c"], picks["c"])
    assert s["trees_top1"] == 1.0 and s["memory_top1"] == 0.25 and s["trees_miss_in_beam"] == 0.0
