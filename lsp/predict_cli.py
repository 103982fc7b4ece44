"""`dlm-lsp predict FILE --line N --col M`: one prediction from the command line.

Prints the predicted new region, the edit as a unified diff, and timings.
Positions are 0-based; the column counts characters (code points) of the line.
Exit codes: 0 ok, 2 bad input (missing file, position out of range), 3 model error.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from dlm.lsp.syntax import language_name

PREFIX_CHARS = 6000
SUFFIX_CHARS = 2000


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


def read_source(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: no such file; pass the path of a source file")
    data = path.read_bytes()
    # invalid UTF-8 is replaced, not fatal: the model still sees the rest of the file
    return data.decode("utf-8", errors="replace")


def prompt_at(text: str, line: int, col: int, path: str = "", language: str = "") -> tuple[Prompt, int, int]:
    """Prompt for a cursor at (line, col): the region is the cursor's line.

    Returns the prompt and the line span [first, last] of the region.
    """
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        raise InputError(f"--line {line} is outside the file, which has {len(lines)} line(s) "
                         f"(0-based: 0..{len(lines) - 1})")
    if not 0 <= col <= len(lines[line]):
        raise InputError(f"--col {col} is outside line {line}, which has {len(lines[line])} character(s) "
                         f"(0-based: 0..{len(lines[line])})")
    start = sum(len(x) + 1 for x in lines[:line])
    end = start + len(lines[line]) + (1 if line + 1 < len(lines) else 0)
    prefix = text[max(0, start - PREFIX_CHARS) : start]
    if start > PREFIX_CHARS and "\n" in prefix:  # windows start at a line boundary
        prefix = prefix[prefix.index("\n") + 1 :]
    suffix = text[end : end + SUFFIX_CHARS]
    if end + SUFFIX_CHARS < len(text) and "\n" in suffix:
        suffix = suffix[: suffix.rindex("\n") + 1]
    prompt = Prompt(prefix=prefix, region=text[start:end], cursor=col, suffix=suffix,
                    language=language, path=path)
    return prompt, line, line


def run(args: argparse.Namespace) -> int:
    try:
        text = read_source(args.file)
        prompt, first, last = prompt_at(text, args.line, args.col, path=args.file.name,
                                        language=language_name("", args.file.name))
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
        t0 = time.perf_counter()
        pred = engine.predict(prompt, params, CancelToken())
        wall_ms = (time.perf_counter() - t0) * 1000
        engine.close()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"dlm-lsp predict: model error: {exc}", file=sys.stderr)
        return 3
    print(f"--- predicted region (line {first}{'' if first == last else f'-{last}'})")
    print(pred.text, end="" if pred.text.endswith("\n") else "\n")
    print("--- edit")
    diff = list(difflib.unified_diff(prompt.region.splitlines(keepends=True), pred.text.splitlines(keepends=True),
                                     f"a/{args.file.name}", f"b/{args.file.name}", n=0))
    print("".join(d if d.endswith("\n") else d + "\n" for d in diff) if diff else "(no change)")
    print("--- timings")
    print(f"load {load_ms:.0f} ms | predict {wall_ms:.1f} ms = queue {pred.queue_ms:.1f} + prefill "
          f"{pred.prefill_ms:.1f} + denoise {pred.denoise_ms:.1f} ms | {pred.steps} steps, {pred.tokens} tokens "
          f"({pred.tokens_per_step:.2f}/step), context {pred.context_tokens} tokens")
    return 0
