"""`dlm-lsp eval --next-edits`: next-edit prediction replayed from real edit histories, through the real server.

Material (one "record" = the hunks one commit made to one Python file, the file as it was at
the commit's parent, `before`):
- `--split valid|test` (default valid): the edit-histories records of that split (--edit-histories
  or $DLM_EDIT_HISTORIES). Tune on `valid`; `test` is the held-out figure that no tuning may see.
- `--git REPO`: the first-parent history of REPO's HEAD (the last --git-commits commits), oldest
  to newest, mined the way the edit-histories records are (modified .py files, <= 32 KiB, 1-12
  hunks of `git diff -U0`, <= 200 changed lines). The server's workspace root is a temporary git
  repository that holds the history up to the parent of the commit being replayed and no later
  commit (fetched commit by commit from REPO, which is only read), with the parent checked out.

One server process replays one session (--session): by default one repository's records, oldest commit
first, so that what the server learns from edits never crosses projects and never comes from a later
commit; `--session commit` starts one per commit. With --git the whole walk is one session.

The replay: the server runs with edit predictions on and its gate at 0 (every proposal comes back
with its confidence; the thresholds are swept here, offline). For a record with n >= 2 hunks the
file is opened as `before`, and its hunks are applied as the user would make them, in file order
(top to bottom), each one `didChange` (its old lines replaced by its new ones), --edit-gap-s apart
(by default just over the server's history idle time, so that each hunk is its own edit event, as
a user who takes a few seconds per edit makes them). After hunk k (k = 1 .. n-1) `dlm/editPrediction`
is asked with the cursor at the end of the text hunk k wrote (at the end of its last new line; for
a pure deletion, where its lines were). That request is one next-edit *opportunity*; the truth is
the hunks k+1 .. n not applied yet (the "remaining hunks"). Replaying in file order makes the
first remaining hunk both the next one and the nearest to the cursor: the *next hunk*. Hunk n is
typed too, and not asked about: the user makes the whole commit, and a later record of the session
(a later commit, or another file of this one) may use what the server learnt from it.

A proposal is judged by what it does to the document (the proposal applied, then a line diff of
before and after, so that how the server cut its edits does not matter):
- shown at threshold t: a proposal that changes the document, answered, whose confidence passes
  the server's gate at t (lsp.gate.decide, with --rewrite-recent for proposals that rewrite recent
  typing, as the server's minConfidenceRewriteRecent);
- location: one of its changed line blocks overlaps a remaining hunk's lines (a block or a hunk that
  only inserts overlaps what it touches: the lines on either side of its insertion point);
- exact (the headline): the document after the proposal is the document after the next hunk,
  byte for byte, and nothing else changed;
- exact, any remaining: the document after the proposal is the document after the remaining hunks
  that its blocks overlap (one or several), so a right edit further down counts too;
- deletes kept lines: a non-blank line that no remaining hunk touches (the commit keeps it) is
  removed by the proposal and nothing like it (difflib ratio >= 0.5) takes its place in the same
  block; "changes kept lines" counts any change to such a line;
- characters saved: for a proposal that is exact (any remaining), the characters the reproduced
  hunks insert (a character diff of their old and new lines): what the user no longer types.

Figures: per threshold, the share of opportunities shown, and of those shown: location, exact,
exact (any), deletes kept lines (each with a 95% Wilson interval), characters saved per opportunity
(95% normal interval), latency p50/p99 of the shown ones; then per split and per repository at one
threshold. `--records FILE` writes one JSON line per opportunity for analysis.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dlm.coder_model.edit_memory.patterns import common_ends
from dlm.drivers.bench.typing_latency import Bench, _plain, request
from dlm.lsp.positions import to_character, to_index
from dlm.lsp.stats import percentile

DEFAULT_CASES = 100  # opportunities
EDIT_GAP_S = 1.2  # between two hunks: over the server's history idleS (1.0), so each hunk is one event
MAX_BEFORE_BYTES = 32 * 1024  # the edit-histories rules, for --git
MAX_HUNKS = 12
MAX_CHANGED_LINES = 200
KEPT_LINE_SIMILAR = 0.5  # a removed kept line with a replacement this similar was rewritten, not deleted
MAX_MATCH_LINES = 200  # blocks larger than this are not searched for rewritten lines (all count deleted)
# the Targets (BENCHMARKS.md "Next edits"): the lowest threshold that meets them is reported
TARGET_SHOWN, TARGET_EXACT, TARGET_LOCATION, TARGET_DELETES_KEPT = 0.15, 0.50, 0.70, 0.05


# ---- material -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    """`n_del` lines of `before` from 0-based line `start` become `add` (for n_del == 0 the new
    lines go before line `start`): a record's hunk in `before`'s coordinates."""

    start: int
    n_del: int
    add: str

    @classmethod
    def from_record(cls, h: dict) -> Hunk:
        return cls(h["at"] - 1 if h["del"] else h["at"], h["del"], h["add"])


@dataclass
class EditRecord:
    split: str  # valid | test | git
    repo: str
    commit: str
    date: str
    path: str
    before: str
    hunks: list[Hunk]
    max_steps: int | None = None  # replay only the first steps (a run's last record, cut to --cases)

    @property
    def opportunities(self) -> int:
        n = len(self.hunks) - 1
        return n if self.max_steps is None else min(n, self.max_steps)


def git_lines(text: str) -> list[str]:
    """Lines as git counts them: split after "\\n" only, each with its "\\n" (the last maybe without)."""
    return [x for x in re.split(r"(?<=\n)", text) if x]


def record_from_json(rec: dict) -> EditRecord:
    return EditRecord(rec["split"], rec["repo"], rec["commit"], rec.get("date", ""), rec["path"], rec["before"],
                      [Hunk.from_record(h) for h in rec["hunks"]])


def usable(rec: EditRecord) -> bool:
    """>= 2 hunks and no carriage return: LSP ends lines at \\r too, git does not, and the two
    line counts would disagree (3 CRLF records in the data)."""
    return len(rec.hunks) >= 2 and "\r" not in rec.before and not any("\r" in h.add for h in rec.hunks)


def select_records(records: list[EditRecord], cases: int, seed: int) -> list[EditRecord]:
    """Records whose opportunities add up to `cases` (the last one cut), taken round-robin over the
    repositories in a seeded order (so a small run covers every repository), then in replay order:
    per repository, oldest commit first (an edit memory then sees only earlier commits)."""
    by_repo: dict[str, list[EditRecord]] = {}
    for r in records:
        if usable(r):
            by_repo.setdefault(r.repo, []).append(r)
    for rs in by_repo.values():
        rs.sort(key=lambda r: hashlib.sha256(f"{seed}:{r.commit}:{r.path}".encode()).hexdigest())
    chosen, left = [], cases
    queues = [list(reversed(by_repo[k])) for k in sorted(by_repo)]
    while left > 0 and any(queues):
        for q in queues:
            if q and left > 0:
                r = q.pop()
                if r.opportunities > left:  # cut: its first `left` steps only (the truth keeps every hunk)
                    r = EditRecord(r.split, r.repo, r.commit, r.date, r.path, r.before, r.hunks, left)
                chosen.append(r)
                left -= r.opportunities
    return sorted(chosen, key=lambda r: (r.split, r.repo, r.date, r.commit, r.path))


def dataset_records(split: str, data_dir: str | None) -> list[EditRecord]:
    """The split's records with >= 2 hunks (the test split is read here, by evaluation, only to report)."""
    from dlm.drivers.training.commit_edits import iter_edit_records

    return [record_from_json(rec) for rec in iter_edit_records(split, data_dir, allow_test=split == "test")
            if len(rec["hunks"]) >= 2]


