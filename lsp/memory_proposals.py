"""The repository memory's proposals for an inline request while typing, and the model's check of them.

In a file of an indexed workspace folder, a typing request asks the workspace's repository memory
(coder_model.memory.RepoMemory, kept by lsp.workspace_index) for whole-line insertions at the
cursor. The proposals go into the prompt with snippets of other files, and the engine's denoiser
checks them in the passes that make its own answer (coder_model.verify). The memory is queried on
a pool thread (a first query can take tens of ms), never on the event loop. The LSP's inline
pipeline (lsp.inline), `dlm-lsp predict` (lsp.predict_cli) and the HTTP endpoint
(lsp.http_endpoint) share these functions, so the three propose alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from dlm.coder_model.languages import language_for_path, language_name
from dlm.coder_model.memory import line_ranker
from dlm.coder_model.memory.line_ranker import LineFacts
from dlm.coder_model.types import CancelToken, MemoryProposal
from dlm.lsp import context, syntax_check
from dlm.lsp.documents import Document
from dlm.lsp.engine_runs import chain
from dlm.lsp.options import Options
from dlm.lsp.stats import Stats
from dlm.lsp.workspace_index import WorkspaceIndex, file_path

log = logging.getLogger(__name__)

# the memory's beam (BENCHMARKS.md "Repository memory alone": its 8 hold the line 46.4%, its first 35.2%)
MEMORY_BEAM = 8
VERIFIED = 4  # proposals the denoiser checks per request: each costs its slots in every pass


MEMORY_LINES = 4000  # lines of the document on each side of the cursor the memory reads as this file


def memory_for(doc: Document, built: context.BuiltContext, options: Options,
               workspace_index: WorkspaceIndex) -> tuple[Any, str]:
    """(the repository memory, the file's path in it) for an inline request while typing, or
    (None, ""): no index yet, the file is in no indexed root, or a wide (edit) request."""
    if built.mode != "typing" or not options.index.enabled:
        return None, ""
    path = file_path(doc.uri)
    if path is None:
        return None, ""
    return workspace_index.memory_for(path)


def text_around(doc: Document, row: int, col: int) -> tuple[str, str]:
    """The document before and after the cursor, up to MEMORY_LINES lines each way (taken on the
    event loop: the document changes there)."""
    lines = doc.lines
    line = lines[row]
    before = "".join(lines[max(0, row - MEMORY_LINES) : row]) + line[:col]
    after = line[col:] + "".join(lines[row + 1 : row + 1 + MEMORY_LINES])
    return before, after


@cache
def shipped_ranker():
    """The line ranker beside coder_model.memory.line_ranker, or None when it is missing or cannot
    be read (said once in the log: the memory's own order and score then stand)."""
    try:
        return line_ranker.load()
    except (OSError, ValueError) as exc:
        log.error("the line ranker %s cannot be read (%s); the repository memory ranks its own drafts. "
                  "Reinstall dlm-lsp, or fit it again: python -m dlm.drivers.training.fit_line_ranker",
                  line_ranker.MODEL_PATH, exc)
        return None


@dataclass(frozen=True)
class DraftSyntax:
    """What the syntax check (lsp.syntax_check) says of one request's drafts, for the line ranker:
    `parses(text)`, does the line with that insertion keep its syntax; `string_swallows_code`, is
    the cursor inside a triple-quoted string whose closing quotes the code below needs."""

    parses: Callable[[str], bool]
    string_swallows_code: bool = False

    @classmethod
    def of_text(cls, language: str, before: str, after: str) -> DraftSyntax:
        """The checks on a document given as its text around the cursor."""

        def parses(text: str) -> bool:
            try:
                return syntax_check.check_text(language, before, after, text) is None
            except Exception:  # a grammar edge case: the draft is judged as one that parses
                log.exception("syntax check of a memory draft failed")
                return True

        try:
            swallows = syntax_check.string_swallows_code_text(language, before, after)
        except Exception:  # a grammar edge case: no string is known to be open
            log.exception("reading the strings around the cursor failed")
            swallows = False
        return cls(parses, swallows)


def memory_proposals(memory, before: str, after: str, rel_path: str, open_files: dict[str, str],
                     ranker=None, syntax: DraftSyntax | None = None) -> tuple[MemoryProposal, ...]:
    """The memory's whole-line insertions at the cursor (coder_model.memory.RepoMemory.complete),
    best first. With a `ranker` (coder_model.memory.line_ranker), its trees order them and their
    probability is each one's score; `syntax`: the syntax check's facts of the drafts (by
    default read on `before` + `after`)."""
    found = [c for c in memory.complete(before, after, path=rel_path, beam=MEMORY_BEAM, open_files=open_files,
                                        exclude_path=rel_path) if c.text]
    if ranker is None or not found:
        return tuple(MemoryProposal(c.text, c.score) for c in found)[:VERIFIED]
    if syntax is None:
        syntax = DraftSyntax.of_text(language_for_path(rel_path), before, after)
    texts = [c.text for c in found]
    facts = LineFacts.of(before, after, syntax.string_swallows_code)
    probs = ranker.probabilities(facts, [c.score for c in found], [c.support for c in found],
                                 texts, [syntax.parses(t) for t in texts])
    order = sorted(range(len(found)), key=lambda i: -probs[i])  # stable: ties keep the memory's order
    return tuple(MemoryProposal(texts[i], probs[i]) for i in order)[:VERIFIED]


def document_syntax(doc: Document, row: int, col: int) -> DraftSyntax:
    """The DraftSyntax of an insertion at (row, col), for memory_proposals on a pool thread: the
    checks run on a copy of the document's lines and tree taken now, on the event loop (the
    document and its tree change there)."""
    language = language_name(doc.language_id, doc.uri)
    try:
        tree = doc.syntax.tree().copy() if doc.syntax is not None else None
    except Exception:  # a grammar edge case: the check reads the lines alone
        log.exception("parsing the document for the line ranker failed")
        tree = None
    lines = list(doc.lines)
    root = tree.root_node if tree is not None else None

    def parses(text: str) -> bool:
        try:
            return syntax_check.check(language, lines, row, col, text, False, root) is None
        except Exception:  # a grammar edge case: the draft is judged as one that parses
            log.exception("syntax check of a memory draft failed")
            return True

    try:
        swallows = syntax_check.string_swallows_code(language, lines, row, col, root)
    except Exception:  # a grammar edge case: no string is known to be open
        log.exception("reading the strings around the cursor failed")
        swallows = False
    return DraftSyntax(parses, swallows)


def checked_by_model(memory, rel: str, doc: Document, row: int, col: int, built: context.BuiltContext,
                     run: Callable[[context.BuiltContext], Future], cancel: CancelToken, pool: Executor,
                     stats: Stats, workspace_index: WorkspaceIndex, options: Options) -> Future:
    """A Future of the model's run (`run`) on `built` with the memory's proposals and snippets of
    other files in its prompt; its result is None when the request was cancelled meanwhile. The
    proposals are computed on a pool thread, then the engine's denoiser checks them."""
    out: Future = Future()
    opened = workspace_index.open_files(file_path(doc.uri) or "")
    opened.pop(rel, None)  # this document is the memory's first level, from the text below
    before, after = text_around(doc, row, col)
    ranker = shipped_ranker() if options.index.rank_drafts else None
    syntax = document_syntax(doc, row, col) if ranker is not None else None

    def propose() -> None:
        # The indexer waits from here until the model's step ends too: its Python work
        # would otherwise take the GIL between the step's torch calls, each time for a
        # whole switch interval.
        end = workspace_index.begin_prediction()
        out.add_done_callback(lambda _: end())
        try:
            t_memory = time.monotonic()
            proposals = memory_proposals(memory, before, after, rel, opened, ranker, syntax)
            stats.stage("memory_ms", (time.monotonic() - t_memory) * 1000)
            if cancel.cancelled:
                out.set_result(None)
                return
            # typing: snippets of other files in the layout's snippet sections too
            with_memory = context.with_snippets(built, memory, rel)
            with_memory = replace(with_memory, prompt=replace(with_memory.prompt, proposals=proposals))
            chain(run(with_memory), out)
        except Exception as exc:  # noqa: BLE001 - a memory failure costs this keystroke, never the server
            if not out.done():
                out.set_exception(exc)

    pool.submit(propose)
    return out
