"""The edit memory: this session's edit patterns, the project's git history as support, and
the proposals they make (docs/architecture.md §10: edits -> patterns -> sites -> proposals).

`EditMemory.observe` takes a closed edit (bursts.Edit) of a document; its patterns (the
token-level ones of patterns.extract, the edit's whole-line block, patterns.block_pattern, read
with the lines around it from the document, and a changed block's adapted twin,
patterns.adapted_pattern, proposed in its own document only) are remembered, newest first, at most `max_patterns`. An edit that reverts a remembered
pattern (an undo) makes the memory forget that pattern, and is not a pattern itself.

`EditMemory.propose` finds, for the newest patterns (and the open burst's, passed in by
the caller), the sites of a document where each still applies, ranks them by context
similarity and distance from the cursor, and gives each proposal its confidence: the
calibrated P(it is the next edit) from boosted trees fitted on the edit-histories train split
(edit_calibration.py: the pattern's kind, how often and how recently it was applied, how many of
its sites lie between the edit and this one, how far, and the other facts of
edit_calibration.features), scaled by how much more often this
project's git history repeats the kind than the corpus does (without the calibration model: the
memory's own support, per-kind priors raised with each application). A rename to a name that already
existed elsewhere in the document is ambiguous (its other uses may be another variable): it
proposes in that document only, and the trees see that it is ambiguous and whether a site is in
the edit's function body, until the user makes the same rename a second time (a systematic
rename); it never renames a def's parameter into one it already has.

`GitMiner` reads the repository's commits up to HEAD (`git log -p -U0`, capped in commits,
bytes, time and memory, with nothing of the repository's configuration able to run a program:
git_read.py), in a background thread: the patterns of each commit's hunks give, per kind,
how often a pattern recurs within its commit, and the pattern keys seen.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import logging
import os
import re
import subprocess
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace

from dlm.coder_model.edit_history import render_event
from dlm.coder_model.edit_memory import git_read
from dlm.coder_model.edit_memory.bursts import Edit
from dlm.coder_model.edit_memory.edit_calibration import Calibration, load
from dlm.coder_model.edit_memory.patterns import (
    DEF_RE,
    Pattern,
    adapted_pattern,
    block_pattern,
    extract,
    is_name,
    tokens,
)
from dlm.coder_model.edit_memory.sites import Site, find_sites, rank

log = logging.getLogger(__name__)

# P(a pattern of this kind is repeated elsewhere), before any git history is read. Measured on
# the edit-histories valid split (docs/next-edits.md).
DEFAULT_PRIORS: dict[str, float] = {"rename": 0.45, "append_arg": 0.15, "insert_line": 0.3, "replace": 0.3}
# How often a pattern of each kind recurs within its commit, over the edit-histories train split
# (python -m dlm.drivers.evaluation.edit_memory_tuning --split train --corpus-repeat 7: every 7th record,
# grouped by commit; insert_line too rare there, a guess). A project
# whose history repeats a kind more (less) often than these gets that kind's prior scaled up (down).
CORPUS_REPEAT: dict[str, float] = {"rename": 0.304, "append_arg": 0.055, "insert_line": 0.2, "replace": 0.087}
PRIOR_WEIGHT = 10.0  # pseudo-counts of the corpus rate against the project's own git counts
# A pattern proposes after the edit that made it and the next one (an edit elsewhere that is not
# the pattern again makes it stale): on the valid split replayed through one server, older patterns
# proposed in unrelated files.
RECENT_EDITS = 2
# The best-ranked sites of each pattern that get a proposal and a confidence, whatever `limit` a
# caller asks for: the trees choose among the same candidates, and count them (`candidates`), in the
# server, the replays and the fit (serving = training); a multiple of `limit` would differ between
# them (4 x `limit`: 32 sites in the server, 4 in the library replay, 256 in the fit).
RANKED_SITES = 32
OTHER_FILE = 0.5  # support factor of a pattern learnt in another file


_SHIPPED: list[Calibration | None] = []


def shipped_calibration() -> Calibration | None:
    """The calibration model shipped beside the code, read once."""
    if not _SHIPPED:
        _SHIPPED.append(load())
    return _SHIPPED[0]


@dataclass
class Entry:
    pattern: Pattern
    path: str
    line: int  # where the edit was (document line)
    context: frozenset[str]
    name: str
    event: str  # the edit as a rendered history event (coder_model.edit_history)
    at: float
    count: int = 1
    ambiguous: bool = False
    end: int = -1  # the edit's last line + 1 (its own lines are no site of it)
    seq: int = 0  # EditMemory.edits when it was last seen

    @functools.cached_property
    def shape(self) -> tuple[str, int]:
        """(the edit's first changed line, its lines changed): the event's first removed line (its
        first added one for an insertion) and how many lines it removed and added (edit_calibration:
        a site whose line resembles the edit's is likelier the next edit)."""
        old = [x[1:] for x in self.event.split("\n") if x.startswith("-") and not x.startswith("---")]
        new = [x[1:] for x in self.event.split("\n") if x.startswith("+") and not x.startswith("+++")]
        return (old or new or [""])[0], len(old) + len(new)


@dataclass(frozen=True)
class Proposal:
    path: str
    site: Site
    pattern: Pattern
    support: float  # the proposal's confidence: P(it is the next edit), 0..1 (calibrated; module doc)
    rank_score: float
    event: str  # the pattern's edit as a history event (the denoiser's context)
    # every site of the pattern in the block of neighbouring lines around `site` (it included), in
    # document order: one next edit (a rename used twice on a line, on three lines in a row)
    group: tuple[Site, ...] = ()
    applied: int = 1  # times the pattern was applied (this session, plus git sightings, at most 3 of them)
    age: int = 0  # closed edits since the pattern was last applied (0: the newest edit, or the open one)
    same_file: bool = True  # the pattern was learnt in this document
    ambiguous: bool = False  # a rename to a name that existed (proposed in its document only)
    # where the site lies from the edit that made the pattern (from the cursor for a pattern of
    # another document): lines below its last line (> 0), or above its first line (< 0)
    offset: int = 1
    between: int = 0  # lines with sites of the same pattern between the edit and this site
    # the cursor is in this document; False: a site looked for in another file (a jump there), whose
    # distance from the cursor means nothing: calibrated without it (edit_calibration.features)
    cursor_here: bool = True
    # facts the calibration weighs (edit_calibration.features): the site lies in the function the edit
    # was made in (same document); the edit was made in a function; one of the group's sites is
    # used as an attribute (`.name`); sites of the pattern in the document (before the limit); the
    # site follows a `#` on its line
    in_scope: bool = False
    edit_in_def: bool = False
    attr_site: bool = False
    pattern_sites: int = 1
    in_comment: bool = False
    cursor_distance: int = 0  # lines between the site and the cursor (this document)
    candidates: int = 1  # proposals made for this request, all patterns (before the limit)
    line_similarity: float = 0.0  # the site's line against the edit's first changed line (difflib ratio)
    indent_change: int = 0  # columns of indentation between the two
    edit_lines: int = 1  # lines the pattern's edit removed and added

    @property
    def sites(self) -> tuple[Site, ...]:
        return self.group or (self.site,)


@dataclass
class GitStats:
    commits: int = 0
    kinds: dict[str, list[int]] = field(default_factory=dict)  # kind -> [patterns, repeated in commit]
    keys: Counter = field(default_factory=Counter)
    head: str = ""


class EditMemory:
    def __init__(self, max_patterns: int = 32, max_edit_lines: int = 20, max_age_s: float = 900.0,
                 calibration: Calibration | None | bool = True) -> None:
        # True: the shipped model (edit_calibration.py); None or False: the memory's own support
        self.calibration = shipped_calibration() if calibration is True else (calibration or None)
        self.max_patterns = max_patterns
        self.max_edit_lines = max_edit_lines
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()  # newest last
        self.git = GitStats()
        self.forgotten = 0  # patterns forgotten by an undo (dlm/stats)
        self.edits = 0  # closed edits observed (patterns or not): a pattern's recency is in edits
        # Whether a rename's new name existed before it, as first seen: later sightings would
        # count the uses this pattern itself renamed (accepted proposals) as pre-existing.
        self._ambiguous: OrderedDict[tuple, bool] = OrderedDict()

    # ---- learning ---------------------------------------------------------------------------
    def entries_of(self, path: str, edit: Edit, lines: list[str], skip: tuple[int, int] | None = None) -> list[Entry]:
        """The patterns of an edit of `path` (not remembered: see `observe`); `lines` is the
        document now, `skip` a line range [a, b) of it changed after the edit (not looked at)."""
        out = []
        for x in extract(list(edit.old), list(edit.new), self.max_edit_lines):
            p = x.pattern
            line = edit.start + x.line
            ambiguous = False
            if p.kind == "rename":
                with self._lock:
                    known = self._ambiguous.get(p.key)
                if known is None:
                    known = _exists_outside(lines, p.new, [(edit.start, edit.start + len(edit.new)), skip or (0, 0)])
                    with self._lock:
                        self._ambiguous[p.key] = known
                        while len(self._ambiguous) > 4 * self.max_patterns:
                            self._ambiguous.popitem(last=False)
                ambiguous = known
            event = render_event(path, edit.start, list(edit.old), list(edit.new))
            out.append(Entry(p, path, line, x.context, x.name, event, edit.at, 1, ambiguous,
                             edit.start + len(edit.new)))
        if len(edit.old) <= self.max_edit_lines and len(edit.new) <= self.max_edit_lines:
            block = self._block_entry(path, edit, lines, skip)
            # A rename is carried use by use (its sites hold every identical line): no block. An edit
            # that the token-level patterns name too keeps its block pattern as `same_lines`, its
            # confidence fitted apart: on the valid split, as one kind with the blocks they cannot
            # name, its wrong sites outranked their right ones.
            # (delete_line, a one-line deletion's undo marker, names nothing: that deletion is delete_lines)
            if block is not None and not any(e.pattern.kind == "rename" for e in out):
                if any(e.pattern.kind != "delete_line" for e in out):
                    block.pattern = replace(block.pattern, kind="same_lines")
                out.append(block)
                # the same change where the lines differ in a name or two (patterns.adapted_pattern)
                if (adapted := adapted_pattern(block.pattern)) is not None:
                    out.append(replace(block, pattern=adapted))
        return out

    def _block_entry(self, path: str, edit: Edit, lines: list[str], skip: tuple[int, int] | None) -> Entry | None:
        """The edit's whole-line block pattern (patterns.block_pattern), the lines right outside
        the edit read from the document (unless changed after the edit: `skip`)."""
        a, b = skip or (0, 0)

        def around(i: int) -> str | None:
            return lines[i] if 0 <= i < len(lines) and not a <= i < b else None

        found = block_pattern(list(edit.old), list(edit.new), around(edit.start - 1),
                              around(edit.start + len(edit.new)))
        if found is None:
            return None
        p, head, n_new = found
        start = edit.start + head
        ctx = frozenset(t.text for x in (*edit.old, *edit.new) for t in tokens(x) if is_name(t.text))
        event = render_event(path, edit.start, list(edit.old), list(edit.new))
        return Entry(p, path, start, ctx, "", event, edit.at, 1, False, start + n_new)

    def observe(self, path: str, edit: Edit, lines: list[str], skip: tuple[int, int] | None = None) -> list[Entry]:
        """Remember a closed edit's patterns (an undo forgets the pattern it reverts)."""
        found = self.entries_of(path, edit, lines, skip)
        kept = []
        with self._lock:
            self.edits += 1
            for e in found:
                e.seq = self.edits
            for e in found:
                undone = [k for k, old in self._entries.items() if e.pattern.undoes(old.pattern)]
                if undone:
                    for k in undone:
                        del self._entries[k]
                        self._ambiguous.pop(k, None)
                    self.forgotten += len(undone)
                    continue
                if e.pattern.kind == "delete_line":
                    continue
                old = self._entries.pop(e.pattern.key, None)
                if old is not None:
                    e.count = old.count + 1  # the same pattern again: its support grows
                    e.ambiguous = old.ambiguous
                    e.context = old.context | e.context
                    e.pattern = _merged(e.pattern, old.pattern)
                self._entries[e.pattern.key] = e
                kept.append(e)
            while len(self._entries) > self.max_patterns:
                self._entries.popitem(last=False)
        return kept

    def forget_all(self) -> None:
        with self._lock:
            self._entries.clear()

    def patterns(self) -> list[Entry]:
        with self._lock:
            return list(reversed(self._entries.values()))

    def undone_by(self, entries: list[Entry]) -> bool:
        """True when one of these (an open burst's) reverts a remembered pattern."""
        with self._lock:
            return any(e.pattern.undoes(old.pattern) for e in entries for old in self._entries.values())

    # ---- support ----------------------------------------------------------------------------
    def prior(self, kind: str) -> float:
        """The kind's default prior, scaled by how much more (or less) often this project's git
        history repeats the kind within a commit than the corpus does (CORPUS_REPEAT)."""
        base = DEFAULT_PRIORS.get(kind, 0.3)
        corpus = CORPUS_REPEAT.get(kind, 0.2)
        seen, repeated = self.git.kinds.get(kind, (0, 0))
        project = (repeated + PRIOR_WEIGHT * corpus) / (seen + PRIOR_WEIGHT)
        return min(0.95, base * project / corpus)

    def git_factor(self, kind: str) -> float:
        """How much more (or less) often this project's git history repeats the kind within a
        commit than the corpus does (1.0 before any history is read)."""
        corpus = CORPUS_REPEAT.get(kind, 0.2)
        seen, repeated = self.git.kinds.get(kind, (0, 0))
        return (repeated + PRIOR_WEIGHT * corpus) / (seen + PRIOR_WEIGHT) / corpus

    def calibrated(self, p: Proposal) -> float:
        """The proposal's confidence: P(it is the next edit) from the calibration model (fitted on
        the train split), scaled by the project's git history; the memory's own support when there
        is no model."""
        if self.calibration is None:
            return p.support
        # (another document's pattern is one of the model's features: no factor for it here)
        return min(0.95, self.calibration(p) * self.git_factor(p.pattern.kind))

    def applied(self, e: Entry) -> int:
        """Times the pattern was applied: this session, plus up to 3 sightings in the git history."""
        return e.count + min(self.git.keys.get(e.pattern.key, 0), 3)

    def support(self, e: Entry, rank_score: float) -> float:
        """P(the proposal is right): 1 - (1 - prior)^n for a pattern applied n times (this
        session, plus up to 3 sightings in the git history), scaled a little by the site's rank
        (on the valid split, the count predicted exactness; context similarity hardly did)."""
        n = self.applied(e)
        p = 1.0 - (1.0 - self.prior(e.pattern.kind)) ** n
        return p * (0.8 + 0.2 * rank_score)

    # ---- proposing --------------------------------------------------------------------------
    def live_patterns(self, pending: list[Entry] = (), open_edit: bool | None = None, now: float | None = None,
                      max_patterns: int = 4, recent_edits: int = RECENT_EDITS, path: str | None = None) -> list[Entry]:
        """The patterns `propose` looks for in the document `path`, in its order (the open burst's,
        then the newest); `path` None: in a document no edit was made in (a jump's target)."""
        return self._live(pending, open_edit, now, max_patterns, recent_edits, path)[1]

    def _live(self, pending, open_edit, now, max_patterns, recent_edits, path) -> tuple[int, list[Entry]]:
        """(edits counted, the open edit included; the patterns that propose in `path`), see `propose`.
        A pattern that cannot propose in `path` (`_proposes_in`) takes none of the `max_patterns`
        places: in another file the one behind it is looked for instead."""
        now = time.monotonic() if now is None else now
        with self._lock:
            edits = self.edits + (1 if (bool(pending) if open_edit is None else open_edit) else 0)
            # the open edit repeats a remembered pattern: it is one more application of it
            pending = [replace(e, count=old.count + 1, ambiguous=old.ambiguous, context=old.context | e.context,
                               pattern=_merged(e.pattern, old.pattern))
                       if (old := self._entries.get(e.pattern.key)) is not None else e for e in pending]
        candidates = list(pending) + [e for e in self.patterns()
                                      if now - e.at <= self.max_age_s and edits - e.seq < recent_edits]
        seen: set[tuple] = set()
        live: list[Entry] = []
        for e in candidates:
            if e.pattern.key in seen or e.pattern.kind == "delete_line" or not _proposes_in(e, path):
                continue
            seen.add(e.pattern.key)
            if len(seen) > max_patterns:
                break
            live.append(e)
        return edits, live

    def propose(self, path: str, lines: list[str], cursor_line: int, now: float | None = None,
                pending: list[Entry] = (), max_patterns: int = 4, max_scan: int = 2000,
                limit: int = 8, recent_edits: int = RECENT_EDITS, open_edit: bool | None = None,
                cursor_here: bool = True) -> list[Proposal]:
        """The best sites in `lines` (the document `path`) for the patterns of the open burst
        (`pending`) and of the last `recent_edits` edits (the RANKED_SITES best-ranked sites of each);
        at most `limit`, best first. `open_edit`:
        an edit is still open (the server's tracker; default: when `pending` has patterns), and it
        is the newest edit: the closed ones are one edit older. `cursor_here` False: the cursor is
        in another document (`cursor_line` is then where the scan starts, 0: the top)."""
        edits, live = self._live(pending, open_edit, now, max_patterns, recent_edits, path)
        out: list[Proposal] = []
        for e in live:
            # a rename the user made twice is a systematic one, whatever names existed before it.
            # An ambiguous rename (to a name that existed: elsewhere the old name may be another
            # variable) keeps all its sites; the trees know it is ambiguous and whether the site is
            # in the edit's function (edit_calibration.features), and hold the other uses back: on the
            # train split's held-out folds, keeping only like uses in the function lost more right
            # proposals than it kept wrong ones out (BENCHMARKS.md "Calibrated next edits", row 4).
            # (An ambiguous one and an adapted one propose in their edit's document only: _proposes_in.)
            ambiguous = e.ambiguous and e.count < 2
            # in another file a module-level name is used as an attribute (stats.count for count):
            # how the edit used the name (Pattern.where) tells things apart only in its own file
            pattern = e.pattern if e.path == path or not e.pattern.where else replace(e.pattern, where="")
            sites = find_sites(pattern, lines, cursor_line, max_scan)
            if e.path == path:  # the edit's own lines are where it was made, not a site
                sites = [s for s in sites if not e.line <= s.line < max(e.end, e.line + 1)]
            if e.pattern.kind == "rename":
                sites = [s for s in sites if not _repeats_a_parameter(lines[s.line], e.pattern.new)]
            by_line: dict[int, list[Site]] = {}
            for s in sites:
                by_line.setdefault(s.line, []).append(s)
            rows = sorted(by_line)
            lo, hi = (e.line, max(e.end, e.line + 1)) if e.path == path else (cursor_line, cursor_line)
            edit_def = enclosing_def(lines, e.line) if e.path == path else None
            grouped: set[int] = set()
            for score, s in rank(sites, e.context, cursor_line, e.name, limit=RANKED_SITES):
                # a block site is one edit of whole lines: never grouped with the next one
                group = (s,) if e.pattern.block else block_of(by_line, s.line)
                if group[0].line in grouped:
                    continue  # the block is proposed already, from a better-ranked site of it
                grouped.add(group[0].line)
                support = self.support(e, score) * (1.0 if e.path == path else OTHER_FILE)
                out.append(Proposal(path, s, e.pattern, support, score, e.event, group,
                                    self.applied(e),
                                    max(0, edits - e.seq) if e.seq else 0, e.path == path, ambiguous,
                                    *_whereabouts(rows, s.line, lo, hi), cursor_here,
                                    in_scope=edit_def is not None and edit_def[0] < s.line < edit_def[1],
                                    edit_in_def=edit_def is not None,
                                    attr_site=any(_after_dot(lines[x.line], x.start) for x in group),
                                    pattern_sites=len(sites), in_comment=_in_comment(lines[s.line], s.start),
                                    cursor_distance=abs(s.line - cursor_line),
                                    **_resemblance(e, lines[s.line])))
        out = [replace(p, candidates=len(out)) for p in out]
        if self.calibration is not None:
            out = [replace(p, support=self.calibrated(p)) for p in out]
        out.sort(key=lambda p: (-p.support, abs(p.site.line - cursor_line)))
        return out[:limit]

    # ---- git --------------------------------------------------------------------------------
    def learn_git(self, stats: GitStats) -> None:
        self.git = stats


def _proposes_in(e: Entry, path: str | None) -> bool:
    """Whether `e` may propose in the document `path` (None: a document no edit was made in). An
    ambiguous rename made once (whether the name existed is known in the edit's document only: no
    jump either) and an adapted block (a look-alike of the edit's lines: a sibling in its document,
    not a jump's reason) propose in their edit's document only."""
    if e.path == path:
        return True
    return not (e.ambiguous and e.count < 2) and e.pattern.kind != "adapted"


def _merged(new: Pattern, old: Pattern) -> Pattern:
    """The pattern applied again (the same key): a rename used both ways (Pattern.where) matches both."""
    return new if new.where == old.where else replace(new, where="")


MAX_GROUP = 8  # sites in one proposal, at most


def block_of(by_line: dict[int, list[Site]], row: int) -> tuple[Site, ...]:
    """The sites on the run of consecutive lines with sites that holds `row` (nearest first
    when more than MAX_GROUP), in document order."""
    lo = hi = row
    while lo - 1 in by_line:
        lo -= 1
    while hi + 1 in by_line:
        hi += 1
    rows = sorted(range(lo, hi + 1), key=lambda r: abs(r - row))
    picked: list[Site] = []
    for r in rows:
        for s in sorted(by_line[r], key=lambda s: s.start):
            if len(picked) < MAX_GROUP and not any(x.line == s.line and x.start < s.end and s.start < x.end
                                                   for x in picked):
                picked.append(s)  # overlapping sites on a line (a name and a part of it): the first
    return tuple(sorted(picked, key=lambda s: (s.line, s.start)))


def _whereabouts(rows: list[int], row: int, lo: int, hi: int) -> tuple[int, int]:
    """(offset, between) of a site on `row` from an edit on lines [lo, hi) (Proposal's fields);
    `rows`: the sorted lines holding sites of the pattern."""
    if row >= hi:
        return row - hi + 1, bisect.bisect_left(rows, row) - bisect.bisect_left(rows, hi)
    return row - lo, bisect.bisect_left(rows, lo) - bisect.bisect_right(rows, row)


def _resemblance(e: Entry, site_line: str) -> dict:
    """Proposal's line_similarity, indent_change and edit_lines for a site on `site_line`."""
    ref, n = e.shape
    site = site_line.rstrip("\r\n")
    a, b = ref.strip(), site.strip()
    similarity = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() if a or b else 1.0
    indent = abs((len(ref) - len(ref.lstrip())) - (len(site) - len(site.lstrip())))
    return {"line_similarity": similarity, "indent_change": indent, "edit_lines": n}


def _repeats_a_parameter(line: str, new_name: str) -> bool:
    """A rename to `new_name` on this line would name two of a def's parameters alike (a
    SyntaxError): the line is a def's and already has the name (`def area(width, height):` for
    width -> height)."""
    return DEF_RE.match(line) is not None and any(t.text == new_name for t in tokens(line))


def _after_dot(line: str, col: int) -> bool:
    """The text before column `col` ends in a `.` (whitespace aside): an attribute."""
    return line[:col].rstrip().endswith(".")


def _in_comment(line: str, col: int) -> bool:
    """A `#` token comes before column `col` on the line (not one inside a string literal)."""
    return "#" in line[:col] and any(t.text == "#" and t.start < col for t in tokens(line[:col]))


def enclosing_def(lines: list[str], row: int) -> tuple[int, int] | None:
    """(def line, end) of the innermost def/class block holding `row` (end exclusive), by indentation."""
    for i in range(min(row, len(lines) - 1), -1, -1):
        m = DEF_RE.match(lines[i])
        if m is None:
            continue
        indent = len(m.group(1))
        end = i + 1
        while end < len(lines):
            text = lines[end]
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break
            end += 1
        if row < end:
            return i, end
    return None


def _exists_outside(lines: list[str], name: str, ranges: list[tuple[int, int]]) -> bool:
    """`name` is a token of a line outside the line ranges [a, b): it existed before the rename."""
    if not name:
        return False
    for i, line in enumerate(lines):
        if name not in line or any(a <= i < b for a, b in ranges):
            continue
        if any(t.text == name for t in tokens(line)):
            return True
    return False


# ---- the project's history ---------------------------------------------------------------------

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_log(text: str, max_edit_lines: int = 20) -> GitStats:
    """GitStats of `git log -p -U0 --format=commit%x20%H` output."""
    stats = GitStats()
    commit_keys: Counter = Counter()
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def end_hunk() -> None:
        nonlocal old, new
        if old or new:
            for x in extract(old, new, max_edit_lines):
                if x.pattern.kind != "delete_line":
                    commit_keys[(x.pattern.kind, x.pattern.key)] += 1
        old, new = [], []

    def end_commit() -> None:
        end_hunk()
        for (kind, key), n in commit_keys.items():
            seen = stats.kinds.setdefault(kind, [0, 0])
            seen[0] += 1
            seen[1] += n > 1
            stats.keys[key] += 1
        commit_keys.clear()

    for line in text.split("\n"):
        if line.startswith("commit "):
            if stats.commits:
                end_commit()
            stats.commits += 1
            in_hunk = False
        elif line.startswith("diff --git"):
            end_hunk()
            in_hunk = False
        elif line.startswith("@@"):
            end_hunk()
            in_hunk = True
        elif in_hunk and line.startswith("-"):
            old.append(line[1:])
        elif in_hunk and line.startswith("+"):
            new.append(line[1:])
    if stats.commits:
        end_commit()
    return stats


class GitMiner:
    """Mines a repository's history up to its current HEAD on a daemon thread; `on_done` gets
    the GitStats (never called when the root is not a git repository, git is missing, or the
    repository is refused as unsafe: git_read.check_repository). `close` kills a git still
    running (its whole process group)."""

    def __init__(self, root: str, on_done, max_commits: int = 300, max_bytes: int = 8_000_000,
                 timeout_s: float = 60.0) -> None:
        self.root, self.on_done = root, on_done
        self.max_commits, self.max_bytes, self.timeout_s = max_commits, max_bytes, timeout_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dlm-git-edits", daemon=True)

    def start(self) -> GitMiner:
        self.thread.start()
        return self

    def close(self, wait_s: float = 1.0) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(wait_s)

    def _run(self) -> None:
        try:
            stats = mine(self.root, self.max_commits, self.max_bytes, self.timeout_s, stop=self.stop)
        except Exception:  # a broken repository costs the support, never the server
            log.debug("git history of %s not mined", self.root, exc_info=True)
            return
        if stats is not None and not self.stop.is_set():
            self.on_done(stats)


_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# `git log -p` of the last commits, with every switch that keeps a hostile repository from
# running a program or reading outside the workspace (git_read.LOG_SAFETY).
_LOG = ("log", "--no-merges", "--no-color", "--no-renames", *git_read.LOG_SAFETY, "-p", "-U0")


def mine(root: str, max_commits: int, max_bytes: int, timeout_s: float = 60.0,
         stop: threading.Event | None = None) -> GitStats | None:
    """GitStats of the last `max_commits` non-merge commits up to HEAD (None: not a repository,
    git missing or failing, or a repository refused as unsafe, logged with the reason).
    `timeout_s` bounds the whole of it; what git wrote by then is mined."""
    root = os.path.abspath(root)
    try:
        git_dir = git_read.check_repository(root)
    except git_read.UnsafeRepository as e:
        log.warning("git history of %s not mined: %s", root, e)
        return None
    if git_dir is None:
        return None
    deadline = time.monotonic() + timeout_s
    try:
        head = git_read.run_git(root, git_dir, ["rev-parse", "--verify", "HEAD"],
                                min(10.0, timeout_s), 4096, stop=stop)
    except (OSError, subprocess.SubprocessError):
        return None
    if head is None or head.returncode != 0:
        return None
    sha = head.out.decode("ascii", errors="replace").strip()
    if not _SHA.fullmatch(sha):
        return None
    try:
        res = git_read.run_git(root, git_dir, [*_LOG, f"-n{max_commits}", "--format=commit %H", sha],
                               max(0.0, deadline - time.monotonic()), max_bytes, stop=stop)
    except (OSError, subprocess.SubprocessError):
        return None
    if res is None:
        return None
    if res.timed_out:
        log.info("git history of %s: stopped at the %.0f s limit, %d bytes read", root, timeout_s,
                 len(res.out))
    text = res.out.decode("utf-8", errors="replace")
    if res.capped or res.returncode != 0:  # the cap, the deadline, a kill or a failure cut a commit: drop it
        text = text[: text.rfind("\ncommit ")] if "\ncommit " in text else ""
    stats = parse_log(text)
    stats.head = sha
    return stats
