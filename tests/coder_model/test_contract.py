"""The contract between the editor side (dlm.lsp) and the model side (dlm.coder_model).

What the model sees must not depend on the way it is served: (a) a remote engine
takes its context budget from the server, so local and remote give the same token
layout; (b) serving renders edit history byte-for-byte as training does; (c) every
language the server detects has one name, from coder_model.languages.
"""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import sys

import pytest
from dlm.coder_model import languages
from dlm.coder_model.edit_history import render_event
from dlm.coder_model.types import CancelToken, LayoutBudget, Prompt, SamplerParams
from dlm.lsp import context, syntax, zed_prompts
from dlm.lsp.documents import Document
from dlm.lsp.history import History, HistoryOptions
from dlm.lsp.options import ContextOptions

# ---- (a) local and remote: the same budget, the same token layout ---------------------------------

LONG_PROMPT = Prompt(
    prefix="".join(f"value_{i} = compute({i}, 'padding text')\n" for i in range(300)),
    region="    return a + b",
    cursor=10,
    suffix="".join(f"print(value_{i})\n" for i in range(300)),
    # more history than either budget holds, so the budget decides what is kept
    history=tuple(render_event("m.py", i, [f"x_{i} = 1\n"], [f"x_{i} = 2\n"]) for i in range(60)),
    language="python",
    path="m.py",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def loopback_serve(tiny_checkpoint):
    """`dlm-lsp serve` of the tiny checkpoint on loopback, as a user starts it; yields the port."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", f"127.0.0.1:{port}",
         "--model", tiny_checkpoint, "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_remote_engine_gets_the_local_budget_and_layout(tiny_checkpoint, tiny_model, loopback_serve):
    from dlm.coder_model.engine import LocalEngine
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.remote.client import RemoteEngine

    model, tok = tiny_model
    local = LocalEngine(model, tok, device="cpu")
    remote = RemoteEngine("127.0.0.1", loopback_serve, connect_timeout=5.0, backoff_max=0.5)
    try:
        assert remote.wait_connected(180), remote.status().message
        # the tiny model's window, not the layout's 2,048-token default
        assert local.budget == LayoutBudget.for_window(model.config.context_window) != LayoutBudget()
        assert remote.budget == local.budget
        local_ids = encode_prompt(tok, LONG_PROMPT, local.budget)
        assert encode_prompt(tok, LONG_PROMPT, remote.budget) == local_ids
        assert local_ids != encode_prompt(tok, LONG_PROMPT, LayoutBudget())  # the budget decides the layout
        # and the server really encodes with it: the same context length comes back
        params = SamplerParams(steps=4, block_len=8, max_blocks=1)
        pred_remote = remote.predict(LONG_PROMPT, params, CancelToken())
        pred_local = local.predict(LONG_PROMPT, params, CancelToken())
        assert not pred_remote.cancelled, remote.status().message
        assert pred_remote.context_tokens == pred_local.context_tokens == len(local_ids)
    finally:
        remote.close()
        local.close()


def test_a_server_without_a_budget_in_hello_gets_the_default_and_a_warning(caplog):
    from dlm.coder_model.remote.client import budget_from_hello

    with caplog.at_level(logging.WARNING, logger="dlm.remote.client"):
        assert budget_from_hello({"t": "hello"}, "gpu:7341") == LayoutBudget()
    assert "Upgrade dlm-lsp on the server" in caplog.text
    assert budget_from_hello(
        {"budget": {"max_context": 256, "max_history": 85, "max_suffix": 64}}, "gpu:7341"
    ) == LayoutBudget(256, 85, 64)


@pytest.mark.parametrize("bad", [
    [256, 85, 64], {"max_context": 256}, {"max_context": "256", "max_history": 85, "max_suffix": 64},
    {"max_context": 0, "max_history": 0, "max_suffix": 0}, {"max_context": 256, "max_history": -1, "max_suffix": 64},
])  # fmt: skip
def test_a_malformed_budget_in_hello_refuses_the_session(bad):
    from dlm.coder_model.remote.client import RemoteRefused, budget_from_hello

    with pytest.raises(RemoteRefused, match="malformed budget"):
        budget_from_hello({"budget": bad}, "gpu:7341")


# ---- (b) edit history: serving == the renderer == training ----------------------------------------

BEFORE = "def f(a):\n    b = a\n    return b\n\n\nprint(f(1))\n"


def _served_event() -> str:
    """The event lsp.history renders when line 1 becomes two lines, after a pause."""
    doc = Document("file:///proj/m.py", BEFORE, 1, "python")
    doc.history = History("m.py", HistoryOptions(idle_s=1000))
    doc.apply((1, 4), (1, 9), "b = a + 1\n    c = b", 2)
    doc.history.close_if_idle(0, doc.lines, cursor_line=100)  # a jump closes the event
    events = doc.history.rendered()
    assert len(events) == 1, events
    return events[0]


def test_served_history_is_the_shared_renderer():
    served = _served_event()
    assert served == render_event("m.py", 1, ["    b = a\n"], ["    b = a + 1\n", "    c = b\n"])
    assert served == "--- a/m.py\n+++ b/m.py\n@@ -2 +2,2 @@\n-    b = a\n+    b = a + 1\n+    c = b\n"


def test_served_history_is_what_training_renders_for_the_same_hunk():
    from dlm.coder_model.training.hunks import Hunk, build_next_edit

    hunks = [Hunk(1, 1, ("    b = a + 1\n", "    c = b\n")), Hunk(5, 1, ("print(f(2))\n",))]
    built = build_next_edit(BEFORE, hunks, [0, 1], 1, random.Random(0), "m.py", "contract")
    assert built is not None
    assert built.example.prompt.history == (_served_event(),)


def test_zed_edit_events_are_rendered_as_training_renders_them():
    # Zed sends its diffs with context lines; the model gets the -U0 event
    zed = "User edited m.py:\n```diff\n@@ -1,3 +1,4 @@\n def f(a):\n-    b = a\n+    b = a + 1\n+    c = b\n     return b\n```"
    assert zed_prompts.parse_zeta_events(zed) == (_served_event(),)


# ---- (c) one language name per file --------------------------------------------------------------


def _names_for(ext: str) -> set[str]:
    """Every name the serving side gives a file with this extension (no languageId)."""
    path = f"src/file{ext}"
    doc = Document(f"file:///{path}", "x = 1\n", 1, "")
    built = context.build(doc, 0, 0, "typing", ContextOptions(), path)
    zp = zed_prompts.ZedPrompt(format="qwen", text="x = 1\n", cursor=0, editable=(0, 6), path=path)
    return {
        languages.language_for_path(path),
        languages.language_name("", f"file:///{path}"),
        built.prompt.language,  # the LSP
        zed_prompts.build_prompt(zp).prompt.language,  # the Zed endpoint
    }


@pytest.mark.parametrize("ext", sorted(languages.EXTENSIONS))
def test_every_extension_has_one_name_on_every_path(ext):
    names = _names_for(ext)
    assert len(names) == 1 and names <= languages.NAMES, names
    assert _names_for(ext.upper()) == names  # case does not matter


def test_tsx_and_jsx_are_the_react_variants_everywhere():
    assert _names_for(".tsx") == {"typescriptreact"} and _names_for(".jsx") == {"javascriptreact"}


def test_every_grammar_is_keyed_by_a_shared_name_and_reachable():
    assert syntax.GRAMMARS  # the server parses something
    for name in syntax.GRAMMARS:
        assert name in languages.NAMES, f"{name} is not a name of coder_model.languages"
        assert languages.language_name(name) == name
        exts = [e for e, n in languages.EXTENSIONS.items() if n == name]
        assert exts, f"no extension maps to {name}"


def test_language_ids_and_aliases_map_to_shared_names():
    assert languages.ALIASES
    for alias, name in languages.ALIASES.items():
        assert name in languages.NAMES and languages.language_name(alias) == name
    # a languageId wins over the extension (an editor knows better), unknown ones fall back to it
    assert languages.language_name("typescriptreact", "a.ts") == "typescriptreact"
    assert languages.language_name("", "a.tsx") == "typescriptreact"
    doc = Document("file:///a.tsx", "x\n", 1, "tsx")
    assert context.build(doc, 0, 0, "typing", ContextOptions(), "a.tsx").prompt.language == "typescriptreact"


def test_the_grammar_follows_the_shared_name():
    pytest.importorskip("tree_sitter_typescript")
    a = syntax.language_for("", "file:///a.tsx")
    b = syntax.language_for("typescriptreact", "file:///a")
    assert a is not None and a == b
    assert syntax.language_for("", "file:///a.ts") != a  # .ts is not TSX
