"""Server options: defaulted dataclasses filled from LSP `initializationOptions`.

Clients send a JSON object, e.g. `{"context": {"prefixTokens": 512},
"sampler": {"steps": 16}, "throttleMs": 20}`; keys may be camelCase or
snake_case. Unknown keys and values of the wrong type or out of range are reported (the
server logs them) and the defaults are kept, so a typo never stops the
server; the ranges are OPTION_CAPS below and coder_model.limits.SAMPLER_CAPS,
checked by the validator every door shares (coder_model.limits.check).

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

from dlm.coder_model.limits import DEFAULT_DEADLINE_MS, REQUEST_CAPS, Cap, check, check_sampler
from dlm.coder_model.regions import RegionBudget
from dlm.lsp.history import HistoryOptions


@dataclass
class ContextOptions(RegionBudget):
    """The region sizes (coder_model.regions.RegionBudget: the fields training cuts by) and the
    server's windows. The prefix and suffix windows are the model's (coder_model.budget.plan),
    capped by `prefix_tokens` / `suffix_tokens` when those are set (0: no cap)."""

    prefix_tokens: int = 0
    suffix_tokens: int = 0
    idle_ms: int = 300  # a pause this long switches to the wide region
    max_line_chars: int = 2000  # longer cursor lines (minified code) get no suggestion
    window_fill: float = 0.75  # a re-anchored window starts this full, leaving room to grow


@dataclass
class SchedulerOptions:
    throttle_ms: int = 20  # leading edge: at least this long between model runs of one document
    timeout_ms: int = 10_000  # give up waiting for a prediction (the engine is stuck)
    type_through: bool = True  # typing through a shown insertion answers from it, with no model run


@dataclass
class IndexOptions:
    """The workspace index (lsp.workspace_index; README "Repository memory")."""

    enabled: bool = True
    max_files: int = 50_000  # source files per workspace root; the walk stops there
    max_file_bytes: int = 1_000_000  # larger files are skipped (minified bundles, generated code)
    max_tokens: int = 20_000_000  # tokens per root (RepoMemory's cap)
    rescan_s: float = 60.0  # mtime rescan interval when the client does not watch files (0: never)
    exclude: list[str] = field(default_factory=list)  # more .gitignore-style patterns to leave out


@dataclass
class NextEditOptions:
    """Next edits from the edit memory (lsp.next_edits, coder_model.edit_memory; README "Next edits")."""

    enabled: bool = True  # the edit memory's proposals answer dlm/editPrediction (when editPredictions is on)
    # Show a proposal in the document at this confidence (the calibrated P(it is the next edit),
    # edit_memory/calibration.py) or above: on the largest development measure (train commits held
    # out of the fit) 0.25's smaller margin over issue 24's shown and exact Targets is the widest of
    # the thresholds swept (README "Next edits", BENCHMARKS.md "Session 12"; 0.2 until the adapted
    # blocks, which add proposals the trees rate lower)
    min_confidence: float = 0.25
    # Answer a jump to another file at this confidence of its site or above (its own trees,
    # `elsewhere`, judge it: on the same folds 64% of the jumps at 0.2 are what the commit did there,
    # BENCHMARKS.md "Session 11"); the site the jump leads to is shown there at this gate too
    min_confidence_jump: float = 0.2
    # The denoiser checks each proposal before it is shown (it can veto; its probability of the edit is
    # mixed into the confidence). Off: that probability did not tell right proposals from wrong ones on
    # the valid split (median 0.041 against 0.033), the mix was neutral at equal shown share, and it
    # costs a model run per request; the gate's figures are for the calibrated confidence alone.
    check_with_model: bool = False
    checked: int = 2  # proposals the denoiser checks per request, best first
    veto: float = 0.0  # a proposal whose edit the model gives less than this probability is never shown
    deadline_ms: int = 300  # the model's check answers this long after the request, or the proposal is dropped
    max_patterns: int = 32  # patterns remembered (newest kept)
    max_edit_lines: int = 20  # an edit of more lines (a paste, a reformat) is not a pattern
    max_scan_lines: int = 2000  # candidate lines per pattern looked at, nearest the cursor first
    max_proposals: int = 8  # ranked sites kept per request
    git_commits: int = 300  # commits of the root's git history mined for support (0: none)
    jump_lines: int = 8  # a proposal farther than this from the cursor carries a "jump to" hint
    # Files looked at (the other open documents, then the indexed files nearest the document's
    # folder) for a jump to another file when this document has no proposal; 0: never.
    other_files: int = 500
    # Without a proposal, the model's wide rewrite of the region answers. Off: on the valid split
    # every one of its proposals deleted lines the commit keeps, none was exact (BENCHMARKS.md "Next edits").
    model_fallback: bool = False


@dataclass
class Options:
    context: ContextOptions = field(default_factory=ContextOptions)
    history: HistoryOptions = field(default_factory=HistoryOptions)
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    sampler: dict[str, Any] = field(default_factory=dict)  # SamplerParams overrides
    index: IndexOptions = field(default_factory=IndexOptions)
    next_edits: NextEditOptions = field(default_factory=NextEditOptions)
    # Deadline and confidence gate (lsp.gate; README "Protocol"). minConfidence is chosen by
    # `dlm-lsp eval` on the embedded model (BENCHMARKS.md "Acceptance through the server").
    deadline_ms: int = DEFAULT_DEADLINE_MS  # answer this long after the keystroke, or not at all
    # Show a suggestion only at this confidence or above. 0.5: through the server, on 400 held-out
    # lines each of xarray, astropy, django and sympy, the repository memory's proposals checked by
    # the denoiser show 39.3% of the lines at 69.5% precision from 0.5, and each repository >= 25% at
    # >= 60% (sympy, the weakest: 31.5% at 61.1%); 0.5 is the lowest threshold where every one of the
    # four meets that (BENCHMARKS.md "Repository memory through the server"). Without an index the
    # model alone showed nothing at 0.3 already (xarray, 150 lines).
    min_confidence: float = 0.5
    min_confidence_rewrite_recent: float = 0.98  # ... and this for one deleting/rewriting recent typing
    recent_edit_s: float = 5.0  # "recent" typing: lines changed this many seconds ago or less
    # Answer dlm/editPrediction (edits away from the cursor): on since the default gate
    # (nextEdits.minConfidence) met issue 24's Targets on the development data (README "Next
    # edits"). The proposals come from the edit memory; the model's own rewrite stays off.
    edit_predictions: bool = True
    max_syntax_chars: int = 2_000_000  # larger documents are plain text (no tree-sitter)
    max_document_chars: int = 50_000_000  # larger documents are refused with a log line
    status_interval_s: float = 2.0  # at most one dlm/status with new latencies per interval


# The range of every numeric option (lsp.options' own; the sampler's are coder_model.limits'), checked
# by coder_model.limits.check like every other option and request parameter. Keyed by the dotted
# snake_case name; README "Limits" lists them. An upper bound is where a larger value only
# breaks things: a 1e300 ms throttle stalls every request, a 1e300 ms timeout never gives up.
OPTION_CAPS: dict[str, Cap] = {
    "context.prefix_tokens": Cap("int", 0, 65_536),
    "context.suffix_tokens": Cap("int", 0, 65_536),
    "context.typing_region_tokens": Cap("int", 1, 4096),
    "context.typing_region_lines": Cap("int", 1, 200),
    "context.wide_region_lines_before": Cap("int", 0, 200),
    "context.wide_region_lines_after": Cap("int", 0, 200),
    "context.wide_region_tokens": Cap("int", 1, 4096),
    "context.idle_ms": Cap("int", 0, 60_000),
    "context.max_line_chars": Cap("int", 1, 1_000_000),
    "context.window_fill": Cap("float", 0.1, 1.0),
    "history.max_events": Cap("int", 0, 64),
    "history.max_tokens": Cap("int", 0, 65_536),
    "history.gap_lines": Cap("int", 0, 10_000),
    "history.idle_s": Cap("float", 0.0, 3600.0),
    "scheduler.throttle_ms": Cap("int", 0, 2000),
    "scheduler.timeout_ms": Cap("int", 100, 600_000),
    "scheduler.type_through": Cap("bool"),
    "index.enabled": Cap("bool"),
    "index.max_files": Cap("int", 0, 10_000_000),
    "index.max_file_bytes": Cap("int", 0, 100_000_000),
    "index.max_tokens": Cap("int", 0, 1_000_000_000),
    "index.rescan_s": Cap("float", 0.0, 86_400.0),
    "index.exclude": Cap("strings", high=10_000),
    "next_edits.enabled": Cap("bool"),
    "next_edits.min_confidence": Cap("float", 0.0, 1.0),
    "next_edits.min_confidence_jump": Cap("float", 0.0, 1.0),
    "next_edits.check_with_model": Cap("bool"),
    "next_edits.checked": Cap("int", 1, 16),
    "next_edits.veto": Cap("float", 0.0, 1.0),
    "next_edits.deadline_ms": Cap("int", 1, 10_000),
    "next_edits.max_patterns": Cap("int", 1, 1024),
    "next_edits.max_edit_lines": Cap("int", 1, 200),
    "next_edits.max_scan_lines": Cap("int", 1, 100_000),
    "next_edits.max_proposals": Cap("int", 1, 100),
    "next_edits.git_commits": Cap("int", 0, 10_000),
    "next_edits.jump_lines": Cap("int", 0, 10_000),
    "next_edits.other_files": Cap("int", 0, 100_000),
    "next_edits.model_fallback": Cap("bool"),
    "deadline_ms": Cap("int", 1, int(REQUEST_CAPS["deadline_ms"].high)),
    "min_confidence": Cap("float", 0.0, 1.0),
    "min_confidence_rewrite_recent": Cap("float", 0.0, 1.0),
    "recent_edit_s": Cap("float", 0.0, 3600.0),
    "edit_predictions": Cap("bool"),
    "max_syntax_chars": Cap("int", 0, 1_000_000_000),
    "max_document_chars": Cap("int", 1, 1_000_000_000),
    "status_interval_s": Cap("float", 0.0, 3600.0),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _fill(obj: Any, data: dict, where: str, problems: list[str]) -> None:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in data.items():
        name = _snake(str(key))
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
