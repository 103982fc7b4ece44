"""Zed's edit-prediction prompts, read back into our Prompt (pure functions, no I/O).

Zed shows edit predictions only from its own providers, one of which,
`open_ai_compatible_api`, posts a prompt string Zed formats itself
(crates/edit_prediction and crates/zeta_prompt), chosen by its
`prompt_format` setting:

- fill-in-the-middle (code_llama, star_coder, deepseek_coder, qwen,
  codegemma, codestral, glm): the text before and after the cursor of a
  ~512-token window; Zed inserts the answer at the cursor;
- zeta (zeta1): an instruction, the user's recent edits as diffs, and an
  excerpt with `<|editable_region_start|>`, the cursor marker
  `<|user_cursor_is_here|>` and `<|editable_region_end|>`; Zed replaces the
  editable region with the answer (text after `<|editable_region_start|>\\n`)
  and shows the difference as edits anywhere in the region;
- zeta2: `<|file_sep|>`-separated sections (related files, `edit history`
  with `--- a/PATH` / `+++ b/PATH` diffs, then the cursor's file) and the
  cursor's file as Qwen FIM markers around an editable region that holds
  the cursor marker `<|user_cursor|>`. Zed has several layouts of it; we read
  the ones it sends to an OpenAI-compatible server: the editable region
  between git merge markers `<<<<<<< CURRENT` and `=======` (before the
  suffix, Zed's default, or after `<|fim_middle|>`; the answer is the new
  region followed by `>>>>>>> UPDATED`, and a prompt that ends with the
  start of the region, Zed's "prefill", gets only the rest), or between
  `<|fim_middle|>current` and `<|fim_middle|>updated` (the answer is the new
  region);
- any other prompt (other OpenAI-compatible clients) is plain text to
  continue: prefix = the prompt, no suffix; the answer is the completion
  after it.

`parse_prompt` reads the request text into a `ZedPrompt`; `build_prompt` makes
the engine's Prompt of it (region = the cursor line, plus a line either side
for the zeta formats, so the masked block stays short; or, in typing mode, the
cursor line as an insertion prompt in every format; language names from
coder_model.languages; Zed's edit diffs re-rendered as the -U0 hunks the model
was trained on); `render_answer` writes the model's new region in the format
Zed reads, cut at the request's `stop` sequences where the answer is an
insertion. lsp.http_endpoint does the HTTP around them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from dlm.coder_model.edit_history import render_event
from dlm.coder_model.languages import language_for_path
from dlm.coder_model.types import Prompt
from dlm.lsp.postprocess import suggest

log = logging.getLogger(__name__)

CURSOR = "<|user_cursor_is_here|>"
START_OF_FILE = "<|start_of_file|>"
REGION_START = "<|editable_region_start|>"
REGION_END = "<|editable_region_end|>"
ZETA_EXCERPT_HEADER = "\n\n### User Excerpt:\n\n"
ZETA_EDITS_HEADER = "### User Edits:\n\n"
ZETA_RESPONSE_HEADER = "\n\n### Response:\n"

# zeta2 (crates/zeta_prompt)
ZETA2_CURSOR = "<|user_cursor|>"
FILE_SEP = "<|file_sep|>"
ZETA2_HISTORY = FILE_SEP + "edit history\n"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
MERGE_CURRENT, MERGE_SEPARATOR, MERGE_UPDATED = "<<<<<<< CURRENT\n", "=======\n", ">>>>>>> UPDATED\n"
MIDDLE_CURRENT, MIDDLE_UPDATED = FIM_MIDDLE + "current\n", FIM_MIDDLE + "updated\n"

# name -> (opening, middle, closing) markers; the text between opening and
# middle is the prefix, between middle and closing the suffix (codestral: reversed).
FIM_FORMATS: dict[str, tuple[str, str, str]] = {
    "code_llama": ("<PRE> ", " <SUF>", " <MID>"),
    "star_coder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "deepseek_coder": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # also codegemma
    "glm": ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),
}
CODESTRAL = ("[SUFFIX]", "[PREFIX]")  # "[SUFFIX]{suffix}[PREFIX]{prefix}"

SUPPORTED = "code_llama, star_coder, deepseek_coder, qwen, codegemma, codestral, glm, zeta, zeta2"
# The format of a request with OpenAI's `suffix` field (lsp.http_endpoint): prompt | suffix.
SUFFIX_FORMAT = "suffix"


class PromptFormatError(ValueError):
    """The prompt is in no format we can read; the message says what to set in Zed."""


@dataclass(frozen=True)
class ZedPrompt:
    """What a Zed prompt says: an excerpt of the file and where the cursor is in it.

    `text` is the excerpt without markers, `cursor` an offset in it, and
    `editable` the (start, end) offsets Zed lets the answer rewrite (zeta), or
    the whole excerpt (fill-in-the-middle, where the answer is an insertion).
    """

    format: str
    text: str
    cursor: int
    editable: tuple[int, int]
    history: tuple[str, ...] = ()
    path: str = ""
    start_of_file: bool = False
    end_marker: str = ""  # zeta2: what ends the answer (Zed strips it)


def parse_prompt(prompt: str) -> ZedPrompt:
    """A Zed edit-prediction prompt -> ZedPrompt; PromptFormatError if it is in no known format."""
    if not isinstance(prompt, str):
        raise PromptFormatError(f"'prompt' must be a string, got {type(prompt).__name__}")
    if REGION_START in prompt and CURSOR in prompt:
        return _parse_zeta(prompt)
    if ZETA2_CURSOR in prompt and FILE_SEP in prompt and FIM_PREFIX in prompt:
        return _parse_zeta2(prompt)
    for name, (a, b, c) in FIM_FORMATS.items():
        if prompt.startswith(a) and prompt.endswith(c) and b in prompt[len(a) : len(prompt) - len(c)]:
            body = prompt[len(a) : len(prompt) - len(c)]
            prefix, _, suffix = body.partition(b)
            return _fim(name, prefix, suffix)
    s, p = CODESTRAL
    if prompt.startswith(s) and p in prompt[len(s) :]:
        suffix, _, prefix = prompt[len(s) :].partition(p)
        return _fim("codestral", prefix, suffix)
    if ZETA2_CURSOR in prompt or CURSOR in prompt:  # a cursor marker in a layout we do not read
        raise PromptFormatError(
            "the prompt has a Zed cursor marker but is in none of the layouts dlm-lsp reads (" + SUPPORTED
            + '; zeta2_1\'s multi-region layout is not read); in Zed set "prompt_format": "zeta2" or "qwen"'
        )
    # No markers: a plain completion prompt (other OpenAI-compatible clients). Continue it.
    return ZedPrompt(format="plain", text=prompt, cursor=len(prompt), editable=(0, len(prompt)))


def _fim(name: str, prefix: str, suffix: str) -> ZedPrompt:
    text = prefix + suffix
    return ZedPrompt(format=name, text=text, cursor=len(prefix), editable=(0, len(text)))


def _parse_zeta(prompt: str) -> ZedPrompt:
    """Zeta (v1) prompt: instruction, '### User Edits:' diffs, '### User Excerpt:' block, '### Response:'."""
    rs = prompt.find(REGION_START)
    hdr = prompt.rfind(ZETA_EXCERPT_HEADER, 0, rs)
    if hdr < 0:
        raise PromptFormatError(
            "zeta prompt without '### User Excerpt:' before <|editable_region_start|>; "
            'this is not the zeta format Zed sends, set "prompt_format": "zeta" or "qwen"'
        )
    end = prompt.rfind(ZETA_RESPONSE_HEADER)
    if end < rs:
        end = len(prompt)
    excerpt = prompt[hdr + len(ZETA_EXCERPT_HEADER) : end]
    excerpt = excerpt.removesuffix("\n```")
    path = ""
    if excerpt.startswith("```"):
        first, _, excerpt = excerpt.partition("\n")
        path = first[3:].strip()
    sof = excerpt.startswith(START_OF_FILE + "\n")
    if sof:
        excerpt = excerpt[len(START_OF_FILE) + 1 :]
    before, _, rest = excerpt.partition(REGION_START)
    rest = rest.removeprefix("\n")
    editable, found_end, after = rest.partition(REGION_END)
    if not found_end:
        raise PromptFormatError("zeta prompt has <|editable_region_start|> but no <|editable_region_end|>")
    edits_at = prompt.find(ZETA_EDITS_HEADER)
    events = prompt[edits_at + len(ZETA_EDITS_HEADER) : hdr] if 0 <= edits_at < hdr else ""
    ed_before, ed_after = _split_at_cursor("zeta", editable.removesuffix("\n"), CURSOR)
    return _with_editable_region("zeta", before, ed_before, ed_after, after,
                                 history=parse_zeta_events(events), path=path, start_of_file=sof)


def _parse_zeta2(prompt: str) -> ZedPrompt:
    """zeta2 prompt (crates/zeta_prompt): sections after `<|file_sep|>`; the last one is the
    cursor's file, in one of the layouts the module docstring lists."""
    prefix_at = prompt.find(FIM_PREFIX)
    file_at = prompt.rfind(FILE_SEP, 0, prefix_at)
    if file_at < 0:
        raise PromptFormatError("zeta2 prompt without a <|file_sep|>PATH line before <|fim_prefix|>; "
                                'set "prompt_format": "zeta2" (or "qwen") in Zed')
    path, _, _ = prompt[file_at + len(FILE_SEP) : prefix_at].partition("\n")
    history_at = prompt.find(ZETA2_HISTORY, 0, file_at)
    history: tuple[str, ...] = ()
    if history_at >= 0:
        end = prompt.find(FILE_SEP, history_at + len(ZETA2_HISTORY))
        history = parse_zeta2_events(prompt[history_at + len(ZETA2_HISTORY) : end if end >= 0 else file_at])
    body = prompt[prefix_at + len(FIM_PREFIX) :]
    end_marker, prefill = "", ""
    if MERGE_CURRENT in body:
        end_marker = MERGE_UPDATED
        before_region, _, rest = body.partition(MERGE_CURRENT)
        if FIM_SUFFIX in before_region:  # v0120: prefix <|fim_suffix|> suffix <|fim_middle|> <<<<<<< ...
            before, _, after = before_region.partition(FIM_SUFFIX)
            after = after.removesuffix(FIM_MIDDLE)
            editable, found, _ = rest.partition(MERGE_SEPARATOR)
        else:  # v0131 (Zed's default): prefix <<<<<<< region ======= <|fim_suffix|> suffix <|fim_middle|>
            before = before_region
            editable, found, rest = rest.partition(MERGE_SEPARATOR)
            after_part, _, prefill = rest.removeprefix(FIM_SUFFIX).rpartition(FIM_MIDDLE)
            after = after_part
        if not found:
            raise PromptFormatError("zeta2 prompt has <<<<<<< CURRENT but no ======= after the editable region")
    elif MIDDLE_CURRENT in body:
        body = body.removeprefix("\n")
        if 0 <= body.find(FIM_SUFFIX) < body.find(MIDDLE_CURRENT):  # v0112: prefix, suffix, then the region
            before, _, rest = body.partition(FIM_SUFFIX)
            after, _, rest = rest.removeprefix("\n").partition(MIDDLE_CURRENT)
            editable, _, _ = rest.partition(MIDDLE_UPDATED)
        else:  # v0113/v0114: prefix, the region, suffix
            before, _, rest = body.partition(MIDDLE_CURRENT)
            editable, _, rest = rest.partition(FIM_SUFFIX)
            after, _, _ = rest.removeprefix("\n").partition(MIDDLE_UPDATED)
    else:
        raise PromptFormatError("zeta2 prompt with neither <<<<<<< CURRENT nor <|fim_middle|>current around "
                                'the editable region; set "prompt_format": "zeta2" (or "qwen") in Zed')
    ed_before, ed_after = _split_at_cursor("zeta2", editable, ZETA2_CURSOR)
    if prefill and not ed_before.startswith(prefill):
        raise PromptFormatError("zeta2 prompt ends with text that does not start the editable region")
    # Zed's prefill (the region's first lines, after <|fim_middle|>) is fixed: the answer continues it
    return _with_editable_region("zeta2", before, ed_before, ed_after, after, fixed_start=len(prefill),
                                 history=history, path=path.strip(), end_marker=end_marker)


