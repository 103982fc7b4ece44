"""The edit memory's confidence, calibrated: P(a proposal is exactly the next edit), from boosted
trees (boosting.py) fitted on the edit-histories *train* split (docs/next-edits.md).

A proposal's features (`features`: its pattern's kind; how often and how recently the pattern was
applied; how many of its sites lie between the edit and this one; how far the site is; whether it
lies in the function the edit was made in; how a rename's site uses the name (`.name` or bare)
against the edit; how many sites the pattern has in the document; the size of the pattern; a
site in a comment; how much the site's line resembles the edit's, and its indentation) go through the trees. Which side of the edit a site lies on is left out on
purpose: the replayed histories apply a commit's hunks top to bottom, so a site above the edit is
never the next hunk there, and a model that learnt that would hide sites above from a user who
edits upwards (BENCHMARKS.md "Calibrated next edits").

Two sets of trees, one per place (`place`): `elsewhere` for a jump's site (a pattern learnt in
another document, asked about by the jump scan in a document without the cursor), `here` for
the rest. They are fitted apart because the two are different questions: a site near the edit
just made, or a use of the same name in a file the user has not touched. Fitted together, the
few proposals of another document in the in-file replay (111 of 69,512) taught the trees almost
nothing about jumps (a rename made twice scored 0.14-0.20, under the gate); fitted on the jump
replay's own proposals, the train split's held-out folds make 1.6 times the jumps at the default
gate, 64.3% of them exact against 60.0% (BENCHMARKS.md "Jumps to another file").

The model (`calibration.json` beside this file) is data: made by

    python -m dlm.drivers.evaluation.edit_memory_tuning --split train --fit-calibration \\
        coder_model/edit_memory/calibration.json

which replays the train split into the memory and labels every proposal by whether it was the
next hunk byte for byte (`here`), and replays each file of the train split's multi-file commits
and asks the commit's other files and 4 nearby files it left alone as the jump scan does,
labelling every proposal by whether it gives the file after the hunks it lies on (`elsewhere`;
evaluation.edit_memory_tuning.jump_pairs). Never fitted on valid or test (the driver refuses them). The server and
the library read it at import; without it (a broken install) the memory's own support is used.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from dlm.coder_model.edit_memory import boosting
from dlm.coder_model.edit_memory.boosting import Trees

log = logging.getLogger(__name__)

TABLE_PATH = Path(__file__).with_name("calibration.json")
FORMAT = 3  # 3: two sets of trees, `here` and `elsewhere` (module doc)
PLACES = ("here", "elsewhere")
# the kinds the features name (a kind not here, from a newer pattern set, has none of them on:
# re-fit); rename~part is a rename's site inside a longer name (sites.Site.part)
KINDS = ("rename", "rename~part", "replace", "same_lines", "lines", "delete_lines", "insert_lines",
         "append_arg", "insert_line", "adapted")
WHERE = {"attr": 0.0, "name": 1.0, "": 2.0}  # patterns.Pattern.where of a rename
FEATURES = (*(f"kind={k}" for k in KINDS), "applied", "edits ago", "sites between", "log distance",
            "same document", "cursor here", "context similarity", "in the edit's function",
            "edit in a function", "rename's use", "site as attribute", "sites in group",
            "sites of the pattern", "old chars", "new chars", "old lines", "new lines",
            "tokens matched", "ambiguous rename", "site in a comment", "log distance from the cursor",
            "proposals made", "line similarity", "indent change", "edit's lines", "names substituted")


def kind_of(p) -> str:
    kind = p.pattern.kind
    if getattr(getattr(p, "site", None), "part", False):
        kind += "~part"  # a rename inside a longer name: its own kind (sites.Site.part)
    return kind


def _near_its_edit(p) -> bool:
    """The proposal's offset is a distance from the edit that made its pattern (not from a cursor
    in another file than the edit's)."""
    return getattr(p, "cursor_here", True) and getattr(p, "same_file", True)


