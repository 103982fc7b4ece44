"""RepoMemory: the workspace's token n-gram and snippet index, nested under the file, open buffers and retrieved windows.

Writers (`update_file`, `remove_file`) and readers (`complete`, `retrieve`)
may run on different threads. Counts of the workspace live in a few sorted
tables (an LSM: changed files wait in a list, counted into a small dict
table by the next queries while few are waiting, and are sealed into a
sorted table by the server's indexer when it is idle, or at SEAL_TOKENS_BULK;
TIER tables of one size tier merge into one), so a file saved in the editor
costs milliseconds and a bulk index of a 200k-line repository a few
rebuilds at most. Seals and merges build outside the lock that readers
take: a suggestion never waits for one (update_file does, in its thread:
call it from a background thread).

Secrets never enter it (dlm.coder_model.secrets): a line of an indexed file, an open
buffer or the current document that holds one is emptied before it is lexed
(so no part of it reaches the vocabulary, the tables, the snippets or the
saved file), and a continuation that would put a secret on the cursor's line
is never proposed.
"""

from __future__ import annotations

import re
import threading
import typing
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dlm.coder_model.memory.follow import MAX_FOLLOW_LINES
from dlm.coder_model.memory.lexer import is_line_break, lex, line_start
from dlm.coder_model.memory.ngram import (
    BOS,
    MAX_TOKEN_ID,
    DictTable,
    Level,
    Segment,
    Smoothing,
    SortedTable,
    add_mass,
    beam_search,
    next_tokens,
    order_keys,
)
from dlm.coder_model.memory.retrieve import Snippet, SnippetIndex, snippet_windows
from dlm.coder_model.secrets import contains_secret, inserted_secret, mask_in_pieces, mask_secrets

DEFAULT_ORDER = 6
LOCAL_EXTRA_ORDER = 6  # the file, open-buffer and retrieved levels count contexts of order 12 (workspace: 6)
RETRIEVED_EXTRA_LINES = 10  # lines after a retrieved window counted with it
# Changed files wait in a list; a query counts them into dicts (about 150 bytes per n-gram), so
# while queries come they are sealed into a sorted table early, and a bulk index with no query
# in between seals big batches (fewer rebuilds).
SEAL_TOKENS = 40_000  # the smallest tables' size tier (_tier) starts at twice this
SEAL_TOKENS_BULK = 250_000  # pending tokens sealed when no query has counted them
TIER = 4  # sorted tables of one size tier merged into one
MAX_SEGMENTS = 8  # past this many sorted tables, the two adjacent ones smallest together merge
# No merge (but a full compact) makes a table of more tokens: a merge holds its inputs and its
# output at once, and the output of a merge of tables this large is what the peak memory pays.
MERGE_MAX_TOKENS = 4_000_000
# Pending tokens one query counts, at most: about 10 ms of dict updates (10k cost a query 100 ms
# on 2.5 GHz Xeon). The server's indexer seals what is pending as soon as it has nothing else to
# do (lsp.workspace_index), so a query counts only what arrived during a bulk index.
QUERY_COUNT_TOKENS = 1_000
# More pending than this is a bulk index under way: queries count none of it (their answers would
# change, and their memo reset, at every seal of SEAL_TOKENS), and it is sealed at SEAL_TOKENS_BULK.
QUERY_COUNT_MAX_PENDING = 20_000
QUERY_PIECE_TOKENS = 20_000  # a pending file longer than this is counted QUERY_COUNT_TOKENS a query
# Of the current document above the cursor's line (below: half), for the file level. Measured on
# xarray and astropy (200 cases each): 4k to 200k characters give the same exact match within a
# point; the cost of the first query on a line grows with it.
CURRENT_FILE_CHARS = 32_000
# A document up to this long is counted whole ahead of its first query (prepare_document, about
# 0.6 ms per 1,000 characters on a pool thread): the current-file level of a cursor line is then
# that count less the line's (BASE_DOCUMENTS kept). A longer one is counted around the cursor.
BASE_MAX_CHARS = 256_000
BASE_DOCUMENTS = 4
OPEN_BUFFER_CHARS = 64_000  # of each open buffer (its table is built on the query path, once per version)
OPEN_BUFFERS = 16  # open-buffer tables cached
TAIL_CHARS = 4096  # of `before` lexed for the context, at most
TYPED_WORD = -2  # token id of a half-typed word the vocabulary does not know
MEMO_ENTRIES = 50_000  # next-token answers cached across keystrokes
INTERN_BATCH = 4096  # new tokens interned per hold of the readers' lock
WINDOW_BATCH_LINES = 2000  # lines whose snippet windows are found between two pauses
WINDOW_INSERT_BATCH = 200  # snippet windows inserted per hold of the readers' lock
LEX_CHUNK_CHARS = 1 << 14  # an indexed file is lexed this much at a time (one regex call, GIL held: ~3 ms)
PROVISIONAL = MAX_TOKEN_ID + 1  # ids of a file's new tokens until they are interned
_LINE_BREAK = re.compile(r"\r\n|\n|\r")  # the lexer's line breaks


