"""Next edits from the edit memory (coder_model.edit_memory; docs/next-edits.md).

The server feeds every applied change to `record` (per document, a BurstTracker groups
changes into edits; a closed edit's patterns go into the one server-wide EditMemory, so
an edit in one buffer proposes in the others). `start` mines each workspace root's git
history up to HEAD for support, in the background. Each function gets an `EditContext`, the
server's parts the edit memory uses (built once by lsp.server). `propose` answers dlm/editPrediction:

1. the open edit's patterns (peeked, not remembered until it closes) and the newest
   remembered ones find their sites in this document, ranked by their calibrated confidence
   (coder_model.edit_memory.edit_calibration; on a pool thread, the document's lines copied on
   the event loop first); with `nextEdits.checkWithModel` off (the default) the best one at
   `nextEdits.minConfidence` or above is the answer;
2. with `checkWithModel` on, the denoiser checks the best `checked` proposals, best first: the site's line is the
   region with the span the pattern replaces taken out, the cursor where it was, the
   pattern's edit as the newest history event, and the pattern's text as the one proposal
   (coder_model.verify, like the repository memory's): the answer is the region with the
   proposal or unchanged (vetoed); the confidence mixes the memory's support and the
   model's probability of the edit. Below `nextEdits.minConfidence`, nothing is shown;
3. a proposal is sent only if the document is still at the version it was computed for,
   and the span it replaces still holds the text the pattern covers: it never changes
   user text outside that span.
4. no proposal passed in this document: the same patterns (made at least JUMP_MIN_APPLIED times)
   are looked for in the other open
   documents, then in the workspace's indexed files (read from disk), at most
   `nextEdits.otherFiles` files within the request's deadline; the first file with a proposal
   over the gate is answered as a jump to its best site, with no edits (`jump: {uri, path,
   position, label}`). The scan judges a site by the trees fitted on jumps (edit_memory.edit_calibration,
   `elsewhere`). The client opens the file there, and asks again: the edit itself is then
   proposed in that document, at the jump's confidence or above (`Landing`). The scan runs on the
   pool and is kept while the patterns stay the same.

An accepted next edit counts as a repetition of its pattern, as the same edit made again by hand
does: the client sends `dlm/acceptedEdit {id}` right before it applies the proposal's edits
(`accepted_edit`), and that edit becomes one edit of its own (the user's open edit is closed first,
the accepted one as soon as the document holds it). Else a site accepted within the burst
tracker's pause and gap of the user's own edit would join that edit: the pattern would count as
made once, and its other sites would wait for a second rename by hand (an ambiguous rename is
systematic only from the second time, and the calibrated confidence grows with the count).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlm.coder_model import limits
from dlm.coder_model.edit_memory import BurstTracker, EditMemory, GitMiner, Proposal, key_text, span_text
from dlm.coder_model.types import CancelToken, MemoryProposal, Prompt, traits_of
from dlm.lsp import discovery
from dlm.lsp.convert import param
from dlm.lsp.documents import Document
from dlm.lsp.server_context import ServerContext
from dlm.lsp.workspace_index import file_path

log = logging.getLogger(__name__)

WINDOW_LINES = 60  # lines of prefix and suffix around a site given to the model (then cut by the windows)
# How long a scan of the other files is reused while the patterns stay the same (files change
# on disk meanwhile; the answer's site is checked again each time it is sent).
ELSEWHERE_TTL_S = 10.0
# The longest one scan of the other files runs, once they are ordered (within the request's deadline
# too): the nearest files are looked at first, so a large workspace costs a request about this much.
ELSEWHERE_SCAN_S = 0.15
# A jump to another file only for an edit the user has made at least this often (by hand or by
# accepting it): one rename of a local name says little about the same name in another file, and
# sending the user to another file costs more than a proposal in place.
JUMP_MIN_APPLIED = 2
# The client's report that it applies a next edit (see the module doc): the in-document proposals
# answered last are kept by id for it, at most this many (a client accepts one it just showed).
ACCEPTED_EDIT = "dlm/acceptedEdit"
MAX_ANSWERED = 32


@dataclass
class Elsewhere:
    """The last scan of the other files: for which document and patterns, when, and its best
    proposal ((uri, proposal), or None)."""

    key: tuple
    at: float
    found: tuple[str, Proposal] | None


@dataclass
class Landing:
    """The last jump answered: its file, its site (the pattern's key, line, column) and confidence.
    When the client opens the file there and asks again, that site is the same proposal and keeps
    the jump's confidence: the scan's confidence comes from the trees fitted on jumps (`elsewhere`,
    edit_memory.edit_calibration), the in-document one from the trees fitted on next edits in a file
    (`here`), and the two may disagree about one site; a jump that leads to nothing shown would be
    the worst of both."""

    uri: str
    site: tuple
    confidence: float

    def apply(self, uri: str, found: list[Proposal]) -> list[Proposal]:
        """`found` (best first) with the jump's site at the jump's confidence, when it is there."""
        if uri != self.uri:
            return found
        out = [replace(p, support=max(p.support, self.confidence)) if self.holds(uri, p) else p for p in found]
        return sorted(out, key=lambda p: -p.support)  # stable: the memory's order among equals

    def holds(self, uri: str, p: Proposal) -> bool:
        """`p` is the jump's site: it passes the jump's gate (nextEdits.minConfidenceJump), the one
        that let the jump through, not the document's."""
        return uri == self.uri and _site_key(p) == self.site


@dataclass
class Answered:
    """An in-document proposal as answered: its document, the version its ranges are for, its sites."""

    uri: str
    version: int
    sites: tuple


@dataclass
class Accepting:
    """An accepted next edit the client is applying: the document's text once it is applied, and
    how many more changes may come before it is (then it is no longer waited for)."""

    expected: str
    changes_left: int


def _site_key(p: Proposal) -> tuple:
    return (p.pattern.key, p.site.line, p.site.start)


class NextEdits:
    """The server's edit memory and one burst tracker per open document."""

    def __init__(self) -> None:
        self.memory = EditMemory()
        self.trackers: dict[str, BurstTracker] = {}
        self.miners: dict[str, GitMiner] = {}
        # uri -> (the document, its path) of each tracker: an open edit is closed from its lines when
        # the user edits another document or closes this one (else the last edit of a file, the one
        # a user carries to the next file, was never remembered)
        self.documents: dict[str, tuple[Document, str]] = {}
        self.elsewhere: Elsewhere | None = None  # the last scan of the other files (propose_elsewhere)
        self.landing: Landing | None = None  # the last jump answered (propose_elsewhere)
        self.answered: OrderedDict[str, Answered] = OrderedDict()  # id -> in-document proposal (result)
        self.accepting: dict[str, Accepting] = {}  # uri -> the accepted edit being applied (accepted_edit)

    def close(self) -> None:
        """Stop every git miner (its process group is killed): nothing of a server outlives its shutdown."""
        for miner in self.miners.values():
            try:
                miner.close()
            except Exception:  # shutdown goes on; the miner's child dies with the server anyway
                log.debug("closing a git miner failed", exc_info=True)
        self.miners.clear()

    def configure(self, opts) -> None:
        self.memory.max_patterns = opts.max_patterns
        self.memory.max_edit_lines = opts.max_edit_lines
        for t in self.trackers.values():
            t.max_lines = opts.max_edit_lines

    def tracker(self, uri: str, max_lines: int, idle_s: float) -> BurstTracker:
        t = self.trackers.get(uri)
        if t is None:
            t = self.trackers[uri] = BurstTracker(idle_s=idle_s, max_lines=max_lines)
        return t

    def forget(self, uri: str) -> None:
        """The document is closed (or re-opened): its open edit is closed and remembered."""
        self.close_open_edit(uri)
        self.trackers.pop(uri, None)
        self.documents.pop(uri, None)
        self.accepting.pop(uri, None)
        for item in [k for k, a in self.answered.items() if a.uri == uri]:
            del self.answered[item]  # a re-open may reuse a version number: its ranges mean nothing

    def close_open_edit(self, uri: str) -> None:
        tracker, (doc, path) = self.trackers.get(uri), self.documents.get(uri, (None, ""))
        if tracker is None or tracker.open is None:
            return
        try:
            edit = tracker.peek(doc.lines) if doc is not None else None
            tracker.reset()
            if edit is not None:
                self.memory.observe(path, edit, doc.lines)
        except Exception:  # the memory must never cost a keystroke
            log.exception("edit memory: could not close the open edit of %s", uri)

    def close_others(self, uri: str) -> None:
        """A change in `uri`: the open edits of the other documents are finished."""
        for other, tracker in list(self.trackers.items()):
            if other != uri and tracker.open is not None:
                self.close_open_edit(other)


@dataclass(frozen=True)
class EditContext(ServerContext):
    """The server's context (lsp.server_context) and the edit memory it serves."""

    next_edits: NextEdits | None = None


def start(ctx: EditContext, roots: list[str]) -> None:
    """Mine each root's git history (up to its HEAD now) in the background, once per root."""
    opts = ctx.options.next_edits
    if not (ctx.options.edit_predictions and opts.enabled) or opts.git_commits <= 0:
        return
    ne = ctx.next_edits
    for root in roots:
        if root not in ne.miners:
            ne.miners[root] = GitMiner(root, ne.memory.learn_git, max_commits=opts.git_commits).start()


def record(ctx: EditContext, doc: Document, change) -> None:
    """An applied change of `doc` (lsp.documents.Change): a closed edit's patterns are remembered."""
    opts = ctx.options.next_edits
    if not (ctx.options.edit_predictions and opts.enabled):
        return
    try:
        # a pause of history.idleS ends an edit, as it ends an edit event of the history (lsp.history)
        ne = ctx.next_edits
        ne.close_others(doc.uri)
        tracker = ne.tracker(doc.uri, opts.max_edit_lines, ctx.options.history.idle_s)
        ne.documents[doc.uri] = (doc, ctx.path_of(doc.uri))
        for edit in tracker.after_change(change, doc.lines):
            # the change that closed the edit is in doc.lines already: its lines are not looked at
            skip = (change.start_line, change.new_end_line + 1)
            ctx.next_edits.memory.observe(ctx.path_of(doc.uri), edit, doc.lines, skip)
        acc = ne.accepting.get(doc.uri)
        if acc is not None:
            acc.changes_left -= 1
            if doc.size == len(acc.expected) and doc.text == acc.expected:
                ne.close_open_edit(doc.uri)  # the accepted edit is in: one edit, whatever comes next
                del ne.accepting[doc.uri]
            elif acc.changes_left <= 0:
                del ne.accepting[doc.uri]  # applied otherwise: its burst closes as any other does
    except Exception:  # the memory must never cost a keystroke
        log.exception("edit memory: could not record a change of %s", doc.uri)
        ctx.next_edits.trackers.pop(doc.uri, None)
        ctx.next_edits.documents.pop(doc.uri, None)


def _pending(ctx: EditContext, doc: Document, path: str, lines: list[str]) -> tuple[list, bool]:
    """The open edit's patterns, and whether an edit is open (the newest edit: the memory counts
    the closed ones as one edit older); an open edit that undoes a remembered pattern forgets it."""
    tracker = ctx.next_edits.trackers.get(doc.uri)
    edit = tracker.peek(lines) if tracker is not None else None
    if edit is None:
        return [], False
    memory = ctx.next_edits.memory
    entries = memory.entries_of(path, edit, lines)
    if memory.undone_by(entries):
        memory.observe(path, edit, lines)  # forgets what it reverts, remembers nothing
        tracker.reset()
        return [], False
    return [e for e in entries if e.pattern.kind != "delete_line"], True


def region_of(doc_lines: list[str], p: Proposal) -> tuple[str, int, str]:
    """The site's lines (one, or a block pattern's) with the replaced span taken out, the cursor
    there, and the lines' text after the edit."""
    s = p.site
    first, last = s.line, max(s.line + 1, s.last_line if s.end_line >= 0 else s.line + 1)
    text = "".join(doc_lines[first:last]) if s.end_line >= 0 else doc_lines[s.line]
    end = s.end if s.end_line < 0 else len("".join(doc_lines[first : s.end_line])) + s.end
    return text[: s.start] + text[end:], s.start, text[: s.start] + s.new_text + text[end:]


def check_prompt(doc: Document, lines: list[str], p: Proposal, path: str, windows) -> Prompt:
    """The denoiser's view of a proposal (module doc, step 2)."""
    region, cursor, _ = region_of(lines, p)
    row = p.site.line
    prefix = "".join(lines[max(0, row - WINDOW_LINES) : row])[-windows.prefix_chars :] if windows.prefix_chars else ""
    suffix = "".join(lines[row + 1 : row + 1 + WINDOW_LINES])[: windows.suffix_chars]
    history: tuple[str, ...] = ()
    if doc.history is not None:
        history = doc.history.rendered(windows.history_chars)
    history = tuple(h for h in history if h != p.event) + (p.event,)  # the pattern's edit, newest
    prompt = Prompt(prefix=prefix, region=region, cursor=cursor, suffix=suffix, history=history,
                    language=doc.language_id, path=path,
                    proposals=(MemoryProposal(p.site.new_text, p.support),))
    return limits.bound_fields(prompt)


async def check(ctx: EditContext, prompt: Prompt, expected: str, deadline: float) -> float | None:
    """The model's verdict on one proposal: its confidence, or None (vetoed, late, refused)."""
    if not ctx.holder.ready():
        return None
    engine = ctx.holder.engine
    if traits_of(engine).hosted:  # a hosted engine has no probability to check it with: the
        return prompt.proposals[0].score  # memory's own confidence stands, and nothing leaves the machine
    params = replace(ctx.sampler_params(), veto=ctx.options.next_edits.veto)
    cancel = CancelToken()
    fut = engine.submit(prompt, params, cancel, deadline)
    try:
        pred = await asyncio.wait_for(asyncio.wrap_future(fut), max(0.05, deadline - time.monotonic() + 1.0))
    except (ValueError, asyncio.TimeoutError):
        cancel.cancel()
        return None
    if pred.cancelled or pred.late or pred.text != expected:
        return None
    return pred.confidence if pred.confidence is not None else prompt.proposals[0].score


async def propose(ctx: EditContext, doc: Document, row: int, col: int) -> dict | None:
    """The dlm/editPrediction result from the edit memory, or None (no proposal passed)."""
    opts = ctx.options.next_edits
    t0 = time.monotonic()
    uri, version, path = doc.uri, doc.version, ctx.path_of(doc.uri)
    lines = list(doc.lines)  # a snapshot: the document changes on the event loop meanwhile
    # asked about this document, the user is here: an edit still open in another one (the edit a
    # jump to this file came from) is finished, and its patterns propose here
    ctx.next_edits.close_others(uri)
    pending, open_edit = _pending(ctx, doc, path, lines)
    memory = ctx.next_edits.memory
    if not pending and not memory.patterns():
        return None
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(
        ctx.pool, lambda: memory.propose(path, lines, row, pending=pending, max_scan=opts.max_scan_lines,
                                        limit=opts.max_proposals, open_edit=open_edit))
    ctx.stats.stage("next_edit_sites_ms", (time.monotonic() - t0) * 1000)
    if ctx.next_edits.landing is not None:
        found = ctx.next_edits.landing.apply(uri, found)
    chosen: tuple[Proposal, float] | None = None
    deadline = t0 + opts.deadline_ms / 1000.0
    windows = ctx.windows(ctx.holder.engine.budget) if ctx.holder.ready() else None
    for p in found[: opts.checked]:
        if p.support < 1e-6:
            continue
        if not opts.check_with_model or windows is None:
            if opts.check_with_model:
                break  # the model is not loaded: nothing is shown unchecked
            conf: float | None = p.support
        else:
            prompt = check_prompt(doc, lines, p, path, windows)
            conf = await check(ctx, prompt, region_of(lines, p)[2], deadline)
        landed = ctx.next_edits.landing is not None and ctx.next_edits.landing.holds(uri, p)
        if conf is not None and conf >= (opts.min_confidence_jump if landed else opts.min_confidence):
            chosen = (p, conf)
            break
    if chosen is None:
        if ctx.documents.get(uri) is not doc or doc.version != version:
            return None
        return await propose_elsewhere(ctx, doc, pending, open_edit, deadline)
    if ctx.documents.get(uri) is not doc or doc.version != version:
        ctx.stats.add("outdated")  # the file changed while the proposal was computed: dropped
        return None
    p, conf = chosen
    if any(span_text(doc.lines, s) != s.old_text for s in p.sites):
        return None  # never replace text the pattern does not cover
    return result(ctx, doc, p, conf, row)


def site_range(doc: Document, s) -> dict:
    start, end = doc.to_position(s.line, s.start), doc.to_position(s.last_line, s.end)
    return {"start": {"line": start[0], "character": start[1]}, "end": {"line": end[0], "character": end[1]}}


def result(ctx: EditContext, doc: Document, p: Proposal, confidence: float, row: int) -> dict:
    """The dlm/editPrediction result: one edit per site of the proposal's block, in order."""
    edits = [{"range": site_range(doc, s), "newText": s.new_text} for s in p.sites]
    out: dict[str, Any] = {
        "id": ctx.next_id(), "version": doc.version, "edits": edits,
        "confidence": confidence, "rewritesRecent": False,
        "source": "editMemory", "label": p.pattern.label(),
    }
    answered = ctx.next_edits.answered
    answered[out["id"]] = Answered(doc.uri, doc.version, p.sites)
    while len(answered) > MAX_ANSWERED:
        answered.popitem(last=False)
    first = p.sites[0]
    if min(abs(s.line - row) for s in p.sites) > ctx.options.next_edits.jump_lines:
        # far from the cursor: the client shows a "jump to" hint first (docs/next-edits.md)
        out["jump"] = {"position": edits[0]["range"]["start"], "lines": first.line - row, "label": p.pattern.label()}
    return out


def accepted_edit(ctx: EditContext, params: Any) -> None:
    """`dlm/acceptedEdit {id, textDocument?}`: the client applies the in-document next edit `id`
    now (sent right before the edit's didChange; see the module doc). The document's open edit, the
    user's own, is closed and remembered, and the accepted edit is closed once the document holds it:
    the edit memory then sees the accepted site as the pattern applied once more, exactly as it
    sees the same edit made again by hand. Ignored when the id is not a proposal answered here, was
    reported already, or the document is no longer at the proposal's version with its sites intact
    (the client applied it before telling: its change is then a burst like any other)."""
    opts = ctx.options.next_edits
    if not (ctx.options.edit_predictions and opts.enabled):
        return
    item = param(params, "id")
    key = str(item) if isinstance(item, (str, int)) and not isinstance(item, bool) else None
    ne = ctx.next_edits
    answer = ne.answered.pop(key, None) if key is not None else None
    if answer is None:
        log.debug("%s for an id that is no next edit answered here (%.40r); ignored", ACCEPTED_EDIT, item)
        return
    doc = ctx.documents.get(answer.uri)
    if doc is None or doc.version != answer.version or any(span_text(doc.lines, s) != s.old_text
                                                           for s in answer.sites):
        log.debug("%s %s: the document changed since the proposal; not counted as a repetition",
                  ACCEPTED_EDIT, key)
        return
    try:
        ne.close_others(doc.uri)
        ne.close_open_edit(doc.uri)
        ne.accepting[doc.uri] = Accepting(applied_text(doc.lines, answer.sites), 2 * len(answer.sites) + 2)
    except Exception:  # the memory must never cost the server
        log.exception("edit memory: could not take the accepted edit %s of %s", key, doc.uri)


def applied_text(lines: list[str], sites) -> str:
    """The text of `lines` with each site's span replaced by its new text (sites not overlapping)."""
    starts = [0]
    for x in lines:
        starts.append(starts[-1] + len(x))
    text = "".join(lines)
    for s in sorted(sites, key=lambda s: (s.line, s.start), reverse=True):
        a, b = starts[s.line] + s.start, starts[s.last_line] + s.end
        text = text[:a] + s.new_text + text[b:]
    return text


# ---- a jump to another file (module doc, step 4) ----------------------------------------------


async def propose_elsewhere(ctx: EditContext, doc: Document, pending: list, open_edit: bool,
                            deadline: float) -> dict | None:
    """A proposal over the gate in another file (the first one found, nearest first), as a jump to
    it; None when there is none."""
    opts = ctx.options.next_edits
    if opts.other_files <= 0:
        return None
    ne = ctx.next_edits
    live = ne.memory.live_patterns(pending, open_edit)
    if not any(ne.memory.applied(e) >= JUMP_MIN_APPLIED for e in live):
        return None  # no edit made twice: no jump, whatever a scan would find
    key = (doc.uri, tuple((e.pattern.key, e.count, e.seq) for e in live))
    now = time.monotonic()
    if ne.elsewhere is None or ne.elsewhere.key != key or now - ne.elsewhere.at > ELSEWHERE_TTL_S:
        opened = [(d.uri, list(d.lines)) for d in ctx.documents if d.uri != doc.uri]  # snapshots, on the loop
        needles = [k for k in (key_text(e.pattern) for e in live) if k]
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(
            ctx.pool, lambda: scan_elsewhere(ctx, doc.uri, opened, needles, pending, open_edit, deadline))
        ne.elsewhere = Elsewhere(key, now, found)
    if ne.elsewhere.found is None:
        return None
    target, p = ne.elsewhere.found
    there = current(ctx, target)
    if there is None or any(span_text(there.lines, s) != s.old_text for s in p.sites):
        ne.elsewhere = None  # edited or gone since the scan: scan again next time
        return None
    row, col = there.to_position(p.site.line, p.site.start)
    ctx.stats.add("jump_elsewhere")
    ne.landing = Landing(target, _site_key(p), p.support)
    return {"id": ctx.next_id(), "version": doc.version, "edits": [], "confidence": p.support,
            "rewritesRecent": False, "source": "editMemory", "label": p.pattern.label(),
            "jump": {"uri": target, "path": ctx.path_of(target), "position": {"line": row, "character": col},
                     "label": p.pattern.label()}}


def nearest_files(ctx: EditContext, uri: str, skip: set[str]) -> list[str]:
    """The workspace's indexed files but `skip`, nearest `uri`'s folder first: by the folders
    between the two (up to the common one, then down), then by path."""
    here = file_path(uri) or ""
    return sorted((f for f in ctx.workspace_index.indexed_files() if f not in skip),
                  key=lambda f: (folders_between(here, f), f))


def folders_between(a: str, b: str) -> int:
    """Folders from file a's up to the one the two share, then down to file b's."""
    here, there = a.split("/")[:-1], b.split("/")[:-1]
    common = 0
    for x, y in zip(here, there):
        if x != y:
            break
        common += 1
    return (len(here) - common) + (len(there) - common)


def scan_elsewhere(ctx: EditContext, uri: str, opened: list[tuple[str, list[str]]], needles: list[str],
                   pending: list, open_edit: bool, deadline: float) -> tuple[str, Proposal] | None:
    """On the pool: the first file, in order, with a proposal at `nextEdits.minConfidenceJump` or
    above (that file's best): the other open documents (`opened`: snapshots), then the indexed
    files nearest `uri`, at most `nextEdits.otherFiles` files, until the deadline. A file on disk
    is read only when it holds one of the patterns' key texts (`needles`).

    A jump leads only to a file the index takes (WorkspaceIndex.accepts: inside a root, not ignored,
    not a secret, no link on the way) that `discovery.read_workspace_file` reads (a regular file,
    never a FIFO or a device, within `index.maxFileBytes`): an open document too, whose editor
    may have opened any file."""
    opts = ctx.options.next_edits
    memory = ctx.next_edits.memory
    workspace = ctx.workspace_index
    max_bytes = ctx.options.index.max_file_bytes
    stacks: dict = {}  # each root's ignore rules, read once for this scan (never the indexer's own)
    skip = {file_path(u) or u for u, _ in opened} | {file_path(uri) or uri}
    open_uris = {u for u, _ in opened}
    sources: list[tuple[str, list[str] | None]] = list(opened)
    if len(sources) < opts.other_files:
        files = nearest_files(ctx, uri, skip)[: opts.other_files - len(sources)]
        sources.extend((Path(f).as_uri(), None) for f in files)
    until = min(deadline, time.monotonic() + ELSEWHERE_SCAN_S)
    for target, lines in sources[: opts.other_files]:
        if time.monotonic() > until:
            break
        path = file_path(target)
        if path is None:
            continue  # an untitled or remote buffer is no file of the workspace
        try:
            if lines is None:
                got = workspace.read_file(path, max_bytes, stacks)
                if isinstance(got, str) or not any(n in got.text for n in needles):
                    continue
                lines = Document(target, got.text).lines
            elif workspace.accepts(path, stacks):
                continue
            found = memory.propose(ctx.path_of(target), lines, 0, pending=pending, max_scan=opts.max_scan_lines,
                                   limit=1, open_edit=open_edit, cursor_here=False)
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # unreadable, not text, or gone: not a place for a next edit
        if found and found[0].support >= opts.min_confidence_jump and found[0].applied >= JUMP_MIN_APPLIED:
            if target in open_uris and not _open_document_indexable(ctx, path, lines, stacks):
                continue
            return target, found[0]  # the nearest file with a site over the gate
    return None


def _open_document_indexable(ctx: EditContext, path: str, lines: list[str], stacks: dict) -> bool:
    """An open document the index would take: its file on disk reads (`read_workspace_file`) and
    its text passes the index's content rules (no secret, not binary, not too large)."""
    max_bytes = ctx.options.index.max_file_bytes
    if not isinstance(ctx.workspace_index.read_file(path, max_bytes, stacks), discovery.Source):
        return False
    return not discovery.check_text("".join(lines), max_bytes)


def current(ctx: EditContext, uri: str) -> Document | None:
    """The file as it is now: the open document, else read from disk like the index reads it
    (WorkspaceIndex.read_file: never through a link, never a FIFO or a device, within
    `index.maxFileBytes`); None when the index would not take it or it is unreadable."""
    doc = ctx.documents.get(uri)
    if doc is not None:
        return doc
    path = file_path(uri)
    if path is None:
        return None
    got = ctx.workspace_index.read_file(path, ctx.options.index.max_file_bytes)
    if isinstance(got, str):
        return None
    try:
        return Document(uri, got.text, encoding=ctx.documents.encoding)
    except ValueError:
        return None
