"""`dlm-lsp http --workspace DIR`: the endpoint answers Zed from the repository memory of DIR.

The endpoint runs in the test on loopback with the embedded model and a workspace that repeats a
distinctive call (as tests/lsp/test_memory_e2e.py does for the language server), so the memory's
only proposal is known: a fill-in-the-middle, a plain and a zeta2 request typed up to it get it.
The workspace also holds a secret on a repeated line (never answered), a file its .gitignore
leaves out, and a folder next to it holds a file the endpoint must never open; a prompt that
names either gets no memory. The gate lets everything through (min_confidence 0): the claims
are about what the memory adds and what it never does, not how often the model agrees.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dlm.lsp import cli
from dlm.lsp import http_endpoint as he
from test_zed_endpoint import zed_fim, zed_parse_zeta2_output, zed_zeta2

pytestmark = pytest.mark.timeout(240)

TOKEN = "0123456789abcdef0123456789abcdef"
LINE = "    frobnicate_widget(registry, widget_id=42, strict=True)\n"
ANSWER = "widget(registry, widget_id=42, strict=True)"
SECRET = "ghp_" + "Zq8vT3kLm9Xw2Rb7Yc4Np6Hd1Jf5Gs0Ae8Ui"  # a GitHub token by shape (coder_model.secrets)
OUTSIDE_MARKER = "OUTSIDE_MARKER_7f3a9c"
IGNORED_MARKER = "IGNORED_MARKER_5e1b2d"
QWEN_STOP = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]


def _project(tmp: Path) -> Path:
    root = tmp / "proj"
    root.mkdir()
    for i in range(6):
        (root / f"mod{i}.py").write_text(
            f"def handler_{i}(registry):\n{LINE}    GITHUB_TOKEN = \"{SECRET}\"\n    return registry\n")
    # a file the index leaves out (.gitignore); its lines would be the memory's only answer to `zorblax_`
    (root / ".gitignore").write_text("ignored.py\n")
    (root / "ignored.py").write_text("".join(f"def g{i}(registry):\n    zorblax_quux({IGNORED_MARKER})\n"
                                             for i in range(6)))
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text("".join(f"def e{i}(registry):\n    zorblax_quux({OUTSIDE_MARKER})\n"
                                             for i in range(6)))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from dlm.coder_model.engine import load_engine

    tmp = tmp_path_factory.mktemp("http_ws")
    root = _project(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp / "cache"))  # the index's cache, never the user's
        holder = he.EngineHolder(lambda: load_engine(None, "cpu"))
        workspace = he.FolderIndex(str(root))
        predictor = he.Predictor(holder, he.EndpointOptions(deadline_ms=600_000, min_confidence=0.0,
                                                            token=TOKEN.encode()), workspace)
        server = he.make_server("127.0.0.1", 0, predictor)
        holder.start()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                _, health = call(url + "/health")
                if health.get("status") == "ready" and health.get("index", {}).get("state") == "ready":
                    break
                assert health.get("status") != "failed", health
                time.sleep(0.1)
            else:
                raise AssertionError(f"model or index never ready: {health}")
            assert health["index"]["files"] == 6, health  # mod0..mod5: not ignored.py, not ../outside
            yield url, root, tmp
        finally:
            server.shutdown()
            server.server_close()
            holder.close()
            workspace.close()


def call(url: str, body: dict | None = None, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def complete(url: str, prompt: str, stop: list[str], token: str | None = TOKEN) -> tuple[int, dict]:
    return call(url + "/v1/completions", {"model": "dlm", "prompt": prompt, "max_tokens": 256, "stop": stop}, token)


def text_of(url: str, prompt: str, stop: list[str]) -> str:
    status, body = complete(url, prompt, stop)
    assert status == 200, body
    return body["choices"][0]["text"]


def zeta2_typed(path: str, typed: str) -> tuple[str, str]:
    """A zeta2 prompt (Zed's default layout) of a new function whose body line is typed up to
    `typed`, and the editable region Zed sent (to compare the answer with)."""
    excerpt = f"def handler_9(registry):\n{typed}\n    return registry\n"
    cursor = excerpt.index(typed) + len(typed)
    return zed_zeta2("v0131", path, excerpt, (0, len(excerpt)), cursor), excerpt


# ---- the memory's continuation -----------------------------------------------------------------------


def test_fim_and_plain_prompts_get_the_memorys_continuation(served):
    url, _, _ = served
    fim = zed_fim("qwen", "def handler_9(registry):\n    frobnicate_", "\n    return registry\n")
    assert text_of(url, fim, QWEN_STOP) == ANSWER
    # a prompt with no markers (other OpenAI-compatible clients) is continued with it too
    assert text_of(url, "def handler_9(registry):\n    frobnicate_", ["\n"]) == ANSWER


def test_zeta2_prompt_of_an_indexed_file_gets_the_memorys_continuation(served):
    url, root, _ = served
    # Zed names the file by its worktree's name and the path in it
    prompt, excerpt = zeta2_typed(f"{root.name}/mod0.py", "    frobnicate_")
    text = text_of(url, prompt, [])
    assert zed_parse_zeta2_output(text) == excerpt.replace("    frobnicate_\n", LINE)
    assert text.endswith(">>>>>>> UPDATED\n")


def test_a_path_that_names_no_indexed_file_gets_no_memory(served):
    """The same typed line as above, in a prompt whose path leaves the folder: the model answers
    alone, and it never saw the workspace's line (with the index off, the language server's
    model does not write it either: tests/lsp/test_memory_e2e.py)."""
    url, _, tmp = served
    for path in ("../outside/evil.py", str(tmp / "outside" / "evil.py")):
        prompt, _ = zeta2_typed(path, "    frobnicate_")
        assert ANSWER not in text_of(url, prompt, []), path


# ---- what the endpoint never reads or answers ----------------------------------------------------------


def test_a_prompts_path_names_an_indexed_file_or_nothing():
    roots, indexed = ("/work/proj", "/data/real/proj"), {"mod0.py", "pkg/a.py", "proj/b.py"}
    named = {
        "mod0.py": "mod0.py", "./pkg//a.py": "pkg/a.py", "proj/pkg/a.py": "pkg/a.py",  # Zed: worktree name first
        "proj/b.py": "proj/b.py", "/work/proj/pkg/a.py": "pkg/a.py", "/data/real/proj/mod0.py": "mod0.py",
        "pkg\\a.py": "pkg/a.py",
        # outside the folder, or not indexed: nothing
        "../proj/mod0.py": None, "proj/../mod0.py": None, "pkg/../mod0.py": None, "/etc/passwd": None,
        "/work/proj/../proj/mod0.py": None, "/work/projx/mod0.py": None, "other.py": None, "": None,
        "mod0.py\x00": None, "/work/proj": None,
    }
    for path, rel in named.items():
        assert he.indexed_path(path, roots, indexed) == rel, path



@pytest.fixture
def opened(monkeypatch):
    """The paths opened while the test runs (any thread of this process) that name the files
    the endpoint must never read."""
    seen: list[str] = []
    names = ("evil.py", "ignored.py")

    def spy(real):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and any(n in os.fsdecode(file) for n in names):
                seen.append(os.fsdecode(file))
            return real(file, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(builtins, "open", spy(builtins.open))
    monkeypatch.setattr(io, "open", spy(io.open))
    monkeypatch.setattr(os, "open", spy(os.open))
    return seen


def test_a_prompt_never_makes_the_endpoint_read_the_file_it_names(served, opened):
    url, root, tmp = served
    evil = tmp / "outside" / "evil.py"
    paths = ["../outside/evil.py", f"{root.name}/../outside/evil.py", str(evil), "ignored.py",
             f"{root.name}/ignored.py", str(root / "ignored.py")]
    answers = []
    for path in paths:
        prompt, _ = zeta2_typed(path, "    zorblax_")
        answers.append(text_of(url, prompt, []))
    # a prompt of no file is answered from the index, which holds neither file
    answers.append(text_of(url, zed_fim("qwen", "def g9(registry):\n    zorblax_", "\n"), QWEN_STOP))
    answers.append(text_of(url, "def g9(registry):\n    zorblax_", ["\n"]))
    for path, text in zip(paths + ["<fim>", "<plain>"], answers):
        assert OUTSIDE_MARKER not in text and IGNORED_MARKER not in text, (path, text)
    assert opened == []


def test_a_secret_in_the_workspace_never_comes_back(served):
    url, root, _ = served
    typed = LINE + "    GITHUB_TOKEN = "
    answers = [
        text_of(url, "def handler_9(registry):\n" + typed, ["\n"]),
        text_of(url, zed_fim("qwen", "def handler_9(registry):\n" + typed, "\n    return registry\n"), QWEN_STOP),
    ]
    prompt, _ = zeta2_typed(f"{root.name}/mod0.py", typed.rstrip("\n"))
    answers.append(text_of(url, prompt, []))
    for text in answers:
        assert SECRET[:12] not in text and "ghp_" not in text, text


# ---- who may ask ---------------------------------------------------------------------------------------


def test_requests_without_the_token_are_refused(served):
    url, _, _ = served
    fim = zed_fim("qwen", "def handler_9(registry):\n    frobnicate_", "\n")
    for token in (None, "wrong-token-wrong-token-wrong-token"):
        status, body = complete(url, fim, QWEN_STOP, token=token)
        assert status == 401 and "token" in body["error"]["message"], body
        assert ANSWER not in json.dumps(body)
    assert call(url + "/health", token=None)[0] == 401


@pytest.fixture
def run_cli(monkeypatch):
    """`dlm-lsp http --listen 127.0.0.1:0 ARGV` as the console script runs it, in this process; an
    endpoint that would start fails the test at once (it would serve forever)."""

    def refused(*a, **k):
        raise AssertionError("dlm-lsp http started serving")

    monkeypatch.setattr(he, "make_server", refused)

    def run(*argv: str) -> int:
        _, parser, rest = cli.parser_for(["http", "--listen", "127.0.0.1:0", *argv])
        return he.run(cli.expand_paths(parser.parse_args(rest)))

    return run


def test_a_workspace_without_a_token_is_refused(tmp_path, monkeypatch, capsys, run_cli):
    monkeypatch.delenv("DLM_TOKEN", raising=False)
    (tmp_path / "proj").mkdir()
    assert run_cli("--workspace", str(tmp_path / "proj")) == 2
    err = capsys.readouterr().err
    assert "needs a token" in err and "--token-file" in err and "API key" in err


@pytest.fixture
def token_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return str(f)


def test_root_home_and_its_parents_are_refused(tmp_path, monkeypatch, capsys, token_file, run_cli):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    errors = []
    for folder, why in (("/", "whole file system"), (str(home), "home directory"),
                        (str(tmp_path / "users"), "holds the home directory"), ("~", "home directory")):
        assert run_cli("--token-file", token_file, "--workspace", folder) == 2, folder
        errors.append(err := capsys.readouterr().err)
        assert why in err and "not served" in err and "--workspace ~/src/myproject" in err, err
    assert run_cli("--token-file", token_file, "--workspace", str(tmp_path / "missing")) == 2
    errors.append(err := capsys.readouterr().err)
    assert "is not a folder" in err
    assert not any(TOKEN in e for e in errors)  # the token is never printed
