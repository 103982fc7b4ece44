"""Wire format of remote mode (docs/architecture.md §7).

Every frame is a 4-byte big-endian length followed by that many bytes of one
msgpack map `{"t": type, "id": int, ...}`. Types:

- ``hello``   handshake, three stages (see `auth.py` for the proofs):
  server ``challenge`` {v, nonce, auth} -> client ``response`` {v, nonce, proof, client}
  -> server ``welcome`` {v, proof, model, device, limits, budget}. `client` is a label
  the client chose: informational only, never an identity (the server keys caches by
  connection). `budget` is the model's context layout budget {max_context,
  max_history, max_suffix} (tokens), so the client windows its prompts to it.
- ``predict`` {id, prompt: {...Prompt fields}, params: {...SamplerParams fields},
  deadline_ms?}: `deadline_ms` (optional, float > 0) is the time the request had left
  when it was sent.
- ``cancel``  {id}: stop request `id`; the server answers it with a cancelled result.
- ``result``  {id, text, steps, tokens, timings, cancelled, ..., confidence?, late?,
  proposal_confidences?}: one per predict; `confidence` (optional, float in [0, 1]) and
  `late` (optional, bool) come from engines that compute them; `proposal_confidences`
  (optional, at most MAX_PROPOSALS [text, confidence] pairs, best first) from a check of the
  prompt's proposals.
- ``error``   {id, code, message}: id 0 = about the connection (the server closes it
  right after); id > 0 = about that request only (the connection stays up).

Many requests can be in flight on one connection; results come in any order
and are matched by id. This module is pure translation and validation (no
sockets, no torch), so the server, the client and the tests share it.
"""

from __future__ import annotations

import asyncio
import math
import struct
from dataclasses import dataclass, fields, replace
from typing import Any

import msgpack
from dlm.coder_model import limits
from dlm.coder_model.budget import MAX_SNIPPETS
from dlm.coder_model.secrets import inserted_secret, mask_keeping_offset, mask_secrets
from dlm.coder_model.types import MemoryProposal, Prediction, Prompt, RetrievedSnippet, SamplerParams

# A snippet's text as it may come over the wire: more than any model's snippet cut keeps
# (budget.clip_prompt cuts it by the model's budget), little enough that a hostile client cannot
# make the server hold megabytes per request.
MAX_SNIPPET_WIRE_CHARS = 16_000

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")  # 4-byte big-endian frame length
MAX_ID = 2**63 - 1  # ids are positive int64 so any msgpack implementation can carry them

MESSAGE_TYPES = ("hello", "predict", "cancel", "result", "error")
HELLO_STAGES = ("challenge", "response", "welcome")

# error codes; a fatal one closes the connection
FATAL_CODES = frozenset(
    {
        "bad_frame",  # not a msgpack map / not decodable
        "frame_too_large",
        "unknown_type",
        "timeout",  # handshake, half-sent frame or idle connection
        "version_mismatch",
        "auth_failed",
        "protocol",  # a valid message at the wrong time (e.g. predict before hello)
        "shutting_down",
        "too_many_connections",  # the server holds --max-connections already
    }
)
REQUEST_CODES = frozenset({"bad_request", "too_many_requests", "duplicate_id", "server_error"})