# ---- git histories (--git) -----------------------------------------------------------------------------


def _git(repo: Path, *args: str, binary: bool = False):
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout if binary else proc.stdout.decode("utf-8", errors="replace")


_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


def git_commit_records(repo: Path, parent: str, commit: str, date: str) -> list[EditRecord]:
    """The records `commit` makes (the edit-histories rules): modified .py files, UTF-8, `before`
    <= 32 KiB, 1-12 hunks of `git diff -U0`, <= 200 changed lines. The added text is read from the
    file at the commit (so a last line without a newline stays so)."""
    out = []
    names = _git(repo, "diff", "--no-renames", "--name-status", "-z", parent, commit).split("\0")
    for status, path in zip(names[::2], names[1::2]):
        if status != "M" or not path.endswith(".py"):
            continue
        try:
            old_b = _git(repo, "show", f"{parent}:{path}", binary=True)
            new_b = _git(repo, "show", f"{commit}:{path}", binary=True)
            if len(old_b) > MAX_BEFORE_BYTES:
                continue
            before, after = old_b.decode("utf-8"), new_b.decode("utf-8")
        except (RuntimeError, UnicodeDecodeError):
            continue
        diff = _git(repo, "diff", "-U0", "--no-renames", "--no-ext-diff", parent, commit, "--", path)
        after_lines = git_lines(after)
        hunks, changed = [], 0
        for m in _HUNK_HEADER.finditer(diff):
            at, n_del = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
            new_at, n_add = int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1)
            add = "".join(after_lines[new_at - 1 : new_at - 1 + n_add]) if n_add else ""
            hunks.append(Hunk(at - 1 if n_del else at, n_del, add))
            changed += n_del + n_add
        if not 1 <= len(hunks) <= MAX_HUNKS or changed > MAX_CHANGED_LINES:
            continue
        out.append(EditRecord("git", repo.resolve().name, commit, date, path, before, hunks))
    return out


