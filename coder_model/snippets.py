"""Retrieved snippets for the layout's snippet sections (docs/architecture.md §4, §10).

One rule for the server (lsp.context, from the workspace index) and training's examples (from the
other files of the same project in the corpus), so the model is served the snippets it was
trained with:

- the query is the QUERY_LINES lines above the region, the end of the prompt's prefix (`query_lines`), never the typed text: it
  stays the same while the user types on one line, so the snippet sections, which come first in
  the layout, keep their tokens and the prefix KV cache holds;
- a retrieved window (coder_model.memory.retrieve: WINDOW lines, Jaccard over identifiers) is cut
  to the SNIPPET_LINES lines that share most identifiers with the query (`best_lines`), so that
  what the budget keeps (coder_model.budget: a fifth of the context) is the part that matched;
- at most MAX_SNIPPETS, best first, none from the file being edited.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlm.coder_model.budget import MAX_SNIPPETS, SNIPPET_LINES
from dlm.coder_model.memory.retrieve import QUERY_LINES, Snippet, identifiers
from dlm.coder_model.types import RetrievedSnippet

# A window sharing less than this Jaccard with the query is noise to the model, not a hint.
MIN_SCORE = 0.08


def query_lines(prefix: str) -> list[str]:
    """The query: the last QUERY_LINES lines of a prompt's prefix, the lines above the region
    (what the user types, in the region, is not in it)."""
    return prefix.splitlines(keepends=True)[-QUERY_LINES:]


def best_lines(lines: Sequence[str], query: set[str], n: int = SNIPPET_LINES) -> tuple[int, int]:
    """[start, end) of the `n` consecutive lines of `lines` sharing most identifiers with `query`
    (the first such run on a tie)."""
    if len(lines) <= n:
        return 0, len(lines)
    shared = [len(identifiers([line]) & query) for line in lines]
    best, best_at, run = -1, 0, sum(shared[:n])
    for a in range(len(lines) - n + 1):
        if a:
            run += shared[a + n - 1] - shared[a - 1]
        if run > best:
            best, best_at = run, a
    return best_at, best_at + n


def pick(retrieved: Sequence[Snippet], query: Sequence[str]) -> tuple[RetrievedSnippet, ...]:
    """The layout's snippets from retrieved windows (best first) for the query lines."""
    words = identifiers(query)
    out: list[RetrievedSnippet] = []
    for w in retrieved:
        if len(out) == MAX_SNIPPETS:
            break
        if w.score < MIN_SCORE:
            continue
        lines = w.text.splitlines(keepends=True)
        a, b = best_lines(lines, words)
        text = "".join(lines[a:b])
        if text.strip():
            out.append(RetrievedSnippet(w.path, text if text.endswith("\n") else text + "\n"))
    return tuple(out)