class ProtocolError(Exception):
    """A peer broke the protocol. `fatal` errors close the connection; others answer one request."""

    def __init__(self, code: str, message: str, *, request_id: int = 0, fatal: bool | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.fatal = code in FATAL_CODES if fatal is None else fatal


class IdleTimeout(ProtocolError):
    """No frame started within the idle (or handshake) timeout."""

    def __init__(self, message: str):
        super().__init__("timeout", message)


class ConnectionClosed(Exception):
    """The peer closed the connection cleanly between frames."""


# --------------------------------------------------------------------- framing


def encode_frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """msgpack bytes -> a map with a string "t" and an int "id"; ProtocolError otherwise."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types (ExtraData, FormatError, ...)
        raise ProtocolError(
            "bad_frame", f"frame body is not valid msgpack ({type(exc).__name__}: {exc}); send one msgpack map"
        ) from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_frame", f"frame body is a msgpack {type(obj).__name__}; send a map")
    t = obj.get("t")
    if not isinstance(t, str):
        raise ProtocolError("bad_frame", 'frame map has no string "t" (message type)')
    if t not in MESSAGE_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {t[:40]!r}; known: {', '.join(MESSAGE_TYPES)}")
    mid = obj.get("id", 0)
    if isinstance(mid, bool) or not isinstance(mid, int) or not 0 <= mid <= MAX_ID:
        raise ProtocolError("bad_frame", f'"id" must be an integer in [0, 2^63), got {mid!r:.40}')
    obj["id"] = mid
    return obj


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    max_bytes: int,
    first_byte_timeout: float | None,
    frame_timeout: float | None,
) -> dict[str, Any]:
    """Read one frame. Waits up to `first_byte_timeout` for a frame to start (idle
    timeout) and then up to `frame_timeout` for the rest of it, so a peer that
    sends half a frame and stops cannot hold the connection open."""
    message, _ = await read_sized_frame(reader, max_bytes=max_bytes, first_byte_timeout=first_byte_timeout,
                                        frame_timeout=frame_timeout)
    return message


async def read_sized_frame(
    reader: asyncio.StreamReader,
    *,
    max_bytes: int,
    first_byte_timeout: float | None,
    frame_timeout: float | None,
) -> tuple[dict[str, Any], int]:
    """`read_frame`, and the body's size in bytes (the server counts the bytes a client has in flight)."""
    try:
        first = await asyncio.wait_for(reader.readexactly(1), first_byte_timeout)
    except asyncio.IncompleteReadError:
        raise ConnectionClosed() from None
    except asyncio.TimeoutError:
        raise IdleTimeout(f"no frame within {first_byte_timeout:g} s; closing idle connection") from None
    try:
        rest = await asyncio.wait_for(reader.readexactly(HEADER.size - 1), frame_timeout)
        (length,) = HEADER.unpack(first + rest)
        if length == 0:
            raise ProtocolError("bad_frame", "zero-length frame; a frame holds one msgpack map")
        if length > max_bytes:
            raise ProtocolError(
                "frame_too_large",
                f"frame of {length} bytes exceeds the limit of {max_bytes} bytes; send a smaller prompt "
                "(the server's limit is set by --max-frame-bytes)",
            )
        body = await asyncio.wait_for(reader.readexactly(length), frame_timeout)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(
            "bad_frame", f"connection closed in the middle of a frame ({len(exc.partial)} bytes of it read)"
        ) from None
    except asyncio.TimeoutError:
        raise ProtocolError(
            "timeout", f"frame not completed within {frame_timeout:g} s of its first byte (half-sent frame)"
        ) from None
    return decode_body(body), length


# -------------------------------------------------------------------- messages


def error_message(code: str, message: str, request_id: int = 0) -> dict[str, Any]:
    return {"t": "error", "id": request_id, "code": code, "message": message}


def cancel_message(request_id: int) -> dict[str, Any]:
    return {"t": "cancel", "id": request_id}


_PROMPT_STR_FIELDS = ("prefix", "region", "suffix", "language", "path")


# What this side of the protocol can take beyond version 1's fields, announced in the server's
# hello: a client sends a field of a feature only to a server that announced it.
# "insert": typing prompts as insertions (Prompt.insert, layout 2); "snippets": retrieved snippets.
FEATURES = ("proposals", "insert", "snippets")


def without_secrets(prompt: Prompt) -> Prompt:
    """`prompt` with no secret (dlm.coder_model.secrets) left in any text field, as it may leave the machine.

    Every line holding one is emptied, in every field: the prefix, the region (the cursor
    keeps its place), the suffix, each history entry, the path and each snippet; the user's
    own document is no exception (a server the user configured is still another machine).
    A proposal that would put a secret on the cursor's line is dropped. A prompt without a
    secret comes back as it is (the same object)."""
    prefix, _ = mask_secrets(prompt.prefix)
    region, cursor, _ = mask_keeping_offset(prompt.region, prompt.cursor)
    suffix, _ = mask_secrets(prompt.suffix)
    history = tuple(mask_secrets(h)[0] for h in prompt.history)
    path, _ = mask_secrets(prompt.path)
    snippets = tuple(RetrievedSnippet(mask_secrets(sn.path)[0], mask_secrets(sn.text)[0]) for sn in prompt.snippets)
    line_before = region[: cursor][region.rfind("\n", 0, cursor) + 1 :]
    line_after = region[cursor:].split("\n", 1)[0]
    proposals = tuple(p for p in prompt.proposals if not inserted_secret(line_before, p.text, line_after))
    changed = (prefix != prompt.prefix or region != prompt.region or suffix != prompt.suffix
               or history != prompt.history or path != prompt.path or snippets != prompt.snippets
               or proposals != prompt.proposals)
    if not changed:
        return prompt
    return replace(prompt, prefix=prefix, region=region, cursor=cursor, suffix=suffix, history=history,
                   path=path, snippets=snippets, proposals=proposals)


def prompt_to_wire(prompt: Prompt) -> dict[str, Any]:
    """The wire form of `prompt`, its secrets masked first (`without_secrets`)."""
    prompt = without_secrets(prompt)
    out = {
        "prefix": prompt.prefix,
        "region": prompt.region,
        "cursor": prompt.cursor,
        "suffix": prompt.suffix,
        "history": list(prompt.history),
        "language": prompt.language,
        "path": prompt.path,
    }
    if prompt.proposals:  # the repository memory's insertions, checked by the server's denoiser
        out["proposals"] = [[p.text, float(p.score)] for p in prompt.proposals]
    if prompt.insert:  # typing: the model writes the insertion at the cursor (layout v2)
        out["insert"] = True
    if prompt.snippets:  # retrieved from the client's workspace index: they leave the machine here
        out["snippets"] = [[sn.path, sn.text] for sn in prompt.snippets]
    return out


def snippets_from_wire(raw: Any, request_id: int) -> tuple[RetrievedSnippet, ...]:
    """prompt.snippets: at most MAX_SNIPPETS [path, text] pairs; each text is cut to what the
    layout can keep (coder_model.budget.clip_prompt cuts it again, by the model's budget)."""
    if not isinstance(raw, list) or len(raw) > MAX_SNIPPETS:
        raise _bad(request_id, f"prompt.snippets must be a list of at most {MAX_SNIPPETS} [path, text] pairs")
    out = []
    for item in raw:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise _bad(request_id, "each of prompt.snippets must be [path, text], two strings")
        out.append(RetrievedSnippet(limits.bound_path(limits.clean_text(item[0])),
                                    limits.clean_text(item[1][:MAX_SNIPPET_WIRE_CHARS])))
    return tuple(out)


def proposals_from_wire(raw: Any, request_id: int) -> tuple[MemoryProposal, ...]:
    if not isinstance(raw, list) or len(raw) > limits.MAX_PROPOSALS:
        raise _bad(request_id, f"prompt.proposals must be a list of at most {limits.MAX_PROPOSALS} [text, score] pairs")
    out = []
    for item in raw:
        ok = (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
              and isinstance(item[1], (int, float)) and not isinstance(item[1], bool)
              and math.isfinite(item[1]) and 0.0 <= item[1] <= 1.0 and len(item[0]) <= limits.MAX_PROPOSAL_CHARS)
        if not ok:
            raise _bad(request_id, "each of prompt.proposals must be [text of at most "
                       f"{limits.MAX_PROPOSAL_CHARS} characters, a score in [0, 1]]")
        out.append(MemoryProposal(limits.clean_text(item[0]), float(item[1])))
    return tuple(out)


def params_to_wire(params: SamplerParams) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in fields(SamplerParams)}


