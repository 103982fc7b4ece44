"""Helpers for the LSP end-to-end tests: the real server as a subprocess.

A plain module (imported as `lsp_helpers`: pytest puts this folder on sys.path
for the tests in it), not a conftest, so that no test imports a conftest by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


SERVER = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]


def plain(obj):
    """pygls' client hands back custom results as namedtuples; make them dicts/lists."""
    if hasattr(obj, "_asdict"):
        return {k: plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


async def request(client, method: str, params):
    return plain(await client.protocol.send_request_async(method, params))
