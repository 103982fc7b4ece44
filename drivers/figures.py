"""How a driver hands back its figures: the JSON printed on stdout and, when asked, written to a
file too (BENCHMARKS.md quotes it)."""

from __future__ import annotations

import json
from pathlib import Path


def print_figures(figures: dict, path: str | Path | None) -> int:
    """Prints `figures` as indented JSON, writes the same to `path` when given; 0 (the exit status)."""
    text = json.dumps(figures, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n", encoding="utf-8")
    return 0