def predict_message(request_id: int, prompt: Prompt, params: SamplerParams,
                    deadline_ms: float | None = None) -> dict[str, Any]:
    msg = {"t": "predict", "id": request_id, "prompt": prompt_to_wire(prompt), "params": params_to_wire(params)}
    if deadline_ms is not None:
        msg["deadline_ms"] = float(deadline_ms)
    return msg


def _bad(request_id: int, message: str) -> ProtocolError:
    return ProtocolError("bad_request", message, request_id=request_id, fatal=False)


def prompt_from_wire(obj: Any, request_id: int) -> Prompt:
    if not isinstance(obj, dict):
        raise _bad(request_id, '"prompt" must be a map of Prompt fields')
    unknown = set(obj) - set(_PROMPT_STR_FIELDS) - {"cursor", "history", "proposals", "insert", "snippets"}
    if unknown:
        raise _bad(request_id, f"unknown prompt fields {sorted(map(str, unknown))}; known: prefix, region, "
                   "cursor, suffix, history, language, path, proposals, insert, snippets")
    kwargs: dict[str, Any] = {}
    for name in _PROMPT_STR_FIELDS:
        value = obj.get(name, "")
        if not isinstance(value, str):
            raise _bad(request_id, f"prompt.{name} must be a string, got {type(value).__name__}")
        kwargs[name] = value
    for name in ("prefix", "region", "suffix"):
        if name not in obj:
            raise _bad(request_id, f"prompt.{name} is missing")
    cursor = obj.get("cursor")
    if isinstance(cursor, bool) or not isinstance(cursor, int):
        raise _bad(request_id, f"prompt.cursor must be an integer, got {type(cursor).__name__}")
    history = obj.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, str) for h in history):
        raise _bad(request_id, "prompt.history must be a list of strings")
    proposals = proposals_from_wire(obj["proposals"], request_id) if "proposals" in obj else ()
    insert = obj.get("insert", False)
    if not isinstance(insert, bool):
        raise _bad(request_id, f"prompt.insert must be true or false, got {type(insert).__name__}")
    snippets = snippets_from_wire(obj["snippets"], request_id) if "snippets" in obj else ()
    try:
        prompt = Prompt(cursor=cursor, history=tuple(history), proposals=proposals, insert=insert,
                        snippets=snippets, **kwargs)
    except ValueError as exc:
        raise _bad(request_id, f"invalid prompt: {exc}") from None
    # path, language and history entries cut to coder_model.limits here, before anything tokenizes
    # them (a 1 MB path once cost ~800 ms and ~90 MB); the windows are the layout budget's business.
    return limits.bound_fields(prompt)