def _split_at_cursor(name: str, editable: str, cursor_marker: str) -> tuple[str, str]:
    """The editable region before and after its one cursor marker."""
    if editable.count(cursor_marker) != 1:
        raise PromptFormatError(
            f"{name} prompt has {editable.count(cursor_marker)} cursor markers in the editable region; expected 1"
        )
    ed_before, _, ed_after = editable.partition(cursor_marker)
    return ed_before, ed_after


def _with_editable_region(
    name: str, before: str, ed_before: str, ed_after: str, after: str, fixed_start: int = 0, **fields
) -> ZedPrompt:
    """The ZedPrompt of a file cut as `before` + the editable region (`ed_before` + the cursor +
    `ed_after`) + `after`; the region's first `fixed_start` characters are not to be rewritten."""
    start = len(before)
    return ZedPrompt(
        format=name,
        text=before + ed_before + ed_after + after,
        cursor=start + len(ed_before),
        editable=(start + fixed_start, start + len(ed_before) + len(ed_after)),
        **fields,
    )


_ZETA2_FILE_HEADER = re.compile(r"^--- a(/[^\n]*)\n\+\+\+ b(/[^\n]*)\n", re.MULTILINE)


def parse_zeta2_events(events: str) -> tuple[str, ...]:
    """zeta2's edit history ('--- a/PATH\\n+++ b/PATH\\n' + hunks per event, oldest first) ->
    edit events rendered by coder_model.edit_history, one per hunk."""
    out: list[str] = []
    heads = list(_ZETA2_FILE_HEADER.finditer(events))
    for i, m in enumerate(heads):
        body = events[m.end() : heads[i + 1].start() if i + 1 < len(heads) else len(events)]
        name = m.group(2).lstrip("/") or "untitled"
        for start, old, new in parse_hunks(body):
            event = render_event(name, start, old, new)
            if event:
                out.append(event)
    return tuple(out)