def git_history(repo: Path, commits: int) -> list[tuple[str, str, str]]:
    """(parent, commit, date) of the last `commits` first-parent commits of HEAD with one parent,
    oldest first."""
    lines = _git(repo, "rev-list", "--first-parent", "--parents", f"--max-count={commits}", "--format=%cs",
                 "HEAD").splitlines()
    out = []
    for head, date in zip(lines[::2], lines[1::2]):
        shas = head.split()[1:]  # "commit <sha> <parents...>"
        if len(shas) == 2:
            out.append((shas[1], shas[0], date.strip()))
    return list(reversed(out))


class ParentWorkspace:
    """A temporary git repository holding REPO's history up to one commit and no later one: each
    `advance(sha)` fetches sha (and its ancestors) from REPO and checks it out. Walking a
    first-parent history oldest to newest, everything fetched before is an ancestor of what is
    checked out: the server's root never holds a later state. REPO itself is only read."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo.resolve()
        self.root = Path(tempfile.mkdtemp(prefix="dlm-eval-edits-")) / self.repo.name
        self.root.mkdir()
        self.cache = self.root.parent / "cache"  # the server's XDG_CACHE_HOME (NextEditReplay.run)
        _git(self.root, "init", "-q")
        self.head: str | None = None

    def advance(self, sha: str) -> list[str]:
        """Check out `sha`; the paths that changed on disk since the last one (relative)."""
        if sha == self.head:
            return []
        _git(self.root, "fetch", "-q", "--no-tags", str(self.repo), sha)
        _git(self.root, "-c", "advice.detachedHead=false", "checkout", "-q", "--force", "--detach", sha)
        changed = []
        if self.head is not None:
            changed = [p for p in _git(self.root, "diff", "--name-only", "-z", self.head, sha).split("\0") if p]
        self.head = sha
        return changed

    def close(self) -> None:
        shutil.rmtree(self.root.parent, ignore_errors=True)


# ---- one step of a replay: the document, the cursor, the truth -------------------------------------


@dataclass(frozen=True)
class Span:
    """A remaining hunk in the current document's coordinates: lines [start, start + n_del)
    become `add` (an insertion before line `start` when n_del == 0)."""

    start: int
    n_del: int
    add: str

    @property
    def end(self) -> int:
        return self.start + self.n_del


def apply_spans(lines: list[str], spans: list[Span]) -> str:
    out = list(lines)
    for s in sorted(spans, key=lambda s: s.start, reverse=True):
        out[s.start : s.end] = git_lines(s.add)
    return "".join(out)


def replay_steps(rec: EditRecord):
    """For k = 1 .. n, every hunk: (the change that applies hunk k-1 as (start line, end line, new
    text) in the document before it, the document after it, the cursor (line, code-point column) at
    the end of what it wrote, the remaining hunks as Spans of that document). The first
    `rec.opportunities` steps are opportunities; the rest (the last hunk, and a cut record's steps
    past the cut) are typed and not asked about: the user makes the whole commit, and what a later
    record of the session may learn from them, an edit memory learns, as from an editor."""
    lines = git_lines(rec.before)
    delta = 0
    for k, h in enumerate(rec.hunks):
        start = h.start + delta
        change = (start, start + h.n_del, h.add)
        added = git_lines(h.add)
        lines[start : start + h.n_del] = added
        delta += len(added) - h.n_del
        if added:
            row = start + len(added) - 1
            col = len(added[-1].rstrip("\n"))
        else:  # a pure deletion: where its lines were
            row, col = min(start, max(len(lines) - 1, 0)), 0
        remaining = [Span(x.start + delta, x.n_del, x.add) for x in rec.hunks[k + 1 :]]
        yield change, list(lines), (row, col), remaining


# ---- judging one proposal ------------------------------------------------------------------------------


def line_offsets(text: str) -> list[int]:
    """Offsets of line starts, LSP lines (split at "\\n"; no "\\r" in the material)."""
    out = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            out.append(i + 1)
    return out


def offset_of(text: str, starts: list[int], line: int, character: int) -> int:
    """Code-point offset of an LSP position (UTF-16 characters; clamped like the server)."""
    if line >= len(starts):
        return len(text)
    a = starts[line]
    b = starts[line + 1] - 1 if line + 1 < len(starts) else len(text)
    return a + to_index(text[a:b], max(character, 0))


def position_of(text: str, starts: list[int], offset: int) -> tuple[int, int]:
    import bisect

    line = bisect.bisect_right(starts, offset) - 1
    end = starts[line + 1] - 1 if line + 1 < len(starts) else len(text)
    return line, to_character(text[starts[line] : end], offset - starts[line])


def apply_edits(text: str, edits: list[dict]) -> str:
    """The document after a proposal's LSP edits ({range, newText}, ranges in `text`)."""
    starts = line_offsets(text)
    spans = []
    for e in edits:
        r = e["range"]
        a = offset_of(text, starts, r["start"]["line"], r["start"]["character"])
        b = offset_of(text, starts, r["end"]["line"], r["end"]["character"])
        spans.append((min(a, b), max(a, b), e.get("newText", "")))
    out = text
    for a, b, new in sorted(spans, key=lambda s: s[0], reverse=True):
        out = out[:a] + new + out[b:]
    return out


