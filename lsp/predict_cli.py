"""`dlm-lsp predict FILE --line N --col M`: one prediction from the command line, as the
language server makes it, with the repository memory on.

Prints which repository memory it used, the predicted new region, the suggestion at the
cursor, which source made it (the memory, checked by the model or sure alone, or the model alone), the edit
as a unified diff of the file, the confidence and whether the editor would show it, and
timings. Positions are 0-based (the first line is --line 0, the first column --col 0), as in
LSP; the column counts characters (code points) of the line.

The repository memory: predict indexes the file's project, its git root (the nearest folder
at or above the file's folder holding `.git`), else the file's folder, with the server's own code
(lsp.workspace_index.WorkspaceIndex: the same discovery rules, .gitignore honoured, secrets masked, no
link followed, and the same on-disk cache, so a project the server indexed loads at once). It
refuses the roots the server refuses (`/`, the home directory and the folders above it) with
a message and predicts with the model alone then; `--no-index` skips the index. The memory is
consulted as the server consults it (typing mode only): its proposals come from
`lsp.memory_proposals.memory_proposals` over the text around the cursor, the snippets of other files
from `context.with_snippets`, and the denoiser checks the proposals.

Typing: in the default `--mode typing` the position means "typed up to here". An editor's
buffer has nothing after the cursor on the line being typed, while the file on disk holds the
line's true continuation, so the document predict builds is the file with the rest of the
cursor's line removed (as `dlm-lsp eval --repo` cuts the typed line at the cursor), and the
indexed copy of the file itself is left out of every memory query (`exclude_path`, the
server's rule for the document being edited; the server also swaps that copy for the open
buffer after a debounce, which changes nothing a query sees, so predict, which opens no
buffer, leaves the copy in place): the suggestion can never be copied from the text it is
meant to predict. The printed suggestion is compared with the rest of the line the file
has. `--no-index` predicts on the same cut document, with no memory. `--mode wide` (the region rewrite after a pause) predicts on the file as it is,
and the server never consults the memory there, so it indexes nothing.

The prompt is built by lsp.context, as the server builds it, with the windows fitted to the
engine's context budget. A region too large for the model's window (a line of thousands of
tokens) is cut around the cursor instead of failing.

The diff is of the file on disk: what it becomes with the model's answer (in typing mode,
the answer in place of the rest of the line; no diff when the answer is that rest, or when
the model proposes nothing). It names the file by its path relative to the current
directory (its file name when it lies elsewhere), with `a/` and `b/` prefixes and three lines
of context, so `dlm-lsp predict F --line N --col M --diff | patch -p1` applies it from the
current directory (`patch -p1 -d DIR` for a file in DIR outside it).

Exit codes: 0 ok, 2 bad input (missing, binary or non-UTF-8 file, position out of range),
3 model error.
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

from dlm.coder_model import limits
from dlm.coder_model.budget import LAYOUT_SPECIALS, plan
from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.edit_history import patch_lines
from dlm.coder_model.hosted.settings import EngineSettingsError, add_engine_arguments, settings_from_args
from dlm.coder_model.types import CancelToken, LayoutBudget, Prompt, SamplerParams
from dlm.lsp import context, discovery, gate, positions, postprocess
from dlm.lsp.documents import Document, content
from dlm.lsp.options import ContextOptions, Options

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Bytes looked at for NUL: text files never have one, binaries have one early (headers, padding).
BINARY_SNIFF_BYTES = 8192
WAIT_NOTE_S = 5.0  # a wait for the index longer than this (counted from the start) is said on stderr


class InputError(Exception):
    """Bad command-line input: exit code 2."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.description = (
        "Predict the edit at a position of a file as the language server would, with the repository "
        "memory of the file's project on (its git root, else its folder; --no-index: the model alone), "
        "and print the new region, the suggestion and its source (memory or model), the edit as a "
        "unified diff (file line numbers; `--diff | patch -p1` applies it), the confidence and timings. "
        "While typing (the default --mode) the rest of the cursor's line counts as not typed yet. "
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
    ap.add_argument("--no-index", action="store_true",
                    help="the model alone: no repository memory (by default predict indexes the file's project, "
                         "its git root or else its folder, as the server indexes a workspace, and consults the "
                         "memory while typing)")
    ap.add_argument("--index-timeout", type=float, default=600.0, metavar="S",
                    help="seconds to wait for the project's index (default 600; a project the server or an "
                         "earlier predict indexed loads from the cache in about a second)")
    ap.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                    help="DEBUG, INFO, WARNING or ERROR, any case (default WARNING; DEBUG adds tracebacks)")
    add_engine_arguments(ap)


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


