"""Options, counters, folders and exit codes under a hostile client: the LSP cases of the abuse test, each
driven against the real server as a subprocess over raw stdio frames."""

from __future__ import annotations

import time

import pytest
from dlm.lsp.options import parse_options
from test_hardening_lsp import RawServer, frame

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def server():
    s = RawServer()
    yield s
    s.close()


def _init(server: RawServer, options=None, capabilities=None, folders=None) -> dict:
    res = server.call("initialize", {
        "processId": None, "rootUri": None, "capabilities": capabilities or {},
        "initializationOptions": options or {}, "workspaceFolders": folders,
    })  # fmt: skip
    server.notify("initialized", {})
    return res


def _ready(server: RawServer) -> dict:
    for _ in range(200):
        stats = server.call("dlm/stats", {})["result"]
        if stats["state"] == "ready":
            return stats
        time.sleep(0.05)
    raise AssertionError("the fake engine never became ready")


# ---- an infinite or NaN option is refused with a log line; initialize succeeds ----------------------


@pytest.mark.parametrize("options", [
    {"deadlineMs": float("inf")},  # what JSON's 1e400 parses to
    {"scheduler": {"timeoutMs": float("inf")}},
    {"context": {"prefixTokens": float("-inf")}},
    {"minConfidence": float("nan")},
])  # fmt: skip
def test_an_infinite_option_is_logged_and_the_default_kept(server, options):
    res = _init(server, options)
    assert "error" not in res, res
    _ready(server)
    server.open("file:///inf.py", "x = \n")
    assert server.inline("file:///inf.py", 0, 4)["result"]["items"][0]["insertText"] == "FAKE"


def test_1e400_in_the_json_text_is_refused_like_infinity(server):
    body = (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": null, '
            b'"capabilities": {}, "initializationOptions": {"deadlineMs": 1e400, "throttleMs": Infinity}}}')
    server.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    res = server.reply(1)
    assert "error" not in res, res


# ---- out-of-range options, the throttle at its edge too, are logged and defaulted -------------------


def test_a_block_over_the_remote_cap_is_refused_as_an_option():
    opts, problems = parse_options({"sampler": {"blockLen": 4096, "threshold": 0.5}})
    assert opts.sampler == {"threshold": 0.5}
    assert any("block_len" in p and "1024" in p for p in problems)


@pytest.mark.parametrize("options,where", [
    ({"scheduler": {"throttleMs": 1e300}}, "throttle_ms"),
    ({"sampler": {"steps": True}}, "steps"),
    ({"sampler": {"blockLen": 1024, "maxBlocks": 3, "steps": 4096}}, "slot-steps"),
    ({"editPredictions": 1}, "edit_predictions"),
])  # fmt: skip
def test_out_of_range_options_keep_their_defaults(options, where):
    opts, problems = parse_options(options)
    assert any(where in p for p in problems), problems
    assert opts.scheduler.throttle_ms == 20 and opts.sampler == {} and opts.edit_predictions is True


def test_a_huge_throttle_does_not_stall_requests(server):
    _init(server, {"scheduler": {"throttleMs": 1e300, "timeoutMs": 2000}})
    _ready(server)
    server.open("file:///t.py", "x = \n")
    t0 = time.monotonic()
    for i in range(3):  # an unchecked throttle would make each run wait it out (then the 2 s timeout)
        server.change("file:///t.py", 2 + i, (0, 4 + i), (0, 4 + i), "a")
        assert server.inline("file:///t.py", 0, 5 + i)["result"]["items"]
    assert time.monotonic() - t0 < 5.9


# ---- counters count only what was issued --------------------------------------------------------


