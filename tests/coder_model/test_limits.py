"""The one validator (coder_model.limits): what every door's options and parameters go through."""

from __future__ import annotations

import math

import pytest
from dlm.coder_model import limits
from dlm.coder_model.limits import Cap, check
from dlm.coder_model.types import Prompt, SamplerParams

INT = Cap("int", 1, 1024)
FLOAT = Cap("float", 0.0, 1.0)


@pytest.mark.parametrize("value,cap,expected", [
    (16, INT, 16), (16.0, INT, 16), (0.5, FLOAT, 0.5), (1, FLOAT, 1.0), (True, Cap("bool"), True),
    ("margin", limits.SAMPLER_CAPS["rule"], "margin"),
])  # fmt: skip
def test_accepted_values_come_back_in_the_caps_kind(value, cap, expected):
    ok, problem = check("x", value, cap)
    assert problem is None and ok == expected and type(ok) is type(expected)


@pytest.mark.parametrize("value,cap,fragment", [
    (True, INT, "must be an integer"),  # a boolean is not 1
    (math.inf, INT, "not a finite number"),  # JSON's 1e400
    (-math.inf, FLOAT, "not a finite number"),
    (math.nan, FLOAT, "not a finite number"),
    (2.5, INT, "must be an integer"),
    (1e300, INT, "outside its range"),
    (0, INT, "outside its range"),
    ("9", INT, "must be an integer"),
    (1, Cap("bool"), "true or false"),
    ("vibes", limits.SAMPLER_CAPS["rule"], "one of max_prob, margin, entropy"),
    (None, FLOAT, "must be a number"),
])  # fmt: skip
def test_refused_values_say_what_is_accepted(value, cap, fragment):
    ok, problem = check("x", value, cap)
    assert ok is None and fragment in problem and problem.startswith("x")


def test_sampler_overrides_keep_the_good_values_and_default_the_bad():
    params, problems = limits.sampler_params({"steps": 8, "block_len": 4096, "temperature": math.nan, "warp": 1})
    assert params == SamplerParams(steps=8)
    assert len(problems) == 3
    params, problems = limits.sampler_params({"block_len": 1024, "max_blocks": 3, "steps": 4096})
    assert params == SamplerParams() and "slot-steps" in problems[0]
    assert limits.request_slot_steps(SamplerParams()) == 2048
    assert limits.request_slot_steps(SamplerParams(steps=4096)) == 2048  # a block takes at most block_len steps


def test_fields_are_bounded_and_a_small_prompt_is_returned_as_is():
    small = Prompt("a", "b", 0, "c", history=("h",), language="python", path="x.py")
    assert limits.bound_fields(small) is small
    big = Prompt("a", "b", 0, "c", history=tuple(f"e{i}" * 10_000 for i in range(100)), language="l" * 100,
                 path="/d" * 1000 + "/file.py")
    out = limits.bound_fields(big)
    assert out.path.endswith("/file.py") and len(out.path) == limits.MAX_PATH_CHARS
    assert len(out.language) == limits.MAX_LANGUAGE_CHARS
    assert len(out.history) == limits.MAX_HISTORY_EVENTS and out.history[-1].startswith("e99")
    assert all(len(e) <= limits.MAX_HISTORY_EVENT_CHARS for e in out.history)
    assert (out.prefix, out.region, out.suffix) == ("a", "b", "c")


def test_clean_text_replaces_lone_surrogates_only():
    assert limits.clean_text("a\ud800b") == "a\ufffdb"
    assert limits.clean_text("😀 é") == "😀 é"
