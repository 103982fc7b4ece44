"""Framing, message validation and auth primitives (no sockets, no model)."""

from __future__ import annotations

import asyncio
import os

import msgpack
import pytest
from dlm.coder_model.remote import auth
from dlm.coder_model.remote.client import parse_host_port
from dlm.coder_model.remote.wire import (
    HEADER,
    PARAM_CAPS,
    ConnectionClosed,
    IdleTimeout,
    ProtocolError,
    deadline_from_wire,
    decode_body,
    encode_frame,
    params_from_wire,
    predict_message,
    prediction_from_wire,
    prompt_from_wire,
    read_frame,
    result_message,
)
from dlm.coder_model.types import Prediction, Prompt, SamplerParams


def _read(data: bytes, *, eof: bool = True, max_bytes: int = 1 << 20, timeout: float = 0.2):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        return await read_frame(reader, max_bytes=max_bytes, first_byte_timeout=timeout, frame_timeout=timeout)

    return asyncio.run(go())


def test_predict_roundtrip_preserves_prompt_and_params():
    prompt = Prompt(prefix="import os\n", region="x = ñ🙂", cursor=4, suffix="\n", history=("-a\n+b\n",),
                    language="python", path="/tmp/a.py")
    params = SamplerParams(steps=7, block_len=16, threshold=0.5, rule="margin", order="left_to_right")
    msg = _read(encode_frame(predict_message(42, prompt, params)))
    assert msg["t"] == "predict" and msg["id"] == 42
    assert prompt_from_wire(msg["prompt"], 42) == prompt
    assert params_from_wire(msg["params"], 42) == params


def test_an_insertion_prompt_travels_with_its_snippets():
    from dlm.coder_model.types import RetrievedSnippet

    prompt = Prompt(prefix="import os\n", region="x = os.", cursor=7, suffix="\n", language="python", path="a.py",
                    insert=True, snippets=(RetrievedSnippet("pkg/b.py", "y = os.path.join(a)\n"),))
    msg = _read(encode_frame(predict_message(3, prompt, SamplerParams())))
    assert msg["prompt"]["insert"] is True and msg["prompt"]["snippets"] == [["pkg/b.py", "y = os.path.join(a)\n"]]
    assert prompt_from_wire(msg["prompt"], 3) == prompt
    plain = Prompt(prefix="", region="x", cursor=1, suffix="")
    assert set(_read(encode_frame(predict_message(4, plain, SamplerParams())))["prompt"]) >= {"region"}
    assert "insert" not in predict_message(4, plain, SamplerParams())["prompt"]  # an older server still takes it


@pytest.mark.parametrize("field,bad", [
    ("insert", "yes"), ("snippets", "a.py"), ("snippets", [["a.py"]]), ("snippets", [["a.py", 3]]),
    ("snippets", [["a.py", "x"]] * 3),
])  # fmt: skip
def test_a_malformed_insert_or_snippets_field_is_refused_by_name(field, bad):
    base = {"prefix": "", "region": "x", "cursor": 0, "suffix": ""}
    with pytest.raises(ProtocolError, match=f"prompt.{field}"):
        prompt_from_wire({**base, field: bad}, 1)


def test_result_roundtrip():
    pred = Prediction(text="y = 1", steps=3, tokens=4, queue_ms=1.5, prefill_ms=2.0, denoise_ms=3.0,
                      context_tokens=10, cached_tokens=8, blocks=1)
    msg = _read(encode_frame(result_message(9, pred)))
    assert msg["id"] == 9 and prediction_from_wire(msg) == pred


@pytest.mark.parametrize(
    "body,code",
    [
        (b"\xc1", "bad_frame"),  # 0xc1 is never used in msgpack
        (msgpack.packb([1, 2]), "bad_frame"),  # not a map
        (msgpack.packb({"id": 1}), "bad_frame"),  # no type
        (msgpack.packb({"t": "launch", "id": 1}), "unknown_type"),
        (msgpack.packb({"t": "predict", "id": -1}), "bad_frame"),
        (msgpack.packb({"t": "predict", "id": "1"}), "bad_frame"),
        (msgpack.packb({"t": "cancel", "id": 1}) + b"\x00", "bad_frame"),  # trailing bytes
    ],
)
def test_decode_rejects(body, code):
    with pytest.raises(ProtocolError) as err:
        decode_body(body)
    assert err.value.code == code and err.value.fatal