def test_accept_and_shown_count_only_issued_ids(server):
    _init(server, {"minConfidence": 0})
    _ready(server)
    server.open("file:///acc.py", "v = \n")
    item = server.inline("file:///acc.py", 0, 4)["result"]["items"][0]
    bogus = [[], [None], ["no-such-id"], [12345]]
    for args in bogus:
        server.call("workspace/executeCommand", {"command": "dlm.acceptCompletion", "arguments": args})
    server.notify("textDocument/didShowInlineEdit", {})
    server.notify("textDocument/didShowInlineEdit", {"item": {"command": {"arguments": ["nope"]}}})
    server.notify("textDocument/didShowCompletion", {"item": {"insertText": "x"}})
    server.notify("textDocument/didPartiallyAcceptCompletion", {"item": {}, "acceptedLength": 1})
    stats = server.call("dlm/stats", {})["result"]
    assert (stats["accepted"], stats["shown"], stats["partially_accepted"]) == (0, 0, 0)
    # the real item counts, once
    for _ in range(2):
        server.notify("textDocument/didShowCompletion", {"item": item})
        server.notify("textDocument/didPartiallyAcceptCompletion", {"item": item, "acceptedLength": 1})
        server.call("workspace/executeCommand", item["command"])
    stats = server.call("dlm/stats", {})["result"]
    assert (stats["accepted"], stats["shown"], stats["partially_accepted"]) == (1, 1, 1)


# ---- workspace folders are deduplicated ---------------------------------------------------------


def test_the_same_workspace_folder_added_many_times_is_kept_once(server):
    folder = {"uri": "file:///work/proj", "name": "proj"}
    _init(server, folders=[folder, folder])
    _ready(server)
    for _ in range(5):
        server.notify("workspace/didChangeWorkspaceFolders",
                      {"event": {"added": [folder] * 1000, "removed": []}})
    assert server.call("dlm/stats", {})["result"]["workspace_folders"] == 1
    server.notify("workspace/didChangeWorkspaceFolders", {"event": {"added": [], "removed": [folder]}})
    assert server.call("dlm/stats", {})["result"]["workspace_folders"] == 0


# ---- exit codes and the position encoding --------------------------------------------------------


def test_exit_without_shutdown_exits_1(server):
    _init(server)
    server.notify("exit", None)
    assert server.proc.wait(timeout=30) == 1


def test_exit_after_shutdown_exits_0(server):
    _init(server)
    server.call("shutdown", None)
    server.notify("exit", None)
    assert server.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("offered,chosen", [
    (["utf-8", "utf-32"], "utf-8"),
    (["utf-32", "utf-8"], "utf-32"),
    (["utf-16", "utf-32"], "utf-16"),
    (["latin-1", "utf-32", "utf-8"], "utf-32"),
    ([], "utf-16"),
])  # fmt: skip
def test_the_position_encoding_is_the_clients_first_supported_choice(server, offered, chosen):
    res = _init(server, capabilities={"general": {"positionEncodings": offered}})
    assert res["result"]["capabilities"]["positionEncoding"] == chosen


def test_choose_encoding_is_the_clients_first_supported_choice():
    from dlm.lsp.positions import choose_encoding

    assert choose_encoding(["utf-8", "utf-32"]) == "utf-8"
    assert choose_encoding(["utf-16", "utf-8"]) == "utf-16"
    assert choose_encoding(["ucs-2", "utf-32"]) == "utf-32"
    assert choose_encoding(None) == "utf-16"


# ---- bounded fields: a 1 MB uri or language id is cut before it reaches the model ------------------------


def test_a_megabyte_path_and_language_are_bounded():
    server = RawServer(DLM_ENGINE_FACTORY="fake_engine:field_sizes")
    try:
        _init(server, {"minConfidence": 0}, folders=[{"uri": "file:///d", "name": "d"}])
        _ready(server)
        uri = "file:///d/" + "d/" * 500_000 + "long.xyz"  # a path relative to the folder, 1 MB long
        server.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
            "textDocument": {"uri": uri, "languageId": "x" * 1_000_000, "version": 1, "text": "x = \n"}}}))
        text = server.inline(uri, 0, 4)["result"]["items"][0]["insertText"]
        path_chars, language_chars = map(int, text[1:].split("L"))
        assert 0 < path_chars <= 512 and language_chars <= 64, text
    finally:
        server.close()


# ---- docs/configuration.md states the caps the code applies: it is rendered from them -----------------


