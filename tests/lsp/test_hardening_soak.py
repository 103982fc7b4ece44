"""Soak: typing through the real server with the real (embedded) model, memory sampled.

Marked slow (run with `-m slow`). DLM_SOAK_KEYSTROKES sets the length (default 30,000);
DLM_SOAK_OUT names a JSON file for the figures (BENCHMARKS.md "Soak"). Each keystroke is a
didChange and an inline completion request, as an editor sends them; the client waits for
the answers every 10 keystrokes (latest wins: the superseded requests answer empty, the
last runs the model). The document is reset every 2,000 keystrokes so that its own size
does not count as growth. The bound is generous: it catches a leak per keystroke or per
request (pygls' futures were ~2 KB a keystroke, 60 MB over 30,000), not allocator noise.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from lsp_helpers import rss_kb
from test_hardening_lsp import RawServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]

SOURCE = (Path(__file__).resolve().parents[2] / "lsp" / "context.py").read_text()
WARMUP = 1_000  # keystrokes before the first sample (at most a fifth of the run)
RESET_EVERY = 2_000
MAX_GROWTH_KB = 50_000


def test_typing_soak_memory_is_bounded():
    keystrokes = int(os.environ.get("DLM_SOAK_KEYSTROKES", "30000"))
    warmup, every = min(WARMUP, keystrokes // 5), max(10, keystrokes // 30)
    server = RawServer("--device", "cpu", DLM_ENGINE_FACTORY="")  # the embedded checkpoint
    uri = "file:///soak/typed.py"
    header = "import os\n\n\n"
    try:
        server.initialize()
        server.open(uri, header)
        pid = server.proc.pid
        version, row, col = 1, 3, 0
        pending: list[int] = []
        samples: list[tuple[int, int]] = []
        rss_start = None
        t0 = time.monotonic()
        for k in range(1, keystrokes + 1):
            if k % RESET_EVERY == 0:  # back to the header (a full-text change)
                version += 1
                server.notify(
                    "textDocument/didChange",
                    {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": header}]},
                )
                row, col = 3, 0
            ch = SOURCE[(k - 1) % len(SOURCE)]
            version += 1
            server.change(uri, version, (row, col), (row, col), ch)
            if ch == "\n":
                row, col = row + 1, 0
            else:
                col += 1
            pending.append(server.request("textDocument/inlineCompletion", {
                "textDocument": {"uri": uri}, "position": {"line": row, "character": col},
                "context": {"triggerKind": 2}}))  # fmt: skip
            if k % 10 == 0:
                for msg_id in pending:
                    assert "result" in server.reply(msg_id, timeout=120)
                pending.clear()
                server.seen.clear()  # the client keeps nothing: only the server's memory is measured
            if k == warmup:
                rss_start = rss_kb(pid)
            if k % every == 0:
                samples.append((k, rss_kb(pid)))
        stats = server.call("dlm/stats", {})["result"]
        wall = time.monotonic() - t0
        rss_end = rss_kb(pid)
        figures = {
            "keystrokes": keystrokes, "wall_s": round(wall, 1), "rss_start_kb": rss_start, "rss_end_kb": rss_end,
            "rss_max_kb": max(r for _, r in samples), "samples": samples, "completed": stats["completed"],
            "requests": stats["requests"], "pending_futures": stats["pending_futures"],
        }  # fmt: skip
        print(json.dumps(figures))
        if os.environ.get("DLM_SOAK_OUT"):
            Path(os.environ["DLM_SOAK_OUT"]).write_text(json.dumps(figures, indent=1))
        assert stats["completed"] > 0, "the model never ran: the soak measured nothing"
        assert stats["pending_futures"] <= 2
        assert rss_end - rss_start < MAX_GROWTH_KB, (
            f"RSS grew {rss_end - rss_start} kB after warm-up: {samples}"
        )
    finally:
        server.close()