def typed_document(doc: Document, line: int, col: int) -> tuple[Document, str]:
    """(the document as an editor has it while the cursor's line is typed up to `col`: the
    rest of that line removed, its line break kept; that rest)."""
    lines = doc.lines
    text = content(lines[line])
    rest = text[col:]
    if not rest:
        return doc, ""
    cut = "".join(lines[:line]) + text[:col] + lines[line][len(text) :] + "".join(lines[line + 1 :])
    return Document(doc.uri, cut, encoding=doc.encoding), rest


def build_context(doc: Document, line: int, col: int, mode: context.Mode, budget: LayoutBudget,
                  path: str) -> context.BuiltContext | None:
    """The server's context for the cursor, in the windows of the engine's budget, its fields
    bounded as the server bounds them (coder_model.limits)."""
    opts = ContextOptions()
    built = context.build(doc, line, col, mode, opts, context.windows_for(budget, opts), path)
    return None if built is None else replace(built, prompt=limits.bound_fields(built.prompt))


# -- the repository memory ----------------------------------------------------------------------


def project_root(path: Path) -> Path:
    """The project a file belongs to: the nearest folder at or above the file's folder that
    holds `.git` (a folder, or the file a git worktree or submodule has), else the file's folder."""
    folder = path.resolve().parent
    for d in (folder, *folder.parents):
        if (d / ".git").exists():
            return d
    return folder


class ProjectIndex:
    """The server's workspace index (lsp.workspace_index.WorkspaceIndex, default index options) over one
    project root, built in its background thread while the model loads."""

    def __init__(self, root: Path) -> None:
        from dlm.lsp.workspace_index import WorkspaceIndex

        self.root = root
        self.t0 = time.monotonic()
        self.workspace = WorkspaceIndex()
        self.workspace.set_roots([str(root)])

    def wait(self, timeout_s: float) -> tuple[dict, str]:
        """(the index status, '' when ready, else why it is not used). A wait of more than a
        few seconds (a large project's first index) is said once on stderr."""
        deadline = self.t0 + timeout_s
        said = False
        while True:
            status = self.workspace.status()
            state = status.get("state")
            if state == "ready":
                return status, ""
            if state in ("failed", "off"):
                why = status.get("reason") or status.get("message") or "no reason given"
                return status, f"the index of {self.root} is {state}: {why}"
            if not said and time.monotonic() - self.t0 > WAIT_NOTE_S:
                said = True
                print(f"dlm-lsp predict: waiting for the index of {self.root} ({status.get('text') or state}); "
                      "the next run loads it from the cache, and --no-index predicts without it",
                      file=sys.stderr)
            if time.monotonic() >= deadline:
                return status, (f"the index of {self.root} was not ready after {timeout_s:g} s "
                                f"({status.get('files', 0)} files so far); raise --index-timeout, or pass "
                                "--no-index to predict without it")
            time.sleep(0.05)

    def close(self) -> None:
        self.workspace.close()


def start_index(path: Path, args: argparse.Namespace) -> tuple[ProjectIndex | None, str]:
    """(the project's index, started; or None and, in a few words, why there is none). A refused
    root is said on stderr, with what to do."""
    if args.no_index:
        return None, "--no-index"
    if args.mode != "typing":
        return None, "the server consults it while typing only (--mode typing)"
    root = project_root(path)
    refused = discovery.refusal(str(root))
    if refused:
        print(f"dlm-lsp predict: not indexing {root}: {refused}, which the language server refuses too (it "
              "holds other projects and your secrets); predicting with the model alone. Put the file in a "
              "project folder (a git repository, or a folder of its own) to use the repository memory, or "
              "pass --no-index to predict without it and skip this message", file=sys.stderr)
        return None, f"{root} is refused: {refused}"
    return ProjectIndex(root), ""