def parse_zeta_events(events: str) -> tuple[str, ...]:
    """'User edited PATH:\\n```diff\\nHUNKS\\n```' blocks (oldest first) -> edit events rendered
    by coder_model.edit_history, one per hunk, as serving and training render them."""
    out: list[str] = []
    for block in events.split("User edited ")[1:]:
        head, sep, rest = block.partition(":\n```diff\n")
        if not sep:
            continue
        body, _, _ = rest.rpartition("\n```")
        name = head.strip().strip('"') or "untitled"
        for start, old, new in parse_hunks(body):
            event = render_event(name, start, old, new)
            if event:
                out.append(event)
    return tuple(out)


_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def parse_hunks(diff: str) -> list[tuple[int, list[str], list[str]]]:
    """Unified-diff hunks -> (0-based first old line, old lines, new lines), context included.

    Lines outside a hunk (---/+++ headers, "\\ No newline at end of file") are skipped;
    a hunk whose header cannot be read is skipped with a debug log line, not guessed at.
    """
    hunks: list[tuple[int, list[str], list[str]]] = []
    current: tuple[int, list[str], list[str]] | None = None
    for line in diff.split("\n"):
        if line.startswith("@@"):
            m = _HUNK_HEADER.match(line)
            if m is None:
                log.debug("skipping a diff hunk with an unreadable header: %r", line)
                current = None
                continue
            first, count = int(m.group(1)), 1 if m.group(2) is None else int(m.group(2))
            # git names the line before an empty old side (count 0), the first line otherwise
            current = (first if count == 0 else first - 1, [], [])
            hunks.append(current)
        elif current is None or line.startswith(("--- ", "+++ ", "\\")):
            continue
        elif line.startswith("-"):
            current[1].append(line[1:])
        elif line.startswith("+"):
            current[2].append(line[1:])
        else:  # context (a blank context line may have lost its leading space)
            current[1].append(line[1:])
            current[2].append(line[1:])
    return hunks


