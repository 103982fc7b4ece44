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
from dataclasses import replace

import pytest
from dlm.coder_model import languages
from dlm.coder_model.edit_history import render_event
from dlm.coder_model.types import CancelToken, LayoutBudget, Prompt, SamplerParams
from dlm.lsp import context, syntax, zed_prompts
from dlm.lsp.documents import Document
from dlm.lsp.history import History
from dlm.lsp.options import ContextOptions, HistoryOptions

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
        # the tiny model's window, announced in hello
        assert local.budget == LayoutBudget.for_window(model.config.context_window)
        assert remote.budget == local.budget
        local_ids = encode_prompt(tok, LONG_PROMPT, local.budget)
        assert encode_prompt(tok, LONG_PROMPT, remote.budget) == local_ids
        assert local_ids != encode_prompt(tok, LONG_PROMPT, LayoutBudget.for_window(256))  # the budget decides
        # and the server really encodes with it: the same context length comes back
        params = SamplerParams(steps=4, block_len=8, max_blocks=1)
        pred_remote = remote.predict(LONG_PROMPT, params, CancelToken())
        pred_local = local.predict(LONG_PROMPT, params, CancelToken())
        assert not pred_remote.cancelled, remote.status().message
        assert pred_remote.context_tokens == pred_local.context_tokens == len(local_ids)
    finally:
        remote.close()
        local.close()


def test_the_default_budget_is_the_training_proportions_of_2048_tokens():
    # a client that learns no budget must size its windows as training would have
    assert LayoutBudget() == LayoutBudget.for_window(2048)


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
    from dlm.drivers.training.hunks import Hunk, build_next_edit

    hunks = [Hunk(1, 1, ("    b = a + 1\n", "    c = b\n")), Hunk(5, 1, ("print(f(2))\n",))]
    built = build_next_edit(BEFORE, hunks, [0, 1], 1, random.Random(0), "m.py", "contract")
    assert built is not None
    assert built.example.prompt.history == (_served_event(),)


def test_zed_edit_events_are_rendered_as_training_renders_them():
    # Zed sends its diffs with context lines; the model gets the -U0 event
    zed = "User edited m.py:\n```diff\n@@ -1,3 +1,4 @@\n def f(a):\n-    b = a\n+    b = a + 1\n+    c = b\n     return b\n```"
    assert zed_prompts.parse_zeta_events(zed) == (_served_event(),)


# ---- (d) the server's prompt fills the layout that training fills --------------------------------

WINDOWS = context.windows_for(LayoutBudget(), ContextOptions())
# typing: an insertion prompt, whose region ends in a second <cursor> (no <rewrite> section)
SECTIONS = ("<history>", "<prefix>", "<suffix>", "<region>")


def _section_tokens(tok, ids: list[int]) -> dict[str, int]:
    """Tokens of each layout section (markers excluded), in order of appearance."""
    names = {tok.special[s]: s for s in SECTIONS}
    out: dict[str, int] = {}
    current = None
    for i in ids:
        if i in names:
            current = names[i]
            out[current] = 0
        elif current is not None and i != tok.special["<cursor>"]:
            out[current] += 1
    return out


