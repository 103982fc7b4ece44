"""The one validator for every option and request parameter, and the caps it applies.

Three doors take numbers from outside: the LSP's `initializationOptions`
(lsp.options), the HTTP endpoint's request bodies (lsp.http_endpoint) and the
remote server's `predict` frames (coder_model.remote.wire). They all
check values here, against the same caps, so a value refused by one door is
refused by the others, and docs/configuration.md ("Limits") lists them once.

The check itself and the Cap it applies are coder_model.caps' (what it refuses, and why);
the sampler's caps are declared on SamplerParams' fields and the LSP options' on lsp.options'
dataclasses, and docs/configuration.md is rendered from them (lsp.option_docs).

What a door does with a refusal is the door's choice, stated in docs/configuration.md:
options (set once, at startup) are logged and the default is kept, so a typo
never stops a server; a request field is refused with the problem named (the
caller sees it at once, and a silently changed knob would change the answer).

Text fields that are not the model's windows (path, language, history
entries) are bounded here too, before anything tokenizes them: a 1 MB path
costs ~800 ms and ~90 MB to tokenize, and the layout keeps a line of it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from dlm.coder_model.caps import Cap, check, field_caps
from dlm.coder_model.types import Prompt, SamplerParams

# The deadline of a prediction (docs/architecture.md §3): an answer this long after the keystroke, or none.
# lsp.options and lsp.http_endpoint default to it; the remote server measures request cost in it.
DEFAULT_DEADLINE_MS = 250
# A request whose estimated time exceeds this many default deadlines is refused by the remote
# server: no editor waits that long, and the steps would be taken from the other clients.
MAX_REQUEST_DEADLINES = 10


# ---- sampler parameters: the same caps for LSP options, HTTP and remote requests ------------------

# Each SamplerParams field declares its cap and meaning (coder_model.caps.option); SamplerParams
# checks itself against them, and every door checks a request's values against them here.
SAMPLER_CAPS: dict[str, Cap] = field_caps(SamplerParams)
# The total work of one request in slot-steps: block_len x max_blocks x the steps one block can
# take (at most block_len: every step commits at least one slot). 32x the default request
# (32 x 2 x 32 = 2,048), so any sensible setting passes while 1024 x 3 x 1024 does not.
MAX_REQUEST_SLOT_STEPS = 65_536


def request_slot_steps(params: SamplerParams) -> int:
    """Slots x steps a request may run: its cost bound in units of one slot for one step."""
    return params.block_len * params.max_blocks * min(params.steps, params.block_len)


def check_sampler(values: dict[str, Any], where: str = "") -> tuple[dict[str, Any], list[str]]:
    """Sampler overrides (SamplerParams field names) -> (the acceptable ones, the problems).

    Each value is checked against SAMPLER_CAPS; unknown names are problems. When the
    accepted ones together ask for more than MAX_REQUEST_SLOT_STEPS, the size knobs
    (steps, block_len, max_blocks) are dropped, which keeps their defaults.
    """
    good: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in values.items():
        cap = SAMPLER_CAPS.get(name)
        if cap is None:
            problems.append(f"unknown sampler parameter {where}{name!r} (known: {', '.join(SAMPLER_CAPS)})")
            continue
        ok, problem = check(f"{where}{name}", value, cap)
        if problem is not None:
            problems.append(problem)
        else:
            good[name] = ok
    try:
        params = SamplerParams(**good)
    except (TypeError, ValueError) as exc:  # SamplerParams checks the same caps; kept as a net
        problems.append(f"sampler parameters {good}: {exc}")
        return {}, problems
    cost = request_slot_steps(params)
    if cost > MAX_REQUEST_SLOT_STEPS:
        problems.append(
            f"{where}block_len {params.block_len} x max_blocks {params.max_blocks} x steps "
            f"{min(params.steps, params.block_len)} = {cost:,} slot-steps is over the {MAX_REQUEST_SLOT_STEPS:,} a "
            "request may take; ask for fewer steps, blocks or slots")
        good = {k: v for k, v in good.items() if k not in ("steps", "block_len", "max_blocks")}
    return good, problems


def sampler_params(values: dict[str, Any], where: str = "") -> tuple[SamplerParams, list[str]]:
    """SamplerParams from overrides, bad values replaced by the defaults; and the problems."""
    good, problems = check_sampler(values, where)
    return SamplerParams(**good), problems


# ---- request fields -------------------------------------------------------------------------------

REQUEST_CAPS: dict[str, Cap] = {
    # the time a request has left (remote `deadline_ms`, also > 0), and the deadline an LSP or
    # HTTP server gives its requests (deadlineMs, --deadline-ms: at least 1 ms)
    "deadline_ms": Cap("float", 0.0, 600_000.0, doc="answer within this many ms"),
    # HTTP /v1/completions: the completion's tokens (masked slots the model may fill)
    "max_tokens": Cap("int", 1, 65_536, doc="tokens of the completion (HTTP)"),
}

# ---- text fields that are not windows: cut before anything tokenizes them --------------------------

MAX_PATH_CHARS = 512  # the file header names the path; a longer one keeps its end (the file name)
MAX_LANGUAGE_CHARS = 64  # a language id ("python", "typescriptreact"); longer ones are cut
MAX_HISTORY_EVENTS = 64  # rendered edit events kept, newest first (the LSP keeps 6)
MAX_HISTORY_EVENT_CHARS = 16_384  # one rendered event (a diff hunk); a longer one is cut

MAX_PROPOSALS = 16  # memory proposals per request (the server's beam is 8, of which 4 are sent)
MAX_PROPOSAL_CHARS = 1024  # one proposal: an insertion to the end of a line

FIELD_CAPS: dict[str, int] = {
    "path": MAX_PATH_CHARS,
    "language": MAX_LANGUAGE_CHARS,
    "history events": MAX_HISTORY_EVENTS,
    "history event chars": MAX_HISTORY_EVENT_CHARS,
}


def bound_path(path: str) -> str:
    return path[-MAX_PATH_CHARS:] if len(path) > MAX_PATH_CHARS else path


def bound_language(language: str) -> str:
    return language[:MAX_LANGUAGE_CHARS]


def bound_history(history: tuple[str, ...]) -> tuple[str, ...]:
    """The newest MAX_HISTORY_EVENTS events, each cut to MAX_HISTORY_EVENT_CHARS (its head: a
    hunk header and its first lines say where and what)."""
    kept = history[-MAX_HISTORY_EVENTS:]
    if len(kept) == len(history) and all(len(e) <= MAX_HISTORY_EVENT_CHARS for e in kept):
        return history
    return tuple(e[:MAX_HISTORY_EVENT_CHARS] for e in kept)


def bound_fields(prompt: Prompt) -> Prompt:
    """`prompt` with path, language and history cut to the caps above (the windows, prefix,
    region and suffix, are the context budget's business: coder_model.layout)."""
    path, language, history = bound_path(prompt.path), bound_language(prompt.language), bound_history(prompt.history)
    if path is prompt.path and language == prompt.language and history is prompt.history:
        return prompt
    return replace(prompt, path=path, language=language, history=history)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Lone surrogates (JSON allows "\\ud800") replaced by U+FFFD: no UTF-8 encoder or tokenizer
    takes them, and both are one UTF-16 unit, so LSP positions stay in step with the client."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)
