"""Retrieved snippets for training's typing examples: each corpus project seen as a workspace.

A file of the corpus belongs to a project (its `source`: a PyPI distribution, an
algorithmic-python repository, a --root folder). The other files of the same project, in the
same split, are indexed as the server indexes a workspace (coder_model.memory.retrieve), and an
example's snippets are retrieved with the server's rule (coder_model.snippets): the query is
the lines above the region, the file itself is excluded. So the model learns to use the snippet
sections on what the server will give it, and learns to ignore them when they do not help.

Indexes are built lazily, one per project on its first example, and kept (about a hundred bytes
per window of ten lines).
"""

from __future__ import annotations

from collections.abc import Iterable

from dlm.coder_model.memory.retrieve import WINDOW, Snippet, SnippetIndex
from dlm.coder_model.snippets import pick, query_lines
from dlm.coder_model.types import RetrievedSnippet

# Windows retrieved per query before coder_model.snippets.pick keeps the best MAX_SNIPPETS.
RETRIEVED = 4


def project_path(path: str, source: str) -> str:
    """A corpus path as the server names a workspace file: relative to its project's root."""
    return path[len(source) + 1 :] if source and path.startswith(source + "/") else path


class ProjectSnippets:
    """Snippet indexes of the corpus projects of one split."""

    def __init__(self, files: Iterable[tuple[str, str, str]]) -> None:
        """`files`: (path, text, source) of every file of the split."""
        self._files: dict[str, list[tuple[str, str]]] = {}
        for path, text, source in files:
            self._files.setdefault(source, []).append((project_path(path, source), text))
        self._indexes: dict[str, tuple[SnippetIndex, dict[str, list[str]]]] = {}

    def _index(self, source: str) -> tuple[SnippetIndex, dict[str, list[str]]]:
        got = self._indexes.get(source)
        if got is None:
            index, lines_of = SnippetIndex(), {}
            for path, text in self._files.get(source, ()):
                lines = text.splitlines(keepends=True)
                lines_of[path] = lines
                index.update_file(path, lines)
            got = self._indexes[source] = (index, lines_of)
        return got

    def snippets(self, source: str, path: str, prefix: str) -> tuple[RetrievedSnippet, ...]:
        """Snippets for an example of the file `path` (corpus path) of `source` whose prompt's prefix
        is `prefix`: other files of the project only."""
        index, lines_of = self._index(source)
        query = query_lines(prefix)
        rel = project_path(path, source)
        found = []
        for wid, score in index.search(query, RETRIEVED, exclude_path=rel):
            wpath, start = index.win_path[wid], index.win_start[wid]
            found.append(Snippet(wpath, start, "".join(lines_of[wpath][start : start + WINDOW]), score))
        return pick(found, query)
