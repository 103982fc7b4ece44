"""docs/configuration.md, rendered from the option declarations.

Every option is one dataclass field declared with coder_model.caps.option (its default, its range
and its meaning): lsp.options' groups, coder_model.regions.RegionBudget
and coder_model.types.SamplerParams. The request limits are coder_model.limits' constants. The
page is this module's output, so it says what the code does:

    .venv/bin/python -m dlm.lsp.option_docs > docs/configuration.md

tests/lsp/test_hardening_limits.py fails while the page and the rendering differ.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import textwrap
from typing import Any

from dlm.coder_model import limits
from dlm.coder_model.caps import Cap, format_bound
from dlm.coder_model.types import SamplerParams
from dlm.lsp.options import OPTION_CAPS, Options

COMMAND = ".venv/bin/python -m dlm.lsp.option_docs > docs/configuration.md"
_WIDTH = 100  # the JSON example's lines


def camel(name: str) -> str:
    """A dotted snake_case option name as clients send it (lsp.options takes either spelling):
    next_edits.min_confidence -> nextEdits.minConfidence."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


@dataclasses.dataclass(frozen=True)
class Row:
    key: str  # the dotted snake_case name (OPTION_CAPS' key, or sampler.<SamplerParams field>)
    default: Any
    cap: Cap
    doc: str


def option_rows() -> list[Row]:
    """Every option of initializationOptions in declaration order, the sampler's parameters
    where Options declares the `sampler` group."""
    rows: list[Row] = []

    def walk(cls: type, instance: Any, where: str) -> None:
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if "cap" in f.metadata:
                rows.append(Row(where + f.name, value, f.metadata["cap"], f.metadata["doc"]))
            elif dataclasses.is_dataclass(value):
                walk(type(value), value, f"{where}{f.name}.")
            elif f.name == "sampler" and not where:
                walk(SamplerParams, SamplerParams(), "sampler.")
            else:  # every option declares its range (tests/lsp/test_hardening_limits.py)
                raise TypeError(f"option {where}{f.name} is declared without coder_model.caps.option")

    walk(Options, Options(), "")
    return rows


def _value(value: Any) -> str:
    return json.dumps(value)


def _pack(items: list[str], first: str, indent: str, last: str) -> list[str]:
    """`items` joined by ", " into lines of at most _WIDTH characters: the first line starts with
    `first`, the others with `indent`; `last` closes the last one."""
    lines: list[str] = []
    line = first
    for i, item in enumerate(items):
        text = item + (", " if i < len(items) - 1 else last)
        if len(line) + len(text.rstrip()) > _WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += text
    lines.append(line.rstrip())
    return lines


