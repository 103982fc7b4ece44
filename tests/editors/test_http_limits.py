"""Limits of `dlm-lsp http`'s requests: a lone surrogate in the prompt, max_tokens applied and
typed, request fields checked by the shared validator (coder_model.limits)."""

from __future__ import annotations

import json

import pytest
from dlm.lsp import http_endpoint as he
from test_http_hardening import _start, call

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def endpoint(tiny_checkpoint):
    from dlm.coder_model.engine import load_engine

    holder = he.EngineHolder(lambda: load_engine(tiny_checkpoint, "cpu"))
    server = _start(holder, sampler={"steps": 4, "block_len": 16, "max_blocks": 2, "threshold": 0.0})
    yield server
    server.shutdown()
    server.server_close()
    holder.close()


def post(server, obj) -> tuple[int, dict]:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    status, _, out = call(server, "POST", "/v1/completions", body)
    return status, out


def test_a_lone_surrogate_in_the_prompt_is_not_a_500(endpoint):
    # valid JSON; json.loads gives a str holding U+D800, which no tokenizer can encode
    body = b'{"model": "dlm", "prompt": "<|fim_prefix|>x = \\ud800<|fim_suffix|>\\n<|fim_middle|>"}'
    status, out = post(endpoint, body)
    assert status == 200, out
    assert isinstance(out["choices"][0]["text"], str)


def test_max_tokens_bounds_what_the_model_writes(endpoint):
    prompt = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n<|fim_middle|>"
    status, out = post(endpoint, {"model": "dlm", "prompt": prompt})
    assert status == 200 and out["usage"]["completion_tokens"] > 1  # 16 x 2 slots at threshold 0
    status, out = post(endpoint, {"model": "dlm", "prompt": prompt, "max_tokens": 1})
    assert status == 200, out
    assert out["usage"]["completion_tokens"] <= 1


@pytest.mark.parametrize("value,fragment", [
    (True, "max_tokens must be an integer"),
    (0, "max_tokens=0 is outside"),
    (1e400, "max_tokens"),  # 1e400 is written as such in the body below
    (2.5, "max_tokens must be an integer"),
])  # fmt: skip
def test_bad_max_tokens_are_400_with_the_range(endpoint, value, fragment):
    text = json.dumps({"model": "dlm", "prompt": "<|fim_prefix|>x<|fim_suffix|><|fim_middle|>", "max_tokens": 7})
    text = text.replace('"max_tokens": 7', '"max_tokens": ' + ("1e400" if value == 1e400 else json.dumps(value)))
    status, out = post(endpoint, text.encode())
    assert status == 400, out
    assert fragment in out["error"]["message"]


def test_the_endpoints_sampler_options_go_through_the_same_caps():
    predictor = he.Predictor(he.EngineHolder(lambda: None), he.EndpointOptions(sampler={"block_len": 4096, "steps": 8}))
    assert predictor.params.block_len == 32 and predictor.params.steps == 8
