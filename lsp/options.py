"""Server options: defaulted dataclasses filled from LSP `initializationOptions`.

Clients send a JSON object, e.g. `{"context": {"prefixTokens": 512},
"sampler": {"steps": 16}, "throttleMs": 20}`; keys may be camelCase or
snake_case. Unknown keys and values of the wrong type are reported (the
server logs them and shows one warning) and the defaults are kept, so a typo
never stops the server.

Token budgets use a characters-per-token estimate (3.5 for code) instead of
the model tokenizer: the windows are cut at line boundaries anyway, the
estimate costs nothing per keystroke, and the server does not need the
tokenizer before the model has loaded. The model side truncates exactly if
an estimate ever overshoots.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from dlm.lsp.history import HistoryOptions


@dataclass
class ContextOptions:
    prefix_tokens: int = 1024
    suffix_tokens: int = 256
    typing_region_tokens: int = 48  # cursor line + rest of its statement, while typing
    typing_region_lines: int = 4
    wide_region_lines_before: int = 2  # after a pause or a jump: a few lines around the cursor
    wide_region_lines_after: int = 4
    wide_region_tokens: int = 160
    idle_ms: int = 300  # a pause this long switches to the wide region
    max_line_chars: int = 2000  # longer cursor lines (minified code) get no suggestion
    window_fill: float = 0.75  # a re-anchored window starts this full, leaving room to grow
    chars_per_token: float = 3.5


@dataclass
class SchedulerOptions:
    throttle_ms: int = 20  # leading edge: at least this long between model runs of one document
    timeout_ms: int = 10_000  # give up waiting for a prediction (the engine is stuck)
    prefix_cache: bool = True


@dataclass
class IndexOptions:
    """The workspace index (lsp.workspace; README "Repository memory")."""

    enabled: bool = True
    max_files: int = 50_000  # source files per workspace root; the walk stops there
    max_file_bytes: int = 1_000_000  # larger files are skipped (minified bundles, generated code)
    max_tokens: int = 20_000_000  # tokens per root (RepoMemory's cap)
    rescan_s: float = 60.0  # mtime rescan interval when the client does not watch files (0: never)
    exclude: list[str] = field(default_factory=list)  # more .gitignore-style patterns to leave out


@dataclass
class Options:
    context: ContextOptions = field(default_factory=ContextOptions)
    history: HistoryOptions = field(default_factory=HistoryOptions)
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    sampler: dict[str, Any] = field(default_factory=dict)  # SamplerParams overrides
    index: IndexOptions = field(default_factory=IndexOptions)
    # Deadline and confidence gate (lsp.gate; README "Protocol"). minConfidence is chosen by
    # `dlm-lsp eval` on the embedded model (BENCHMARKS.md "Acceptance through the server").
    deadline_ms: int = 250  # answer this long after the keystroke, or not at all
    # Show a suggestion only at this calibrated confidence or above. 0.6: with a calibrated
    # P(right) it is the lowest threshold whose shown suggestions are >= 60% right; measured on the
    # embedded model (BENCHMARKS.md), every threshold >= 0.5 shows nothing and so nothing wrong.
    min_confidence: float = 0.6
    min_confidence_rewrite_recent: float = 0.98  # ... and this for one deleting/rewriting recent typing
    recent_edit_s: float = 5.0  # "recent" typing: lines changed this many seconds ago or less
    edit_predictions: bool = False  # answer dlm/editPrediction (edits away from the cursor)
    max_syntax_chars: int = 2_000_000  # larger documents are plain text (no tree-sitter)
    max_document_chars: int = 50_000_000  # larger documents are refused with a log line
    status_interval_s: float = 2.0  # at most one dlm/status with new latencies per interval


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
                problems.append(f"option {where}{name} must be an object, got {value!r}")
        elif isinstance(current, dict):
            if isinstance(value, dict):
                current.update({_snake(str(k)): v for k, v in value.items()})
            else:
                problems.append(f"option {where}{name} must be an object, got {value!r}")
        elif isinstance(current, bool):
            if isinstance(value, bool):
                setattr(obj, name, value)
            else:
                problems.append(f"option {where}{name} must be true or false, got {value!r}")
        elif isinstance(current, (int, float)):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                setattr(obj, name, type(current)(value))
            else:
                problems.append(f"option {where}{name} must be a number >= 0, got {value!r}")
        else:
            setattr(obj, name, value)


def parse_options(data: Any) -> tuple[Options, list[str]]:
    """Options from initializationOptions, and a list of problems (empty when all is well)."""
    opts = Options()
    problems: list[str] = []
    if data is None:
        return opts, problems
    if not isinstance(data, dict):
        return opts, [f"initializationOptions must be an object, got {type(data).__name__}; using defaults"]
    _fill(opts, data, "", problems)
    for name in ("min_confidence", "min_confidence_rewrite_recent"):
        if getattr(opts, name) > 1:
            problems.append(f"option {name} must be a confidence in [0, 1], got {getattr(opts, name)}; "
                            f"using {getattr(Options, name)}")
            setattr(opts, name, getattr(Options, name))
    if not (isinstance(opts.index.exclude, list) and all(isinstance(p, str) for p in opts.index.exclude)):
        problems.append(f"option index.exclude must be a list of .gitignore patterns (strings), "
                        f"got {opts.index.exclude!r}; using []")  # fmt: skip
        opts.index.exclude = []
    if opts.deadline_ms < 1:
        problems.append(f"option deadline_ms must be at least 1 ms, got {opts.deadline_ms}; using {Options.deadline_ms}")
        opts.deadline_ms = Options.deadline_ms
    return opts, problems
