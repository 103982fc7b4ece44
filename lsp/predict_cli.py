"""`dlm-lsp predict FILE --line N --col M`: one prediction from the command line.

Prints the predicted new region, the edit as a unified diff of the file, and
timings. Positions are 0-based (the first line is --line 0, the first column
--col 0), as in LSP; the column counts characters (code points) of the line.
The prompt is built by lsp.context, as the language server builds it, with
the windows fitted to the engine's context budget: what `predict` shows is
what an editor would get at that position. A region too large for the
model's window (a line of thousands of tokens) is cut around the cursor
instead of failing.

The diff names the file by its path relative to the current directory (its
file name when it lies elsewhere), with `a/` and `b/` prefixes and three
lines of context, so `dlm-lsp predict F --line N --col M --diff | patch -p1`
applies it from the current directory (`patch -p1 -d DIR` for a file in DIR
outside it).

Exit codes: 0 ok, 2 bad input (missing, binary or non-UTF-8 file, position
out of range), 3 model error.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dlm.coder_model.budget import LAYOUT_SPECIALS, plan
from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.edit_history import patch_lines
from dlm.coder_model.types import CancelToken, LayoutBudget, Prompt, SamplerParams
from dlm.lsp import context, gate, positions
from dlm.lsp.documents import Document
from dlm.lsp.options import ContextOptions, Options

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Bytes looked at for NUL: text files never have one, binaries have one early (headers, padding).
BINARY_SNIFF_BYTES = 8192


class InputError(Exception):
    """Bad command-line input: exit code 2."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.description = (
        "Predict the edit at a position of a file and print the new region, the edit as a unified "
        "diff (file line numbers; `--diff | patch -p1` applies it) and timings. "
        "--line and --col are 0-based: the first line of the file is --line 0."
    )
    ap.add_argument("file", type=Path, help="source file (UTF-8 text)")
    ap.add_argument("--line", type=int, required=True,
                    help="0-based line of the cursor (the first line is 0; an editor's line 42 is --line 41)")
    ap.add_argument("--col", type=int, required=True,
                    help="0-based column of the cursor, in characters (code points) of the line")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    add_device_argument(ap)
    ap.add_argument("--steps", type=int, default=SamplerParams.steps, help="upper bound on denoising steps")
    ap.add_argument("--threshold", type=float, default=SamplerParams.threshold,
                    help="commit every slot above this confidence in one step (1.0 = one slot per step)")
    ap.add_argument("--block-len", type=int, default=SamplerParams.block_len)
    ap.add_argument("--order", default="confidence", choices=("confidence", "left_to_right"))
    ap.add_argument("--repeat-penalty", type=float, default=SamplerParams.repeat_penalty,
                    help="logits off a token that repeats its neighbourhood (0 = off)")
    ap.add_argument("--end-threshold", type=float, default=SamplerParams.end_threshold,
                    help="length-aware decoding: <eom> where P(ended) first reaches it (0 = off)")
    ap.add_argument("--mode", default="typing", choices=("typing", "wide"),
                    help="region: the cursor line and the rest of its statement (typing, what inline "
                         "completion uses while you type) or a few lines around it (wide, after a pause)")
    ap.add_argument("--diff", action="store_true",
                    help="print only the unified diff, for `| patch -p1`: nothing when the model changes "
                         "nothing or when the editor would hide the suggestion (below --min-confidence)")
    ap.add_argument("--min-confidence", type=float, default=Options.min_confidence, metavar="P",
                    help=f"the editor's gate: a suggestion below this calibrated confidence is hidden "
                         f"(default {Options.min_confidence}, the server's; 0 shows everything)")
    ap.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                    help="DEBUG, INFO, WARNING or ERROR, any case (default WARNING; DEBUG adds tracebacks)")


# -- input ------------------------------------------------------------------------------------