def changed_blocks(old: list[str], new: list[str]) -> list[tuple[int, int, int, int]]:
    """Line blocks (i1, i2, j1, j2): old[i1:i2] became new[j1:j2] (difflib, after the common
    head and tail are cut off so that large files cost little)."""
    head, tail = common_ends(old, new)
    a, b = old[head : len(old) - tail], new[head : len(new) - tail]
    if not a and not b:
        return []
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def overlaps(a1: int, a2: int, b1: int, b2: int) -> bool:
    """Do line ranges [a1, a2) and [b1, b2) overlap? An empty range (an insertion point) overlaps
    what it touches: a range it lies inside or at the edge of."""
    if a1 == a2 and b1 == b2:
        return a1 == b1
    if a1 == a2:
        return b1 <= a1 <= b2
    if b1 == b2:
        return a1 <= b1 <= a2
    return a1 < b2 and b1 < a2


def inserted_chars(old: str, new: str) -> int:
    """Characters a user types to turn `old` into `new` (inserted or replacing, character diff)."""
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag in ("insert", "replace"))


def _deleted_kept(old_block: list[str], new_block: list[str], kept: list[bool]) -> tuple[int, int]:
    """(kept lines deleted, kept lines changed) in one block: a non-blank kept line is deleted when
    no unused new line of the block is similar to it (KEPT_LINE_SIMILAR), else rewritten."""
    changed = sum(1 for x, k in zip(old_block, kept) if k and x.strip())
    if len(old_block) > MAX_MATCH_LINES or len(new_block) > MAX_MATCH_LINES:
        return changed, changed
    free = [y.strip() for y in new_block]
    deleted = 0
    for x, k in zip(old_block, kept):
        if not (k and x.strip()):
            continue
        best, best_j = 0.0, -1
        for j, y in enumerate(free):
            if y is None:
                continue
            r = difflib.SequenceMatcher(None, x.strip(), y, autojunk=False).ratio()
            if r > best:
                best, best_j = r, j
        if best >= KEPT_LINE_SIMILAR:
            free[best_j] = None
        else:
            deleted += 1
    return deleted, changed


@dataclass
class Judgement:
    changes: bool = False  # the proposal changes the document at all
    location: bool = False
    exact: bool = False  # the next hunk, byte for byte
    exact_any: bool = False  # the remaining hunks it overlaps, byte for byte
    kept_deleted: int = 0  # non-blank kept lines removed with nothing similar in their place
    kept_changed: int = 0  # non-blank kept lines changed at all
    chars_saved: int = 0
    lines_removed: int = 0
    lines_added: int = 0


def judge(lines: list[str], edits: list[dict], remaining: list[Span]) -> Judgement:
    """Judge a proposal (LSP edits of the document `lines`) against the remaining hunks, the first
    of which is the next (module docstring: the definitions)."""
    text = "".join(lines)
    after = apply_edits(text, edits)
    j = Judgement()
    if after == text:
        return j
    j.changes = True
    new = git_lines(after)
    blocks = changed_blocks(lines, new)
    j.lines_removed = sum(i2 - i1 for i1, i2, _, _ in blocks)
    j.lines_added = sum(j2 - j1 for _, _, j1, j2 in blocks)
    hit = sorted({n for i1, i2, _, _ in blocks for n, s in enumerate(remaining) if overlaps(i1, i2, s.start, s.end)})
    j.location = bool(hit)
    if remaining:
        j.exact = after == apply_spans(lines, remaining[:1])
    if hit:
        j.exact_any = after == apply_spans(lines, [remaining[n] for n in hit])
    if j.exact_any:
        j.chars_saved = sum(inserted_chars("".join(lines[remaining[n].start : remaining[n].end]), remaining[n].add)
                            for n in hit)
    touched = [False] * (len(lines) + 1)
    for s in remaining:
        for i in range(s.start, s.end):
            touched[i] = True
    for i1, i2, j1, j2 in blocks:
        d, c = _deleted_kept(lines[i1:i2], new[j1:j2], [not touched[i] for i in range(i1, i2)])
        j.kept_deleted += d
        j.kept_changed += c
    return j


# ---- the replay ----------------------------------------------------------------------------------------


@dataclass
class Opportunity:
    split: str
    repo: str
    commit: str
    path: str
    step: int  # hunks applied before the request
    hunks: int
    cursor: tuple[int, int] = (0, 0)  # LSP position of the request
    latency_ms: float | None = None
    error: str = ""
    confidence: float | None = None
    rewrites_recent: bool = False
    edits: list = field(default_factory=list)
    judgement: Judgement = field(default_factory=Judgement)
    next_hunk: dict = field(default_factory=dict)  # the truth: the next hunk's lines and new text


