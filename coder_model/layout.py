"""The native token layout (docs/architecture.md §4): Prompt -> context tokens, target -> block tokens.

    <bos>[<file>{snippet path}\\n{snippet text}]...<file>{language}:{path}\\n<history>{event}<edit>{event}...
    <prefix>{prefix}<suffix>{suffix}[<edit>{draft}]...<region>{region[:cursor]}<cursor>{region[cursor:]}<rewrite>
    [MASK] x L                                  (edit mode: the block is the new region)

    ...<region>{region[:cursor]}<cursor>{region[cursor:]}<cursor>
    [MASK] x L                                  (typing, Prompt.insert: the block is the insertion)

Two modes, told apart by the marker that ends the context: after <rewrite> the block holds the
new text of the whole region; after a second <cursor> it holds only the text to insert at the
cursor (up to the end of the statement), so the model never re-types what the user typed.
Retrieved snippets of other files (Prompt.snippets) come first, each as a `<file>` section of its
own, with no new special token (the tokenizer's ids stay as they are): the file's own `<file>`
line is the last, followed by <history>.

The repository memory's drafts (Prompt.proposals, best first) stand between the suffix and the
region, each after an `<edit>` marker (the history's marker; after <suffix> it can only open a
draft), for a model trained with them (layout 3: `LayoutBudget.max_drafts` > 0, from its
ModelConfig.drafts_window); a model without a drafts section gets none and reads the layout it
was trained on (2) token for token. They come after the suffix because they change with the
word being typed, as the region does.

The order is chosen for the prefix KV cache: typing inside a line changes only
the region, so everything up to <region> keeps its tokens (the snippets too: their query is
the lines above the region, coder_model.snippets). Each segment is
tokenized on its own, and the tokenizer memoises long segments, so a keystroke
re-tokenizes only what changed. How many tokens each section keeps is
coder_model.budget's plan, the one budget every serving path and training share.
The block holds the new region, then <eom>, then <pad> to the block's end;
a region longer than one block continues in a second block whose context is
the first (block diffusion).
"""

from __future__ import annotations

import re

from dlm.coder_model.budget import DRAFT_TOKENS, MAX_DRAFTS, MAX_SNIPPETS, clip_prompt, plan
from dlm.coder_model.tokenizer import Tokenizer
from dlm.coder_model.types import LayoutBudget, Prompt

__all__ = [
    "DRAFTS_LAYOUT", "LAYOUT_VERSION", "PREFIX_CUT_QUANTUM", "SUPPORTED_LAYOUTS", "LayoutBudget", "answer_text", "decode_context",
    "display_path", "encode_prompt", "encode_target", "new_region", "render_drafts", "target_block",
]

PREFIX_CUT_QUANTUM = 32

# The version of this layout (the tokens a Prompt becomes and the block's target). A checkpoint
# records the version it was trained with (config.json "layout_version"; none = 1, the layout of
# the embedded checkpoint) and the loader refuses any other: a model fed a layout it was not
# trained on writes nonsense without an error. Bump it with every change to what encode_prompt,
# encode_target or target_block produce. 2: typing prompts (Prompt.insert) end in a second
# <cursor> and the block is the insertion; retrieved snippets as <file> sections before the file's.
# 3: the memory's drafts after the suffix (render_drafts), for a model with a drafts window. A
# model of layout 2 has none, and layout 3 without drafts is layout 2 token for token: both load.
LAYOUT_VERSION = 3
DRAFTS_LAYOUT = 3  # the first layout with a drafts section
SUPPORTED_LAYOUTS = (2, 3)


_SURROGATE = re.compile("[\ud800-\udfff]")


def display_path(path: str | bytes) -> str:
    """A file path as text every tokenizer, UTF-8 encoder and JSON reader takes: the bytes of a
    name that are not UTF-8 (kept by `os.fsdecode` as surrogate escapes, so that the name still
    opens the file) become U+FFFD. For the model's prompt and for messages, never to open a file."""
    if isinstance(path, bytes):
        return path.decode("utf-8", errors="replace")
    path = str(path)
    if path.isascii():
        return path
    try:
        return path.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    except UnicodeError:  # a lone surrogate that is no escaped byte (JSON allows "\ud800")
        return _SURROGATE.sub("\ufffd", path)