def with_memory(index: ProjectIndex, doc: Document, built: context.BuiltContext, path: Path, line: int,
                col: int) -> tuple[context.BuiltContext, str]:
    """`built` with the memory's proposals and snippets, computed as the inline pipeline (lsp.inline) computes
    them for a typing request (the document's own indexed copy excluded), and the file's path
    in the index; (`built`, '') when the index holds no memory for the file."""
    from dlm.lsp.memory_proposals import document_syntax, memory_proposals, shipped_ranker, text_around

    ws = index.workspace
    memory, rel = ws.memory_for(str(path.resolve()))
    if memory is None or built.mode != "typing":
        return built, ""
    opened = ws.open_files(str(path.resolve()))
    opened.pop(rel, None)  # this document is the memory's first level, from the text below
    before, after = text_around(doc, line, col)
    with ws.prediction():
        ranker = shipped_ranker() if ws.options.rank_drafts else None
        proposals = memory_proposals(memory, before, after, rel, opened, ranker, document_syntax(doc, line, col))
        out = context.with_snippets(built, memory, rel)
    return replace(out, prompt=replace(out.prompt, proposals=proposals)), rel


def answer_source(prompt: Prompt, new_region: str, memory_note: str, checked: bool = True, passes: int = 0,
                  ranked: bool = False) -> str:
    """Which source made the answer: the memory (its proposal, `ranked` by the line ranker or in
    its own order; checked by the model, answered with no check asked for: `passes` 0, or alone
    where it is sure: the fast path), the memory vetoed by the model, or the model decoding alone
    (and why the memory did not propose)."""
    proposals = prompt.proposals
    if proposals:
        n = len(proposals)
        region, c = prompt.region, prompt.cursor
        for i, p in enumerate(proposals):
            if region[:c] + p.text + region[c:] == new_region:  # coder_model.verify.region_after
                if checked:
                    how = "checked by the model"
                elif not passes:
                    how = "no model check: sampler.verifyPasses is 0"
                else:
                    how = "sure enough that no check ran: sampler.memoryFirst"
                score = "the line ranker's probability" if ranked else "memory probability"
                return f"memory (the repository memory's proposal {i + 1} of {n}, {score} {p.score:.3f}, {how})"
        return f"memory: the model vetoed all {n} of the repository memory's proposals, so nothing is proposed"
    if memory_note:
        return f"model (no repository memory: {memory_note}; the model decoded alone)"
    return "model (the repository memory had no proposal at this position; the model decoded alone)"


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
        settings = settings_from_args(args)
        if settings is not None:
            if args.model:
                raise EngineSettingsError("--engine names a model server and --model another engine: give one")
            settings.resolved()
    except EngineSettingsError as exc:
        print(f"dlm-lsp predict: --engine: {exc}", file=sys.stderr)
        return 2
    try:
        file_doc = open_document(args.file, read_source(args.file), args.line, args.col)
        params = SamplerParams(steps=args.steps, threshold=args.threshold, block_len=args.block_len,
                               order=args.order, repeat_penalty=args.repeat_penalty,
                               end_threshold=args.end_threshold)
    except (InputError, ValueError) as exc:
        print(f"dlm-lsp predict: {exc}", file=sys.stderr)
        return 2
    if args.mode == "typing":
        doc, rest = typed_document(file_doc, args.line, args.col)
    else:
        doc, rest = file_doc, ""
    name = diff_name(args.file)
    index, memory_note = start_index(args.file, args)
    try:
        return _predict(args, params, file_doc, doc, rest, name, index, memory_note)
    finally:
        if index is not None:
            index.close()


def load_predict_engine(args: argparse.Namespace):
    """The embedded model (or --model), or the hosted engine --engine names (docs/engines.md)."""
    settings = settings_from_args(args)
    if settings is None:
        from dlm.coder_model.engine import load_engine

        return load_engine(args.model, args.device)
    from dlm.coder_model.hosted.http_engine import HostedEngine

    engine = HostedEngine(settings)
    if engine.status().state == "failed":
        engine.close()
        raise ValueError(engine.status().message)
    return engine


