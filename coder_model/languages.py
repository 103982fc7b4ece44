"""The one table of language names (docs/architecture.md §1: a table both sides must agree on).

The name goes into the model's header (`<file>{language}:{path}`), so the
server, the HTTP endpoint, `predict` and the training corpus must all give a
file the same name. Names are LSP languageIds, the vocabulary editors send.
No torch here: `dlm.lsp` imports it before any model is loaded.
"""

from __future__ import annotations

# file extension (lower case, with the dot) -> language name
EXTENSIONS: dict[str, str] = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascriptreact",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "typescriptreact",
    ".rs": "rust", ".go": "go", ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".lua": "lua", ".rb": "ruby", ".sh": "shellscript", ".bash": "shellscript",
}  # fmt: skip

# Other spellings editors and clients use for the same languages.
ALIASES: dict[str, str] = {
    "py": "python", "python3": "python", "js": "javascript", "jsx": "javascriptreact",
    "ts": "typescript", "tsx": "typescriptreact", "rs": "rust", "golang": "go",
    "c++": "cpp", "sh": "shellscript", "bash": "shellscript", "shell": "shellscript",
}  # fmt: skip

NAMES: frozenset[str] = frozenset(EXTENSIONS.values())


def language_for_path(path: str) -> str:
    """The language of a file path or URI by its extension ('' if unknown)."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return EXTENSIONS.get(name[dot:].lower(), "") if dot > 0 else ""


def language_name(language_id: str = "", path: str = "") -> str:
    """The model's name for a document: its languageId if we know it, else by extension.

    An unknown languageId with an unknown extension is passed through as the
    editor sent it (lower case), so the header still says something.
    """
    lid = (language_id or "").strip().lower()
    if lid in NAMES:
        return lid
    if lid in ALIASES:
        return ALIASES[lid]
    return language_for_path(path) or lid