class NextEditReplay(Bench):
    """`dlm-lsp bench`'s client and server handling, replaying EditRecords (and, for --git, the
    workspace advanced commit by commit)."""

    def __init__(self, args: argparse.Namespace, records: list[EditRecord],
                 workspace: ParentWorkspace | None = None, parents: dict[str, str] | None = None) -> None:
        super().__init__(args)
        self.records = records
        self.workspace = workspace
        self.parents = parents or {}
        self.results: list[Opportunity] = []
        self.index_status: dict | None = None

    def initialization_options(self) -> dict:
        # gate at 0 and edit predictions on: every proposal comes back with its confidence; the edit
        # memory's own gate (nextEdits.minConfidence, where the server has one; a server without it
        # logs the key and goes on) at 0 too, so its proposals are swept here like the model's
        return {"minConfidence": 0, "minConfidenceRewriteRecent": 0, "editPredictions": True,
                "nextEdits": {"minConfidence": 0}, "deadlineMs": self.args.deadline_ms}

    def root_uri(self) -> str | None:
        return self.workspace.root.as_uri() if self.workspace else None

    async def run(self):
        if self.workspace is None:
            return await super().run()
        if self.records:  # the server indexes the first parent from `initialize`
            self.workspace.advance(self.parents[self.records[0].commit])
        # the server persists what it learns of a root in XDG_CACHE_HOME: a cache of its own, removed with the
        # workspace, so that no run reads what an earlier one saw at a later commit, and the user's cache stays clean
        saved = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(self.workspace.cache)
        try:
            return await super().run()
        finally:
            if saved is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = saved

    async def _wait_ready(self, client, log_file: str) -> None:
        await super()._wait_ready(client, log_file)
        if self.workspace is None:
            return
        deadline = time.monotonic() + self.args.load_timeout
        while time.monotonic() < deadline:  # the workspace index at the first parent, like eval --repo
            index = (await request(client, "dlm/stats", {})).get("index") or {}
            if index.get("state") in ("ready", "failed", "off"):
                self.index_status = index
                return
            await asyncio.sleep(0.5)

    def uri(self, n: int, rec: EditRecord) -> str:
        if self.workspace is not None:
            return (self.workspace.root / rec.path).as_uri()
        return f"file:///eval-next-edits/{rec.repo.replace('/', '__')}/{n}/{rec.path}"

    async def _replay(self, client, types) -> None:
        for n, rec in enumerate(self.records):
            if self.workspace is not None:
                changed = self.workspace.advance(self.parents[rec.commit])
                if changed:  # what an editor's file watcher reports after a checkout
                    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
                        types.FileEvent(uri=(self.workspace.root / p).as_uri(), type=types.FileChangeType.Changed)
                        for p in changed]))
            await self._record(client, types, self.uri(n, rec), rec)
            if self.args.progress:
                print(f"dlm-lsp eval --next-edits: {len(self.results)} opportunities", file=sys.stderr)

    async def _record(self, client, types, uri: str, rec: EditRecord) -> None:
        text, version = rec.before, 1
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))
        last = time.monotonic()
        for k, (change, lines, (row, col), remaining) in enumerate(replay_steps(rec), start=1):
            gap = self.args.edit_gap_s - (time.monotonic() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            starts = line_offsets(text)
            a = starts[change[0]] if change[0] < len(starts) else len(text)
            b = starts[change[1]] if change[1] < len(starts) else len(text)
            version += 1
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(*position_of(text, starts, a)),
                                      types.Position(*position_of(text, starts, b))),
                    text=change[2])]))
            text = text[:a] + change[2] + text[b:]
            last = time.monotonic()
            if text != "".join(lines):
                raise RuntimeError(f"{rec.repo} {rec.commit[:12]} {rec.path}: the replayed document and the "
                                   "record's hunks disagree; the record is damaged")
            if k > rec.opportunities:
                continue  # typed, not asked about (replay_steps)
            line_text = lines[row].rstrip("\n") if row < len(lines) else ""
            cursor = (row, to_character(line_text, col))
            opp = Opportunity(rec.split, rec.repo, rec.commit, rec.path, k, len(rec.hunks), cursor)
            nxt = remaining[0]
            opp.next_hunk = {"line": nxt.start, "del": "".join(lines[nxt.start : nxt.end]), "add": nxt.add}
            t0 = time.monotonic()
            try:
                res = _plain(await client.protocol.send_request_async(
                    "dlm/editPrediction", {"textDocument": {"uri": uri},
                                           "position": {"line": cursor[0], "character": cursor[1]}}))
            except Exception as exc:  # noqa: BLE001 - an error answer is an answer with nothing shown
                res, opp.error = None, str(exc)[:300]
            opp.latency_ms = (time.monotonic() - t0) * 1000
            if isinstance(res, dict) and res.get("edits") and res.get("version", version) == version:
                opp.edits = res["edits"]
                opp.confidence = res.get("confidence")
                opp.rewrites_recent = bool(res.get("rewritesRecent"))
                opp.judgement = judge(lines, opp.edits, remaining)
            self.results.append(opp)
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


