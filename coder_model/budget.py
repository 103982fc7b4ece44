"""The one context budget (docs/architecture.md §3, §4): a LayoutBudget -> token cuts and text windows.

Every path that gives the model text (the LSP's context builder, `dlm-lsp http`, `dlm-lsp
predict`, the remote backend, the open families, and training's example builders) sizes it
here, so the model is served the layout it was trained on:

- `plan(budget)` gives the token cuts the layout (coder_model.layout.encode_prompt) makes:
  a fixed allowance for the header and markers, retrieved snippets up to `snippets` (a fifth
  of the context, MAX_SNIPPETS of them, each SNIPPET_LINES lines at most), history up to
  `max_history`, the suffix up to `max_suffix`, a fixed allowance for the region, and the
  prefix in what is left;
- a model trained with the repository memory's drafts (layout 3) keeps up to MAX_DRAFTS of them,
  DRAFT_TOKENS each at most, in `drafts` tokens (`LayoutBudget.max_drafts`, an eighth of the
  context for a model trained now: DRAFTS_SHARE);
- `Plan.prefix_chars` / `suffix_chars` / `history_chars` are the text windows that fill those
  cuts (`chars_for`): enough characters that a line-snapped window re-anchored only partly full
  (lsp.context's hysteresis) still holds more text than the cut keeps. The layout then cuts the
  far end exactly, in tokens, as it does for training's examples;
- `clip_before` / `clip_after` / `clip_prompt` cut text by characters at MAX_CHARS_PER_TOKEN,
  above what any cut keeps, so that a megabyte of text is never tokenized to be thrown away;
- `region_fits` says whether a region can fit at all (a token is at least one UTF-8 byte).

No torch, no tokenizer: the server sizes its windows before the model has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlm.coder_model.limits import bound_path
from dlm.coder_model.types import LayoutBudget, Prompt

# Characters per token of code, the estimate every window is sized with (3.2-3.5 measured on this
# repository's Python with the embedded tokenizer); cuts are made exactly in tokens by the layout.
CHARS_PER_TOKEN = 3.5
# No ordinary text has more characters per token than this (a long run of spaces may, and loses
# only its far end), so a cut at this ratio never removes text a token cut would keep.
MAX_CHARS_PER_TOKEN = 8
# Special tokens of the native layout around the text (coder_model.layout): <bos> <file> <history>
# <prefix> <suffix> <region> <cursor> <rewrite>.
LAYOUT_SPECIALS = 8
# Retrieved snippets (coder_model.layout's sections before the file's, docs/architecture.md §10): how
# many, how many lines each (the lines of a retrieved window that share most identifiers with the
# query), and the share of the context they may take (a fifth: 76 tokens of a 384-token window).
MAX_SNIPPETS = 2
SNIPPET_LINES = 6
SNIPPETS_SHARE = 5
# The memory's drafts (coder_model.layout.render_drafts): how many, how many tokens each (a line's
# rest is 6-12 tokens; a multi-line draft keeps its first lines), and the share of the context a
# model trained with them gives them (48 tokens of a 384-token window).
MAX_DRAFTS = 4
DRAFT_TOKENS = 32
DRAFTS_SHARE = 8
# LAYOUT_SPECIALS and the `language:path\n` line of an ordinary path; the layout counts the real
# header and cuts the prefix for a longer one.
HEADER_TOKENS = 16


@dataclass(frozen=True)
class Plan:
    """Token cuts of one budget, and the text windows that fill them."""

    budget: LayoutBudget
    header: int  # allowance for the header and markers
    history: int  # at most this many tokens of history events (newest kept)
    suffix: int  # at most this many suffix tokens (nearest kept)
    region: int  # allowance reserved for the region, whatever its size (a larger one takes from the prefix)
    prefix: int  # the prefix's room with no history, no snippets and a full suffix
    snippets: int = 0  # at most this many tokens of retrieved snippets, their <file> lines included
    drafts: int = 0  # at most this many tokens of the memory's drafts, their markers included

    @property
    def prefix_room_max(self) -> int:
        """The prefix's room with no history and no suffix: the most the layout can keep."""
        return max(0, self.budget.max_context - self.header - self.region)

    @property
    def prefix_chars(self) -> int:
        return chars_for(self.prefix_room_max)

    @property
    def suffix_chars(self) -> int:
        return chars_for(self.suffix)

    @property
    def history_chars(self) -> int:
        return chars_for(self.history)

    @property
    def region_bytes(self) -> int:
        """A region of at most this many UTF-8 bytes always fits beside a full history and suffix."""
        return max(0, self.budget.max_context - self.header - self.history - self.suffix)