def read_source(path: Path) -> str:
    """The file's text; InputError for a missing, binary or non-UTF-8 file (the model reads
    UTF-8 source code: guessing at bytes would show it garbage and give a meaningless edit)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file; pass the path of a source file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc}); check its permissions") from None
    nul = data.find(b"\0", 0, BINARY_SNIFF_BYTES)
    if nul >= 0:
        raise InputError(
            f"{path} is a binary file (NUL byte at offset {nul}), not source code; pass a UTF-8 text file "
            "(a UTF-16 text file also has NUL bytes: convert it with `iconv -f UTF-16 -t UTF-8`)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start)
        raise InputError(
            f"{path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (0-based line {line}) "
            "is not valid UTF-8; if it is text in another encoding, convert it first, e.g. "
            "`iconv -f latin1 -t UTF-8`"
        ) from None


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
                  path: str) -> context.BuiltContext | None:
    """The server's context for the cursor, in the windows of the engine's budget."""
    opts = ContextOptions()
    return context.build(doc, line, col, mode, opts, context.windows_for(budget, opts), path)


# -- fitting an oversized prompt to the model's window ---------------------------------------------

def _longest_start(text: str, count: Callable[[str], int], limit: int) -> str:
    """The longest start of `text` with at most `limit` tokens (binary search on characters)."""
    if count(text) <= limit:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def fit_prompt(prompt: Prompt, budget: LayoutBudget, count: Callable[[str], int]) -> tuple[Prompt, int, int]:
    """The prompt cut so that the model's window holds it: (prompt, first, last) where the
    region is now the old region's characters [first, last).

    The engine's layout cuts the prefix and bounds history and suffix, but takes the region
    whole: a region of thousands of tokens (one huge line) overflows the model. Here a region
    that does not fit beside the header, history and suffix keeps the characters around the
    cursor (at least half the window; the suffix is cut to make room), and what it loses moves
    to the prefix and suffix, so the text the model sees stays in order. A prompt that fits
    is returned unchanged.
    """
    region, c = prompt.region, prompt.cursor
    cuts = plan(budget)
    window = budget.max_context
    header = count(f"{prompt.language}:{prompt.path}\n") + LAYOUT_SPECIALS
    history = min(cuts.history, sum(count(e) + 1 for e in prompt.history))
    suffix_tokens = min(cuts.suffix, count(prompt.suffix))
    room = window - header - history - suffix_tokens
    if count(region[:c]) + count(region[c:]) <= room:
        return prompt, 0, len(region)
    region_room = max(room, window // 2)

    def fits(r: int) -> bool:
        return count(region[max(0, c - r) : c]) + count(region[c : c + r]) <= region_room

    lo, hi = 0, max(c, len(region) - c)
    while lo < hi:  # the widest radius around the cursor that fits
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    first, last = max(0, c - lo), min(len(region), c + lo)
    suffix_room = max(0, min(cuts.suffix, window - header - history - region_room))
    cut = replace(
        prompt,
        prefix=prompt.prefix + region[:first],
        region=region[first:last],
        cursor=c - first,
        suffix=_longest_start(region[last:] + prompt.suffix, count, suffix_room),
    )
    return cut, first, last


def token_counter(engine) -> Callable[[str], int] | None:
    """len(tokens) of a text with the engine's tokenizer, or None when the engine has none here
    (the open families cut their own infill window; a remote engine tokenizes on the server)."""
    tok = getattr(engine, "tok", None)
    encode = getattr(tok, "encode", None)
    return (lambda text: len(encode(text))) if callable(encode) else None


def gate_reason(confidence: float | None, args: argparse.Namespace) -> str:
    return f"confidence {confidence:.3f} is below --min-confidence {args.min_confidence}"


# -- output -----------------------------------------------------------------------------------


def _span(start: int, stop: int) -> str:
    # GNU diff: "first,count", the count omitted when 1, and an empty side names the line before it
    n = stop - start
    if n == 1:
        return f"{start + 1}"
    return f"{start if n == 0 else start + 1},{n}"


def unified_diff(old: str, new: str, name: str, context_lines: int = 3) -> str:
    """`diff -u` of two versions of a file named `name`, with a/ b/ prefixes ('' if equal).

    Not coder_model.edit_history (the -U0 hunks the model reads as history): this one is for
    `patch`, so it has context lines and marks a last line without a newline.
    """
    a, b = patch_lines(old), patch_lines(new)
    if a == b:
        return ""
    out = [f"--- a/{name}\n", f"+++ b/{name}\n"]

    def emit(mark: str, line: str) -> None:
        out.append(mark + line if line.endswith("\n") else mark + line + "\n\\ No newline at end of file\n")

    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context_lines):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_span(i1, i2)} +{_span(j1, j2)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                for line in a[x1:x2]:
                    emit(" ", line)
                continue
            for line in a[x1:x2]:
                emit("-", line)
            for line in b[y1:y2]:
                emit("+", line)
    return "".join(out)


def diff_name(path: Path) -> str:
    """The file's path relative to the current directory, or its name when it lies elsewhere."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