@dataclass(frozen=True)
class Built:
    prompt: Prompt
    region_start: int  # offsets of the region in ZedPrompt.text
    region_end: int


def _line_start(text: str, pos: int, lo: int) -> int:
    i = text.rfind("\n", lo, pos)
    return lo if i < 0 else i + 1


def _line_end(text: str, pos: int, hi: int) -> int:
    i = text.find("\n", pos, hi)
    return hi if i < 0 else i


def build_prompt(zp: ZedPrompt, zeta_lines_before: int = 1, zeta_lines_after: int = 1,
                 typing: bool = False, region_end: int | None = None) -> Built:
    """The engine's Prompt for a parsed Zed prompt: the region is the cursor line (fim) or
    the cursor line with `zeta_lines_before`/`after` lines around it (zeta), clipped to
    Zed's editable range. `typing`: an insertion prompt (Prompt.insert, the language server's
    typing mode) on the cursor line alone, in every format, or up to `region_end` (an offset at
    or after the cursor line's end: the rest of its statement, as the server's region rule cuts
    it): the model, or the repository memory's proposals, write only the text to insert at the
    cursor."""
    lo, hi = zp.editable
    t = zp.text
    s = _line_start(t, zp.cursor, lo)
    e = _line_end(t, zp.cursor, hi)
    if typing and region_end is not None and e <= region_end <= hi:
        e = region_end
    if zp.format in ("zeta", "zeta2") and not typing:
        for _ in range(zeta_lines_before):
            if s > lo:
                s = _line_start(t, s - 1, lo)
        for _ in range(zeta_lines_after):
            if e < hi:
                e = _line_end(t, e + 1, hi)
    prompt = Prompt(
        prefix=t[:s],
        region=t[s:e],
        cursor=zp.cursor - s,
        suffix=t[e:],
        history=zp.history,
        language=language_for_path(zp.path),
        path=zp.path,
        insert=typing,
    )
    return Built(prompt, s, e)