def test_the_configuration_page_is_rendered_from_the_caps():
    """docs/configuration.md is lsp.option_docs' rendering of the option declarations, and the
    rendering names every cap: each option's range and default, the sampler's, the requests'."""
    import json
    from pathlib import Path

    from dlm.coder_model import limits
    from dlm.coder_model.types import SamplerParams
    from dlm.lsp import option_docs
    from dlm.lsp.options import OPTION_CAPS, Options

    page = Path(__file__).resolve().parents[2].joinpath("docs", "configuration.md").read_text()
    rendered = option_docs.configuration_markdown()
    assert page == rendered, f"docs/configuration.md differs from the declarations: {option_docs.COMMAND}"

    camel = option_docs.camel
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in rendered.splitlines() if line.startswith("| `")}
    options, sampler = Options(), SamplerParams()
    for name, cap in OPTION_CAPS.items():
        value = options
        for part in name.split("."):
            value = getattr(value, part)
        assert cells.get(f"`{camel(name)}`", [])[:2] == [f"`{json.dumps(value)}`", cap.describe()], name
    for name, cap in limits.SAMPLER_CAPS.items():
        default = f"`{json.dumps(getattr(sampler, name))}`"
        assert cells.get(f"`sampler.{camel(name)}`", [])[:2] == [default, cap.describe()], name
        assert cells.get(f"`{name}` (`sampler.{camel(name)}`)") == ["all three", cap.describe(), default]
    section = " ".join(rendered.split("## Limits", 1)[1].split("\n## ", 1)[0].split())  # unwrapped
    assert cells.get("`max_tokens`", [])[1:2] == [limits.REQUEST_CAPS["max_tokens"].describe()]
    remote_deadline = cells["`deadline_ms` (remote: the time a request has left)"][1]
    assert remote_deadline.endswith(f"{int(limits.REQUEST_CAPS['deadline_ms'].high):,}]")
    assert cells["`--deadline-ms`"][1] == OPTION_CAPS["deadline_ms"].describe()
    assert f"{limits.MAX_REQUEST_SLOT_STEPS:,} slot-steps" in section
    for value in (limits.MAX_PATH_CHARS, limits.MAX_LANGUAGE_CHARS, limits.MAX_HISTORY_EVENTS):
        assert f" {value} " in section
    assert f"{limits.MAX_HISTORY_EVENT_CHARS:,} characters" in section


def test_a_request_the_model_refuses_is_one_warning_not_a_traceback_per_keystroke():
    """A sampler the model cannot take costs each keystroke its suggestion and the editor one
    warning, never an error traceback per keystroke."""
    server = RawServer(DLM_ENGINE_FACTORY="fake_engine:refusing")
    try:
        _init(server)
        _ready(server)
        server.open("file:///r.py", "x = \n")
        for i in range(3):
            res = server.inline("file:///r.py", 0, 4)
            assert "error" not in res and res["result"]["items"] == []
        stats = server.call("dlm/stats", {})["result"]
        assert stats["refused"] == 3 and stats["failed"] == 0
        logs = [m["params"] for m in server.seen if m.get("method") == "window/logMessage"]
        refusals = [p for p in logs if "refused" in p["message"]]
        assert len(refusals) == 1 and refusals[0]["type"] == 2  # one Warning
        assert not [p for p in logs if "Traceback" in p["message"]]
    finally:
        server.close()


def test_every_option_has_a_range():
    """A new option is declared with its range (coder_model.caps.option), which puts it in OPTION_CAPS:
    without one the server reports that it cannot be set, and the configuration page misses it."""
    import dataclasses

    from dlm.lsp.options import OPTION_CAPS, Options

    def leaves(obj, where=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                yield from leaves(value, f"{where}{f.name}.")
            elif f.name != "sampler":
                yield where + f.name

    assert sorted(leaves(Options())) == sorted(OPTION_CAPS)


def test_every_sampler_parameter_has_a_cap():
    """A new SamplerParams field is declared with its cap (coder_model.caps.option), which puts it in
    coder_model.limits.SAMPLER_CAPS and on the configuration page: the three doors refuse a
    parameter they have no cap for."""
    import dataclasses

    from dlm.coder_model.limits import SAMPLER_CAPS
    from dlm.coder_model.types import SamplerParams

    assert sorted(SAMPLER_CAPS) == sorted(f.name for f in dataclasses.fields(SamplerParams))
