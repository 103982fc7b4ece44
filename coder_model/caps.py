"""Caps and declared options: the one validator's rule for a value, and the field that carries it.

An option or sampler parameter is one dataclass field declared with `option(default, cap, doc)`:
its default, its accepted values (a Cap) and its meaning for the user. The tables of caps
(coder_model.limits.SAMPLER_CAPS, lsp.options.OPTION_CAPS) are read off the fields
(`field_caps`), and docs/configuration.md is rendered from them (lsp.option_docs), so nothing
is written twice. coder_model.limits holds what the doors do with the caps; this module stands
apart from it because coder_model.types declares its fields with these caps and
coder_model.limits imports coder_model.types.

What a check refuses (and why each matters):
- a number that is not finite: JSON's `1e400` parses as infinity and
  `int(inf)` raises OverflowError; NaN passes every `<` comparison;
- a boolean where a number is wanted: `True` is an `int` to Python, so
  `max_tokens: true` would read as 1;
- a value outside its range: one request's knobs bound its cost for everyone
  sharing the model, and a `throttleMs` of 1e300 stalls every request.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cap:
    """The accepted values of one option or parameter: `kind` is "int", "float", "bool",
    "choice" or "strings"; numbers lie in [low, high] (None: no bound); a choice is one of
    `choices`; strings are a list of at most `high` of them.

    `valid`, where set, is the (low, high) of the values that mean something, wider than the
    cap: [low, high] bounds what a request may ask (its cost for everyone sharing the model),
    while code may build a heavier value on purpose (a benchmark's heavy client). `in_code`
    is the cap such a value is held to."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""
    valid: tuple[float | None, float | None] | None = None

    @functools.cached_property
    def in_code(self) -> Cap:
        """The cap a value built in code is held to: its `valid` range, else this cap (computed
        once: SamplerParams checks its fields at every construction)."""
        if self.valid is None:
            return self
        return dataclasses.replace(self, low=self.valid[0], high=self.valid[1], valid=None)

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "strings":
            return f"a list of at most {int(self.high or 0):,} strings"
        what = "an integer" if self.kind == "int" else "a number"
        if self.low is None and self.high is None:
            return what if self.kind == "int" else "a finite number"
        if self.high is None:
            return f"{what} >= {format_bound(self.low)}"
        if self.low is None:
            return f"{what} <= {format_bound(self.high)}"
        return f"{what} in [{format_bound(self.low)}, {format_bound(self.high)}]"


def format_bound(x: float) -> str:
    """A range's end as the messages and docs write it: 4096, 65,536, 0.1, 2^63-1."""
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
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if strings and len(value) <= (cap.high or 0):
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


def option(default: Any, cap: Cap, doc: str) -> Any:
    """A dataclass field declaring one option: its default, its accepted values and a one-line
    meaning for the user (the cap carries the doc too, for the tables read off the fields). A
    list default is copied for each instance."""
    cap = dataclasses.replace(cap, doc=doc)
    metadata = {"cap": cap, "doc": doc}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: copy.copy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_caps(cls: type, where: str = "") -> dict[str, Cap]:
    """{dotted snake_case name: cap} of the fields of dataclass `cls` declared with `option`,
    in declaration order; a field whose default is a dataclass is a group, and its fields are
    named `group.field`. A field declared otherwise has no cap and is left out (the tests
    check that every option has one)."""
    caps: dict[str, Cap] = {}
    for f in dataclasses.fields(cls):
        if "cap" in f.metadata:
            caps[where + f.name] = f.metadata["cap"]
        elif isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            caps.update(field_caps(f.default_factory, f"{where}{f.name}."))
    return caps
