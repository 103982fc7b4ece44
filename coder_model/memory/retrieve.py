"""Similar snippets from other files: Jaccard over identifier sets of fixed line windows.

RepoCoder's retriever (Zhang et al. 2023), kept cheap: every file is cut
into windows of WINDOW lines every STRIDE lines; a window is the set of its
identifiers. A query is the identifiers of the last QUERY_LINES complete
lines above the cursor, so the answer does not change while the cursor
stays on one line (the layout section that holds the snippets keeps its
KV cache). Candidates come from an inverted index over the rarer
identifiers (an identifier in more than RARE_SHARE of the windows, `self`
or `return`, would touch every window); the best are then scored by exact
Jaccard against the window's stored identifier array.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 20
STRIDE = 10
QUERY_LINES = 10
RARE_SHARE = 0.05
RESCORE = 64  # windows rescored exactly per query
_IDENT = re.compile(r"[^\W\d]\w*")


@dataclass(frozen=True, slots=True)
class Snippet:
    path: str
    start_line: int  # 0-based line of the window's first line in its file
    text: str
    score: float  # Jaccard similarity of identifier sets, in [0, 1]


def identifiers(lines: Sequence[str]) -> set[str]:
    out: set[str] = set()
    for line in lines:
        out.update(_IDENT.findall(line))
    return out


def snippet_windows(lines: Sequence[str], lo: int = 0, hi: int | None = None) -> list[tuple[int, set[str]]]:
    """(first line, identifiers) of each window of a file's lines: WINDOW lines every STRIDE;
    only the windows starting in lines [lo, hi) when given (a batch of a long file)."""
    starts = range(0, max(len(lines) - WINDOW, 0) + 1, STRIDE) if lines else range(0)
    if lo or hi is not None:
        starts = starts[-(-lo // STRIDE) : None if hi is None else -(-hi // STRIDE)]
    return [(start, identifiers(lines[start : start + WINDOW])) for start in starts]


class SnippetIndex:
    """Windows of every indexed file and an inverted index from identifier to window."""

    def __init__(self) -> None:
        self.ident_ids: dict[str, int] = {}
        self.postings: list[array] = []  # identifier id -> window ids
        self.win_path: list[str | None] = []  # None: the window's file was removed or replaced
        self.win_start = array("I")
        self.win_idents: list[array] = []  # window id -> sorted identifier ids
        self.by_path: dict[str, range] = {}
        self.dead = 0

    @property
    def live_windows(self) -> int:
        return len(self.win_path) - self.dead

    def _ident(self, word: str) -> int:
        i = self.ident_ids.get(word)
        if i is None:
            i = self.ident_ids[word] = len(self.postings)
            self.postings.append(array("I"))
        return i

    def update_file(self, path: str, lines: Sequence[str]) -> None:
        self.add_windows(path, snippet_windows(lines))

    def add_windows(self, path: str, windows: Sequence[tuple[int, set[str]]]) -> None:
        """Index `path` as `windows` (from `snippet_windows`), replacing what was there."""
        first = self.start_file(path)
        self.append_windows(path, windows)
        self.finish_file(path, first)

    def start_file(self, path: str) -> int:
        """Drop `path`'s windows; the id its new windows start at (`append_windows` them, in
        batches if need be, then `finish_file`; nothing else may add windows meanwhile)."""
        self.remove_file(path)
        return len(self.win_path)

    def finish_file(self, path: str, first: int) -> None:
        self.by_path[path] = range(first, len(self.win_path))

    def append_windows(self, path: str, windows: Sequence[tuple[int, set[str]]]) -> None:
        for start, words in windows:
            ids = sorted({self._ident(w) for w in words})
            if not ids:
                self.win_path.append(None)
                self.win_start.append(start)
                self.win_idents.append(array("I"))
                self.dead += 1
                continue
            wid = len(self.win_path)
            self.win_path.append(path)
            self.win_start.append(start)
            self.win_idents.append(array("I", ids))
            for i in ids:
                self.postings[i].append(wid)

    def remove_file(self, path: str) -> None:
        windows = self.by_path.pop(path, None)
        if windows is None:
            return
        for wid in windows:
            if self.win_path[wid] is not None:
                self.win_path[wid] = None
                self.win_idents[wid] = array("I")
                self.dead += 1
        if self.dead > 1000 and self.dead > self.live_windows:
            self._compact()

    def _compact(self) -> None:
        """Drop dead windows: renumber the live ones and rebuild the postings."""
        keep = [w for w, p in enumerate(self.win_path) if p is not None]
        new_id = {w: i for i, w in enumerate(keep)}
        self.win_path = [self.win_path[w] for w in keep]
        self.win_start = array("I", (self.win_start[w] for w in keep))
        self.win_idents = [self.win_idents[w] for w in keep]
        self.postings = [array("I") for _ in self.postings]
        for wid, ids in enumerate(self.win_idents):
            for i in ids:
                self.postings[i].append(wid)
        by_path: dict[str, list[int]] = {}
        for w in keep:
            by_path.setdefault(self.win_path[new_id[w]], []).append(new_id[w])
        self.by_path = {p: range(ws[0], ws[-1] + 1) for p, ws in by_path.items()}
        self.dead = 0

    def search(self, before_lines: Sequence[str], k: int, exclude_path: str | None = None) -> list[tuple[int, float]]:
        """Best windows for the lines above the cursor: [(window id, Jaccard)], best first, non-overlapping."""
        query_words = identifiers(before_lines[-QUERY_LINES:])
        query = {self.ident_ids[w] for w in query_words if w in self.ident_ids}
        if not query or k <= 0:
            return []
        rare_limit = max(8, int(RARE_SHARE * max(self.live_windows, 1)))
        hits: dict[int, int] = {}
        for i in query:
            post = self.postings[i]
            if len(post) > rare_limit:
                continue
            for w in post:
                hits[w] = hits.get(w, 0) + 1
        if not hits:
            return []
        shortlist = sorted(hits, key=lambda w: -hits[w])[: RESCORE * 2]
        qn = len(query_words)
        scored = []
        for w in shortlist:
            path = self.win_path[w]
            if path is None or path == exclude_path:
                continue
            ids = self.win_idents[w]
            inter = len(query.intersection(ids))
            scored.append((inter / (qn + len(ids) - inter), w))
        scored.sort(key=lambda sw: (-sw[0], sw[1]))
        out: list[tuple[int, float]] = []
        for score, w in scored:
            if any(
                self.win_path[w] == self.win_path[o] and abs(self.win_start[w] - self.win_start[o]) < WINDOW
                for o, _ in out
            ):
                continue
            out.append((w, score))
            if len(out) == k:
                break
        return out
