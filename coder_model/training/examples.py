"""Training/evaluation examples in the native layout, as (Prompt, target region) pairs.

An `Example` is layout-independent: `dlm.coder_model.layout` turns its prompt
into context tokens and its target into the masked block's answer
(target tokens, then <eom>, then <pad>). The builders for each kind live in
their own modules: completion and fill-in-the-middle here, edits in
`edit_examples`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dlm.coder_model.types import Prompt

KINDS = ("completion", "fim", "synthetic_edit", "real_edit", "noop")


@dataclass(frozen=True)
class Example:
    kind: str  # one of KINDS
    prompt: Prompt
    target: str  # the new text of prompt.region
    source: str = ""  # file or record it was made from (for splits and debugging)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            starts.append(i + 1)
    return starts


def window(text: str, start: int, end: int, max_chars: int, side: str) -> str:
    """The text of [start, end) cut to max_chars on the far side, at a line boundary."""
    piece = text[start:end]
    if len(piece) <= max_chars:
        return piece
    if side == "before":
        piece = piece[-max_chars:]
        nl = piece.find("\n")
        return piece[nl + 1 :] if nl >= 0 else piece
    piece = piece[:max_chars]
    nl = piece.rfind("\n")
    return piece[: nl + 1] if nl >= 0 else piece


def region_around(
    text: str, line: int, rng: random.Random, max_lines: int = 4
) -> tuple[int, int]:
    """Character span [a, b) of a region of 1..max_lines whole lines starting at `line`."""
    starts = _line_starts(text)
    n_lines = len(starts)
    first = max(0, min(line, n_lines - 1))
    last = min(n_lines - 1, first + rng.randint(0, max_lines - 1))
    a = starts[first]
    b = starts[last + 1] if last + 1 < n_lines else len(text)
    return a, b


def completion_example(
    text: str, rng: random.Random, path: str = "", language: str = "python",
    prefix_chars: int = 1500, suffix_chars: int = 600,
) -> Example | None:
    """Cursor somewhere in a region; the text after the cursor is cut up to a
    random point (end of token, line or region) and the target restores it."""
    if len(text) < 20:
        return None
    starts = _line_starts(text)
    line = rng.randrange(len(starts))
    a, b = region_around(text, line, rng)
    region = text[a:b]
    if not region.strip():
        return None
    cursor = rng.randint(0, len(region.rstrip("\n")))
    rest = region[cursor:]
    # how much of the text after the cursor the user "has not typed yet"
    cut_kind = rng.random()
    if cut_kind < 0.35:  # rest of the token
        j = 0
        while j < len(rest) and (rest[j].isalnum() or rest[j] == "_"):
            j += 1
        cut = max(j, 1)
    elif cut_kind < 0.75:  # rest of the line
        nl = rest.find("\n")
        cut = nl if nl >= 0 else len(rest)
    else:  # rest of the region
        cut = len(rest.rstrip("\n"))
    if cut <= 0:
        return None
    current = region[:cursor] + rest[cut:]
    prompt = Prompt(
        prefix=window(text, 0, a, prefix_chars, "before"),
        region=current,
        cursor=cursor,
        suffix=window(text, b, len(text), suffix_chars, "after"),
        language=language,
        path=path,
    )
    return Example("completion", prompt, region, path)


def fim_example(
    text: str, rng: random.Random, path: str = "", language: str = "python",
    prefix_chars: int = 1500, suffix_chars: int = 600, max_span: int = 120,
) -> Example | None:
    """Random character span removed from inside a region; the cursor sits at the hole."""
    if len(text) < 20:
        return None
    starts = _line_starts(text)
    a, b = region_around(text, rng.randrange(len(starts)), rng, max_lines=6)
    region = text[a:b]
    if len(region.strip()) < 4:
        return None
    s = rng.randrange(len(region))
    e = min(len(region), s + rng.randint(1, max_span))
    current = region[:s] + region[e:]
    prompt = Prompt(
        prefix=window(text, 0, a, prefix_chars, "before"),
        region=current,
        cursor=s,
        suffix=window(text, b, len(text), suffix_chars, "after"),
        language=language,
        path=path,
    )
    return Example("fim", prompt, region, path)
