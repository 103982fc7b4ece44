"""The workspace folders the server names documents by, and the path of a document in them.

A document's path (in the prompt's header, the edit memory's patterns, the history) is relative
to the innermost workspace folder that holds it, else its file name, cut to coder_model.limits.
A client may add the same folder any number of times, and `path_of` runs on every request: the
folders are kept once each, longest first.
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from dlm.coder_model import limits


class WorkspaceRoots:
    def __init__(self) -> None:
        self.folders: list[str] = []  # once each, longest first

    def __len__(self) -> int:
        return len(self.folders)

    def set(self, roots: list[str]) -> None:
        self.folders = sorted({r.rstrip("/") or "/" for r in roots if r}, key=len, reverse=True)

    def path_of(self, uri: str) -> str:
        parsed = urlparse(uri)
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        for root in self.folders:  # longest first: the innermost folder names the path
            if path.startswith(root.rstrip("/") + "/"):
                return limits.bound_path(path[len(root.rstrip("/")) + 1 :])
        return limits.bound_path(path.rsplit("/", 1)[-1])
