"""The one validator for every option and request parameter, and the caps it applies.

Three doors take numbers from outside: the LSP's `initializationOptions`
(lsp.options), the HTTP endpoint's request bodies (lsp.http_endpoint) and the
remote server's `predict` frames (coder_model.remote.protocol). They all
check values here, against the same caps, so a value refused by one door is
refused by the others, and the README table ("Limits") lists them once.

What a check refuses (and why each matters):
- a number that is not finite: JSON's `1e400` parses as infinity and
  `int(inf)` raises OverflowError; NaN passes every `<` comparison;
- a boolean where a number is wanted: `True` is an `int` to Python, so
  `max_tokens: true` would read as 1;
- a value outside its range: one request's knobs bound its cost for everyone
  sharing the model, and a `throttleMs` of 1e300 stalls every request.

What a door does with a refusal is the door's choice, stated in the README:
options (set once, at startup) are logged and the default is kept, so a typo
never stops a server; a request field is refused with the problem named (the
caller sees it at once, and a silently changed knob would change the answer).

Text fields that are not the model's windows (path, language, history
entries) are bounded here too, before anything tokenizes them: a 1 MB path
costs ~800 ms and ~90 MB to tokenize, and the layout keeps a line of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from dlm.coder_model.types import Prompt, SamplerParams

# The deadline of a prediction (DESIGN §3): an answer this long after the keystroke, or none.
# lsp.options and lsp.http_endpoint default to it; the remote server measures request cost in it.
DEFAULT_DEADLINE_MS = 250
# A request whose estimated time exceeds this many default deadlines is refused by the remote
# server: no editor waits that long, and the steps would be taken from the other clients.
MAX_REQUEST_DEADLINES = 10


@dataclass(frozen=True)
class Cap:
    """The accepted values of one option or parameter: `kind` is "int", "float", "bool",
    "choice" or "strings"; numbers lie in [low, high]; a choice is one of `choices`; strings
    are a list of at most `high` of them."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "strings":
            return f"a list of at most {int(self.high or 0):,} strings"
        what = "an integer" if self.kind == "int" else "a number"
        return f"{what} in [{_fmt(self.low)}, {_fmt(self.high)}]"


def _fmt(x: float | None) -> str:
    if x is None:
        return "-inf"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    if isinstance(x, int) and x >= 10_000:
        return f"{x:_}".replace("_", ",") if x < 2**62 else "2^63-1"
    return str(x)


def check(name: str, value: Any, cap: Cap) -> tuple[Any, str | None]:
    """(the value, None) when `value` is acceptable for `cap`, else (None, what is wrong).

    An integral float is taken for an int (JSON writes 16 as 16.0 sometimes); the
    value comes back converted to the cap's kind.
    """
    if cap.kind == "bool":
        if isinstance(value, bool):
            return value, None
        return None, f"{name} must be true or false, got {_show(value)}"
    if cap.kind == "choice":
        if isinstance(value, str) and value in cap.choices:
            return value, None
        return None, f"{name} must be one of {', '.join(cap.choices)}, got {_show(value)}"
    if cap.kind == "strings":
        if isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) <= (cap.high or 0):
            return list(value), None
        return None, f"{name} must be {cap.describe()}, got {_show(value)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{name} must be {cap.describe()}, got {_show(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return None, f"{name} is {value}, not a finite number; send {cap.describe()}"
    if cap.kind == "int" and isinstance(value, float) and not value.is_integer():
        return None, f"{name} must be {cap.describe()}, got {value}"
    if (cap.low is not None and value < cap.low) or (cap.high is not None and value > cap.high):
        return None, f"{name}={_show(value)} is outside its range; send {cap.describe()}"
    return (int(value) if cap.kind == "int" else float(value)), None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- sampler parameters: the same caps for LSP options, HTTP and remote requests ------------------

SAMPLER_CAPS: dict[str, Cap] = {
    "steps": Cap("int", 1, 4096, doc="denoising steps per block (upper bound)"),
    "block_len": Cap("int", 1, 1024, doc="masked slots per block"),
    "max_blocks": Cap("int", 1, 64, doc="blocks when no <eom> comes"),
    "threshold": Cap("float", 0.0, 1.0, doc="commit every slot above this confidence"),
    "temperature": Cap("float", 0.0, 100.0, doc="0 = greedy"),
    "seed": Cap("int", 0, 2**63 - 1, doc="sampling seed"),
    "rule": Cap("choice", choices=("max_prob", "margin", "entropy"), doc="confidence rule"),
    "order": Cap("choice", choices=("confidence", "left_to_right"), doc="decode order"),
    "repeat_penalty": Cap("float", 0.0, 100.0, doc="logits off a token that repeats (0: off)"),
    "end_threshold": Cap("float", 0.0, 1.0, doc="length-aware end: p(<eom>) + p(<pad>) to end at (0: off)"),
    "memory_weight": Cap("float", -100.0, 100.0, doc="repository memory: weight of the memory's logit"),
    "model_weight": Cap("float", -100.0, 100.0, doc="repository memory: weight of the model's log score"),
    "memory_bias": Cap("float", -100.0, 100.0, doc="repository memory: bias of the mixed confidence"),
    "veto": Cap("float", 0.0, 1.0, doc="repository memory: a proposal the model scores lower is never shown"),
    "verify_passes": Cap("int", 0, 8, doc="repository memory: model passes per proposal (0: the memory alone)"),
}
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
    except (TypeError, ValueError) as exc:  # cannot happen with the caps above; kept as a net
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
