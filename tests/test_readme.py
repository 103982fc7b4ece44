"""The README's first screen: two commands, and the first one prints what the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def _first_screen() -> tuple[list[str], list[str]]:
    """(the first command's predict arguments, the output lines the README shows for it)."""
    text = (ROOT / "README.md").read_text()
    head = text[: text.index("## ")]
    command = re.findall(r"```sh\n(.+?)\n```", head)[0]
    argv = command.split(".venv/bin/dlm-lsp ", 1)[1].split()
    shown = re.findall(r"```text\n(.+?)\n```", head, re.DOTALL)[0].split("\n")
    return argv, shown


def test_the_first_command_prints_what_the_readme_says(tmp_path):
    """The README's first command, run as written (the embedded model, this repository indexed
    into a fresh cache): the suggestion it shows is the one printed, the rest of the line in the
    file; the memory made it; the gate shows it. And the model alone shows nothing there."""
    argv, shown = _first_screen()
    assert argv[0] == "predict"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def run(*extra: str) -> str:
        r = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", *argv, *extra], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = run()
    suggestion = next(x for x in shown if x.startswith("== suggestion at the cursor: "))
    assert suggestion.endswith(", the text that follows in the file")
    assert suggestion in out.split("\n"), out
    source = next(x for x in shown if x.startswith("== source: "))
    assert source.startswith("== source: memory (") and "\n== source: memory (" in out, out
    assert "the editor would show it" in next(x for x in shown if x.startswith("== confidence "))
    assert re.search(r"^== confidence [0-9.]+; the editor would show it$", out, re.MULTILINE), out
    alone = run("--no-index")
    assert "== source: model" in alone
    assert ("== suggestion at the cursor: none" in alone
            or re.search(r"^== confidence [0-9.]+; the editor would hide it", alone, re.MULTILINE)), alone


def test_embedded_checkpoint_is_shipped_and_small():
    d = ROOT / "coder_model" / "checkpoints" / "default"
    files = list(d.glob("*.safetensors"))
    assert files and (d / "config.json").exists() and (d / "tokenizer.json").exists()
    assert sum(f.stat().st_size for f in files) < 60 * 2**20
    # shards stay under 16 MiB each (what the GPU machine's $OUT returns, and friendly to git)
    assert all(f.stat().st_size < 16 * 2**20 for f in files), [(f.name, f.stat().st_size) for f in files]
