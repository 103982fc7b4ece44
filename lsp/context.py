"""Document + cursor -> Prompt (docs/architecture.md §2, §4).

The editable region is snapped to syntax:
- "typing" (the user is typing here, last edit < idle_ms ago near the cursor):
  the cursor line plus the rest of its statement, bounded in tokens, so the
  masked block stays short (L ~ 32-48) and a step is cheap. Its Prompt is an
  insertion prompt (Prompt.insert, docs/architecture.md §4): the region shows the model the
  line around the cursor, and the model writes only the text to insert there;
  the same after a pause, an explicit trigger or a jump when the cursor is at a completion point
  (the end of the line's text, or only closing brackets, quotes or a colon after it; an empty line);
- "wide" (after a pause or a jump with text after the cursor, and for dlm/editPrediction): a few
  lines around the cursor, widened to whole statements, to look for next edits.

The windows are sized by the one budget (coder_model.budget, `windows_for`),
so that the layout fills the model's context as training's examples fill it.
The prefix window ends at the region and starts at a line kept in
`Document.anchors["prefix"]` (it follows edits above it). It is re-chosen
only when the window would exceed its budget or no longer precedes the
region, and then placed `window_fill` full, so typing (and Enter) does not
move its start: the tokens before the region stay the same and the model's
prefix KV cache stays valid. The suffix window works the same way.

`with_snippets` adds snippets of other files from the workspace index (typing only), retrieved
by coder_model.snippets' rule from the lines above the region, so they too stay the same while
the user types on one line.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from dlm.coder_model import regions
from dlm.coder_model.budget import chars_for, plan
from dlm.coder_model.languages import language_name
from dlm.coder_model.layout import display_path
from dlm.coder_model.regions import Mode
from dlm.coder_model.snippets import pick, query_lines
from dlm.coder_model.types import LayoutBudget, Prompt, RetrievedSnippet
from dlm.lsp.documents import Document, content
from dlm.lsp.options import ContextOptions


@dataclass(frozen=True)
class BuiltContext:
    prompt: Prompt
    start_line: int  # first line of the region
    end_line: int  # last line of the region (inclusive; its terminator is in the suffix)
    mode: Mode


@dataclass(frozen=True)
class Windows:
    """Text windows in characters: the model's cuts (coder_model.budget) under the user's caps."""

    prefix_chars: int
    suffix_chars: int
    history_chars: int


def windows_for(budget: LayoutBudget, opts: ContextOptions) -> Windows:
    """The windows that fill the model's layout as training fills it (coder_model.budget.plan):
    the layout then cuts the far ends exactly, in tokens. `prefix_tokens`/`suffix_tokens`
    options (when set) cap them, e.g. to trade context for latency."""
    cuts = plan(budget)
    prefix = cuts.prefix_room_max if not opts.prefix_tokens else min(opts.prefix_tokens, cuts.prefix_room_max)
    suffix = cuts.suffix if not opts.suffix_tokens else min(opts.suffix_tokens, cuts.suffix)
    return Windows(chars_for(prefix), chars_for(suffix), cuts.history_chars)


# What may follow the cursor at a completion point: closing brackets, quotes, a colon, blanks.
COMPLETION_POINT_TAIL = frozenset(")]}>\"'`: \t\r\n")


def at_completion_point(line: str, col: int) -> bool:
    """The cursor at the end of the line's text, or followed only by closing brackets, quotes or a
    colon, or on an empty line: where an editor user expects the rest of the line to be offered."""
    return all(ch in COMPLETION_POINT_TAIL for ch in line[col:])


def choose_mode(doc: Document, row: int, opts: ContextOptions, now: float | None = None,
                col: int | None = None) -> Mode:
    """"typing" (an insertion at the cursor, the repository memory consulted) while the user types
    here, and after a pause, an explicit trigger or a cursor move wherever the cursor is at a
    completion point (`at_completion_point`): a user of Copilot or llama.vim gets the rest of the line
    there whether or not a key came just before. "wide" (the region rewrite, for edits around the
    cursor) elsewhere: mid-line after a pause, or with no column given."""
    now = time.monotonic() if now is None else now
    recent = doc.last_change_at and (now - doc.last_change_at) * 1000 < opts.idle_ms
    near = abs(row - doc.last_change_line) <= 1
    if recent and near:
        return "typing"
    if col is not None and 0 <= row < len(doc.lines) and at_completion_point(doc.lines[row], col):
        return "typing"
    return "wide"


def _chars(lines: list[str], a: int, b: int) -> int:
    return sum(len(x) for x in lines[a:b])


def region_rows(doc: Document, row: int, col: int, mode: Mode, opts: ContextOptions) -> tuple[int, int]:
    """First and last (inclusive) line of the region: the rules of coder_model.regions, which
    the training example builders cut by too, over the document's incremental tree."""
    span = doc.syntax.statement_span if doc.syntax is not None else None
    return regions.region_rows(doc.lines, row, col, mode, opts, span)