@pytest.mark.parametrize("source", ["lsp/server.py", "coder_model/sampler.py"])
def test_server_and_training_fill_the_same_layout(source):
    """The same file and cursor, through the server's context builder and through training's
    example builder (with the trainer's windows), encoded for the embedded model's budget: the
    same sections, each filled to the same budget within the layout's 32-token cut quantum."""
    from pathlib import Path

    from dlm.coder_model.budget import plan
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir, read_config
    from dlm.coder_model.layout import PREFIX_CUT_QUANTUM, encode_prompt
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.drivers.training import examples

    d = embedded_checkpoint_dir()
    tok = Tokenizer.from_file(d / "tokenizer.json")
    budget = LayoutBudget.for_window(read_config(d)["context_window"])
    cuts = plan(budget)
    text = (Path(__file__).resolve().parents[2] / source).read_text()
    windows = context.windows_for(budget, ContextOptions())
    rng = random.Random(7)
    checked = 0
    for _ in range(200):
        cut = examples.server_region(text, rng, "python", "typing")
        if cut is None or cut.a < 4000 or len(text) - cut.b < 2000:
            continue  # a cursor deep inside the file: both sides have more text than the window
        region = text[cut.a : cut.b]
        train = examples._prompt(text, cut, region, cut.cursor - 0, "m.py", "python",
                                 cuts.prefix_chars, cuts.suffix_chars)
        row = text.count("\n", 0, cut.a + cut.cursor)
        col = cut.a + cut.cursor - (text.rfind("\n", 0, cut.a + cut.cursor) + 1)
        doc = Document("file:///proj/m.py", text, 1, "python")
        served = context.build(doc, row, col, "typing", ContextOptions(), windows, "m.py")
        assert served is not None and served.prompt.region == region
        assert served.prompt.insert and train.insert  # both sides: the block is the insertion
        served_ids, train_ids = encode_prompt(tok, served.prompt, budget), encode_prompt(tok, train, budget)
        assert served_ids[-1] == train_ids[-1] == tok.special["<cursor>"]
        a = _section_tokens(tok, served_ids)
        b = _section_tokens(tok, train_ids)
        assert list(a) == list(b) == list(SECTIONS), (a, b)
        assert a["<region>"] == b["<region>"], (a, b)
        assert cuts.suffix - 4 <= a["<suffix>"] <= cuts.suffix and cuts.suffix - 4 <= b["<suffix>"] <= cuts.suffix
        room = budget.max_context - 3 - (len(tok.encode("python:m.py\n")) + 2) - cuts.suffix - max(
            a["<region>"] + 3, cuts.region)
        for filled in (a["<prefix>"], b["<prefix>"]):
            assert room - PREFIX_CUT_QUANTUM < filled <= room, (a, b, room)
        checked += 1
    assert checked >= 20


def _project_memory(*rels: str):
    """({path: text} of this repository's files `rels`, a RepoMemory of them): a project as the
    server's workspace index holds it."""
    from pathlib import Path

    from dlm.coder_model.memory.index import RepoMemory

    root = Path(__file__).resolve().parents[2]
    files = {rel: (root / rel).read_text() for rel in rels}
    memory = RepoMemory()
    for rel, text in files.items():
        memory.update_file(rel, text)
    return files, memory


def test_server_and_training_retrieve_the_same_snippets(tmp_path):
    """A project's files as the server's workspace index (RepoMemory, lsp.context.with_snippets)
    and as training's project (training.project_snippets): the same typing prompt gets the same
    snippet sections, none from the file itself, and typing on the line does not change them."""
    from dlm.drivers.training.project_snippets import ProjectSnippets

    files, memory = _project_memory("lsp/server.py", "lsp/context.py", "lsp/workspace_index.py",
                                    "coder_model/engine.py", "coder_model/verify.py")
    project = ProjectSnippets((f"proj==1/{rel}", text, "proj==1") for rel, text in files.items())
    text = files["lsp/server.py"]
    lines = text.splitlines(keepends=True)
    rng = random.Random(3)
    compared = 0
    for row in rng.sample([r for r in range(40, len(lines) - 40) if lines[r].strip()], 30):
        doc = Document("file:///proj/lsp/server.py", text, 1, "python")
        col = len(lines[row]) - len(lines[row].lstrip())
        built = context.build(doc, row, col, "typing", ContextOptions(), WINDOWS, "lsp/server.py")
        served = context.with_snippets(built, memory, "lsp/server.py").prompt.snippets
        trained = project.snippets("proj==1", "proj==1/lsp/server.py", built.prompt.prefix)
        assert served == trained
        assert all(sn.path != "lsp/server.py" for sn in served)
        # a keystroke on the line: the same snippets
        doc.apply((row, col), (row, col), "x", 2)
        again = context.build(doc, row, col + 1, "typing", ContextOptions(), WINDOWS, "lsp/server.py")
        assert context.with_snippets(again, memory, "lsp/server.py").prompt.snippets == served
        compared += bool(served)
    assert compared >= 5  # most lines of server.py find something in the files it uses