def encode_prompt(tok: Tokenizer, prompt: Prompt, budget: LayoutBudget | None = None) -> list[int]:
    """Context token ids for a prompt, ending with <rewrite> (edit mode) or a second <cursor>
    (Prompt.insert); cut by coder_model.budget.plan.

    The text is first cut by characters (coder_model.budget.clip_prompt), here and so on every
    path (local, remote, training): the prefix's far-end token cut depends on the length of
    the text it is given, so every path must give it the same text."""
    b = budget or LayoutBudget()
    cuts = plan(b)
    prompt = clip_prompt(prompt, b)
    sp = tok.special
    snippets: list[int] = []
    for sn in prompt.snippets[:MAX_SNIPPETS]:  # best first: a later one gets what room is left
        room = cuts.snippets - len(snippets)
        ids = [sp["<file>"]] + tok.encode(f"{display_path(sn.path)}\n") + tok.encode(sn.text)
        if room < 8 or not sn.text.strip():
            continue
        snippets += ids[:room]
    path = display_path(prompt.path)  # a name that is not UTF-8 is no text a tokenizer takes
    header = [sp["<bos>"]] + snippets + [sp["<file>"]] + tok.encode(f"{prompt.language}:{path}\n")

    history: list[int] = []
    for event in reversed(prompt.history):  # newest events are kept first
        ids = tok.encode(event)
        if len(history) + len(ids) + 1 > cuts.history:
            break
        history = [sp["<edit>"]] + ids + history

    region = (
        [sp["<region>"]]
        + tok.encode(prompt.region[: prompt.cursor])
        + [sp["<cursor>"]]
        + tok.encode(prompt.region[prompt.cursor :])
        + [sp["<cursor>"] if prompt.insert else sp["<rewrite>"]]
    )
    suffix = tok.encode(prompt.suffix)[: cuts.suffix]
    drafts = render_drafts(tok, prompt.proposals, cuts.drafts)
    # The prefix's room must not depend on what changes while typing (the region),
    # or its first token moves every keystroke and the prefix KV cache never hits:
    # reserve a fixed allowance for the region, and cut the prefix's far end in
    # steps of PREFIX_CUT_QUANTUM tokens so that a line moving into the prefix
    # (Enter) shifts the start only once per quantum.
    region_allowance = max(len(region), cuts.region)
    room = b.max_context - len(header) - 3 - len(history) - len(suffix) - len(drafts) - region_allowance
    prefix = tok.encode(prompt.prefix)
    if len(prefix) > room:
        drop = len(prefix) - max(room, 0)
        drop = min(len(prefix), -(-drop // PREFIX_CUT_QUANTUM) * PREFIX_CUT_QUANTUM)
        prefix = prefix[drop:]
    return (header + [sp["<history>"]] + history + [sp["<prefix>"]] + prefix + [sp["<suffix>"]] + suffix + drafts
            + region)


def render_drafts(tok: Tokenizer, proposals, room: int) -> list[int]:
    """The drafts section: up to MAX_DRAFTS of the memory's proposals (best first; any object
    with a `text`), each `<edit>` then its first DRAFT_TOKENS tokens, in `room` tokens at most
    (a draft that does not fit whole is left out, so no draft is a cut one unless it was longer
    than DRAFT_TOKENS). Empty when `room` is 0: a model trained with no drafts section."""
    out: list[int] = []
    if room <= 0:
        return out
    seen: set[str] = set()
    for p in proposals:
        if len(seen) == MAX_DRAFTS:
            break
        if not p.text or p.text in seen:
            continue
        seen.add(p.text)
        ids = [tok.special["<edit>"]] + tok.encode(p.text)[:DRAFT_TOKENS]
        if len(out) + len(ids) > room:
            break
        out += ids
    return out


def answer_text(prompt: Prompt, region: str) -> str:
    """What the blocks must hold for `prompt` when its new region is `region`: the region itself
    (edit mode), or the text inserted at the cursor (Prompt.insert). ValueError when an insertion
    prompt's new region is not the old one with text inserted at the cursor."""
    if not prompt.insert:
        return region
    before, after = prompt.region[: prompt.cursor], prompt.region[prompt.cursor :]
    if not (region.startswith(before) and region.endswith(after) and len(region) >= len(prompt.region)):
        raise ValueError(
            "an insertion prompt's target must be its region with text inserted at the cursor; "
            "build this example with insert=False (edit mode) instead"
        )
    return region[len(before) : len(region) - len(after)]


def new_region(prompt: Prompt, answer: str) -> str:
    """Inverse of answer_text: the new region for what the model wrote in its blocks."""
    if not prompt.insert:
        return answer
    return prompt.region[: prompt.cursor] + answer + prompt.region[prompt.cursor :]


def encode_target(tok: Tokenizer, target: str) -> list[int]:
    """The answer the blocks must hold (answer_text: the new region, or the insertion), then <eom>."""
    return tok.encode(target) + [tok.eom_id]


def target_block(tok: Tokenizer, target_ids: list[int], block: int, block_len: int) -> list[int]:
    """Slots of block number `block` (0-based) for a target, padded with <pad>."""
    piece = target_ids[block * block_len : (block + 1) * block_len]
    return piece + [tok.pad_id] * (block_len - len(piece))


def decode_context(tok: Tokenizer, ids: list[int]) -> dict[str, str]:
    """Inverse of encode_prompt for checks and debugging: the text of each segment."""
    names = {v: k for k, v in tok.special.items()}
    segments: dict[str, list[int]] = {}
    files: list[list[int]] = []  # every <file> section: snippets first, the file's own last
    drafts: list[list[int]] = []  # every <edit> after the suffix
    current = "<head>"
    for i in ids:
        name = names.get(i)
        if name == "<edit>" and current in ("<suffix>", "<drafts>"):
            drafts.append([])
            current = "<drafts>"
        elif current == "<drafts>" and name is None:
            drafts[-1].append(i)
        elif name == "<file>":
            files.append([])
            current = name
        elif current == "<file>" and name is None:
            files[-1].append(i)
        elif name in ("<history>", "<prefix>", "<suffix>", "<region>", "<rewrite>"):
            current = name
            segments.setdefault(current, [])
        elif name == "<cursor>" and current == "<region>" and tok.special["<cursor>"] in segments["<region>"]:
            segments["<insert>"] = []  # the second <cursor>: the block is an insertion
            current = "<insert>"
        elif name == "<cursor>":
            segments.setdefault("<region>", []).append(i)
        elif name in ("<bos>",):
            continue
        else:
            segments.setdefault(current, []).append(i)
    out: dict[str, str] = {}
    if files:
        out["file"] = tok.decode(files[-1])
        out["snippets"] = "\x00".join(tok.decode(f) for f in files[:-1])
    if drafts:
        out["drafts"] = "\x00".join(tok.decode(d) for d in drafts)
    out["mode"] = "insert" if "<insert>" in segments else "rewrite"
    segments.pop("<insert>", None)
    for k, seg in segments.items():
        if k == "<region>" and tok.special["<cursor>"] in seg:
            c = seg.index(tok.special["<cursor>"])
            out["region_before_cursor"] = tok.decode(seg[:c])
            out["region_after_cursor"] = tok.decode(seg[c + 1 :])
        elif k == "<history>":
            events, cur = [], []
            for i in seg:
                if i == tok.special["<edit>"]:
                    if cur:
                        events.append(tok.decode(cur))
                    cur = []
                else:
                    cur.append(i)
            if cur:
                events.append(tok.decode(cur))
            out["history"] = "\x00".join(events)
        else:
            out[k.strip("<>")] = tok.decode(seg)
    return out
