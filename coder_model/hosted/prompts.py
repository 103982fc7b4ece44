"""The request bodies and the answers of every hosted engine kind, in one place (docs/engines.md).

Each builder takes the server's Prompt (coder_model.types: the windows of the one budget, the
editable region by the region rules in use, the edit history as rendered diffs, the repository
memory's snippets), already cut to the engine's budget and with its secrets masked
(coder_model.hosted.http_engine), and returns the path and the JSON body; each reader takes the
decoded JSON answer and returns the new region, or None for "no prediction". What they follow:

- mercury-edit (Inception's next edit): POST /v1/edit/completions with
  {"model", "messages": [{"role": "user", "content": PROMPT}], "max_tokens"}. PROMPT holds
  <|recently_viewed_code_snippets|> (each <|recently_viewed_code_snippet|> starting with
  "code_snippet_file_path: P"), then <|current_file_content|> with "current_file_path: P" and the
  file's excerpt, the editable region between <|code_to_edit|> and <|/code_to_edit|> with
  <|cursor|> at the cursor, then <|edit_diff_history|> with the recent edits as unified diffs. The
  answer is choices[0].message.content: the rewritten editable region, maybe fenced in ```, or
  null for no prediction.
- mercury-fim (Inception's fill in the middle): POST /v1/fim/completions with
  {"model", "prompt", "suffix", "max_tokens"}; the answer is choices[0].text.
- openai-fim: an OpenAI-compatible POST /v1/completions with "prompt" and "suffix" (vLLM, SGLang,
  `dlm-lsp http`); the answer is choices[0].text.
- llamacpp-infill: llama.cpp's POST /infill with {"input_prefix", "input_suffix", "input_extra":
  [{"filename", "text"}], "n_predict"}; the answer is "content".
- ollama: POST /api/generate with {"model", "prompt", "suffix", "stream": false,
  "options": {"num_predict"}}; the answer is "response".

A fill-in-the-middle answer is an insertion at the cursor. Where a kind's request has no place for
the memory's snippets (mercury-fim, openai-fim, ollama) they go before the prefix as commented
file headers (`# Path: P` and the snippet's lines commented), and the current file's own header
(`# Path: P`) comes last, right before the prefix: a model reads the file's name there, and
`dlm-lsp http` reads the name and the snippets back (`read_file_headers`), so that its model gets
the prompt the language server would have given it. A server whose /v1/models names dlm-lsp as the owner
(`dlm-lsp http`) also gets the editable region's extent, the language and the mode (`dlm_fields`):
no other server is sent that field. The edit history has no place in a fill-in-the-middle request
and is not sent.

An answer that cannot be right is refused with a `BadAnswer` whose message is the status line's:
the prompt's own markers in it, an answer for another file, more text than max_tokens can be, or
a rewrite that shares nothing with the editable region.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from typing import Any

from dlm.coder_model.budget import MAX_CHARS_PER_TOKEN, clip_prompt
from dlm.coder_model.types import LayoutBudget, Prompt, RetrievedSnippet

# The path of each kind's endpoint, appended to the configured URL.
ENDPOINTS: dict[str, str] = {
    "mercury-edit": "/v1/edit/completions",
    "mercury-fim": "/v1/fim/completions",
    "openai-fim": "/v1/completions",
    "llamacpp-infill": "/infill",
    "ollama": "/api/generate",
}
DLM_FIELD = "dlm"  # the extension an openai-fim request to `dlm-lsp http` carries (`dlm_fields`)
EDIT_KINDS = frozenset({"mercury-edit"})  # the answer rewrites the editable region; else an insertion
# Kinds whose request has no field for other files: snippets go in as commented file headers.
HEADER_KINDS = frozenset({"mercury-fim", "openai-fim", "ollama"})

# Mercury Edit's prompt markers.
SNIPPETS_START, SNIPPETS_END = "<|recently_viewed_code_snippets|>\n", "<|/recently_viewed_code_snippets|>\n"
SNIPPET_START, SNIPPET_END = "<|recently_viewed_code_snippet|>\n", "<|/recently_viewed_code_snippet|>\n"
CURRENT_START, CURRENT_END = "<|current_file_content|>\n", "<|/current_file_content|>\n"
EDIT_START, EDIT_END = "<|code_to_edit|>\n", "<|/code_to_edit|>\n"
HISTORY_START, HISTORY_END = "<|edit_diff_history|>\n", "<|/edit_diff_history|>\n"
CURSOR = "<|cursor|>"
SNIPPET_PATH, CURRENT_PATH = "code_snippet_file_path: ", "current_file_path: "
# Sections of the prompt that never belong in an answer (the region's own markers are stripped).
PROMPT_SECTIONS = tuple(m.strip() for m in (SNIPPETS_START, SNIPPETS_END, SNIPPET_START, SNIPPET_END,
                                            CURRENT_START, CURRENT_END, HISTORY_START, HISTORY_END))
# Special tokens of common fill-in-the-middle formats: an answer ends before the first one.
FIM_STOPS = ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
             "<|file_sep|>", "<|repo_name|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|im_end|>",
             "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<EOT>", " <EOT>", "</s>")
# A rewrite of a region holding at least this many names (of 3 characters or more) keeps one of
# them, or it is an answer for another place: an edit changes some of a region, not all of it.
MATCH_MIN_WORDS = 2
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")

# Line comments by language (coder_model.languages' names) for the file headers; others get "//".
COMMENTS: dict[str, str] = {
    "python": "#", "ruby": "#", "shellscript": "#", "perl": "#", "r": "#", "yaml": "#", "toml": "#",
    "dockerfile": "#", "makefile": "#", "cmake": "#", "elixir": "#", "julia": "#", "nim": "#",
    "powershell": "#", "lua": "--", "sql": "--", "haskell": "--", "elm": "--", "ada": "--",
    "clojure": ";", "scheme": ";", "lisp": ";", "erlang": "%", "latex": "%", "matlab": "%",
}  # fmt: skip
HEADER_TOKENS = ("#", "//", "--", ";", "%")
_HEADER = re.compile(r"(#|//|--|;|%) Path: (\S[^\n]*)\n")


class BadAnswer(ValueError):
    """The backend's answer cannot be used; the message says why, in words for the status line."""