def features(p) -> list[float]:
    """The model's inputs for a proposal (memory.Proposal, or anything with its fields), in the
    order of FEATURES."""
    kind = kind_of(p)
    pat = p.pattern
    g = getattr
    return [
        *(1.0 if kind == k else 0.0 for k in KINDS),
        float(min(p.applied, 5)), float(min(p.age, 3)), float(min(p.between, 5)),
        # the model learnt the distance from the edit, in its file: a site in a file without the
        # cursor, or of a pattern learnt in another document, has none
        math.log1p(abs(p.offset)) if _near_its_edit(p) else -1.0,
        float(g(p, "same_file", True)), float(g(p, "cursor_here", True)), float(g(p, "rank_score", 0.5)),
        float(g(p, "in_scope", False)), float(g(p, "edit_in_def", False)),
        WHERE.get(g(pat, "where", ""), 2.0) if pat.kind == "rename" else -1.0,
        float(g(p, "attr_site", False)), float(len(g(p, "group", ()) or (1,))),
        float(min(g(p, "pattern_sites", 1), 64)),
        float(min(len(g(pat, "old", "")), 200)), float(min(len(g(pat, "new", "")), 200)),
        float(g(pat, "old", "").count("\n")), float(g(pat, "new", "").count("\n")),
        float(min(len(g(pat, "before", ())), 24)), float(g(p, "ambiguous", False)), float(g(p, "in_comment", False)),
        # nor a distance from the cursor: a jump's site, once its file is open and the cursor on it,
        # is judged without it too (and keeps the jump's confidence: lsp.next_edits.Landing)
        math.log1p(g(p, "cursor_distance", 0)) if _near_its_edit(p) else -1.0,
        float(min(g(p, "candidates", 1), 64)),
        float(g(p, "line_similarity", 0.0)), float(min(g(p, "indent_change", 0), 16)), float(min(g(p, "edit_lines", 1), 40)),
        float(g(g(p, "site", None), "holes", 0)),
    ]


def place(p) -> str:
    """Which trees judge the proposal: `elsewhere` for a site the jump scan looks for in a document
    without the cursor, `here` for the rest. The two sets are fitted on exactly these (the jump
    replay asks with the cursor elsewhere, the in-file replay with it in the document). A site of
    another document's pattern in the cursor's document is `here`'s question (is it the next edit
    after the one just made here?): on the valid split, the `elsewhere` trees passed such sites
    that were 12% exact and cost a point of exact (BENCHMARKS.md "Jumps to another file"). The edit a jump
    has led to keeps the jump's confidence by the server's memory of it (lsp.next_edits.Landing)."""
    return "here" if getattr(p, "cursor_here", True) else "elsewhere"


class Calibration:
    """P(exact next edit) from the fitted trees of the proposal's place (module doc)."""

    def __init__(self, trees: dict[str, Trees], meta: dict | None = None) -> None:
        if set(trees) != set(PLACES):
            raise ValueError(f"edit-memory calibration: trees for {sorted(trees)}, need {list(PLACES)}")
        self.trees = trees
        self.meta = meta or {}

    def __call__(self, p) -> float:
        return self.trees[place(p)](features(p))

    # ---- fitting (drivers.evaluation.next_edits --fit-calibration) ------------------------
    @classmethod
    def fit(cls, labelled: dict[str, list], meta: dict | None = None, **params) -> Calibration:
        """From (proposal, exact) pairs per place (`here`, `elsewhere`); `params` go to boosting.fit."""
        trees = {}
        for where in PLACES:
            if not labelled[where]:
                raise ValueError(f"edit-memory calibration: no proposals {where} to fit on (`elsewhere` comes from "
                                 "commits that changed several files): replay more of the train split (a larger --limit)")
            rows = [features(p) for p, _ in labelled[where]]
            trees[where] = boosting.fit(rows, [1.0 if exact else 0.0 for _, exact in labelled[where]], **params)
        return cls(trees, meta)

    def to_json(self) -> dict:
        return {"format": FORMAT, "features": list(FEATURES), "meta": self.meta,
                **{where: self.trees[where].to_json() for where in PLACES}}

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        if data.get("format") != FORMAT or data.get("features") != list(FEATURES):
            raise ValueError(f"edit-memory calibration: format {data.get('format')!r}, features "
                             f"{data.get('features')!r}; this code reads format {FORMAT} with {len(FEATURES)} "
                             "features: re-fit it (python -m dlm.drivers.evaluation.edit_memory_tuning --split train "
                             "--fit-calibration coder_model/edit_memory/calibration.json)")
        return cls({where: Trees.from_json(data[where]) for where in PLACES}, data.get("meta"))


def load(path: Path = TABLE_PATH) -> Calibration | None:
    """The shipped model, or None (logged) when it is missing or damaged."""
    try:
        return Calibration.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning("edit memory: no calibration model (%s); proposals use the memory's own support", exc)
        return None
