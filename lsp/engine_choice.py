"""Which engine serves: the command line's, or a user-scoped `engine` of initializationOptions
(docs/engines.md). A project can write initializationOptions (.vscode/settings.json, .zed/settings.json,
an exrc), so an engine setting is taken from it only when the client's plugin marks it user-scoped.
"""

from __future__ import annotations

import logging
from typing import Any

from dlm.coder_model.types import Engine
from dlm.lsp.engine_holder import EngineHolder, EngineRefused, hosted_factory

log = logging.getLogger("dlm.lsp.server")


def choose_engine(holder: EngineHolder, command_line_engine: bool, init_options: Any,
                  client: str = "") -> list[str]:
    """The engine of the user's settings (docs/engines.md): initializationOptions["engine"] is taken
    only when the client (`client`: clientInfo.name) is one whose plugin marks it user-scoped, it
    is so marked, and the command line names no engine; anything else is ignored, and dlm/status
    says why (the returned notes, for dlm/status)."""
    value = init_options.get("engine") if isinstance(init_options, dict) else None
    if value is None:
        return []
    from dlm.coder_model.hosted.settings import from_initialization_options

    found = from_initialization_options(value, client)
    notes = [found.note] if found.note else []
    if command_line_engine and (found.settings is not None or found.problem):
        notes.append("initializationOptions.engine ignored: the command line names the engine")
    elif found.problem:  # the failed engine's status says it
        log.warning("initializationOptions.engine: %s", found.problem)
        problem = found.problem

        def refused() -> Engine:  # the user asked for a hosted engine: never the embedded model instead
            raise EngineRefused(problem)

        holder.set_factory(refused)
    elif found.settings is not None:
        holder.set_factory(hosted_factory(found.settings))
        log.info("engine from %s: %s", found.settings.source, found.settings.describe())
    for note in notes:
        log.warning("%s", note)
    return notes