# ---- figures -------------------------------------------------------------------------------------------


def shown(o: Opportunity, threshold: float, rewrite_recent: float) -> bool:
    """Would the server's gate at `threshold` show this proposal (lsp.gate.decide, offline)?"""
    from dlm.lsp.gate import decide

    return o.judgement.changes and decide(
        o.confidence, o.rewrites_recent, False, threshold, max(threshold, rewrite_recent)).show


def _mean_ci(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n)
    return m, max(0.0, m - half), m + half


def _rate(k: int, n: int) -> dict:
    from dlm.drivers.evaluation.repo_cases import wilson  # the one interval of the project's figures

    return {"k": k, "n": n, "rate": k / n if n else None, "ci": list(wilson(k, n)) if n else None}


def summarize_rows(opps: list[Opportunity], thresholds: list[float], rewrite_recent: float) -> list[dict]:
    rows = []
    for t in thresholds:
        s = [o for o in opps if shown(o, t, rewrite_recent)]
        lat = sorted(o.latency_ms for o in s if o.latency_ms is not None)
        saved = [float(o.judgement.chars_saved) if o in s else 0.0 for o in opps]
        m, lo, hi = _mean_ci(saved)
        rows.append({
            "threshold": t, "opportunities": len(opps),
            "shown": _rate(len(s), len(opps)),
            "location": _rate(sum(o.judgement.location for o in s), len(s)),
            "exact": _rate(sum(o.judgement.exact for o in s), len(s)),
            "exact_any": _rate(sum(o.judgement.exact_any for o in s), len(s)),
            "deletes_kept": _rate(sum(o.judgement.kept_deleted > 0 for o in s), len(s)),
            "changes_kept": _rate(sum(o.judgement.kept_changed > 0 for o in s), len(s)),
            "chars_saved_per_opportunity": {"mean": m, "ci": [lo, hi]},
            "chars_saved": int(sum(saved)),
            "latency_shown": {"p50_ms": percentile(lat, 50) if lat else None,
                              "p99_ms": percentile(lat, 99) if lat else None},
        })  # fmt: skip
    return rows


def meets_targets(row: dict) -> bool:
    r = lambda k: row[k]["rate"]
    return (row["shown"]["rate"] or 0) >= TARGET_SHOWN and r("exact") is not None and r("exact") >= TARGET_EXACT \
        and r("location") >= TARGET_LOCATION and r("deletes_kept") <= TARGET_DELETES_KEPT


def summarize(opps: list[Opportunity], thresholds: list[float], rewrite_recent: float) -> dict:
    rows = summarize_rows(opps, thresholds, rewrite_recent)
    chosen = next((r["threshold"] for r in rows if meets_targets(r)), None)
    at = chosen if chosen is not None else min(thresholds)
    groups: dict[tuple[str, int, str], list[Opportunity]] = {}  # each split's row, then its repositories'
    for o in opps:
        groups.setdefault((o.split, 0, "split"), []).append(o)
        groups.setdefault((o.split, 1, o.repo), []).append(o)
    lat = sorted(o.latency_ms for o in opps if o.latency_ms is not None)
    return {
        "rows": rows, "target_threshold": chosen, "groups_at": at,
        "groups": [{"kind": "split" if level == 0 else "repo", "name": split if level == 0 else f"{split}: {name}",
                    **summarize_rows(g, [at], rewrite_recent)[0]} for (split, level, name), g in sorted(groups.items())],
        "latency": {"requests": len(lat), "p50_ms": percentile(lat, 50) if lat else None,
                    "p99_ms": percentile(lat, 99) if lat else None},
        "errors": sum(1 for o in opps if o.error), "rewrite_recent": rewrite_recent,
    }  # fmt: skip


def _pct(rate: dict, ci: bool = True) -> str:
    if rate["rate"] is None:
        return "-"
    out = f"{100 * rate['rate']:.1f}%"
    if ci:
        lo, hi = rate["ci"]
        out += f" ({100 * lo:.0f}-{100 * hi:.0f})"
    return out


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _row(first: str, r: dict) -> str:
    c = r["chars_saved_per_opportunity"]
    return (f"| {first} | {r['shown']['k']} of {r['opportunities']}: {_pct(r['shown'])} | {_pct(r['location'])} | "
            f"{_pct(r['exact'])} | {_pct(r['exact_any'])} | {_pct(r['deletes_kept'])} | {_pct(r['changes_kept'], False)} | "
            f"{c['mean']:.2f} ({c['ci'][0]:.2f}-{c['ci'][1]:.2f}) | {_ms(r['latency_shown']['p50_ms'])} / "
            f"{_ms(r['latency_shown']['p99_ms'])} |")