# Upper bounds on the integer sampler knobs a client may ask for, whatever the model (the
# caps of coder_model.limits.SAMPLER_CAPS, the same for every door): one request's knobs bound
# its cost for everyone sharing the batch. The model may set tighter ones (blocks that fit its
# max_seq_len; the scheduler's check by measured step time).
PARAM_CAPS = {name: int(cap.high) for name, cap in limits.SAMPLER_CAPS.items() if cap.kind == "int"}


def params_from_wire(obj: Any, request_id: int) -> SamplerParams:
    """The `params` of a predict message, checked by coder_model.limits (the validator every door
    shares): a value out of its caps, or knobs asking for more than MAX_REQUEST_SLOT_STEPS
    together, answer this request bad_request (never the connection). Refused rather than
    replaced by a default, as options are: a silently changed knob would change the answer."""
    if obj is None:
        return SamplerParams()
    if not isinstance(obj, dict):
        raise _bad(request_id, '"params" must be a map of SamplerParams fields')
    unknown = set(obj) - set(limits.SAMPLER_CAPS)
    if unknown:
        # Rejected rather than ignored: an ignored knob would silently change the suggestion.
        raise _bad(request_id, f"unknown sampler params {sorted(map(str, unknown))}; this server knows "
                   f"{sorted(limits.SAMPLER_CAPS)} (upgrade the server if the client is newer)")
    kwargs: dict[str, Any] = {}
    for name, value in obj.items():
        ok, problem = limits.check(f"params.{name}", value, limits.SAMPLER_CAPS[name])
        if problem is not None:
            raise _bad(request_id, f"{problem} (the default is {getattr(SamplerParams(), name)!r})")
        kwargs[name] = ok
    try:
        params = SamplerParams(**kwargs)
    except (ValueError, TypeError) as exc:
        raise _bad(request_id, f"invalid sampler params: {exc}") from None
    cost = limits.request_slot_steps(params)
    if cost > limits.MAX_REQUEST_SLOT_STEPS:
        raise _bad(request_id, f"block_len {params.block_len} x max_blocks {params.max_blocks} x steps "
                   f"{min(params.steps, params.block_len)} = {cost:,} slot-steps is over the "
                   f"{limits.MAX_REQUEST_SLOT_STEPS:,} one request may take on this server; ask for fewer steps, "
                   "blocks or slots")
    return params


def deadline_from_wire(msg: dict[str, Any], request_id: int) -> float | None:
    """The optional `deadline_ms` of a predict message (the time the request has left): None,
    or a finite float > 0 and at most the cap of coder_model.limits.REQUEST_CAPS."""
    value = msg.get("deadline_ms")
    if value is None:
        return None
    ok, problem = limits.check("deadline_ms", value, limits.REQUEST_CAPS["deadline_ms"])
    if problem is not None or ok <= 0:
        raise _bad(request_id, f"{problem or f'deadline_ms={value} is not > 0'}: send the milliseconds left "
                   "for this request (or leave it out)")
    return ok