@dataclass(frozen=True, slots=True)
class Candidate:
    """One whole-line continuation proposed by the memory."""

    text: str  # the insertion at the cursor, up to the end of the line
    score: float  # the memory's probability of exactly this insertion, in [0, 1]
    support: int  # how many times the continuation was seen (its rarest step)


@dataclass(frozen=True)
class Weights:
    """Nested cache: counts of each level are multiplied by its weight (workspace = 1)."""

    current_file: float = 20.0
    open_buffers: float = 5.0
    # the windows of other files most like the lines above the cursor (SnippetIndex), counted at
    # the local order: a line of a similar file is copied whole, not pieced from 5-token contexts
    retrieved: float = 5.0
    retrieved_windows: int = 4


@dataclass
class _CurrentFile:
    """The file level for one document: the text above the cursor's line and below it, counted."""

    above: str = ""
    above_ids: list[int] = field(default_factory=list)
    above_table: SortedTable | None = None  # built when the cursor comes to the document or moves up
    above_added: DictTable | None = None  # lines added above since (the cursor moved down)
    below: str = ""
    below_table: SortedTable | None = None


@dataclass
class _Base:
    """A document counted whole ahead of its queries (RepoMemory.prepare_document). For a cursor
    whose document differs from `text` on the cursor's line at most (that line typed on, or new),
    the current-file level is `table` less the counts that line's tokens are part of (`cut`)."""

    text: str
    ids: array
    line_chars: list[int]  # character offset of each line's start, then len(text)
    line_tokens: list[int]  # token index of each line's start, then len(ids)
    table: SortedTable
    cut: tuple[int, int, DictTable, DictTable] | None = None  # (first, end) line's tokens, less, more