def _prefix_start(doc: Document, start: int, opts: ContextOptions, windows: Windows) -> int:
    budget = windows.prefix_chars
    anchor = doc.anchors.get("prefix")
    if anchor is not None and anchor <= start and _chars(doc.lines, anchor, start) <= budget:
        return anchor
    target, used, a = budget * opts.window_fill, 0, start
    while a > 0 and used + len(doc.lines[a - 1]) <= target:
        a -= 1
        used += len(doc.lines[a])
    doc.anchors["prefix"] = a
    return a


def _suffix_end(doc: Document, end: int, opts: ContextOptions, windows: Windows) -> int:
    """Exclusive end line of the suffix window."""
    budget = windows.suffix_chars
    n = len(doc.lines)
    anchor = doc.anchors.get("suffix")
    if anchor is not None and end + 1 <= anchor <= n and _chars(doc.lines, end + 1, anchor) <= budget:
        return anchor
    target, used, b = budget * opts.window_fill, 0, end + 1
    while b < n and used + len(doc.lines[b]) <= target:
        used += len(doc.lines[b])
        b += 1
    doc.anchors["suffix"] = b
    return b


def build(
    doc: Document, row: int, col: int, mode: Mode, opts: ContextOptions, windows: Windows, path: str = "",
    now: float | None = None,
) -> BuiltContext | None:  # fmt: skip
    """The Prompt for a cursor at (row, code-point col), or None when there is nothing to
    suggest (the cursor line is longer than max_line_chars, e.g. minified code)."""
    lines = doc.lines
    if len(lines[row]) > opts.max_line_chars:
        return None
    start, end = region_rows(doc, row, col, mode, opts)
    region = "".join(lines[start:end]) + content(lines[end])
    cursor = _chars(lines, start, row) + col
    p0 = _prefix_start(doc, start, opts, windows)
    s1 = _suffix_end(doc, end, opts, windows)
    prefix = "".join(lines[p0:start])
    suffix = lines[end][len(content(lines[end])) :] + "".join(lines[end + 1 : s1])
    history: tuple[str, ...] = ()
    if doc.history is not None:
        doc.history.close_if_idle(time.monotonic() if now is None else now, lines, row)
        history = doc.history.rendered(windows.history_chars)
    prompt = Prompt(
        prefix=prefix,
        region=region,
        cursor=cursor,
        suffix=suffix,
        history=history,
        language=language_name(doc.language_id, doc.uri),
        path=path,
        insert=mode == "typing",
    )
    return BuiltContext(prompt, start, end, mode)


# Windows retrieved per query before coder_model.snippets.pick keeps the best MAX_SNIPPETS.
RETRIEVED = 4
SNIPPET_MEMO = 64
_snippet_memo: OrderedDict[tuple, tuple[RetrievedSnippet, ...]] = OrderedDict()
_snippet_lock = threading.Lock()


def with_snippets(built: BuiltContext, memory, rel: str) -> BuiltContext:
    """`built` with snippets of other workspace files (`memory`: coder_model.memory RepoMemory;
    `rel`: this file's path in it, excluded). Memoised by query: every keystroke on one line asks
    the same, and an answer that stays the same keeps the snippet sections' KV cache even while
    the index changes underneath (it is refreshed when the query moves to another line)."""
    if not built.prompt.insert:
        return built
    query = query_lines(built.prompt.prefix)
    key = (id(memory), rel, tuple(query))
    with _snippet_lock:
        found = _snippet_memo.get(key)
        if found is not None:
            _snippet_memo.move_to_end(key)
    if found is None:
        found = pick(memory.retrieve(query, RETRIEVED, exclude_path=rel), query)
        # the index keeps a name that is not UTF-8 as os.fsdecode makes it (surrogate escapes,
        # to open the file again); the prompt, tokenized or sent to a remote engine, gets it as text
        found = tuple(replace(s, path=display_path(s.path)) for s in found)
        with _snippet_lock:
            _snippet_memo[key] = found
            while len(_snippet_memo) > SNIPPET_MEMO:
                _snippet_memo.popitem(last=False)
    if not found:
        return built
    return replace(built, prompt=replace(built.prompt, snippets=found))
