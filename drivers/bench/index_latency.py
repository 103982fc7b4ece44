"""Suggestions while the workspace is indexed: latency of `dlm/stats` and of inline completions,
and the peak memory of the server's whole process tree, from the first request to "index ready".

    python -m dlm.drivers.bench.index_latency --workspace DIR [--device cpu] [--every-ms 150]

The server starts with an empty index cache (a temporary XDG_CACHE_HOME), so
the whole folder is indexed while a client types into an open buffer outside
the index (`probe.py`, at the root) every `--every-ms`: each keystroke sends
didChange, an inline completion request and a `dlm/stats` request, and each
answer's wait is recorded. Keystrokes start once the model is ready; the run
ends when the index is ready. The process tree's resident memory is sampled
from /proc (the server and every child it starts) at each keystroke.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PROBE = '''import os
import sys


def read_config(path):
    with open(path) as fh:
        return fh.read()


class Loader:
    def __init__(self, root):
        self.root = root
        self.'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, help="the folder to index")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--every-ms", type=float, default=150.0, help="time between keystrokes")
    parser.add_argument("--load-timeout", type=float, default=300.0, help="seconds to wait for the model")
    parser.add_argument("--index-timeout", type=float, default=1800.0, help="seconds to wait for the index")
    parser.add_argument("--after", type=int, default=50,
                        help="keystrokes typed the same way once the index is ready (the baseline)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants, in MB (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
        todo.extend(children.get(p, ()))
    return total / 1e6


def _peak_mb(pid: int) -> float | None:
    """The server process's own peak resident memory (VmHWM), in MB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1e3, 0)
    except (OSError, ValueError):
        pass
    return None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q / 100 * len(s)))], 1)


async def _run(args: argparse.Namespace) -> dict:
    from dlm.drivers.bench.typing_latency import initialize_for_inline, request
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    root = Path(args.workspace).resolve()
    cache = tempfile.mkdtemp(prefix="dlm-bench-index-cache-")
    log_file = tempfile.mkstemp(prefix="dlm-bench-index-", suffix=".log")[1]
    client = LanguageClient("dlm-bench-index", "0.1")
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--device", args.device, "--log-file", log_file]
    await client.start_io(*cmd, env={**os.environ, "XDG_CACHE_HOME": cache})
    server_pid = client._server.pid  # the asyncio subprocess pygls started
    stats_ms: list[float] = []
    inline_ms: list[float] = []
    rss: list[float] = []
    base_inline_ms: list[float] = []
    base_stats_ms: list[float] = []
    hwm = indexed_s = None
    stages: dict = {}
    t_start = time.monotonic()
    try:
        await initialize_for_inline(client, root.as_uri())
        deadline = time.monotonic() + args.load_timeout
        while (await request(client, "dlm/stats", {}))["state"] != "ready":
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_index: the model was not ready after {args.load_timeout:.0f} s ({log_file})")
            await asyncio.sleep(0.2)
        uri = (root / "probe.py").as_uri()
        text = PROBE
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        version, letters = 1, "pathconfigrootnamex"
        deadline = time.monotonic() + args.index_timeout
        index: dict = {}
        after = -1  # keystrokes left once the index is ready
        while time.monotonic() < deadline and after != 0:
            version += 1
            ch = letters[version % len(letters)]
            line, col = text.count("\n"), len(text) - text.rfind("\n") - 1
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(version=version, uri=uri),
                    [types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(line, col), types.Position(line, col)), text=ch)],
                )
            )
            text += ch
            col += 1
            t0 = time.perf_counter()
            await client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
                    text_document=types.TextDocumentIdentifier(uri),
                    position=types.Position(line, col),
                )
            )
            waited = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            st = await request(client, "dlm/stats", {})
            (stats_ms if after < 0 else base_stats_ms).append((time.perf_counter() - t0) * 1000)
            if after < 0:
                inline_ms.append(waited)
                rss.append(tree_rss_mb(server_pid))
                index = st.get("index") or {}
                if index.get("state") in ("ready", "failed", "off"):
                    hwm = _peak_mb(server_pid)
                    stages = {q: st.get(f"stages_p{q}_ms") for q in (50, 99)}
                    indexed_s = time.monotonic() - t_start
                    after = args.after
            else:
                base_inline_ms.append(waited)
                after -= 1
            if len(text) > 4000:  # a new line now and then: the buffer stays small
                text = PROBE
                version += 1
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(
                        types.VersionedTextDocumentIdentifier(version=version, uri=uri),
                        [types.TextDocumentContentChangeWholeDocument(text=text)],
                    )
                )
            await asyncio.sleep(args.every_ms / 1000)
    finally:
        try:
            await asyncio.wait_for(client.shutdown_async(None), 10)
            client.exit(None)
        except Exception:  # noqa: BLE001 - the server is going away either way
            pass
        await client.stop()
    return {
        "workspace": str(root),
        "index": {k: index.get(k) for k in ("state", "files", "tokens", "message")},
        "seconds": round(indexed_s, 1) if indexed_s is not None else None,
        "keystrokes": len(inline_ms),
        "inline_ms": {"p50": _pct(inline_ms, 50), "p99": _pct(inline_ms, 99), "max": _pct(inline_ms, 100)},
        "stats_ms": {"p50": _pct(stats_ms, 50), "p99": _pct(stats_ms, 99), "max": _pct(stats_ms, 100)},
        "server_stages_ms": stages,  # the server's own split of its last 200 answers before "ready"
        "after_index": {
            "keystrokes": len(base_inline_ms),
            "inline_ms": {"p50": _pct(base_inline_ms, 50), "p99": _pct(base_inline_ms, 99)},
            "stats_ms": {"p50": _pct(base_stats_ms, 50), "p99": _pct(base_stats_ms, 99)},
        },
        "peak_tree_rss_mb": round(max(rss), 0) if rss else None,
        "server_peak_rss_mb": hwm,
        "server_log": log_file,
    }


def run(args: argparse.Namespace) -> int:
    out = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"indexed {out['index']['files']} files, {out['index']['tokens']} tokens ({out['index']['state']}) "
              f"in {out['seconds']} s; {out['keystrokes']} keystrokes")
        print(f"inline completion: p50 {out['inline_ms']['p50']} ms, p99 {out['inline_ms']['p99']} ms, "
              f"max {out['inline_ms']['max']} ms")
        print(f"dlm/stats: p50 {out['stats_ms']['p50']} ms, p99 {out['stats_ms']['p99']} ms, max {out['stats_ms']['max']} ms")
        for q, v in out["server_stages_ms"].items():
            print(f"  server stages p{q} during the build: {v}")
        a = out["after_index"]
        print(f"after the index is ready ({a['keystrokes']} keystrokes): inline p50 {a['inline_ms']['p50']} ms, "
              f"p99 {a['inline_ms']['p99']} ms; dlm/stats p50 {a['stats_ms']['p50']} ms, p99 {a['stats_ms']['p99']} ms")
        print(f"resident memory: the process tree at most {out['peak_tree_rss_mb']} MB when sampled, "
              f"the server's own peak (VmHWM) {out['server_peak_rss_mb']} MB")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m dlm.drivers.bench.index_latency", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
