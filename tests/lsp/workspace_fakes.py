"""What the workspace tests (index, discovery, ignore files) share: `FakeMemory` (the storage side
of RepoMemory's interface), a private cache and HOME per test (`cache_home`, autouse in a module
that imports it), writing a file into a tree, an ignore stack of one text, and waiting for a
condition or for an index's state."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dlm.lsp.gitignore import IgnoreStack, Rules


class FakeMemory:
    """The storage side of RepoMemory's interface; a token is a whitespace-separated word
    (the tests index no blank files, which the real lexer counts and this does not)."""

    def __init__(self, max_tokens: int = 20_000_000) -> None:
        self.max_tokens = max_tokens
        self.texts: dict[str, str] = {}

    def update_file(self, path: str, text: str) -> int:
        n = len(text.split())
        if self.tokens - len(self.texts.get(path, "").split()) + n > self.max_tokens:
            self.texts.pop(path, None)  # refused: no longer indexed (as RepoMemory does)
            return 0
        self.texts[path] = text
        return n

    def remove_file(self, path: str) -> None:
        self.texts.pop(path, None)

    @property
    def files(self) -> int:
        return len(self.texts)

    @property
    def tokens(self) -> int:
        return sum(len(t.split()) for t in self.texts.values())

    def save(self, fh) -> None:
        fh.write(json.dumps({"max_tokens": self.max_tokens, "texts": self.texts}).encode())

    @classmethod
    def load(cls, fh) -> FakeMemory:
        try:
            data = json.loads(fh.read())
        except Exception as exc:
            raise ValueError(f"not a FakeMemory: {exc}") from exc
        mem = cls(data["max_tokens"])
        mem.texts = data["texts"]
        return mem


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return cache


def write(root: Path, rel: str, text: str = "x = 1\n") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def make_project(root: Path) -> Path:
    """Three source files, and one each of what is never indexed: an ignored folder, a secret
    by name, a secret by folder and a vendored package."""
    write(root, "app/main.py", "def main():\n    return helper()\n")
    write(root, "app/util.py", "def helper():\n    return 42\n")
    write(root, "web/index.ts", "export const answer = 42;\n")
    write(root, ".gitignore", "generated/\n*.log\n")
    write(root, "generated/big.py", "skip = True\n")
    write(root, ".env", "TOKEN=hunter2\n")
    write(root, "deploy/credentials.py", "PASSWORD = 'hunter2'\n")
    write(root, "node_modules/lib/index.js", "module.exports = 1;\n")
    return root


def stack(text: str, base: str = "") -> IgnoreStack:
    """The ignore rules of `text` as one ignore file at `base`."""
    s = IgnoreStack()
    s.add(Rules.from_text(base, text))
    return s


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or cond}")


def ready(ws, state: str = "ready") -> dict:
    """The status of `ws` (a WorkspaceIndex) once its state is `state`."""
    wait_until(lambda: ws.status()["state"] == state, what=f"index state {state} (now {ws.status()})")
    return ws.status()