def cursor_line(zp: ZedPrompt) -> tuple[str, int]:
    """The excerpt's line holding the cursor (no line break) and the cursor's column in it."""
    s = _line_start(zp.text, zp.cursor, 0)
    return zp.text[s : _line_end(zp.text, zp.cursor, len(zp.text))], zp.cursor - s


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def render_answer(zp: ZedPrompt, built: Built, new_region: str, stop: list[str]) -> str:
    """The completion text Zed expects for the model's new region.

    An insertion (fill-in-the-middle, plain prompts) is cut at the first `stop` sequence, as a
    server that generates it would stop there. A zeta answer is a whole new editable region:
    stop sequences are not applied inside it (cutting it short would tell Zed to delete the
    rest of the region); zeta2's end marker is added unless it is itself a stop sequence (a
    server stops before one, so Zed would not see it).
    """
    p = built.prompt
    if zp.format in ("zeta", "zeta2"):
        lo, hi = zp.editable
        new_editable = zp.text[lo : built.region_start] + new_region + zp.text[built.region_end : hi]
        if zp.format == "zeta2":
            ends = zp.end_marker and not any(s and s in zp.end_marker for s in stop)
            sep = "" if not ends or new_editable.endswith("\n") else "\n"
            return new_editable + (sep + zp.end_marker if ends else "")
        # Zed keeps the text after "<|editable_region_start|>\n" (up to the end marker, which a
        # server would have stopped at), so nothing follows the new editable text.
        return REGION_START + "\n" + new_editable
    # Fill-in-the-middle and plain prompts: the answer is inserted at the cursor, so only an
    # insertion can be shown. A `suffix` request's prefix is the document before the region, as
    # the language server has it: its open brackets may be closed by the insertion.
    sug = suggest(p.region, p.cursor, new_region, p.suffix, p.prefix if zp.format == SUFFIX_FORMAT else "")
    if sug.replace_end is not None:
        return ""
    return _cut_at_stop(sug.insert_text, stop)