def test_read_frame_limits():
    with pytest.raises(ProtocolError) as err:
        _read(HEADER.pack(5000) + b"x" * 5000, max_bytes=4096)
    assert err.value.code == "frame_too_large"
    with pytest.raises(ProtocolError) as err:
        _read(HEADER.pack(0))
    assert err.value.code == "bad_frame"
    with pytest.raises(ProtocolError) as err:  # half a frame, then EOF
        _read(HEADER.pack(100) + b"x" * 10)
    assert err.value.code == "bad_frame"
    with pytest.raises(ProtocolError) as err:  # half a frame, then silence
        _read(HEADER.pack(100) + b"x" * 10, eof=False)
    assert err.value.code == "timeout" and not isinstance(err.value, IdleTimeout)
    with pytest.raises(IdleTimeout):  # nothing at all
        _read(b"", eof=False)
    with pytest.raises(ConnectionClosed):  # clean EOF between frames
        _read(b"")


def test_two_frames_in_one_read():
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame({"t": "cancel", "id": 1}) + encode_frame({"t": "cancel", "id": 2}))
        reader.feed_eof()
        kw = {"max_bytes": 1024, "first_byte_timeout": 1, "frame_timeout": 1}
        return [(await read_frame(reader, **kw))["id"], (await read_frame(reader, **kw))["id"]]

    assert asyncio.run(go()) == [1, 2]


@pytest.mark.parametrize(
    "prompt,params,fragment",
    [
        ({"prefix": "", "region": "ab", "cursor": 5, "suffix": ""}, {}, "cursor"),
        ({"prefix": 1, "region": "", "cursor": 0, "suffix": ""}, {}, "prompt.prefix"),
        ({"region": "", "cursor": 0, "suffix": ""}, {}, "prefix is missing"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": "", "evil": 1}, {}, "unknown prompt"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": "", "history": [1]}, {}, "history"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": ""}, {"steps": 0}, "steps"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": ""}, {"steps": "9"}, "params.steps must be an integer"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": ""}, {"warp": 9}, "unknown sampler"),
        ({"prefix": "", "region": "", "cursor": 0, "suffix": ""}, {"rule": "vibes"}, "rule"),
    ],
)
def test_invalid_request_fields_are_request_errors(prompt, params, fragment):
    with pytest.raises(ProtocolError) as err:
        prompt_from_wire(prompt, 7)
        params_from_wire(params, 7)
    assert err.value.code == "bad_request" and not err.value.fatal and err.value.request_id == 7
    assert fragment in err.value.message


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"temperature": float("nan")}, "finite"),
        ({"temperature": float("inf")}, "finite"),
        ({"threshold": float("-inf")}, "finite"),
        ({"block_len": 4096}, "block_len=4096 is outside its range; send an integer in [1, 1024]"),
        ({"steps": True}, "params.steps must be an integer"),
        ({"block_len": 1024, "max_blocks": 3, "steps": 4096, "threshold": 1.0}, "slot-steps"),  # each cap met, the product not
        ({"steps": PARAM_CAPS["steps"] + 1}, "steps"),
        ({"max_blocks": 1000}, "max_blocks"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64 - 1}, "seed"),
    ],
)
def test_params_that_would_break_a_shared_batch_are_refused(params, fragment):
    """NaN temperature or a 4096-slot block once failed every request batched with it."""
    body = msgpack.packb({"t": "predict", "id": 3, "params": params})  # NaN and inf survive msgpack
    with pytest.raises(ProtocolError) as err:
        params_from_wire(decode_body(body)["params"], 3)
    assert err.value.code == "bad_request" and not err.value.fatal and err.value.request_id == 3
    assert fragment in err.value.message


def test_params_at_the_caps_are_accepted():
    for name in ("steps", "block_len", "max_blocks", "seed"):  # each at its cap; together they cost too much
        assert getattr(params_from_wire({name: PARAM_CAPS[name]}, 1), name) == PARAM_CAPS[name]


