"""Server options: defaulted dataclasses filled from LSP `initializationOptions`.

Clients send a JSON object, e.g. `{"context": {"prefixTokens": 512},
"sampler": {"steps": 16}, "scheduler": {"throttleMs": 20}}`; keys may be camelCase or
snake_case. Unknown keys and values of the wrong type or out of range are reported (the
server logs them) and the defaults are kept, so a typo never stops the
server. Each option is one field declared with coder_model.caps.option: its default, its
range and its meaning; the ranges (OPTION_CAPS below, read off the fields, and
coder_model.limits.SAMPLER_CAPS) are checked by the validator every door shares
(coder_model.limits.check), and docs/configuration.md is rendered from the same fields
(`python -m dlm.lsp.option_docs > docs/configuration.md`).

Token budgets use the characters-per-token estimate of coder_model.budget
instead of the model tokenizer: the windows are cut at line boundaries anyway,
the estimate costs nothing per keystroke, and the server does not need the
tokenizer before the model has loaded. The layout then cuts exactly, in tokens,
as it does for training.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from dlm.coder_model.caps import Cap, check, field_caps, option
from dlm.coder_model.limits import DEFAULT_DEADLINE_MS, REQUEST_CAPS, check_sampler
from dlm.coder_model.regions import RegionBudget


@dataclass
class ContextOptions(RegionBudget):
    """The region sizes (coder_model.regions.RegionBudget: the fields training cuts by) and the
    server's windows. The prefix and suffix windows are the model's (coder_model.budget.plan),
    capped by `prefix_tokens` / `suffix_tokens` when those are set (0: no cap)."""

    prefix_tokens: int = option(
        0, Cap("int", 0, 65_536), "tokens of text before the region at most (0: the model's window)")
    suffix_tokens: int = option(
        0, Cap("int", 0, 65_536), "tokens of text after the region at most (0: the model's window)")
    idle_ms: int = option(
        300, Cap("int", 0, 60_000), "a pause in typing this long switches to the wide region")
    max_line_chars: int = option(
        2000, Cap("int", 1, 1_000_000), "a cursor line longer than this (minified code) gets no suggestion")
    window_fill: float = option(
        0.75, Cap("float", 0.1, 1.0),
        "how full a text window starts when it is re-anchored (the rest is room to grow)")


@dataclass
class HistoryOptions:
    """Edit events the model sees (lsp.history)."""

    max_events: int = option(6, Cap("int", 0, 64), "edit events the model sees at most, the newest")
    max_tokens: int = option(
        512, Cap("int", 0, 65_536),
        "(estimated) tokens of edit events at most, and never more than the model takes")
    gap_lines: int = option(
        8, Cap("int", 0, 10_000), "a change within this many lines of the open edit event joins it")
    idle_s: float = option(
        1.0, Cap("float", 0.0, 3600.0), "a change more than this many seconds after the previous one "
        "starts a new edit event")


@dataclass
class SchedulerOptions:
    throttle_ms: int = option(
        20, Cap("int", 0, 2000), "at least this long between model runs for one document (leading edge)")
    timeout_ms: int = option(
        10_000, Cap("int", 100, 600_000),
        "give up waiting for a prediction after this long (the engine is stuck)")
    type_through: bool = option(
        True, Cap("bool"), "typing through a shown insertion answers from it, with no model run")


@dataclass
class IndexOptions:
    """The workspace index (lsp.workspace_index; docs/repository-memory.md)."""

    enabled: bool = option(True, Cap("bool"), "index the workspace folders for the repository memory")
    max_files: int = option(
        50_000, Cap("int", 0, 10_000_000), "source files indexed per workspace root; the walk stops there")
    max_file_bytes: int = option(
        1_000_000, Cap("int", 0, 100_000_000), "larger files are skipped (minified bundles, generated code)")
    max_tokens: int = option(
        20_000_000, Cap("int", 0, 1_000_000_000),
        "tokens indexed per workspace root (the repository memory's cap)")
    rescan_s: float = option(
        60.0, Cap("float", 0.0, 86_400.0),
        "seconds between rescans of file times when the client does not watch files (0: never)")
    # On: on the development repositories' frozen cases the trees alone (no model pass) beat the
    # memory checked by the model on exact and on precision at an equal shown share, at half its
    # latency, with no more of what they show broken (BENCHMARKS.md "The shipped configuration");
    # the model's check (sampler.verifyPasses) is off by default for that reason
    rank_drafts: bool = option(
        True, Cap("bool"), "boosted trees re-rank the memory's line drafts, and their probability "
        "that a draft is the line takes the memory's place in its confidence (coder_model.memory.line_ranker)")
    # (RUF009 takes option() for a call in a default: it returns the field, with a default_factory)
    exclude: list[str] = option(  # noqa: RUF009
        [], Cap("strings", high=10_000), "more .gitignore-style patterns of files to leave out of the index")


@dataclass
class NextEditOptions:
    """Next edits from the edit memory (lsp.next_edits, coder_model.edit_memory; docs/next-edits.md)."""

    enabled: bool = option(
        True, Cap("bool"),
        "the edit memory's proposals answer dlm/editPrediction (when editPredictions is on)")
    # On the largest development measure (train commits held out of the fit) 0.25 keeps the widest
    # margin over the shown and exact Targets of the thresholds swept (docs/next-edits.md,
    # BENCHMARKS.md "The shipped edit memory")
    min_confidence: float = option(
        0.25, Cap("float", 0.0, 1.0), "show a proposal in the document at this confidence or above "
        "(the calibrated probability that it is the next edit)")
    # Its site's own trees (`elsewhere`) judge a jump: on the same folds 64% of the jumps at 0.2 are
    # what the commit did there, BENCHMARKS.md "Jumps to another file"
    min_confidence_jump: float = option(
        0.2, Cap("float", 0.0, 1.0), "answer a jump to another file at this confidence of its site or above "
        "(the site it leads to is shown there at this gate too)")
    # Off: the model's probability did not tell right proposals from wrong ones on the valid split
    # (median 0.041 against 0.033), the mix was neutral at equal shown share, and it costs a model
    # run per request; the gate's figures are for the calibrated confidence alone.
    check_with_model: bool = option(
        False, Cap("bool"), "the model checks each proposal before it is shown: it can veto, and its "
        "probability of the edit is mixed into the confidence")
    checked: int = option(2, Cap("int", 1, 16), "proposals the model checks per request, best first")
    veto: float = option(
        0.0, Cap("float", 0.0, 1.0),
        "a proposal whose edit the model gives less than this probability is never shown")
    deadline_ms: int = option(
        300, Cap("int", 1, 10_000),
        "the model's check answers this long after the request, or the proposal is dropped")
    max_patterns: int = option(32, Cap("int", 1, 1024), "edit patterns remembered (the newest)")
    max_edit_lines: int = option(
        20, Cap("int", 1, 200), "an edit of more lines than this (a paste, a reformat) is not a pattern")
    max_scan_lines: int = option(
        2000, Cap("int", 1, 100_000), "candidate lines looked at per pattern, nearest the cursor first")
    max_proposals: int = option(8, Cap("int", 1, 100), "ranked sites kept per request")
    git_commits: int = option(
        300, Cap("int", 0, 10_000), "commits of the root's git history mined for patterns (0: none)")
    jump_lines: int = option(
        8, Cap("int", 0, 10_000),
        'a proposal farther than this many lines from the cursor carries a "jump to" hint')
    other_files: int = option(
        500, Cap("int", 0, 100_000), "files looked at for a jump to another file when this document has no "
        "proposal: the other open documents, then the indexed files nearest its folder (0: never)")
    # Off: on the valid split every one of its proposals deleted lines the commit keeps, none was
    # exact (BENCHMARKS.md "Next edits").
    model_fallback: bool = option(
        False, Cap("bool"), "without a proposal, the model's wide rewrite of the region answers")


@dataclass
class Options:
    context: ContextOptions = field(default_factory=ContextOptions)
    history: HistoryOptions = field(default_factory=HistoryOptions)
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    # Checked against SamplerParams' own caps (coder_model.limits.check_sampler), so it has none here
    sampler: dict[str, Any] = field(
        default_factory=dict, metadata={"doc": "overrides of the sampler's parameters (SamplerParams)"})
    index: IndexOptions = field(default_factory=IndexOptions)
    next_edits: NextEditOptions = field(default_factory=NextEditOptions)
    # Deadline and confidence gate (lsp.gate; docs/protocol.md). minConfidence is chosen by
    # `dlm-lsp eval` on the embedded model (BENCHMARKS.md "Acceptance through the server").
    deadline_ms: int = option(
        DEFAULT_DEADLINE_MS, Cap("int", 1, int(REQUEST_CAPS["deadline_ms"].high)),
        "answer this long after the keystroke, or not at all")
    # 0.45: through the server, on 300 frozen held-out lines each of django, xarray, sympy and
    # astropy, the memory's drafts ranked by the line ranker (the shipped configuration) show
    # 41.9% of the lines at 75.9% precision from 0.45, and each repository >= 25% at >= 60%
    # (sympy, the weakest: 34.3% at 64.1%); 0.45 is the lowest threshold where every one of the
    # four meets that (BENCHMARKS.md "The shipped configuration"). Without an index the model
    # alone showed nothing at 0.3 already (xarray, 150 lines).
    min_confidence: float = option(
        0.45, Cap("float", 0.0, 1.0), "show a suggestion only at this confidence or above")
    min_confidence_rewrite_recent: float = option(
        0.98, Cap("float", 0.0, 1.0),
        "the confidence a suggestion that deletes or rewrites recent typing needs")
    recent_edit_s: float = option(
        5.0, Cap("float", 0.0, 3600.0), 'lines changed this many seconds ago or less are "recent" typing')
    # On: at the default gate (nextEdits.minConfidence) the edit memory's proposals meet the shown
    # and exact Targets on the development data (docs/next-edits.md). The model's own rewrite stays off.
    edit_predictions: bool = option(
        True, Cap("bool"), "answer dlm/editPrediction (edits away from the cursor)")
    max_syntax_chars: int = option(
        2_000_000, Cap("int", 0, 1_000_000_000), "larger documents are plain text (no tree-sitter)")
    max_document_chars: int = option(
        50_000_000, Cap("int", 1, 1_000_000_000), "larger documents are refused with a log line")
    status_interval_s: float = option(
        2.0, Cap("float", 0.0, 3600.0), "at most one dlm/status with new latencies per this many seconds")


# The range of every option, read off the fields (each declares its own with coder_model.caps.option;
# the sampler's are coder_model.limits.SAMPLER_CAPS), checked by coder_model.limits.check like every
# other option and request parameter. Keyed by the dotted snake_case name; docs/configuration.md is
# rendered from the fields (lsp.option_docs). An upper bound is where a larger value only breaks
# things: a 1e300 ms throttle stalls every request, a 1e300 ms timeout never gives up.
OPTION_CAPS: dict[str, Cap] = field_caps(Options)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


# Top-level initializationOptions keys that are not options: `engine` (a hosted model server) is
# coder_model.hosted.settings' own declaration, read only from user scope (docs/engines.md).
SEPARATE_SETTINGS = frozenset({"engine"})


def _fill(obj: Any, data: dict, where: str, problems: list[str]) -> None:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in data.items():
        name = _snake(str(key))
        if not where and name in SEPARATE_SETTINGS:
            continue  # declared and checked by their own owner
        if name not in fields:
            problems.append(f"unknown option {where}{key!r} (known: {', '.join(sorted(fields))})")
            continue
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if isinstance(value, dict):
                _fill(current, value, f"{where}{name}.", problems)
            else:
                problems.append(f"option {where}{name} must be an object, got {value!r:.60}")
        elif name == "sampler" and not where:
            if isinstance(value, dict):
                good, found = check_sampler({_snake(str(k)): v for k, v in value.items()}, "sampler.")
                current.update(good)
                problems.extend(f"option {p}; using the default" for p in found)
            else:
                problems.append(f"option sampler must be an object, got {value!r:.60}")
        else:
            cap = OPTION_CAPS.get(where + name)
            if cap is None:  # a field without a cap is a bug here, not the client's
                problems.append(f"option {where}{name} cannot be set (it has no range in OPTION_CAPS)")
                continue
            ok, problem = check(where + name, value, cap)
            if problem is not None:
                problems.append(f"option {problem}; using {current!r}")
            else:
                setattr(obj, name, ok)


def parse_options(data: Any) -> tuple[Options, list[str]]:
    """Options from initializationOptions, and a list of problems (empty when all is well).

    Never raises: every value is checked (coder_model.limits.check) against OPTION_CAPS or
    the sampler's caps, and a bad one is reported and its default kept.
    """
    opts = Options()
    problems: list[str] = []
    if data is None:
        return opts, problems
    if not isinstance(data, dict):
        return opts, [f"initializationOptions must be an object, got {type(data).__name__}; using defaults"]
    _fill(opts, data, "", problems)
    return opts, problems