HEAD_COLUMNS = ("shown (of opportunities) | location | exact (next hunk) | exact (any remaining) | deletes kept lines "
                "| changes kept lines | chars saved / opportunity | shown latency p50 / p99 ms |")


def render_markdown(s: dict, meta: dict) -> str:
    lat = s["latency"]
    head = (f"`dlm-lsp eval --next-edits {meta.get('material', '')}` — {meta.get('model') or 'model'} on "
            f"{meta.get('device') or '?'}, {meta.get('date', '')}; {s['rows'][0]['opportunities'] if s['rows'] else 0} "
            f"opportunities from {meta.get('records', 0)} records; dlm/editPrediction latency p50 / p99 "
            f"{_ms(lat['p50_ms'])} / {_ms(lat['p99_ms'])} ms over {lat['requests']} requests ({s['errors']} errors); "
            f"rewrite-recent threshold {s['rewrite_recent']}; 95% intervals in parentheses")
    out = [head, "", "| min confidence | " + HEAD_COLUMNS, "| --- " * 9 + "|"]
    out += [_row(f"{r['threshold']:g}", r) for r in s["rows"]]
    chosen = s["target_threshold"]
    out += ["", ("lowest threshold that meets the Targets (shown >= 15%, exact >= 50%, location >= 70%, deletes kept "
                 f"lines <= 5%): {chosen if chosen is not None else 'none'}"), "",
            f"At min confidence {s['groups_at']:g}:", "", "| split / repository | " + HEAD_COLUMNS, "| --- " * 9 + "|"]
    out += [_row(("**" + g["name"] + "**") if g["kind"] == "split" else g["name"], g) for g in s["groups"]]
    return "\n".join(out) + "\n"


def write_plot(s: dict, latencies: list[float], path: Path) -> None:
    """location and exact precision against the shown share per threshold, and the latency CDF (eval's figure)."""
    from dlm.drivers.evaluation.eval_typing import (
        coverage_latency_plot,  # here: drivers.evaluation.eval_typing imports this module
    )

    rows = [r for r in s["rows"] if r["location"]["rate"] is not None]
    coverage_latency_plot(
        path, [r["threshold"] for r in rows], [r["shown"]["rate"] for r in rows],
        [("location", "o-", [r["location"]["rate"] for r in rows]),
         ("exact (next hunk)", "s--", [r["exact"]["rate"] for r in rows]),
         ("deletes kept lines", "x:", [r["deletes_kept"]["rate"] for r in rows])], latencies,
        x_label="share of next-edit opportunities shown", y_label="share of what is shown",
        title="next edits: precision vs coverage (labels: min confidence)",
        latency_label="dlm/editPrediction request -> answer (ms)", latency_share="share of requests")


# ---- the command -----------------------------------------------------------------------------------------


def _splits(args) -> list[str]:
    if args.split is None:
        return [] if args.git else ["valid"]
    out = [s.strip() for s in args.split.split(",") if s.strip()]
    bad = [s for s in out if s not in ("valid", "test")]
    if bad or not out:
        raise SystemExit(f"dlm-lsp eval --next-edits: --split {args.split!r}: use valid (tuning), test (the held-out "
                         "figure, never for tuning) or valid,test")
    return out