def defaults_json() -> str:
    """The whole initializationOptions object with its defaults (camelCase), wrapped."""
    groups: dict[str, list[str]] = {}
    top: list[str] = []
    for row in option_rows():
        group, _, name = row.key.rpartition(".")
        item = f'"{camel(name)}": {_value(row.default)}'
        if group:
            groups.setdefault(camel(group), []).append(item)
        else:
            top.append(item)
    lines: list[str] = []
    opened = False
    for group, items in groups.items():
        lines += _pack(items, ("{" if not opened else " ") + f'"{group}": {{', "  ", "},")
        opened = True
    lines += _pack(top, " ", " ", "}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A doc as a table cell: a special token (<eom>) as code, which markdown would take for HTML."""
    return re.sub(r"(<\w+>)", r"`\1`", text).replace("|", "\\|")


def options_table() -> str:
    lines = ["| option | default | accepted | meaning |", "|---|---|---|---|"]
    for row in option_rows():
        default = f"`{_value(row.default)}`"
        lines.append(f"| `{camel(row.key)}` | {default} | {row.cap.describe()} | {_cell(row.doc)} |")
    return "\n".join(lines)


def limits_table() -> str:
    defaults = SamplerParams()
    lines = ["| name | where | accepted | default |", "|---|---|---|---|"]
    for name, cap in limits.SAMPLER_CAPS.items():
        lines.append(f"| `{name}` (`sampler.{camel(name)}`) | all three | {cap.describe()} | "
                     f"`{_value(getattr(defaults, name))}` |")
    lines.append(f"| block_len x max_blocks x min(steps, block_len) | all three | at most "
                 f"{limits.MAX_REQUEST_SLOT_STEPS:,} slot-steps | {limits.request_slot_steps(defaults):,} |")
    deadline = limits.REQUEST_CAPS["deadline_ms"]
    lines.append(f"| `deadline_ms` (remote: the time a request has left) | remote | a number in "
                 f"({format_bound(deadline.low)}, {format_bound(deadline.high)}] | none |")
    lines.append(f"| `max_tokens` | HTTP | {limits.REQUEST_CAPS['max_tokens'].describe()} | none |")
    lines.append(f"| `--deadline-ms` | HTTP | {OPTION_CAPS['deadline_ms'].describe()} | "
                 f"`{limits.DEFAULT_DEADLINE_MS}` |")
    return "\n".join(lines)


def _para(text: str) -> str:
    """A paragraph written on any number of lines, wrapped to _WIDTH characters."""
    return textwrap.fill(" ".join(text.split()), _WIDTH, break_long_words=False, break_on_hyphens=False)


def configuration_markdown() -> str:
    """The text of docs/configuration.md."""
    bound_s = limits.MAX_REQUEST_DEADLINES * limits.DEFAULT_DEADLINE_MS / 1000
    blocks = [
        "# Configuration",
        _para(f"""This page is generated from the option declarations (`lsp/options.py`,
            `lsp/history.py`, `coder_model/regions.py`, `coder_model/types.py`,
            `coder_model/limits.py`): change those, then run `{COMMAND}`. A test fails while the
            page and the code differ."""),
        _para("""The language server takes its options from the editor's `initializationOptions`; the
            HTTP endpoint (`dlm-lsp http`) and the remote server (`dlm-lsp serve`) take the sampler's
            parameters per request. Every option, with its default, what it accepts and what it
            does, is in [Options](#options) below; the limits of every door are in
            [Limits](#limits). The editors' own settings (VS Code's `dlm.*`, the Neovim plugin's
            `setup()` options) are in [editors.md](editors.md)."""),
        "## initializationOptions",
        "All optional; camelCase or snake_case. The full object, with its defaults:",
        f"```json\n{defaults_json()}\n```",
        _para("""What the groups do: `index` is the workspace index of the
            [repository memory](repository-memory.md); `nextEdits` and `editPredictions` are the
            [next edits](next-edits.md); `deadlineMs`, `minConfidence`, `minConfidenceRewriteRecent`
            and `recentEditS` are the
            [deadline and confidence gate](protocol.md#deadline-and-confidence-gate);
            `sampler.repeatPenalty` and `sampler.endThreshold` are described under
            [degenerate answers](protocol.md#degenerate-answers) (0 turns either off)."""),
        _para("""Unknown keys and bad values (wrong type, not finite such as `1e400` or `NaN`, a
            boolean for a number, out of the ranges below) are logged and the defaults kept:
            `initialize` never fails for an option. The prefix, suffix and history windows are the
            model's: one budget (`coder_model/budget.py`) turns the model's context (the embedded
            model has 384 tokens; a remote server announces its own) into the text windows and
            token cuts that the server, `dlm-lsp http`, `predict`, the remote backend, the open
            families and training all use, so the model is served the layout it was trained on.
            `prefixTokens`/`suffixTokens` cap the windows below that (0: no cap), e.g. to trade
            context for latency on a large model."""),
        "## Options",
        _para("""The keys as clients send them (snake_case works too). `sampler.*` are the sampler's
            parameters, which requests to the other doors carry too ([Limits](#limits))."""),
        options_table(),
        "## Limits",
        _para("""Every option and request parameter goes through one validator (`check`, in
            `coder_model/caps.py`, applied by `coder_model/limits.py`), with the same caps at the
            three doors: the language server's `initializationOptions` (LSP), the HTTP endpoint's
            request bodies and options (HTTP), and the remote server's `predict` frames (remote).
            It refuses numbers that are not finite (JSON's `1e400` is infinity; `NaN`), booleans
            where a number is wanted (`true` is not 1), fractions where an integer is wanted,
            values out of range and unknown names. What a refusal does depends on the door: an
            **option** is logged and its default kept (a typo never stops a server, `initialize`
            never fails); a **request field** is refused with the cap named (HTTP 400; remote
            `bad_request` for that request only, the connection stays), since a silently changed
            knob would change the answer. Sampler parameters are snake_case over the wire and in
            `initializationOptions.sampler` either case. The language server's own options are
            checked the same way, against the ranges in [Options](#options)."""),
        limits_table(),
        _para(f"""The remote server also refuses a request heavier than the default one when, by its
            measured step time, the request would take longer than {limits.MAX_REQUEST_DEADLINES}
            default deadlines ({bound_s:g} s) or one of its steps longer than one
            ({limits.DEFAULT_DEADLINE_MS} ms; see
            ["One client cannot stall the others"](remote.md#one-client-cannot-stall-the-others)),
            and a `predict` frame carries at most {limits.MAX_PROPOSALS} memory proposals of at most
            {limits.MAX_PROPOSAL_CHARS:,} characters each. Text fields that are not the model's
            windows are cut before anything tokenizes them, at every door: the path keeps its last
            {limits.MAX_PATH_CHARS} characters (the file name), the language id its first
            {limits.MAX_LANGUAGE_CHARS}, the history its newest {limits.MAX_HISTORY_EVENTS} events of
            at most {limits.MAX_HISTORY_EVENT_CHARS:,} characters each (an uncut 1 MB path would cost
            ~800 ms and ~90 MB to tokenize). The windows themselves (prefix, region, suffix) are
            fitted to the model's context budget."""),
    ]
    return "\n\n".join(blocks) + "\n"


def main() -> int:
    sys.stdout.write(configuration_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