def plan(budget: LayoutBudget) -> Plan:
    """The cuts of `budget` (the layout's, in coder_model.layout.encode_prompt)."""
    region = budget.max_context // 4
    header = min(HEADER_TOKENS, budget.max_context)
    prefix = max(0, budget.max_context - header - budget.max_history - budget.max_suffix - region
                 - budget.max_drafts)
    return Plan(budget, header, budget.max_history, budget.max_suffix, region, prefix,
                budget.max_context // SNIPPETS_SHARE, budget.max_drafts)


def model_budget(config) -> LayoutBudget:
    """The budget a model was trained with (its coder_model.config.ModelConfig): its context
    window in the training proportions, and its drafts section."""
    return LayoutBudget.for_window(config.context_window, config.drafts_window)


def drafts_window(context_tokens: int) -> int:
    """The drafts section a model trained now with `context_tokens` of context gets."""
    return context_tokens // DRAFTS_SHARE


def chars_for(tokens: int) -> int:
    """Characters of a text window that fills `tokens` tokens after the layout's cut.

    At MAX_CHARS_PER_TOKEN, not the estimate: a window re-anchored only
    `lsp.options.ContextOptions.window_fill` (0.75) full still holds 6 characters per token,
    more than indented code with docstrings has (measured up to ~6), so the layout fills each
    section to the same budget in serving as in training (tests/coder_model/test_contract.py).
    The text beyond is cut by the layout; its tokens are memoised (coder_model.tokenizer)."""
    return int(tokens * MAX_CHARS_PER_TOKEN)


def tokens_for(chars: int) -> int:
    """The estimated tokens of `chars` characters of code."""
    return int(chars / CHARS_PER_TOKEN)


def clip_before(text: str, tokens: int) -> str:
    """The end of `text` that `tokens` tokens can hold at most, starting at a line when one is near."""
    keep = tokens * MAX_CHARS_PER_TOKEN
    if len(text) <= keep:
        return text
    tail = text[-keep:] if keep else ""
    nl = tail.find("\n")
    return tail[nl + 1 :] if 0 <= nl < len(tail) // 4 else tail


def clip_after(text: str, tokens: int) -> str:
    """The start of `text` that `tokens` tokens can hold at most, ending at a line when one is near."""
    keep = tokens * MAX_CHARS_PER_TOKEN
    if len(text) <= keep:
        return text
    head = text[:keep]
    nl = head.rfind("\n")
    return head[: nl + 1] if nl >= 3 * len(head) // 4 else head


def region_fits(region: str, budget: LayoutBudget) -> bool:
    """Whether the layout can take `region` whole beside a full history and suffix."""
    return len(region.encode("utf-8", "surrogatepass")) <= plan(budget).region_bytes


def clip_prompt(prompt: Prompt, budget: LayoutBudget) -> Prompt:
    """`prompt` with its far ends cut by characters, above what the layout keeps: the prefix
    keeps its end, the suffix its start, the history its newest events, the path its end.
    The region is what the model rewrites and is never cut here (see region_fits). Snippets:
    the first MAX_SNIPPETS, each text keeping its start, each path its end."""
    p = plan(budget)
    kept: list[str] = []
    size, keep = 0, p.history * MAX_CHARS_PER_TOKEN
    for event in reversed(prompt.history):  # newest first, as the layout keeps them
        size += len(event)
        if size > keep:
            break
        kept.append(event)
    return replace(
        prompt,
        prefix=clip_before(prompt.prefix, p.prefix_room_max),
        suffix=clip_after(prompt.suffix, p.suffix),
        history=tuple(reversed(kept)),
        path=bound_path(prompt.path),
        snippets=tuple(
            replace(sn, path=bound_path(sn.path), text=clip_after(sn.text, p.snippets))
            for sn in prompt.snippets[:MAX_SNIPPETS]
        ),
    )