# Prediction.scored is the hosted engines' (coder_model.hosted): a remote server's model always
# computes its confidence, so the field never travels.
_PREDICTION_FIELDS = [f.name for f in fields(Prediction) if f.name != "scored"]
# Optional result fields, sent when the engine's Prediction carries them (getattr with
# these defaults: engines that do not compute them leave them out of the result).
_OPTIONAL_RESULT_FIELDS = {"confidence": None, "late": None, "proposal_confidences": None}


def _valid_confidence(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)


def result_message(request_id: int, prediction: Prediction) -> dict[str, Any]:
    msg: dict[str, Any] = {"t": "result", "id": request_id}
    for name in _PREDICTION_FIELDS:
        if name not in _OPTIONAL_RESULT_FIELDS:
            msg[name] = getattr(prediction, name)
    confidence = getattr(prediction, "confidence", None)
    if confidence is not None and _valid_confidence(confidence):  # a NaN from a broken model is not sent
        msg["confidence"] = float(confidence)
    late = getattr(prediction, "late", None)
    if isinstance(late, bool):
        msg["late"] = late
    ranked = getattr(prediction, "proposal_confidences", ())
    if ranked and _valid_proposal_confidences(ranked):  # left out rather than sent invalid
        msg["proposal_confidences"] = [[text, float(c)] for text, c in ranked]
    return msg


def _valid_proposal_confidences(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) <= limits.MAX_PROPOSALS
            and all(isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                    and len(item[0]) <= limits.MAX_PROPOSAL_CHARS and _valid_confidence(item[1])
                    for item in value))


def prediction_from_wire(msg: dict[str, Any]) -> Prediction:
    """A result message -> Prediction; raises ProtocolError on a malformed result."""
    kwargs: dict[str, Any] = {}
    if "confidence" in msg and not _valid_confidence(msg["confidence"]):
        raise ProtocolError("bad_frame", f"result.confidence must be a number in [0, 1], got "
                            f"{msg['confidence']!r:.40}")
    if "late" in msg and not isinstance(msg["late"], bool):
        raise ProtocolError("bad_frame", f"result.late must be a boolean, got {type(msg['late']).__name__}")
    if "proposal_confidences" in msg and not _valid_proposal_confidences(msg["proposal_confidences"]):
        raise ProtocolError("bad_frame", f"result.proposal_confidences must be a list of at most "
                            f"{limits.MAX_PROPOSALS} [text of at most {limits.MAX_PROPOSAL_CHARS} "
                            "characters, a confidence in [0, 1]] pairs")
    for f in fields(Prediction):
        if f.name not in msg or f.name not in _PREDICTION_FIELDS:
            continue
        if f.name in _OPTIONAL_RESULT_FIELDS:  # validated above; a Prediction with these fields takes them
            if f.name == "confidence":
                kwargs[f.name] = float(msg[f.name])
            elif f.name == "proposal_confidences":
                kwargs[f.name] = tuple((limits.clean_text(t), float(c)) for t, c in msg[f.name])
            else:
                kwargs[f.name] = msg[f.name]
            continue
        value = msg[f.name]
        if f.type == "str":
            ok = isinstance(value, str)
        elif f.type == "bool":
            ok = isinstance(value, bool)
        elif f.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        if not ok:
            raise ProtocolError("bad_frame", f"result.{f.name} has the wrong type {type(value).__name__}")
        kwargs[f.name] = value
    if "text" not in kwargs:
        raise ProtocolError("bad_frame", "result without text")
    return Prediction(**kwargs)


@dataclass(frozen=True)
class Limits:
    """What one server connection may do; the server tells the client its values in `welcome`."""

    max_frame_bytes: int = 4 * 1024 * 1024  # a prompt is windowed text: 4 MiB is far above need
    max_inflight: int = 64  # requests in flight per connection
    max_inflight_bytes: int = 16 * 1024 * 1024  # frame bytes of the requests in flight per connection
    handshake_timeout_s: float = 5.0  # connect -> authenticated
    frame_timeout_s: float = 10.0  # first byte of a frame -> its last byte
    idle_timeout_s: float = 600.0  # no frame and nothing in flight -> close

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes={self.max_frame_bytes}: use at least 1024")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight={self.max_inflight}: use at least 1")
        if self.max_inflight_bytes < self.max_frame_bytes:
            raise ValueError(f"max_inflight_bytes={self.max_inflight_bytes} is below max_frame_bytes="
                             f"{self.max_frame_bytes}: a largest frame could never be accepted; raise --max-inflight-bytes")
        for name in ("handshake_timeout_s", "frame_timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: use a positive number of seconds")
