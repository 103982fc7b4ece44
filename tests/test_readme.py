"""The README's first screen: two commands, and the first one's position exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_start_commands():
    text = (ROOT / "README.md").read_text()
    head = text[: text.index("## ")]
    commands = re.findall(r"```sh\n(.+?)\n```", head)
    assert len(commands) == 2
    assert all("torch==2.13.0" in c for c in commands)
    assert commands[1].endswith(".venv/bin/pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci  # CI runs exactly the README's test command
    m = re.search(r"dlm-lsp predict (\S+) --line (\d+) --col (\d+)", commands[0])
    assert m, "the first command predicts with the embedded model"
    lines = (ROOT / m.group(1)).read_text().split("\n")
    line, col = int(m.group(2)), int(m.group(3))
    assert line < len(lines) and col <= len(lines[line]) and lines[line].strip()


def test_embedded_checkpoint_is_shipped_and_small():
    d = ROOT / "coder_model" / "checkpoints" / "default"
    files = list(d.glob("*.safetensors"))
    assert files and (d / "config.json").exists() and (d / "tokenizer.json").exists()
    assert sum(f.stat().st_size for f in files) < 60 * 2**20
    # shards stay under 16 MiB each (what the GPU machine's $OUT returns, and friendly to git)
    assert all(f.stat().st_size < 16 * 2**20 for f in files), [(f.name, f.stat().st_size) for f in files]
