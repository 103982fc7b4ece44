"""The real Inception API (optional): marked `inception`, left out of the default run, and skipped
without INCEPTION_API_KEY. It sends one small, made-up file to api.inceptionlabs.ai.

    INCEPTION_API_KEY=... .venv/bin/pytest -m inception tests/coder_model/hosted

It checks the protocol against the live service: the request is taken (no 4xx), the answer is in
the shape the engine reads (a new region, or none), and the engine reports no problem. It claims
nothing about the quality of the answer.
"""

from __future__ import annotations

import os
import time

import pytest
from dlm.coder_model.hosted.http_engine import HostedEngine
from dlm.coder_model.hosted.settings import EngineSettings
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

pytestmark = [
    pytest.mark.inception,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not os.environ.get("INCEPTION_API_KEY"), reason="INCEPTION_API_KEY is not set"),
]

PROMPT = Prompt(prefix="def fibonacci(n):\n", region="    if n < 2:\n        return ", cursor=len("    if n < 2:\n        return "),
                suffix="\n    return fibonacci(n - 1) + fibonacci(n - 2)\n", language="python", path="fib.py",
                insert=True)


@pytest.mark.parametrize("kind", ["mercury-edit", "mercury-fim"])
def test_the_live_api_takes_the_request_and_answers_in_the_shape_read(kind):
    engine = HostedEngine(EngineSettings(kind=kind, deadline_ms=20_000))
    try:
        pred = engine.predict(PROMPT, SamplerParams(), CancelToken(), time.monotonic() + 20)
        st = engine.status()
        assert st.state == "ready" and not st.message, st.message
        assert not pred.cancelled and not pred.late
        assert isinstance(pred.text, str)
    finally:
        engine.close()
