"""Options declared once (coder_model.caps.option): the field carries the default, the cap and the
doc; the caps tables, SamplerParams' own check and docs/configuration.md are read off it. The page
itself is compared with its rendering in test_hardening_limits."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import get_args

import pytest
from dlm.coder_model import limits
from dlm.coder_model.caps import Cap, check, field_caps, option
from dlm.coder_model.types import ConfidenceRule, DecodeOrder, SamplerParams
from dlm.lsp import option_docs
from dlm.lsp.options import OPTION_CAPS, IndexOptions, Options, parse_options


def test_every_key_on_the_page_is_accepted_as_written():
    """The camelCase keys the page shows are the ones parse_options takes, with the defaults shown."""
    data: dict = {}
    for row in option_docs.option_rows():
        *groups, name = option_docs.camel(row.key).split(".")
        target = data
        for group in groups:
            target = target.setdefault(group, {})
        target[name] = row.default
    opts, problems = parse_options(data)
    assert problems == []
    assert dataclasses.replace(opts, sampler={}) == Options()
    assert opts.sampler == dataclasses.asdict(SamplerParams())


def test_every_option_has_a_one_line_doc():
    rows = option_docs.option_rows()
    assert len(rows) == len(OPTION_CAPS) + len(limits.SAMPLER_CAPS)
    for row in rows:
        assert row.doc and "\n" not in row.doc and row.cap.doc == row.doc, row.key


def test_the_choices_are_the_literal_types():
    assert limits.SAMPLER_CAPS["rule"].choices == get_args(ConfidenceRule)
    assert limits.SAMPLER_CAPS["order"].choices == get_args(DecodeOrder)


@pytest.mark.parametrize("name,value", [
    ("steps", 0), ("block_len", 0), ("max_blocks", 0), ("threshold", 1.5), ("temperature", -0.1),
    ("rule", "vibes"), ("order", "random"), ("veto", 2.0), ("verify_passes", 9), ("end_threshold", -1.0),
    ("memory_weight", float("nan")), ("repeat_penalty", float("inf")), ("steps", True), ("block_len", 2.5),
    ("seed", "1"),
])  # fmt: skip
def test_sampler_params_refuse_what_no_door_takes(name, value):
    """SamplerParams holds its fields to their caps (the `valid` range where one is declared), with
    the validator's message; every door refuses these values too."""
    cap = limits.SAMPLER_CAPS[name]
    _, problem = check(name, value, cap.in_code)
    assert problem is not None and check(name, value, cap)[1] is not None
    with pytest.raises(ValueError) as exc:
        SamplerParams(**{name: value})
    assert str(exc.value) == problem


@pytest.mark.parametrize("name,value", [
    ("steps", 10_000), ("block_len", 4096), ("max_blocks", 100), ("temperature", 200.0), ("seed", -1),
    ("memory_weight", -1000.0), ("repeat_penalty", 1000.0),
])  # fmt: skip
def test_code_may_build_heavier_params_than_a_request_may_ask(name, value):
    """The `valid` range is wider than the request cap (a benchmark's heavy client): SamplerParams
    takes the value, every door refuses it."""
    assert getattr(SamplerParams(**{name: value}), name) == value
    good, problems = limits.check_sampler({name: value})
    assert good == {} and len(problems) == 1 and name in problems[0]


def test_sampler_params_take_the_caps_ends_and_convert_to_their_kind():
    top = {name: cap.high for name, cap in limits.SAMPLER_CAPS.items() if cap.kind in ("int", "float")}
    params = SamplerParams(**top)
    assert all(getattr(params, name) == value for name, value in top.items())
    assert SamplerParams(steps=16.0).steps == 16 and type(SamplerParams(steps=16.0).steps) is int
    assert type(SamplerParams(threshold=1).threshold) is float


def test_an_option_with_a_list_default_is_not_shared():
    a, b = IndexOptions(), IndexOptions()
    a.exclude.append("*.min.js")
    assert b.exclude == [] and IndexOptions().exclude == []


def test_field_caps_follow_groups():
    @dataclasses.dataclass
    class Inner:
        n: int = option(3, Cap("int", 0, 9), "a count")

    @dataclasses.dataclass
    class Outer:
        inner: Inner = dataclasses.field(default_factory=Inner)
        on: bool = option(True, Cap("bool"), "a switch")

    expected = {"inner.n": Cap("int", 0, 9, doc="a count"), "on": Cap("bool", doc="a switch")}
    assert field_caps(Outer) == expected


def test_a_bad_option_is_reported_as_before():
    _, problems = parse_options({"context": {"prefixTokens": -1}, "history": {"idleS": "1"},
                                 "sampler": {"rule": "vibes"}})
    assert problems == [
        "option context.prefix_tokens=-1 is outside its range; send an integer in [0, 65,536]; using 0",
        "option history.idle_s must be a number in [0, 3600], got '1'; using 1.0",
        "option sampler.rule must be one of max_prob, margin, entropy, got 'vibes'; using the default",
    ]


def test_the_command_prints_the_page_without_torch():
    check_torch = "import sys, dlm.lsp.option_docs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check_torch], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.stdout.strip() == "False", out.stderr
    page = subprocess.run([sys.executable, "-m", "dlm.lsp.option_docs"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert page.returncode == 0 and page.stdout == option_docs.configuration_markdown(), page.stderr