def read_records(path: str) -> list[Opportunity]:
    """Opportunities back from a --records file (to report other thresholds without a replay)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                d = json.loads(line)
                d["cursor"] = tuple(d["cursor"])
                d["judgement"] = Judgement(**d["judgement"])
                out.append(Opportunity(**d))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"dlm-lsp eval --next-edits: --from-records {path}: not a --records file of this version "
                         f"({type(exc).__name__}: {exc}); write one with --records FILE") from None
    return out


def report(opps: list[Opportunity], thresholds: list[float], args: argparse.Namespace, meta: dict) -> None:
    summary = summarize(opps, thresholds, args.rewrite_recent)
    md = render_markdown(summary, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval-edits.md").write_text(md, encoding="utf-8")
    (out / "eval-edits.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1, default=str))
    wrote = [out / "eval-edits.md", out / "eval-edits.json"]
    if args.records and not args.from_records:
        with open(args.records, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(asdict(o)) + "\n" for o in opps)
        wrote.append(Path(args.records))
    if not args.no_plot:
        write_plot(summary, [o.latency_ms for o in opps if o.latency_ms is not None], out / "eval-edits.png")
        wrote.append(out / "eval-edits.png")
    print(md)
    print("wrote " + ", ".join(str(w) for w in wrote))


SESSIONS = ("repository", "commit")
SERVER_COUNTS = ("model_runs", "completed", "cancelled", "late")


def sessions(records: list[EditRecord], session: str) -> list[list[EditRecord]]:
    """The records each server process replays (in replay order): what the server learns from edits (its
    history, an edit memory) lasts one session, so no pattern of one project is proposed in another.
    `repository`: one server per split and repository, its commits oldest first (what it remembers is
    the project's past); `commit`: one per commit (only that commit's own earlier edits)."""
    if session not in SESSIONS:
        raise SystemExit(f"dlm-lsp eval --next-edits: --session {session!r}: use one of {', '.join(SESSIONS)}")
    out: dict[tuple, list[EditRecord]] = {}
    for r in records:
        key = (r.split, r.repo) if session == "repository" else (r.split, r.repo, r.date, r.commit)
        out.setdefault(key, []).append(r)
    return list(out.values())


def run_next_edits(args: argparse.Namespace, thresholds: list[float]) -> int:
    if args.from_records:
        opps = read_records(args.from_records)
        if not opps:
            raise SystemExit(f"dlm-lsp eval --next-edits: --from-records {args.from_records} holds no opportunities")
        material = " ".join(f"--split {s}" if s != "git" else "--git" for s in sorted({o.split for o in opps}))
        report(opps, thresholds, args, {"material": f"{material} --from-records {Path(args.from_records).name}",
                                        "model": "(replayed earlier)", "device": "-",
                                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        "records": len({(o.commit, o.path) for o in opps}), "opportunities": len(opps)})
        return 0
    cases = args.cases if args.cases is not None else DEFAULT_CASES
    jobs = args.jobs
    if cases < 1 or args.edit_gap_s < 0 or args.deadline_ms < 1 or args.git_commits < 1 or jobs < 1:
        raise SystemExit("dlm-lsp eval --next-edits: --cases, --git-commits, --deadline-ms and --jobs must be >= 1 "
                         "and --edit-gap-s >= 0")
    splits = _splits(args)
    records: list[EditRecord] = []
    material = []
    for split in splits:
        try:
            got = dataset_records(split, args.edit_histories)
        except FileNotFoundError as exc:
            raise SystemExit(f"dlm-lsp eval --next-edits: {exc}") from None
        records += select_records(got, cases, args.seed)
        material.append(f"--split {split}")
    workspace, parents, git_records = None, {}, []
    if args.git:
        repo = Path(args.git)
        if not (repo / ".git").exists() and not (repo / "HEAD").exists():
            raise SystemExit(f"dlm-lsp eval --next-edits: --git {repo} is not a git repository; pass a clone's folder")
        left = cases
        for parent, commit, date in git_history(repo, args.git_commits):
            if left <= 0:
                break
            for rec in git_commit_records(repo, parent, commit, date):
                if left <= 0 or not usable(rec):
                    continue
                if rec.opportunities > left:
                    rec.max_steps = left
                git_records.append(rec)
                parents[commit] = parent
                left -= rec.opportunities
        if not git_records:
            raise SystemExit(f"dlm-lsp eval --next-edits: the last {args.git_commits} commits of {repo} change no "
                             "Python file in 2 or more hunks; raise --git-commits")
        material.append(f"--git {repo.resolve().name}")
    if not records and not git_records:
        raise SystemExit("dlm-lsp eval --next-edits: no records with 2 or more hunks; pass --edit-histories DIR "
                         "(edit-history *.jsonl.gz records) or --git REPO")
    t0 = time.monotonic()
    opps: list[Opportunity] = []
    status: dict = {}
    server: dict = {}
    index_status = None
    server_runs = 0

    def replay_session(session: list[EditRecord]):
        replay = NextEditReplay(args, session)  # its own server, and its own event loop in this thread
        res = asyncio.run(replay.run())
        return replay.results, res

    # sessions share nothing (a server each), so --jobs replays them side by side; map keeps their order
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(replay_session, sessions(records, args.session)))
    for results, res in done:
        opps += results
        server_runs += 1
        status = res.status or status
        server = {k: (server.get(k) or 0) + (res.server.get(k) or 0) for k in SERVER_COUNTS}
    if git_records:
        workspace = ParentWorkspace(Path(args.git))
        try:
            replay = NextEditReplay(args, git_records, workspace, parents)
            res = asyncio.run(replay.run())
            opps += replay.results
            server_runs += 1
            status, index_status = res.status or status, replay.index_status
            server = {k: (server.get(k) or 0) + (res.server.get(k) or 0) for k in SERVER_COUNTS}
        finally:
            workspace.close()
    meta = {"model": status.get("model", ""), "device": status.get("device", ""),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "material": " ".join(material),
            "records": len(records) + len(git_records), "opportunities": len(opps), "seed": args.seed, "jobs": jobs,
            "edit_gap_s": args.edit_gap_s, "deadline_ms": args.deadline_ms, "wall_s": round(time.monotonic() - t0, 1),
            "index": index_status, "session": args.session, "server_runs": server_runs, "server": server}
    report(opps, thresholds, args, meta)
    return 0