def _predict(args: argparse.Namespace, params: SamplerParams, file_doc: Document, doc: Document, rest: str,
             name: str, index: ProjectIndex | None, memory_note: str) -> int:
    memory_line = f"off ({memory_note})"
    try:
        t0 = time.perf_counter()
        engine = load_predict_engine(args)  # the index builds meanwhile, in its own thread
        load_ms = (time.perf_counter() - t0) * 1000
        try:
            path = name
            if index is not None:
                status, why = index.wait(args.index_timeout)
                if why:
                    print(f"dlm-lsp predict: {why}; predicting with the model alone", file=sys.stderr)
                    memory_line, memory_note, index = f"off ({why})", why, None
                else:
                    note = f"; {status['message']}" if status.get("message") else ""
                    memory_line = f"{index.root}: {status['files']} files, {status['tokens']} tokens{note}"
                    rel = Path(args.file).resolve().relative_to(index.root.resolve()).as_posix()
                    path = rel  # the server names a file by its path in the workspace folder
            built = build_context(doc, args.line, args.col, args.mode, engine.budget, path)
            if built is None:
                print(f"dlm-lsp predict: line {args.line} is longer than {ContextOptions.max_line_chars} "
                      "characters (minified code?); the server makes no suggestion there", file=sys.stderr)
                return 0
            if index is not None:
                try:
                    built, rel = with_memory(index, doc, built, args.file, args.line, args.col)
                except Exception as exc:  # as in the server: a memory failure costs the proposals only
                    logging.getLogger(__name__).debug("repository memory failed", exc_info=True)
                    rel = ""
                    print(f"dlm-lsp predict: the repository memory failed ({type(exc).__name__}: {exc}); "
                          "predicting with the model alone (--log-level debug shows the traceback)",
                          file=sys.stderr)
                if not rel:
                    memory_note = f"the index of {index.root} gave no memory for this file"
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
    start = sum(len(x) for x in doc.lines[: built.start_line]) + first
    changed = pred.text != prompt.region
    old = file_doc.text
    # the file with the suggestion (in typing mode in place of the rest of the line, which the
    # document left out); the file as it is when the model proposes nothing
    new = doc.text[:start] + pred.text + doc.text[start + (last - first) :] if changed else old
    edit = unified_diff(old, new, name)
    verdict = gate.decide(pred.confidence, False, False, args.min_confidence, args.min_confidence)
    if args.diff:
        if edit and not verdict.show:
            print(f"dlm-lsp predict: held back, as the editor would: {gate_reason(pred.confidence, args)}; "
                  "no diff printed (--min-confidence 0 prints it anyway)", file=sys.stderr)
            return 0
        print(edit, end="")
        return 0
    print(f"== repository memory: {memory_line}")
    if rest:
        print(f"== typed up to the cursor: the rest of line {args.line} ({rest!r}) is left out, as in an "
              "editor while it is typed")
    a, b = built.start_line, built.end_line
    print(f"== predicted region (0-based line{f' {a}' if a == b else f's {a}-{b}'}"
          f"{', cut around the cursor' if (first, last) != (0, len(built.prompt.region)) else ''})")
    print(pred.text, end="" if pred.text.endswith("\n") else "\n")
    if prompt.insert:
        sugg = postprocess.suggest(prompt.region, prompt.cursor, pred.text, prompt.suffix, prompt.prefix)
        print(f"== suggestion at the cursor: {suggestion_line(sugg, rest)}")
    ranked = index is not None and index.workspace.options.rank_drafts
    print(f"== source: {answer_source(prompt, pred.text, memory_note, pred.steps > 0, params.verify_passes, ranked)}")
    print("== edit (unified diff with file line numbers; `--diff | patch -p1` applies it)")
    if edit:
        print(edit, end="")
    elif changed:
        print("(none: the suggestion is the text the file already has there)")
    else:
        print("(no change)")
    shown = "the editor would show it" if verdict.show else f"the editor would hide it: {gate_reason(pred.confidence, args)}"
    conf = "none (this engine computes no confidence)" if pred.confidence is None else f"{pred.confidence:.3f}"
    print(f"== confidence {conf}; {shown}")
    print("== timings")
    print(f"load {load_ms:.0f} ms | predict {wall_ms:.1f} ms = queue {pred.queue_ms:.1f} + prefill "
          f"{pred.prefill_ms:.1f} + denoise {pred.denoise_ms:.1f} ms | {pred.steps} steps, {pred.tokens} tokens "
          f"({pred.tokens_per_step:.2f}/step), context {pred.context_tokens} tokens")
    return 0


def suggestion_line(sugg: postprocess.Suggestion, rest: str) -> str:
    """The inline suggestion as the editor would show it, and how it compares with the rest of
    the line the file has."""
    if sugg.held_back:
        return f"none (a degenerate answer, held back: {sugg.held_back})"
    text = sugg.insert_text
    if not text:
        return "none (the answer inserts nothing the server would show at the cursor)"
    if text == rest:
        return f"{text!r}, the text that follows in the file"
    if rest and rest.startswith(text):
        return f"{text!r}, the start of the text that follows in the file ({rest!r})"
    if rest:
        return f"{text!r}; the file has {rest!r}"
    return repr(text)
