"""The VS Code extension builds (`npm ci && npm run compile`) and its unit tests pass (`npm test`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[2] / "editors" / "vscode"


def test_vscode_extension_builds_and_unit_tests_pass():
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: install Node.js 20+ to build the VS Code extension")
    for step in (["ci", "--no-audit", "--no-fund"], ["run", "compile"], ["test"]):
        r = subprocess.run([npm, *step], cwd=EXT, check=False, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"npm {' '.join(step)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert (EXT / "out" / "extension.js").exists()
    assert "# fail 0" in r.stdout