class _NoTraceback(logging.Formatter):
    """Log lines without tracebacks: predict says what failed; --log-level DEBUG shows where."""

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)  # a copy: other handlers keep the traceback
        record.exc_info, record.exc_text = None, None
        return super().format(record)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    fmt = "dlm-lsp predict: %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt) if level == "DEBUG" else _NoTraceback(fmt))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        doc = open_document(args.file, read_source(args.file), args.line, args.col)
        params = SamplerParams(steps=args.steps, threshold=args.threshold, block_len=args.block_len,
                               order=args.order, repeat_penalty=args.repeat_penalty,
                               end_threshold=args.end_threshold)
    except (InputError, ValueError) as exc:
        print(f"dlm-lsp predict: {exc}", file=sys.stderr)
        return 2
    name = diff_name(args.file)
    try:
        from dlm.coder_model.engine import load_engine

        t0 = time.perf_counter()
        engine = load_engine(args.model, args.device)
        load_ms = (time.perf_counter() - t0) * 1000
        try:
            built = build_context(doc, args.line, args.col, args.mode, engine.budget, name)
            if built is None:
                print(f"dlm-lsp predict: line {args.line} is longer than {ContextOptions.max_line_chars} "
                      "characters (minified code?); the server makes no suggestion there", file=sys.stderr)
                return 0
            prompt, first, last = built.prompt, 0, len(built.prompt.region)
            count = token_counter(engine)
            if count is not None:
                prompt, first, last = fit_prompt(prompt, engine.budget, count)
                if (first, last) != (0, len(built.prompt.region)):
                    print(f"dlm-lsp predict: the region (0-based lines {built.start_line}-{built.end_line}, "
                          f"{len(built.prompt.region)} characters) does not fit the model's window of "
                          f"{engine.budget.max_context} tokens; the model rewrites the {last - first} characters "
                          "around the cursor", file=sys.stderr)
            t0 = time.perf_counter()
            pred = engine.predict(prompt, params, CancelToken())
            wall_ms = (time.perf_counter() - t0) * 1000
        finally:
            engine.close()
    except (OSError, ValueError, RuntimeError) as exc:
        hint = "" if args.log_level == "DEBUG" else " (--log-level debug shows the traceback)"
        print(f"dlm-lsp predict: model error: {exc}{hint}", file=sys.stderr)
        return 3
    old = doc.text
    start = sum(len(x) for x in doc.lines[: built.start_line]) + first
    new = old[:start] + pred.text + old[start + (last - first) :]
    edit = unified_diff(old, new, name)
    verdict = gate.decide(pred.confidence, False, False, args.min_confidence, args.min_confidence)
    if args.diff:
        if edit and not verdict.show:
            print(f"dlm-lsp predict: held back, as the editor would: {gate_reason(pred.confidence, args)}; "
                  "no diff printed (--min-confidence 0 prints it anyway)", file=sys.stderr)
            return 0
        print(edit, end="")
        return 0
    a, b = built.start_line, built.end_line
    print(f"== predicted region (0-based line{f' {a}' if a == b else f's {a}-{b}'}"
          f"{', cut around the cursor' if (first, last) != (0, len(built.prompt.region)) else ''})")
    print(pred.text, end="" if pred.text.endswith("\n") else "\n")
    print("== edit (unified diff with file line numbers; `--diff | patch -p1` applies it)")
    print(edit or "(no change)", end="" if edit else "\n")
    shown = "the editor would show it" if verdict.show else f"the editor would hide it: {gate_reason(pred.confidence, args)}"
    conf = "none (this engine computes no confidence)" if pred.confidence is None else f"{pred.confidence:.3f}"
    print(f"== confidence {conf}; {shown}")
    print("== timings")
    print(f"load {load_ms:.0f} ms | predict {wall_ms:.1f} ms = queue {pred.queue_ms:.1f} + prefill "
          f"{pred.prefill_ms:.1f} + denoise {pred.denoise_ms:.1f} ms | {pred.steps} steps, {pred.tokens} tokens "
          f"({pred.tokens_per_step:.2f}/step), context {pred.context_tokens} tokens")
    return 0