class RepoMemory:
    def __init__(
        self,
        max_tokens: int = 20_000_000,
        order: int = DEFAULT_ORDER,
        *,
        local_order: int | None = None,
        smoothing: Smoothing | None = None,
        weights: Weights | None = None,
    ) -> None:
        if not 1 <= order <= 16:
            raise ValueError(f"order must be between 1 and 16, got {order}")
        self.max_tokens = max_tokens
        self.order = order
        # The current file and the open buffers are counted at query time, over a few thousand
        # tokens: their tables can afford longer contexts than the workspace's, and a line copied
        # from elsewhere in the same file is the memory's best case.
        self.local_order = local_order if local_order is not None else order + LOCAL_EXTRA_ORDER
        if not order <= self.local_order <= 24:
            raise ValueError(f"local_order must be between order ({order}) and 24, got {self.local_order}")
        self.query_order = self.local_order
        self.smoothing = smoothing or Smoothing()
        self.weights = weights or Weights()
        self._strings: list[str] = [""]  # token id -> text; id 0 is BOS
        self._ids: dict[str, int] = {"": BOS}
        self._breaks = bytearray(b"\x00")  # token id -> 1 for a line break
        self._files: dict[str, array] = {}
        self._line_starts: dict[str, array] = {}  # path -> token index of each line's first token
        self._tokens = 0
        self._segments: tuple[Segment, ...] = ()
        self._delta = DictTable(order)
        self._delta_parts: list[tuple[str, array, int]] = []  # changes since the last seal
        self._counted = 0  # how many of _delta_parts are counted in _delta
        self._counted_at = 0  # tokens of _delta_parts[_counted] counted in _delta
        self._snippets = SnippetIndex()
        self._lock = threading.RLock()  # readers, and writers' short mutations
        self._write_lock = threading.Lock()  # one writer at a time (merges run under it only)
        self._current: OrderedDict[str, _CurrentFile] = OrderedDict()
        self._bases: OrderedDict[str, _Base] = OrderedDict()
        self._open: OrderedDict[str, tuple[str, SortedTable]] = OrderedDict()
        self._excluded: tuple[str, array, SortedTable] | None = None
        self._retrieved: tuple[tuple, DictTable | None] | None = None
        self._memo: dict = {}
        self._memo_signature: tuple | None = None
        # Called by a writer between slices of its work (a lexed chunk, a batch of windows or
        # of new tokens, a slice of a table's build): the server's indexer waits there while
        # a suggestion is computed, so its Python work never holds the GIL against one.
        self.pause: Callable[[], None] = _no_pause

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def files(self) -> int:
        return len(self._files)

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def vocabulary(self) -> int:
        return len(self._strings)

    def paths(self) -> list[str]:
        with self._lock:
            return list(self._files)

    # --- writing -------------------------------------------------------------------------------

    def _intern(self, tokens: Sequence[str]) -> array:
        ids = self._ids
        out = array("I")
        for tok in tokens:
            i = ids.get(tok)
            if i is None:
                i = len(self._strings)
                if i > MAX_TOKEN_ID:
                    i = BOS  # vocabulary full: an unknown token matches no context
                else:
                    ids[tok] = i
                    self._strings.append(tok)
                    self._breaks.append(1 if is_line_break(tok) else 0)
            out.append(i)
        return out

    def _lex_ids(self, text: str) -> tuple[array, list[str]]:
        """Token ids of `text`, lexed LEX_CHUNK_CHARS at a time (cut after a line feed, where the
        lexer restarts exactly): a known token gets its id, a new one PROVISIONAL + its rank among
        the new ones (first seen first); no list of the whole text's token strings is held."""
        ids = self._ids
        new: dict[str, int] = {}
        out = array("I")
        pos, n = 0, len(text)
        while pos < n:
            end = n if n - pos <= LEX_CHUNK_CHARS else text.find("\n", pos + LEX_CHUNK_CHARS) + 1
            if end <= 0:
                end = n
            chunk = []
            for tok in lex(text[pos:end]):
                i = ids.get(tok)
                if i is None:
                    i = new.get(tok)
                    if i is None:
                        i = new[tok] = PROVISIONAL + len(new)
                chunk.append(i)
            out.extend(chunk)
            pos = end
            if pos < n:
                self.pause()
        return out, list(new)

    def _settle(self, ids: array, new: list[str]) -> None:
        """Replace provisional ids by interned ones (the vocabulary grows in the order the tokens
        first appear, as interning the whole stream at once does). Interning takes the readers'
        lock INTERN_BATCH tokens at a time: a file of 50k new tokens would otherwise hold every
        suggestion up for 0.15 s. `ids` is not published yet, so a reader never sees it half done."""
        if not new:
            return
        real = array("I")
        for lo in range(0, len(new), INTERN_BATCH):
            if lo:
                self.pause()
            with self._lock:
                real.extend(self._intern(new[lo : lo + INTERN_BATCH]))
        import numpy as np

        view = np.frombuffer(ids, dtype=np.uint32)
        provisional = view >= PROVISIONAL
        view[provisional] = np.frombuffer(real, dtype=np.uint32)[view[provisional] - PROVISIONAL]
        del view

    def update_file(self, path: str, text: str) -> int:
        """Index `text` as the content of `path` (replacing what was there); its token count.

        Refuses (returns 0, and the path is no longer indexed) when the
        index would pass max_tokens; an empty file is indexed with 0 tokens
        (`files` tells them apart). Call it from a background thread: now
        and then it seals or merges tables (seconds on a large index),
        while complete() keeps answering from the tables it has.
        """
        text, _ = mask_in_pieces(text, self.pause)  # every caller's text: files read, open buffers
        ids, new = self._lex_ids(text)
        # the snippet windows' identifiers (regular expressions over every line) are found here,
        # outside the readers' lock, which then covers only their insertion
        lines = _LINE_BREAK.split(text)
        del text
        windows = []
        for lo in range(0, len(lines), WINDOW_BATCH_LINES):
            self.pause()
            windows += snippet_windows(lines, lo, lo + WINDOW_BATCH_LINES)
        with self._write_lock:
            old = self._files.get(path)
            if self._tokens - (len(old) if old is not None else 0) + len(ids) > self.max_tokens:
                self._remove_locked(path)
                return 0
            self._settle(ids, new)
            line_starts = self._starts_of_lines(ids)
            with self._lock:
                self._remove_counts(path)
                self._files[path] = ids
                self._line_starts[path] = line_starts
                self._tokens += len(ids)
                self._delta_parts.append((path, ids, +1))
                first = self._snippets.start_file(path)
            # the windows go in WINDOW_INSERT_BATCH at a time, each under the readers' lock: a
            # long file's would hold a suggestion up for tens of milliseconds at once
            for lo in range(0, len(windows), WINDOW_INSERT_BATCH):
                self.pause()
                with self._lock:
                    self._snippets.append_windows(path, windows[lo : lo + WINDOW_INSERT_BATCH])
            with self._lock:
                self._snippets.finish_file(path, first)
            self._maybe_seal()
            return len(ids)

    def remove_file(self, path: str) -> None:
        with self._write_lock:
            self._remove_locked(path)
            self._maybe_seal()

    def _remove_locked(self, path: str) -> None:
        with self._lock:
            self._remove_counts(path)
            self._snippets.remove_file(path)

    def _remove_counts(self, path: str) -> None:
        old = self._files.pop(path, None)
        if old is None:
            return
        self._line_starts.pop(path, None)
        self._tokens -= len(old)
        self._delta_parts.append((path, old, -1))

    def _starts_of_lines(self, ids: array) -> array:
        import numpy as np

        # a copy of the line-break flags: readers may grow the vocabulary meanwhile
        breaks = np.frombuffer(bytes(self._breaks), dtype=np.uint8)
        starts = array("I", [0])
        if len(ids):
            at = np.flatnonzero(breaks[np.frombuffer(ids, dtype=np.uint32)]) + 1
            starts.frombytes(at.astype(np.uint32).tobytes())
        return starts

    def _pending_tokens(self) -> int:
        return sum(len(toks) for _, toks, _ in self._delta_parts)

    def _maybe_seal(self) -> None:
        # queries count at most QUERY_COUNT_MAX_PENDING of the pending tokens into dicts, so the
        # pending list may grow to a bulk seal's size
        if self._pending_tokens() >= SEAL_TOKENS_BULK:
            self._compact_locked(full=False)

    def compact(self, full: bool = True) -> None:
        """Seal pending changes into a sorted table; `full` merges every table into one.

        Called by update_file as changes accumulate; call it with full=True
        after a bulk index (fewer tables answer faster). Runs its builds
        outside the readers' lock.
        """
        with self._write_lock:
            self._compact_locked(full)

    def _compact_locked(self, full: bool) -> None:
        parts = _cancel(list(self._delta_parts))
        if self._delta_parts:
            new: tuple[Segment, ...] = ()
            if parts:
                new = (Segment(SortedTable.build(self.order, [(t, sign) for _, t, sign in parts], self.pause), parts),)
            with self._lock:
                self._segments = self._segments + new
                self._delta = DictTable(self.order)
                self._delta_parts = []
                self._counted = 0
                self._counted_at = 0
        while True:
            segs = self._segments
            group = _merge_group(segs, full)
            if group is None:
                return
            lo, hi = group
            merged_parts = _cancel([p for s in segs[lo:hi] for p in s.parts])
            # counts add up: the merged tables' arrays, not their token streams, are counted again
            table = SortedTable.merge(self.order, [s.table for s in segs[lo:hi]], self.pause)
            with self._lock:
                self._segments = segs[:lo] + (Segment(table, merged_parts),) + segs[hi:]
            if full and len(self._segments) <= 1:
                return

    # --- reading -------------------------------------------------------------------------------

    def complete(
        self,
        before: str,
        after: str = "",
        *,
        path: str = "",
        beam: int = 8,
        max_tokens: int = 24,
        open_files: dict[str, str] | None = None,
        exclude_path: str | None = None,
    ) -> list[Candidate]:
        """Whole-line continuations at the cursor, most probable first (at most `beam`).

        `before`/`after`: the document around the cursor. Levels, most
        trusted first: this document (minus the cursor's line), the other
        `open_files` (path -> text), the workspace windows most like the
        lines above the cursor (retrieved, never this document's), the
        workspace (minus `exclude_path`). The first three count contexts up
        to `local_order` tokens, the workspace up to `order`.
        """
        if beam <= 0 or max_tokens <= 0:
            return []
        rest_of_line = _LINE_BREAK.split(after, maxsplit=1)[0] if after else ""
        line_before = before[line_start(before) :]
        if contains_secret(line_before):
            return []  # whatever comes next on this line extends or follows a secret
        tail_tokens = _tail_tokens(before, self.query_order)
        partial = ""
        if tail_tokens and not is_line_break(tail_tokens[-1]):
            partial = tail_tokens.pop()
        with self._lock:
            ctx = list(self._intern(tail_tokens))
            if len(tail_tokens) < self.query_order and len(before) > sum(map(len, tail_tokens)) + len(partial):
                ctx = [-1] * (self.query_order - len(ctx)) + ctx  # more text above: not a file start
            levels = self._levels(before, after, path, open_files, exclude_path)
            strings = self._strings
            # answers per context stay valid while no table changes: the next keystroke on the
            # same line asks mostly the same contexts (the words after the one being typed)
            signature = (
                id(self.smoothing),
                id(self.weights),
                tuple((lv.weight, tuple((sign, t.serial) for sign, t in lv.tables)) for lv in levels),
            )
            if self._memo_signature != signature or len(self._memo) > MEMO_ENTRIES:
                self._memo = {}
                self._memo_signature = signature
            memo = self._memo
            if not partial and (not before or is_line_break(before[-1])):
                # the cursor at the start of a line: what an editor would indent is not indented
                accept = lambda t: t > 0 and not strings[t][0].isspace()  # fmt: skip
                typed_id = None
            elif partial and partial.isspace():
                # blanks at the cursor (the indentation after Enter, or the space after `=`) are
                # typed in full: the next token adds no blanks (a deeper indentation is not this line)
                cut = len(partial)
                accept = lambda t: t >= 0 and len(strings[t]) > cut and strings[t].startswith(partial) \
                    and not strings[t][cut].isspace()  # fmt: skip
                typed_id = None
            else:
                accept = (lambda t: t >= 0 and strings[t].startswith(partial)) if partial else None
                # the word being typed, as a token: known, or a stand-in id no table holds (typing a
                # new name must not grow the vocabulary one prefix per keystroke)
                typed_id = self._ids.get(partial, TYPED_WORD) if partial else None

            def text_of(t: int) -> str:
                return partial if t == TYPED_WORD else strings[t]

            def step(generated: tuple[int, ...], first: bool) -> list[tuple[int, float, int]]:
                full = (ctx + list(generated))[-(self.query_order - 1) :] if self.query_order > 1 else []
                key = (tuple(full), partial if first else None)
                got = memo.get(key)
                if got is None:
                    keys = order_keys(full, self.query_order)
                    if first:
                        got = next_tokens(levels, keys, self.smoothing, accept, typed=typed_id)
                    else:
                        got = next_tokens(levels, keys, self.smoothing)
                    memo[key] = got
                return got

            found = beam_search(step, text_of, partial, beam, max_tokens, is_line_break)
        merged: dict[str, list] = {}
        right = rest_of_line.strip()
        for text, prob, support in found:
            if right:
                # the line already ends with `right` (say a bracket the editor closed): a candidate
                # must end with it too, and the insertion stops before it
                body = text.rstrip()
                if not body.endswith(right):
                    continue
                text = body[: len(body) - len(right)]
                if not text.strip():
                    continue
            if inserted_secret(line_before, text, rest_of_line):
                continue  # a secret (or part of one) seen elsewhere is never proposed
            add_mass(merged, text, prob, support)
        ranked = sorted(merged.items(), key=lambda kv: -kv[1][0])
        return [Candidate(text, min(1.0, max(0.0, p)), int(sup)) for text, (p, sup) in ranked]

    def retrieve(self, before_lines: Sequence[str], k: int = 4, *, exclude_path: str | None = None) -> list[Snippet]:
        """Snippets of other files like the lines above the cursor (pass complete lines only).

        Stable while the cursor stays on one line: the line being typed is
        not part of the query.
        """
        with self._lock:
            found = self._snippets.search(before_lines, k, exclude_path)
            out = []
            for wid, score in found:
                path = self._snippets.win_path[wid]
                start = self._snippets.win_start[wid]
                out.append(Snippet(path, start, self._lines_text(path, start, start + _window()), score))
            return out

    def follow_lines(
        self,
        before: str,
        first: str,
        after: str = "",
        *,
        open_files: dict[str, str] | None = None,
        exclude_path: str | None = None,
        max_lines: int = MAX_FOLLOW_LINES,
    ) -> list[str]:
        """The lines below the cursor's line once `first` completes it, where a source holds the
        whole line (coder_model.memory.follow): the document above the cursor (nearest first),
        the other open files, then the indexed files the retriever finds like the lines above
        (never `exclude_path`). [] when the line opens nothing, its body is already below the
        cursor, or no source has it. Secrets never come back: a block with a line holding one is
        passed over (the indexed files hold none: indexing empties such lines)."""
        from dlm.coder_model.memory import follow

        line = before[line_start(before) :] + first
        if "\n" in first or not follow.opens_block(line) or follow.body_present(line, after):
            return []
        above = before[: line_start(before)]

        def sources():
            yield above.split("\n"), True
            for text in (open_files or {}).values():
                yield text.split("\n"), False
            lines_above = above.split("\n")[:-1]
            for snip in self.retrieve(lines_above, self.weights.retrieved_windows, exclude_path=exclude_path):
                with self._lock:
                    if snip.path not in self._files:
                        continue
                    text = self._lines_text(snip.path, snip.start_line, snip.start_line + _window() + max_lines)
                yield text.split("\n"), False

        return follow.follow_in(sources(), line, max_lines, refuse=contains_secret)

    def _lines_text(self, path: str, start: int, end: int) -> str:
        ids = self._files[path]
        starts = self._line_starts[path]
        lo = starts[start] if start < len(starts) else len(ids)
        hi = starts[end] if end < len(starts) else len(ids)
        strings = self._strings
        return "".join(strings[t] for t in ids[lo:hi])

    def _levels(
        self,
        before: str,
        after: str,
        path: str,
        open_files: dict[str, str] | None,
        exclude_path: str | None,
    ) -> list[Level]:
        levels = [Level(self.weights.current_file, self._current_tables(path, before, after))]
        if open_files:
            tables = []
            for p, text in open_files.items():
                if p == path:
                    continue
                tables.append((+1, self._open_table(p, text)))
            if tables:
                levels.append(Level(self.weights.open_buffers, tables))
        if self.weights.retrieved > 0 and self.weights.retrieved_windows > 0:
            table = self._retrieved_table(before, path, exclude_path)
            if table is not None:
                levels.append(Level(self.weights.retrieved, [(+1, table)]))
        ws: list = [(+1, s.table) for s in self._segments]
        if self._delta_parts and self._pending_tokens() <= QUERY_COUNT_MAX_PENDING:
            # changes not counted yet are counted now, QUERY_COUNT_TOKENS a query at most (and at
            # least one file, but a file over QUERY_PIECE_TOKENS a piece at a time, the tokens
            # before the piece as its history): a query never counts a bulk index's 250k pending
            # tokens, or one big file, at once
            counted = 0
            parts = self._delta_parts
            while self._counted < len(parts):
                _, toks, sign = parts[self._counted]
                at = self._counted_at
                rest = len(toks) - at
                if counted and counted + rest > QUERY_COUNT_TOKENS:
                    break
                take = rest if rest <= QUERY_PIECE_TOKENS else QUERY_COUNT_TOKENS
                if take:
                    history = toks[max(0, at - self.order + 1) : at]
                    self._delta.add(toks[at : at + take], sign, history=history)
                    counted += take
                if take == rest:
                    self._counted += 1
                    self._counted_at = 0
                else:
                    self._counted_at = at + take
                    break
            if self._counted or self._counted_at:
                ws.append((+1, self._delta))
        if exclude_path is not None and exclude_path in self._files:
            ws.append((-1, self._excluded_table(exclude_path)))
        levels.append(Level(1.0, ws))
        return levels

    def prepare_document(self, path: str, text: str) -> bool:
        """Count the document `text` of `path` whole, ahead of its first query (the server calls it
        when a document opens and when typing pauses, on a pool thread): the first query on any
        of its lines then takes the current-file level from it instead of counting the text
        around the cursor. False (nothing kept) for a document over BASE_MAX_CHARS."""
        if len(text) > BASE_MAX_CHARS:
            with self._lock:
                self._bases.pop(path, None)
            return False
        masked = mask_secrets(text)[0]  # a masked line is emptied, not removed: lines stay lines
        tokens = lex(masked)
        with self._lock:
            ids = self._intern(tokens)
            breaks = self._breaks
            line_tokens = [0] + [i + 1 for i, t in enumerate(ids) if breaks[t]]
        line_chars = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]
        if len(line_chars) != len(line_tokens):  # masked lines keep their breaks: never expected
            return False
        if line_tokens[-1] != len(ids):  # the last line has no break: it ends with the text
            line_tokens.append(len(ids))
            line_chars.append(len(text))
        base = _Base(text, ids, line_chars, line_tokens, _counted(self.local_order, ids))
        with self._lock:
            self._bases[path] = base
            self._bases.move_to_end(path)
            while len(self._bases) > BASE_DOCUMENTS:
                self._bases.popitem(last=False)
        return True

    def _base_tables(self, path: str, before: str, after: str) -> list | None:
        """The current-file level from the document counted ahead, when the document now differs
        from it on the cursor's line at most; else None."""
        base = self._bases.get(path)
        if base is None:
            return None
        text = base.text
        above = before[: line_start(before)]
        brk = _LINE_BREAK.search(after)
        below = after[brk.end() :] if brk else ""
        rest = len(text) - len(below)
        if rest < len(above) or not (text.startswith(above) and text.endswith(below)):
            return None
        first = _index_of(base.line_chars, len(above))
        end = _index_of(base.line_chars, rest) if below else len(base.line_chars) - 1
        if first is None or end is None or end - first > 1:
            return None  # more than the cursor's line changed since it was counted
        a, b = base.line_tokens[first], base.line_tokens[end]
        if base.cut is None or base.cut[:2] != (a, b):
            order, ids = self.local_order, base.ids
            less, more = DictTable(order), DictTable(order)
            # the line's tokens with what stands above them, and the first tokens below with
            # contexts that reach into the line or across it: counted as the text around the
            # line would be, the tokens below start afresh (_current_tables' below table)
            less.add(ids[a:b], history=ids[max(0, a - order + 1) : a])
            head = ids[b : b + order - 1]
            if head:
                less.add(head, history=ids[max(0, b - order + 1) : b])
                more.add(head)
            base.cut = (a, b, less, more)
        _, _, less, more = base.cut
        return [(+1, base.table), (-1, less), (+1, more)]

    def _current_tables(self, path: str, before: str, after: str) -> list:
        tables = self._base_tables(path, before, after)
        if tables is not None:
            return tables
        state = self._current.get(path)
        if state is None:
            state = _CurrentFile()
            self._current[path] = state
            while len(self._current) > 4:
                self._current.popitem(last=False)
        self._current.move_to_end(path)
        above = before[: line_start(before)]
        if state.above_table is None or not (above.startswith(state.above) and len(above) - len(state.above) < 8192):
            text = _window_from_line(above, CURRENT_FILE_CHARS)
            state.above_ids = list(self._intern(lex(mask_secrets(text)[0])))
            state.above_table = _counted(self.local_order, state.above_ids)
            state.above_added = DictTable(self.local_order)
            state.above = above
        elif len(above) > len(state.above):
            new_ids = list(self._intern(lex(mask_secrets(above[len(state.above) :])[0])))
            state.above_added.add(new_ids, history=state.above_ids)
            state.above_ids.extend(new_ids)
            state.above = above
        brk = _LINE_BREAK.search(after)
        below = after[brk.end() :] if brk else ""
        if state.below_table is None or below != state.below:
            state.below = below
            ids = self._intern(lex(mask_secrets(_head_to_line(below, CURRENT_FILE_CHARS // 2))[0]))
            state.below_table = _counted(self.local_order, ids)
        tables = [(+1, state.above_table), (+1, state.below_table)]
        if state.above_added.tokens:
            tables.append((+1, state.above_added))
        return tables

    def _retrieved_table(self, before: str, path: str, exclude_path: str | None) -> DictTable | None:
        """The retrieved windows counted at the local order; the same table while the lines above
        the cursor are the same (the next keystrokes on a line reuse its cached answers)."""
        from dlm.coder_model.memory.retrieve import QUERY_LINES

        above = before[: line_start(before)]
        cut = len(above)
        for _ in range(QUERY_LINES + 1):
            cut = above.rfind("\n", 0, cut)
            if cut < 0:
                break
        query = above[cut + 1 :]
        # any change to the snippet windows (a file indexed, replaced or removed) adds windows or
        # kills some: their count and the dead count together say whether the index moved
        snippets = self._snippets
        key = (path, exclude_path, query, len(snippets.win_path), snippets.dead, self.weights.retrieved_windows)
        if self._retrieved is not None and self._retrieved[0] == key:
            return self._retrieved[1]
        found = snippets.search(query.split("\n"), self.weights.retrieved_windows, exclude_path)
        table: DictTable | None = None
        for wid, _score in found:
            wpath = snippets.win_path[wid]
            if wpath is None or wpath == path or wpath not in self._files:
                continue
            start = snippets.win_start[wid]
            starts = self._line_starts[wpath]
            ids = self._files[wpath]
            lo = starts[start] if start < len(starts) else len(ids)
            end = start + _window() + RETRIEVED_EXTRA_LINES
            hi = starts[end] if end < len(starts) else len(ids)
            if table is None:
                table = DictTable(self.local_order)
            table.add(ids[lo:hi])
        self._retrieved = (key, table)
        return table

    def _open_table(self, path: str, text: str) -> SortedTable:
        got = self._open.get(path)
        if got is not None and got[0] == text:
            self._open.move_to_end(path)
            return got[1]
        table = _counted(self.local_order, self._intern(lex(mask_secrets(text[:OPEN_BUFFER_CHARS])[0])))
        self._open[path] = (text, table)
        while len(self._open) > OPEN_BUFFERS:
            self._open.popitem(last=False)
        return table

    def _excluded_table(self, path: str) -> SortedTable:
        ids = self._files[path]
        if self._excluded is not None and self._excluded[0] == path and self._excluded[1] is ids:
            return self._excluded[2]
        table = _counted(self.order, ids)
        self._excluded = (path, ids, table)
        return table

    # --- persistence ---------------------------------------------------------------------------

    def save(self, fh: typing.BinaryIO) -> None:
        """Write the index: versioned, little-endian arrays, CRC-checked; no pickle."""
        from dlm.coder_model.memory import persist

        # The file holds the files' tokens and the snippets, not the tables (persist), so nothing
        # is merged for it: a merge of every table would hold the old tables and the new at once.
        with self._write_lock:  # no writer meanwhile: files and snippets stay as they are
            with self._lock:
                # the only thing readers change is the vocabulary, and only by appending (they
                # intern what they lex): its length now is the snapshot. Serialising (0.2-0.8 s
                # on a large index) runs outside the readers' lock: suggestions go on meanwhile.
                if self._snippets.dead:
                    self._snippets._compact()
                vocabulary = len(self._strings)
            persist.save(self, fh, vocabulary)

    @classmethod
    def load(cls, fh: typing.BinaryIO) -> RepoMemory:
        """Read an index written by save; ValueError (saying what is wrong) on a bad file."""
        from dlm.coder_model.memory import persist

        return persist.load(cls, fh)


def _no_pause() -> None:
    pass


def _counted(order: int, ids: Sequence[int]) -> SortedTable:
    """The counts of one token stream from its start, for a level built on the query path (the
    current file, an open buffer, the excluded copy): counted in numpy (SortedTable.build), about
    ten times faster than dicts for the 8k tokens and 12 orders of the current file."""
    return SortedTable.build(order, [(ids, 1)])


def _window() -> int:
    from dlm.coder_model.memory.retrieve import WINDOW

    return WINDOW


def _merge_group(segs: Sequence[Segment], full: bool) -> tuple[int, int] | None:
    """Which adjacent tables to merge next: TIER of one size tier, or all of them when `full`."""
    if full:
        return (0, len(segs)) if len(segs) > 1 else None
    sizes = [s.size for s in segs]
    tiers = [_tier(n) for n in sizes]
    for lo in range(len(segs) - TIER, -1, -1):
        if len(set(tiers[lo : lo + TIER])) == 1 and sum(sizes[lo : lo + TIER]) <= MERGE_MAX_TOKENS:
            return lo, lo + TIER
    if len(segs) > MAX_SEGMENTS:
        # tiers interleaved by seal sizes (a bulk seal between query-time seals) never line up
        # TIER of a kind: the two adjacent tables smallest together merge instead, since every
        # query asks every table and its cost grows with their number
        lo = min(range(len(segs) - 1), key=lambda i: sizes[i] + sizes[i + 1])
        if sizes[lo] + sizes[lo + 1] <= MERGE_MAX_TOKENS:
            return lo, lo + 2
    return None


def _tier(size: int) -> int:
    tier = 0
    limit = SEAL_TOKENS * 2
    while size >= limit:
        tier += 1
        limit *= TIER
    return tier


def _cancel(parts: list[tuple[str, array, int]]) -> list[tuple[str, array, int]]:
    """Drop a file's content counted in and counted out (the same token array, opposite signs)."""
    net: dict[int, list] = {}
    for path, toks, sign in parts:
        slot = net.get(id(toks))
        if slot is None:
            net[id(toks)] = [path, toks, sign]
        else:
            slot[2] += sign
    return [(p, t, s) for p, t, s in net.values() if s]


def _index_of(sorted_values: Sequence[int], value: int) -> int | None:
    """The index of `value` in the ascending `sorted_values`, or None."""
    import bisect

    i = bisect.bisect_left(sorted_values, value)
    return i if i < len(sorted_values) and sorted_values[i] == value else None


def _window_from_line(text: str, chars: int) -> str:
    """The last `chars` of `text`, starting at a line start (so it lexes as the whole would)."""
    if len(text) <= chars:
        return text
    cut = len(text) - chars
    return text[line_start(text, cut) :] if line_start(text, cut) > 0 else text[cut:]


def _head_to_line(text: str, chars: int) -> str:
    """The first `chars` of `text`, cut at a line end."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1] if cut >= 0 else text[:chars]


def _tail_tokens(before: str, order: int) -> list[str]:
    """Tokens of the end of `before`: enough whole lines for the context and the typed word
    (a line holding a secret lexed as an empty line: the context never interns one)."""
    start = line_start(before)
    while True:
        if len(before) - start > TAIL_CHARS:
            # a very long line (minified code): its end only; the cut may split one token
            return lex(mask_secrets(before[-TAIL_CHARS:])[0])
        tokens = lex(mask_secrets(before[start:])[0])
        if start == 0 or (len(tokens) > order and len(before) - start >= 200):
            return tokens
        start = line_start(before, start - 1)