def test_deadline_ms_is_optional_and_validated():
    prompt, params = Prompt("", "x", 0, ""), SamplerParams()
    assert deadline_from_wire(_read(encode_frame(predict_message(1, prompt, params))), 1) is None
    msg = _read(encode_frame(predict_message(1, prompt, params, deadline_ms=180)))
    assert deadline_from_wire(msg, 1) == 180.0
    for bad in (0, -5.0, float("nan"), float("inf"), "soon", True):
        with pytest.raises(ProtocolError) as err:
            deadline_from_wire({"deadline_ms": bad}, 4)
        assert err.value.code == "bad_request" and err.value.request_id == 4 and "deadline_ms" in err.value.message


class _ScoredPrediction(Prediction):
    """A Prediction from an engine that computes confidence and lateness (attributes, as getattr finds them)."""

    def __init__(self, text: str, confidence, late):
        super().__init__(text=text, steps=2)
        self.confidence = confidence
        self.late = late


def test_result_carries_confidence_and_late_when_the_engine_has_them():
    msg = _read(encode_frame(result_message(9, _ScoredPrediction("y", 0.75, True))))
    assert msg["confidence"] == 0.75 and msg["late"] is True
    back = prediction_from_wire(msg)
    assert back.text == "y"
    # a Prediction type with these fields gets them back (one without them still decodes)
    assert getattr(back, "confidence", 0.75) == 0.75 and getattr(back, "late", True) is True
    broken = result_message(9, _ScoredPrediction("y", float("nan"), "no"))
    assert "confidence" not in broken and "late" not in broken  # not sent rather than sent invalid


@pytest.mark.parametrize("field,value", [("confidence", 1.5), ("confidence", -0.1), ("confidence", float("nan")),
                                         ("confidence", "high"), ("late", 1), ("late", "yes")])
def test_result_with_invalid_confidence_or_late_is_refused(field, value):
    msg = result_message(9, Prediction(text="y"))
    msg[field] = value
    with pytest.raises(ProtocolError) as err:
        prediction_from_wire(msg)
    assert err.value.code == "bad_frame" and field in err.value.message


def test_hmac_proofs():
    token, other = b"t" * 32, b"u" * 32
    sn, cn = auth.make_nonce(), auth.make_nonce()
    assert sn != cn and len(sn) == auth.NONCE_BYTES
    good = auth.client_proof(token, sn, cn)
    assert auth.proofs_match(good, auth.client_proof(token, sn, cn))
    assert not auth.proofs_match(good, auth.client_proof(other, sn, cn))
    assert not auth.proofs_match(good, auth.client_proof(token, auth.make_nonce(), cn))  # no replay
    assert not auth.proofs_match(good, auth.server_proof(token, sn, cn))  # client and server proofs differ
    assert not auth.proofs_match(good, None)


def test_load_token(tmp_path):
    f = tmp_path / "token"
    f.write_text("0123456789abcdef0123\n")
    os.chmod(f, 0o600)
    assert auth.load_token(str(f), env={}) == b"0123456789abcdef0123"
    assert auth.load_token(None, env={auth.TOKEN_ENV: "abcdefghijklmnopq"}) == b"abcdefghijklmnopq"
    assert auth.load_token(None, env={}) is None
    f.write_text("short")
    with pytest.raises(auth.AuthConfigError, match="at least"):
        auth.load_token(str(f), env={})
    f.write_text("\n")
    with pytest.raises(auth.AuthConfigError, match="empty"):
        auth.load_token(str(f), env={})
    with pytest.raises(auth.AuthConfigError, match="cannot read"):
        auth.load_token(str(tmp_path / "missing"), env={})


def test_bind_policy():
    auth.check_bind_allowed("127.0.0.1", None)
    auth.check_bind_allowed("::1", None)
    auth.check_bind_allowed("localhost", None)
    auth.check_bind_allowed("0.0.0.0", b"x" * 32)
    for host in ("0.0.0.0", "::", "10.1.2.3"):
        with pytest.raises(auth.AuthConfigError, match="without a token"):
            auth.check_bind_allowed(host, None)


def test_parse_host_port():
    assert parse_host_port("gpu:7000") == ("gpu", 7000)
    assert parse_host_port("gpu") == ("gpu", 7341)
    assert parse_host_port("[::1]:9") == ("::1", 9)
    for bad in ("gpu:x", ":9", "gpu:70000", "[::1"):
        with pytest.raises(ValueError):
            parse_host_port(bad)
