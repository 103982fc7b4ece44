"""Scores of a predicted region against the target: edit similarity, next-edit location,
and the Codeforces-style output comparison SAFIM's tests use."""

from __future__ import annotations

import difflib


def levenshtein(a: str, b: str) -> int:
    """Character edit distance (insert, delete, substitute), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(pred: str, target: str, max_cells: int = 4_000_000) -> float:
    """1 - normalized Levenshtein distance, in [0, 1] (1 = identical).

    Above `max_cells` (len * len) the exact DP is too slow in Python and
    difflib's matching-blocks ratio is used instead (same range, 1 = identical).
    """
    if pred == target:
        return 1.0
    n = max(len(pred), len(target))
    if len(pred) * len(target) > max_cells:
        return difflib.SequenceMatcher(None, pred, target, autojunk=False).ratio()
    return 1.0 - levenshtein(pred, target) / n


def changed_lines(old: str, new: str) -> tuple[int, int] | None:
    """[first, last) old-line span that a line diff old -> new touches; None if unchanged."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return None
    return ops[0][1], ops[-1][2]


def location_correct(region: str, pred: str, target: str) -> bool:
    """The prediction edits the same lines of the region as the target does."""
    want = changed_lines(region, target)
    return want is not None and changed_lines(region, pred) == want


def _token_equal(a: str, b: str) -> bool:
    if a == b or a.lower() == b.lower():  # Codeforces checkers accept YES/Yes/yes
        return True
    if "." in a or "." in b or "e" in a.lower():
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        return abs(x - y) <= 1e-6 * max(1.0, abs(y))  # real-valued answers: 1e-6 rel/abs error
    return False


def output_matches(got: str, expected: str) -> bool:
    """Token-wise comparison like Codeforces' standard checkers: whitespace and
    line breaks are separators only, YES/NO case does not matter, and real
    numbers may differ by 1e-6 (relative or absolute)."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(_token_equal(x, y) for x, y in zip(a, b))


