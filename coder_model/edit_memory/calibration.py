"""The edit memory's confidence, calibrated: P(a proposal is exactly the next edit), per pattern
kind and support, from a table fitted on the edit-histories *train* split (README "Next edits").

A proposal's features (its pattern's kind; how often the pattern was applied; how many edits ago;
how many of the pattern's sites lie between the edit and the site; how far) key a table of counts
at five levels, coarse to fine. The estimate starts at the base rate and
walks down the levels, each level's rate shrunk towards the one above it by `PSEUDO_COUNT`
pseudo-counts (a fine cell with few proposals stays near its parent); a cell never seen ends the walk.

The table (`calibration.json` beside this file) is data: made by

    python -m dlm.coder_model.evaluation.next_edits --split train --fit-calibration \\
        coder_model/edit_memory/calibration.json

which replays the train split into the memory and counts, for every proposal, whether it was the
next hunk byte for byte. Never fitted on valid or test (the driver refuses them). The server and
the library read it at import; without it (a broken install) the memory's own support is used.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

TABLE_PATH = Path(__file__).with_name("calibration.json")
PSEUDO_COUNT = 20.0  # how many proposals' worth of weight a level's parent estimate carries
FORMAT = 1
LEVELS = 5  # keys() per proposal


def _applied(n: int) -> int:
    return min(n, 3)


def _between(n: int) -> int:
    return min(n, 2)


def _distance(offset: int) -> str:
    """Distance bucket of a site from the edit, in lines, either side."""
    a = abs(offset)
    return "1" if a <= 1 else "3" if a <= 3 else "10" if a <= 10 else "30" if a <= 30 else "100" if a <= 100 else "far"


def _near_its_edit(p) -> bool:
    """The proposal's offset is a distance from the edit that made its pattern (not from a cursor
    in another file than the edit's)."""
    return getattr(p, "cursor_here", True) and getattr(p, "same_file", True)


def keys(p) -> list[str]:
    """The table keys of a proposal (memory.Proposal or anything with its fields), coarse to fine.
    Which side of the edit a site lies on is left out on purpose: the replayed histories apply a
    commit's hunks top to bottom, so a site above the edit is never the next hunk there, and a
    table that learnt that would hide sites above from a user who edits upwards (with the side,
    the valid split gains about one point of shown share: BENCHMARKS.md "Calibrated next edits")."""
    kind, n, age = p.pattern.kind, _applied(p.applied), min(p.age, 2)
    if getattr(getattr(p, "site", None), "part", False):
        kind += "~part"  # a rename inside a longer name: its own cells (sites.Site.part)
    between = _between(p.between)
    parts = [
        (kind,),
        (kind, n),
        (kind, n, age),
        (kind, n, age, between),
        # the table learnt the distance from the edit, in its file: a site in a file without the
        # cursor, or of a pattern learnt in another document, has none (no cell: the level above answers)
        (kind, n, age, between, _distance(p.offset) if _near_its_edit(p) else "elsewhere"),
    ]
    return ["|".join(map(str, k)) for k in parts]


class Calibration:
    """P(exact next edit) from the fitted table (module doc)."""

    def __init__(self, levels: list[dict[str, list[int]]], base: float, meta: dict | None = None) -> None:
        self.levels = levels
        self.base = base
        self.meta = meta or {}

    def __call__(self, p) -> float:
        q = self.base
        for level, key in zip(self.levels, keys(p)):
            cell = level.get(key)
            if cell is None:
                break
            n, exact = cell
            q = (exact + PSEUDO_COUNT * q) / (n + PSEUDO_COUNT)
        return q

    # ---- fitting (coder_model.evaluation.next_edits --fit-calibration) ------------------------
    @classmethod
    def fit(cls, labelled, meta: dict | None = None) -> Calibration:
        """From (proposal, exact) pairs."""
        levels: list[dict[str, list[int]]] = [{} for _ in range(LEVELS)]
        total = hits = 0
        for p, exact in labelled:
            total += 1
            hits += bool(exact)
            for level, key in zip(levels, keys(p)):
                cell = level.setdefault(key, [0, 0])
                cell[0] += 1
                cell[1] += bool(exact)
        return cls(levels, hits / total if total else 0.0, meta)

    def to_json(self) -> dict:
        return {"format": FORMAT, "pseudo_count": PSEUDO_COUNT, "base": self.base, "meta": self.meta,
                "levels": [dict(sorted(level.items())) for level in self.levels]}

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        if data.get("format") != FORMAT or len(data.get("levels", ())) != LEVELS:
            raise ValueError(f"edit-memory calibration table: format {data.get('format')!r} with "
                             f"{len(data.get('levels', ()))} levels, expected format {FORMAT} with {LEVELS}; "
                             "re-fit it (python -m dlm.coder_model.evaluation.next_edits --split train --fit-calibration)")
        return cls([{k: [int(v[0]), int(v[1])] for k, v in level.items()} for level in data["levels"]],
                   float(data["base"]), data.get("meta"))


def load(path: Path = TABLE_PATH) -> Calibration | None:
    """The shipped table, or None (logged) when it is missing or damaged."""
    try:
        return Calibration.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning("edit memory: no calibration table (%s); proposals use the memory's own support", exc)
        return None
