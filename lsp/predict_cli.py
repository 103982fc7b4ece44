"""`dlm-lsp predict FILE --line N --col M`: one prediction from the command line.

Prints the predicted new region, the edit as a unified diff, and timings.
Positions are 0-based; the column counts characters (code points) of the line.
The prompt is built by lsp.context, as the language server builds it, with
the windows fitted to the engine's context budget: what `predict` shows is
what an editor would get at that position.
Exit codes: 0 ok, 2 bad input (missing file, position out of range), 3 model error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dlm.coder_model.edit_history import render_event
from dlm.coder_model.types import CancelToken, LayoutBudget, SamplerParams
from dlm.lsp import context, positions
from dlm.lsp.documents import Document
from dlm.lsp.options import ContextOptions


class InputError(Exception):
    """Bad command-line input: exit code 2."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", type=Path, help="source file")
    ap.add_argument("--line", type=int, required=True, help="0-based line of the cursor")
    ap.add_argument("--col", type=int, required=True, help="0-based column (characters) of the cursor")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--steps", type=int, default=SamplerParams.steps, help="upper bound on denoising steps")
    ap.add_argument("--threshold", type=float, default=SamplerParams.threshold,
                    help="commit every slot above this confidence in one step (1.0 = one slot per step)")
    ap.add_argument("--block-len", type=int, default=SamplerParams.block_len)
    ap.add_argument("--order", default="confidence", choices=("confidence", "left_to_right"))
    ap.add_argument("--mode", default="typing", choices=("typing", "wide"),
                    help="region: the cursor line and the rest of its statement (typing, what inline "
                         "completion uses while you type) or a few lines around it (wide, after a pause)")


def read_source(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: no such file; pass the path of a source file")
    data = path.read_bytes()
    # invalid UTF-8 is replaced, not fatal: the model still sees the rest of the file
    return data.decode("utf-8", errors="replace")


def open_document(path: Path, text: str, line: int, col: int) -> Document:
    """The file as the server would hold it; InputError if (line, col) is not in it."""
    doc = Document(path.resolve().as_uri(), text, encoding=positions.UTF32)  # --col counts code points
    n = len(doc.lines)
    if not 0 <= line < n:
        raise InputError(f"--line {line} is outside the file, which has {n} line(s) (0-based: 0..{n - 1})")
    width = len(doc.line(line))
    if not 0 <= col <= width:
        raise InputError(f"--col {col} is outside line {line}, which has {width} character(s) "
                         f"(0-based: 0..{width})")
    return doc


def build_context(doc: Document, line: int, col: int, mode: context.Mode, budget: LayoutBudget,
                  path: str) -> context.Built | None:
    """The server's context for the cursor, windows fitted to the engine's budget."""
    opts = context.fit_to_window(ContextOptions(), budget.max_context, budget.max_history, budget.max_suffix)
    return context.build(doc, line, col, mode, opts, path)


def run(args: argparse.Namespace) -> int:
    try:
        doc = open_document(args.file, read_source(args.file), args.line, args.col)
        params = SamplerParams(steps=args.steps, threshold=args.threshold, block_len=args.block_len,
                               order=args.order)
    except (InputError, ValueError) as exc:
        print(f"dlm-lsp predict: {exc}", file=sys.stderr)
        return 2
    try:
        from dlm.coder_model.engine import load_engine

        t0 = time.perf_counter()
        engine = load_engine(args.model, args.device)
        load_ms = (time.perf_counter() - t0) * 1000
        try:
            built = build_context(doc, args.line, args.col, args.mode, engine.budget, args.file.name)
            if built is None:
                print(f"dlm-lsp predict: line {args.line} is longer than {ContextOptions.max_line_chars} "
                      "characters (minified code?); the server makes no suggestion there", file=sys.stderr)
                return 0
            prompt = built.prompt
            t0 = time.perf_counter()
            pred = engine.predict(prompt, params, CancelToken())
            wall_ms = (time.perf_counter() - t0) * 1000
        finally:
            engine.close()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"dlm-lsp predict: model error: {exc}", file=sys.stderr)
        return 3
    first, last = built.start_line, built.end_line
    print(f"--- predicted region (line {first}{'' if first == last else f'-{last}'})")
    print(pred.text, end="" if pred.text.endswith("\n") else "\n")
    print("--- edit")
    # as a -U0 hunk with the file's line numbers, the way edit history is written
    edit = render_event(args.file.name, first, prompt.region.split("\n"), pred.text.split("\n"))
    print(edit or "(no change)", end="" if edit else "\n")
    print("--- timings")
    print(f"load {load_ms:.0f} ms | predict {wall_ms:.1f} ms = queue {pred.queue_ms:.1f} + prefill "
          f"{pred.prefill_ms:.1f} + denoise {pred.denoise_ms:.1f} ms | {pred.steps} steps, {pred.tokens} tokens "
          f"({pred.tokens_per_step:.2f}/step), context {pred.context_tokens} tokens")
    return 0