@dataclass(frozen=True)
class Request:
    path: str  # the endpoint, appended to the engine's URL
    body: dict[str, Any]


def fit(prompt: Prompt, budget: LayoutBudget, kind: str) -> Prompt:
    """`prompt` cut to the engine's budget by the one budget's rule (coder_model.budget.clip_prompt:
    at most MAX_CHARS_PER_TOKEN characters a token, cut at lines, so the backend's tokenizer cuts
    the far ends exactly, as our own layout does), without what the kind's request has no place
    for: a fill-in-the-middle request takes no edit history, and snippets only with a path to
    head them."""
    if kind not in EDIT_KINDS:
        prompt = replace(prompt, history=())
        if kind in HEADER_KINDS and not prompt.path:
            prompt = replace(prompt, snippets=())
    return clip_prompt(prompt, budget)


def comment_token(language: str) -> str:
    return COMMENTS.get(language, "//")


def file_headers(prompt: Prompt) -> str:
    """The commented file headers before a fill-in-the-middle prefix: each snippet (its path, then
    its lines commented), then the current file's path; '' without a path."""
    if not prompt.path:
        return ""
    c = comment_token(prompt.language)
    out: list[str] = []
    for sn in prompt.snippets:
        out.append(f"{c} Path: {_one_line(sn.path)}\n")
        # a line that would read as a header gets a second space: it stays the snippet's
        out.extend(f"{c} {' ' if line.startswith('Path: ') else ''}{line}\n" if line else f"{c}\n"
                   for line in sn.text.splitlines())
    out.append(f"{c} Path: {_one_line(prompt.path)}\n")
    return "".join(out)


def read_file_headers(text: str) -> tuple[str, tuple[RetrievedSnippet, ...], str]:
    """(the current file's path, the snippets, the prefix) of a fill-in-the-middle prompt that
    starts with `file_headers`; ("", (), text) for one that does not. The headers are the run of
    comment lines at the start; the last `Path:` line in it names the current file, and every
    line after it is the file's own text (its first lines may be comments too, unless one of them
    has the header's own form, `# Path: P`, which is read as a header)."""
    first = _HEADER.match(text)
    if first is None:
        return "", (), text
    c = first.group(1)
    lines = text.splitlines(keepends=True)
    run = 0
    while run < len(lines) and lines[run].endswith("\n") and (lines[run] == c + "\n" or lines[run].startswith(c + " ")):
        run += 1
    heads: list[tuple[int, str]] = []  # (line, the path it names)
    for i in range(run):
        m = _HEADER.fullmatch(lines[i])
        if m is not None and m.group(1) == c:
            heads.append((i, m.group(2)))
    snippets = []
    for (i, name), (j, _) in itertools.pairwise(heads):
        snippets.append(RetrievedSnippet(name, "".join(_uncomment(line, c) for line in lines[i + 1 : j]).rstrip("\n")))
    last, path = heads[-1]
    return path, tuple(snippets), "".join(lines[last + 1 :])