def test_server_and_training_give_the_same_drafts_in_the_same_section(tmp_path):
    """The repository memory's drafts at a typing cursor: the server's (lsp.memory_proposals on
    the document, its syntax facts read on the document's tree) and training's
    (training.project_drafts on the file's text) are the same, and a model trained with a drafts
    section is served the context its training encoded."""
    from types import SimpleNamespace

    from dlm.coder_model.budget import model_budget
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir
    from dlm.coder_model.config import ModelConfig
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.drivers.training.batches import train_budget
    from dlm.drivers.training.project_drafts import ProjectDrafts
    from dlm.lsp.memory_proposals import document_syntax, memory_proposals, shipped_ranker, text_around

    files, memory = _project_memory("lsp/server.py", "lsp/context.py", "lsp/inline.py", "coder_model/engine.py",
                                    "coder_model/verify.py")
    memory.compact()  # as the workspace index does when its build ends
    project = ProjectDrafts((f"proj==1/{rel}", text, "proj==1") for rel, text in files.items())
    tok = Tokenizer.from_file(embedded_checkpoint_dir() / "tokenizer.json")
    served_budget = model_budget(ModelConfig(context_window=384, drafts_window=48))
    assert served_budget == train_budget(SimpleNamespace(context=384, draft_share=0.5))
    text = files["lsp/inline.py"]
    lines = text.splitlines(keepends=True)
    rng = random.Random(5)
    compared = 0
    for row in rng.sample([r for r in range(30, len(lines) - 30) if len(lines[r].strip()) > 8], 12):
        # the line typed up to its first word's end, as a user types it; the file holds it whole
        line = lines[row].rstrip("\n")
        col = len(line) - len(line.lstrip())
        while col < len(line) and (line[col].isalnum() or line[col] == "_"):
            col += 1
        typed = "".join(lines[:row]) + line[:col] + "\n" + "".join(lines[row + 1 :])
        doc = Document("file:///proj/lsp/inline.py", typed, 1, "python")
        built = context.build(doc, row, col, "typing", ContextOptions(), WINDOWS, "lsp/inline.py")
        before, after = text_around(doc, row, col)
        served = memory_proposals(memory, before, after, "lsp/inline.py", {}, shipped_ranker(),
                                  document_syntax(doc, row, col))
        p = built.prompt
        target = p.region[: p.cursor] + line[col:] + p.region[p.cursor :]
        trained = project.drafts("proj==1", "proj==1/lsp/inline.py", text, p, target)
        assert served == trained
        prompt = replace(built.prompt, proposals=served)
        assert encode_prompt(tok, prompt, served_budget) == encode_prompt(
            tok, replace(built.prompt, proposals=trained), train_budget(SimpleNamespace(context=384, draft_share=1)))
        compared += bool(served)
    assert compared >= 6


# ---- (c) one language name per file --------------------------------------------------------------


def _names_for(ext: str) -> set[str]:
    """Every name the serving side gives a file with this extension (no languageId)."""
    path = f"src/file{ext}"
    doc = Document(f"file:///{path}", "x = 1\n", 1, "")
    built = context.build(doc, 0, 0, "typing", ContextOptions(), WINDOWS, path)
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
    assert context.build(doc, 0, 0, "typing", ContextOptions(), WINDOWS, "a.tsx").prompt.language == "typescriptreact"


def test_the_grammar_follows_the_shared_name():
    pytest.importorskip("tree_sitter_typescript")
    a = syntax.language_for("", "file:///a.tsx")
    b = syntax.language_for("typescriptreact", "file:///a")
    assert a is not None and a == b
    assert syntax.language_for("", "file:///a.ts") != a  # .ts is not TSX
