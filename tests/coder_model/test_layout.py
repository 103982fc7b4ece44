"""The native layout: segments round-trip, budgets hold, typing keeps the prefix tokens."""

from __future__ import annotations

from dlm.coder_model.layout import LayoutBudget, decode_context, encode_prompt
from dlm.coder_model.types import Prompt

PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))


def test_segments_round_trip(tiny_model):
    _, tok = tiny_model
    p = Prompt(prefix="import os\n", region="x = os.path\n", cursor=5, suffix="print(x)\n",
               history=("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n",), language="python", path="m.py")
    seg = decode_context(tok, encode_prompt(tok, p))
    assert seg["prefix"] == "import os\n" and seg["suffix"] == "print(x)\n"
    assert seg["region_before_cursor"] == "x = o" and seg["region_after_cursor"] == "s.path\n"
    assert seg["history"] == p.history[0] and seg["file"] == "python:m.py\n"


def test_budget_and_prefix_stable_while_typing(tiny_model):
    _, tok = tiny_model
    b = LayoutBudget.for_window(256)
    starts = set()
    for typed in range(0, 30):
        region = "    value = compute(" [: typed % 21] + "\n"
        ids = encode_prompt(tok, Prompt(prefix=PREFIX, region=region, cursor=len(region) - 1, suffix="x\n"), b)
        assert len(ids) <= 256
        p = ids.index(tok.special["<prefix>"])
        starts.add(tuple(ids[: p + 8]))  # the first prefix tokens
    assert len(starts) == 1  # typing in the region never moves the prefix start
