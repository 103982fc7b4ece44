"""What a jump to another file costs (docs/next-edits.md, "Another file"): `dlm/editPrediction`
latency when the document has no site left and the server scans the workspace's other files.

    python -m dlm.drivers.bench.jump_latency --root ~/src/django --name get_version --new get_release

The server (the real `dlm-lsp --stdio`, edit predictions on, its defaults otherwise) indexes
--root as the workspace folder. A new buffer `bench_jump_scratch.py` in it, or in its folder
--at (never written to disk), holds two uses of --name, 31 lines apart; the benchmark renames both, as a user carrying a
rename does (a pause between them: two edits). No use is left in the buffer, so the server looks
in the other files. The first request scans; the next ones reuse the scan while the patterns are
the same. Reported: where the jump leads, the first request's latency and the others'.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from dlm.drivers.bench.typing_latency import Bench, Result, request

SCRATCH = "bench_jump_scratch.py"
FILLER_LINES = 30  # between the two uses: a pause and a distance make the renames two edits
EDIT_PAUSE_S = 1.7  # over the burst tracker's pause (1.5 s)


class JumpBench(Bench):
    PROGRAM = "dlm-lsp bench_jump"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.latencies: list[float] = []
        self.first: dict | None = None
        self.index: dict = {}

    def root_uri(self) -> str | None:
        return Path(self.args.root).resolve().as_uri()

    def initialization_options(self) -> dict | None:
        gate = {} if self.args.min_confidence is None else {"minConfidence": self.args.min_confidence,
                                                             "minConfidenceJump": self.args.min_confidence}
        return {"editPredictions": True, "nextEdits": {"gitCommits": 0, **gate}}

    async def _wait_ready(self, client, log_file: str) -> None:
        await super()._wait_ready(client, log_file)
        self.index = await self.wait_index(client, log_file, time.monotonic() + self.args.load_timeout,
                                           refuse_off=False)

    async def _replay(self, client, types) -> None:
        a = self.args
        uri = (Path(a.root).resolve() / a.at / SCRATCH).as_uri()
        lines = [f"value = {a.name}()\n", *(f"# filler {i}\n" for i in range(FILLER_LINES)), f"again = {a.name}()\n"]
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text="".join(lines))))
        for version, row in ((2, 0), (3, len(lines) - 1)):
            col = lines[row].index(a.name)
            rng = types.Range(start=types.Position(line=row, character=col),
                              end=types.Position(line=row, character=col + len(a.name)))
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangePartial(range=rng, text=a.new)]))
            await asyncio.sleep(EDIT_PAUSE_S)
        for _ in range(a.requests):
            t0 = time.monotonic()
            res = await request(client, "dlm/editPrediction",
                                {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 8}})
            self.latencies.append((time.monotonic() - t0) * 1000)
            if self.first is None:
                self.first = res or {}
            await asyncio.sleep(a.gap_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.bench.jump_latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the workspace folder (a project with files that use --name)")
    ap.add_argument("--name", required=True, help="an identifier the project's files use")
    ap.add_argument("--new", required=True, help="what the benchmark renames it to")
    ap.add_argument("--at", default=".", help="the folder of the scratch buffer, under --root (default: --root)")
    ap.add_argument("--requests", type=int, default=12, help="requests after the renames (default 12)")
    ap.add_argument("--gap-s", type=float, default=0.2, help="pause between two requests (default 0.2 s)")
    ap.add_argument("--min-confidence", type=float, default=None,
                    help="nextEdits.minConfidence and minConfidenceJump for the server (default: the server's own, "
                         "NextEditOptions)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded one)")
    ap.add_argument("--load-timeout", type=float, default=600.0, help="seconds for the model and the index")
    ap.add_argument("--server-log", default=None)
    ap.add_argument("--engine-factory", help=argparse.SUPPRESS)  # tests: see lsp/server_cli.py
    args = ap.parse_args(argv)
    if not Path(args.root).is_dir():
        print(f"dlm-lsp bench_jump: --root {args.root} is not a folder: give the project to index", file=sys.stderr)
        return 2
    if args.min_confidence is not None and not 0.0 <= args.min_confidence <= 1.0:
        print(f"dlm-lsp bench_jump: --min-confidence {args.min_confidence}: give a number in [0, 1]", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"dlm-lsp bench_jump: --requests {args.requests}: use at least 1", file=sys.stderr)
        return 2
    args.seed, args.log_level = 0, "INFO"
    bench = JumpBench(args)
    res: Result = asyncio.run(bench.run())
    jump = (bench.first or {}).get("jump")
    print(f"# bench_jump: {args.root} (buffer in {args.at}), rename {args.name} -> {args.new} made twice; index "
          f"{bench.index.get('files', 0)} files; server log {res.log_file}")
    print(f"jump: {jump['path']} line {jump['position']['line'] + 1} ({jump['label']}, confidence "
          f"{bench.first['confidence']:.3f})" if jump else "jump: none (no file holds a site over the gate)")
    rest = bench.latencies[1:]
    print("\n| request | n | p50 ms | max ms |\n| --- | --- | --- | --- |")
    print(f"| the first (the scan) | 1 | {bench.latencies[0]:.1f} | {bench.latencies[0]:.1f} |")
    if rest:
        print(f"| the next (the scan kept) | {len(rest)} | {statistics.median(rest):.1f} | {max(rest):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