def _uncomment(line: str, c: str) -> str:
    return line[len(c) + 1 :] if line.startswith(c + " ") else line[len(c) :]


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


# -- requests -------------------------------------------------------------------------------------


def dlm_fields(prompt: Prompt) -> dict[str, Any]:
    """What an openai-fim request to `dlm-lsp http` adds (`DLM_FIELD`, sent only to a server whose
    /v1/models says it is dlm-lsp): the editable region's extent around the cursor (characters of
    the prompt's end and of the suffix's start), the language, the path and the mode, so that its
    model gets the prompt the language server would have given the embedded one."""
    return {"region": [prompt.cursor, len(prompt.region) - prompt.cursor], "language": prompt.language,
            "path": prompt.path, "insert": prompt.insert}


def build(kind: str, prompt: Prompt, model: str, max_tokens: int, dlm_server: bool = False) -> Request:
    """The request of `kind` for `prompt` (fitted and masked already); `dlm_server`: the openai-fim
    server is `dlm-lsp http` (`dlm_fields`)."""
    path = ENDPOINTS[kind]
    before = prompt.prefix + prompt.region[: prompt.cursor]
    after = prompt.region[prompt.cursor :] + prompt.suffix
    if kind == "mercury-edit":
        return Request(path, {"model": model, "messages": [{"role": "user", "content": mercury_edit_prompt(prompt)}],
                              "max_tokens": max_tokens})
    if kind == "mercury-fim":
        return Request(path, {"model": model, "prompt": file_headers(prompt) + before, "suffix": after,
                              "max_tokens": max_tokens})
    if kind == "openai-fim":
        body: dict[str, Any] = {"prompt": file_headers(prompt) + before, "suffix": after, "max_tokens": max_tokens,
                                "temperature": 0, "stream": False}
        if model:
            body = {"model": model, **body}
        if dlm_server:
            body[DLM_FIELD] = dlm_fields(prompt)
        return Request(path, body)
    if kind == "llamacpp-infill":
        extra = [{"filename": sn.path, "text": sn.text} for sn in prompt.snippets]
        return Request(path, {"input_prefix": before, "input_suffix": after, "input_extra": extra,
                              "n_predict": max_tokens, "temperature": 0, "cache_prompt": True, "stream": False})
    if kind == "ollama":
        return Request(path, {"model": model, "prompt": file_headers(prompt) + before, "suffix": after,
                              "stream": False, "options": {"num_predict": max_tokens, "temperature": 0}})
    raise ValueError(f"unknown engine kind {kind!r}")


def mercury_edit_prompt(prompt: Prompt) -> str:
    """Mercury Edit's user message: snippets, the file with its editable region, the edit history."""
    parts: list[str] = []
    if prompt.snippets:
        parts.append(SNIPPETS_START)
        for sn in prompt.snippets:
            parts += [SNIPPET_START, SNIPPET_PATH, _one_line(sn.path), "\n", _line(sn.text), SNIPPET_END]
        parts.append(SNIPPETS_END)
        parts.append("\n")
    region = prompt.region[: prompt.cursor] + CURSOR + prompt.region[prompt.cursor :]
    parts += [CURRENT_START, CURRENT_PATH, _one_line(prompt.path or "untitled"), "\n", prompt.prefix,
              EDIT_START, _line(region), EDIT_END,
              # the suffix starts with the line break that ends the region: it is in EDIT_END already
              _line(_after_break(prompt.suffix)),
              CURRENT_END]
    parts += ["\n", HISTORY_START]
    parts += [_line(event) for event in prompt.history]
    parts.append(HISTORY_END)
    return "".join(parts)


def _after_break(suffix: str) -> str:
    """The suffix without the line break that ends the region (EDIT_END ends that line)."""
    for brk in ("\r\n", "\n", "\r"):
        if suffix.startswith(brk):
            return suffix[len(brk) :]
    return suffix


