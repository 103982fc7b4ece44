"""The invariants of docs/architecture.md §1, checked on the source (static imports, function-level
ones included; nothing is imported): the dependency direction, drivers apart from serving, no
import cycles, and one module name per module."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lsp": "dlm.lsp", "coder_model": "dlm.coder_model", "kernels": "dlm.kernels", "drivers": "dlm.drivers"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dlm."):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dlm."))
    return {m for m in found if m in MODULES}


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def _closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(GRAPH[m])
    return seen


def test_the_dependency_direction():
    wrong = [(m, i) for m, deps in GRAPH.items() for i in deps
             if (m.startswith("dlm.coder_model") and i.startswith(("dlm.lsp", "dlm.drivers")))
             or (m.startswith("dlm.kernels") and not i.startswith("dlm.kernels"))
             or (m.startswith("dlm.lsp") and i.startswith("dlm.drivers"))]  # fmt: skip
    assert not wrong, wrong


def test_the_server_imports_no_driver():
    for start in ("dlm.lsp.server_cli", "dlm.lsp.http_endpoint", "dlm.coder_model.remote.remote_cli"):
        assert not [m for m in _closure(start) if m.startswith("dlm.drivers")], start


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_module_names_are_unique():
    names = Counter(m.rsplit(".", 1)[-1] for m, p in MODULES.items() if p.name != "__init__.py")
    assert not [n for n, c in names.items() if c > 1 and n not in {"README"}], names.most_common(5)
