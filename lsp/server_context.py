"""What the keystroke paths use of the server (lsp.server builds it once): the engine, the
counters, the pool, the workspace index, and the server's settings, open documents, paths,
suggestion ids, text windows and sampler. The settings and the open documents are read through
getters, because `initialize` replaces both. The inline pipeline (lsp.inline.InlineContext) and
the edit memory (lsp.next_edits.EditContext) each add what only they use."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlm.coder_model.types import LayoutBudget, SamplerParams
    from dlm.lsp.context import Windows
    from dlm.lsp.documents import Documents
    from dlm.lsp.engine_holder import EngineHolder
    from dlm.lsp.options import Options
    from dlm.lsp.stats import Stats
    from dlm.lsp.workspace_index import WorkspaceIndex


@dataclass(frozen=True)
class ServerContext:
    holder: EngineHolder
    stats: Stats
    pool: Executor
    workspace_index: WorkspaceIndex
    current_options: Callable[[], Options]
    current_documents: Callable[[], Documents]
    path_of: Callable[[str], str]
    next_id: Callable[[], str]
    windows: Callable[[LayoutBudget], Windows]
    sampler_params: Callable[[], SamplerParams]

    @property
    def options(self) -> Options:
        return self.current_options()

    @property
    def documents(self) -> Documents:
        return self.current_documents()

    def shared(self) -> dict[str, Any]:
        """This context's fields by name, for a context that extends it."""
        return {f.name: getattr(self, f.name) for f in fields(ServerContext)}