def _line(text: str) -> str:
    """`text` ending with exactly one line break ('' stays '')."""
    return text if not text or text.endswith("\n") else text + "\n"


# -- answers --------------------------------------------------------------------------------------


def answer_text(kind: str, data: Any) -> str | None:
    """The text of a decoded JSON answer of `kind`: None for "no prediction"; BadAnswer for a body
    not in the kind's shape."""
    if not isinstance(data, dict):
        raise BadAnswer(f"answered JSON that is not an object ({type(data).__name__})")
    if kind in ("llamacpp-infill", "ollama"):
        key = "content" if kind == "llamacpp-infill" else "response"
        value = data.get(key)
        if value is None or isinstance(value, str):
            return value
        raise BadAnswer(f'answered "{key}" that is not text')
    choices = data.get("choices")
    if choices == []:
        return None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadAnswer("answered JSON without choices[0]")
    first = choices[0]
    if kind == "mercury-edit":
        message = first.get("message")
        if message is None:
            return None
        if not isinstance(message, dict):
            raise BadAnswer("answered choices[0].message that is not an object")
        value = message.get("content")
    else:
        value = first.get("text")
        if value is None and isinstance(first.get("message"), dict):  # a chat-shaped answer
            value = first["message"].get("content")
    if value is None or isinstance(value, str):
        return value
    raise BadAnswer("answered a completion that is not text")


def new_region(kind: str, prompt: Prompt, text: str | None, max_tokens: int) -> str | None:
    """The new editable region the answer `text` makes of `prompt`, or None (no prediction);
    BadAnswer when it cannot be right (module docstring)."""
    if text is None:
        return None
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    if kind not in EDIT_KINDS:
        insertion = cut_at_stops(text)
        if len(insertion) > limit:
            raise BadAnswer(f"answered {len(insertion)} characters, more than {max_tokens} tokens can be")
        if not insertion:
            return None
        return prompt.region[: prompt.cursor] + insertion + prompt.region[prompt.cursor :]
    region = unfenced(text, prompt)
    region = region.replace(CURSOR, "")
    if region.startswith(EDIT_START.strip()):  # the region's own markers echoed around it
        region = region[len(EDIT_START.strip()) :].removeprefix("\n")
    stripped = region.rstrip("\n")
    if stripped.endswith(EDIT_END.strip()):
        region = stripped[: -len(EDIT_END.strip())]
    if not prompt.region.endswith("\n") and region.endswith("\n"):
        region = region[:-1]  # the region holds whole lines without the last one's break
    for line in region.splitlines():
        if line.startswith(CURRENT_PATH):
            other = line[len(CURRENT_PATH) :].strip()
            if other != (prompt.path or "untitled"):
                raise BadAnswer(f"answered for another file ({other[:80]})")
    if any(m in region for m in PROMPT_SECTIONS) or CURRENT_PATH in region or SNIPPET_PATH in region:
        raise BadAnswer("answered the prompt's sections, not the editable region")
    if len(region) > len(prompt.region) + limit:
        raise BadAnswer(f"answered {len(region)} characters for a region of {len(prompt.region)}, more than "
                        f"{max_tokens} tokens can add")
    words = set(_WORD.findall(prompt.region))
    if len(words) >= MATCH_MIN_WORDS and region.strip() and not words & set(_WORD.findall(region)):
        raise BadAnswer("answered a region that does not match the editable region")
    return region


def unfenced(text: str, prompt: Prompt) -> str:
    """`text` without a Markdown fence around it; BadAnswer when the fence names another file."""
    body = text.strip("\n")
    if not body.lstrip().startswith("```"):
        return text
    head, sep, rest = body.lstrip().partition("\n")
    info = head[3:].strip()
    if info and ("/" in info or "." in info) and info not in (prompt.path, prompt.path.rsplit("/", 1)[-1]):
        raise BadAnswer(f"answered for another file ({info[:80]})")
    rest = rest if sep else ""
    end = rest.rstrip().rfind("```")
    if end >= 0 and not rest.rstrip()[end + 3 :].strip():
        rest = rest.rstrip()[:end]
    return rest


def cut_at_stops(text: str) -> str:
    """A fill-in-the-middle answer up to the first special token of a FIM format."""
    cut = len(text)
    for stop in FIM_STOPS:
        i = text.find(stop)
        if 0 <= i < cut:
            cut = i
    return text[:cut]
