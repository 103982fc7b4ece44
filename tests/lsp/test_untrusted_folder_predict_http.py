"""A hostile folder against `dlm-lsp predict` and `dlm-lsp http --workspace`: both index the
folder with the language server's WorkspaceIndex, so the server's hardening must hold there too.

Each case builds one project (a git repository whose config runs a textconv driver, a
.gitignore with a catastrophic-backtracking pattern, a secret on a repeated line, links that
lead out of the folder, FIFOs where files and ignore files are read) and runs, through the
console entry (`dlm.lsp.cli.main`, in this process with the embedded model loaded once):

- `dlm-lsp predict FILE --line N --col M`, typed up to a prefix that only the hostile text
  continues, and
- `dlm-lsp http --workspace DIR --token-file F --listen 127.0.0.1:0`, with one plain
  /v1/completions request of the same typed text (a prompt of no file: the endpoint
  consults the whole index), the gate open (--min-confidence 0).

Claims: each command answers within a generous timeout (a hang is a failure, never a wait),
the index is used (its file count leaves the hostile file out), no marker file is created
and the hostile text (ignored, secret, outside the folder, a textconv driver's output) is in
no output. A control case puts the same text in an ordinary file and needs it in both outputs:
the harness can tell when the memory proposes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dlm.lsp import cli, predict_cli
from dlm.lsp import http_endpoint as he
from test_predict_memory import _Kept, embedded  # noqa: F401  (the module-scoped engine fixture)
from test_workspace_reads_stay_inside import unblock

pytestmark = pytest.mark.timeout(240)  # a backstop: the hang checks below say more, sooner

ANSWER_S = 60.0  # each command answers within this (it must not hang)
TOKEN = "0123456789abcdef0123456789abcdef"
LINE = "    frobnicate_widget(registry, widget_id=42, strict=True)\n"
TYPED = "    zorblax_"  # only the hostile file's lines continue it
SECRET = "ghp_" + "Zq8vT3kLm9Xw2Rb7Yc4Np6Hd1Jf5Gs0Ae8Ui"  # a GitHub token by shape (coder_model.secrets)
CONTROL_MARKER = "CONTROL_MARKER_3c8e1f"
IGNORED_MARKER = "IGNORED_MARKER_5e1b2d"
OUTSIDE_MARKER = "OUTSIDE_MARKER_7f3a9c"
TEXTCONV_MARKER = "TEXTCONV_OUTPUT_9d4a6b"
HOSTILE_GLOB = "a*a*a*a*a*a*a*a*a*a*b"  # ten stars: exponential for a backtracking matcher


def zorblax_lines(marker: str) -> str:
    return "".join(f"def g{i}(registry):\n    zorblax_quux(registry, {marker}=42)\n" for i in range(6))


@dataclass
class Case:
    root: Path  # the project (predict's git root, http's --workspace)
    typed: str  # the line typed up to the cursor, in app.py and in the request
    files: int  # what the index must hold
    forbidden: list[str] = field(default_factory=list)  # never in any output
    required: list[str] = field(default_factory=list)  # in every output (the control)
    marker: Path | None = None  # never created
    fifos: list[Path] = field(default_factory=list)
    after: Callable[[], None] = lambda: None  # checks of the fixture itself, once the commands ran


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["HOME"] = str(repo.parent / "home")  # no user or system git config of the test machine
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgSign=false",
            "-c",
            "core.hooksPath=" + os.devnull,
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    ).stdout


def _ordinary(root: Path, typed: str) -> None:
    """The files every case has: five modules repeating LINE, and app.py, typed up to `typed`."""
    for i in range(5):
        (root / f"mod{i}.py").write_text(f"def handler_{i}(registry):\n{LINE}    return registry\n")
    (root / "app.py").write_text(f"def handler(registry):\n{typed}\n")


def control(tmp: Path) -> Case:
    root = tmp / "proj"
    (root / ".git").mkdir(parents=True)
    _ordinary(root, TYPED)
    (root / "other.py").write_text(zorblax_lines(CONTROL_MARKER))
    return Case(root, TYPED, 7, required=[CONTROL_MARKER])


def git_textconv(tmp: Path) -> Case:
    """A repository whose .git/config names a textconv driver that a committed .gitattributes
    applies to every .py file, with an uncommitted change (what `git diff` would run it on)."""
    root = tmp / "proj"
    root.mkdir()
    marker = tmp / "MARK-textconv"
    _git(root, "init", "-q")
    _ordinary(root, TYPED)
    (root / "other.py").write_text("def g(registry):\n    return registry\n")
    (root / ".gitattributes").write_text("*.py diff=x\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    # written by git into .git/config, quoted as git reads it back
    _git(root, "config", "diff.x.textconv", f"sh -c 'touch {marker}; echo \"    zorblax_{TEXTCONV_MARKER}\"'")
    (root / "other.py").write_text("def g(registry):\n    return registry, 1\n")

    def fixture_is_hostile() -> None:  # git itself runs the driver: the case could have failed
        assert not marker.exists()
        _git(root, "diff")
        assert marker.exists(), (
            "the textconv driver did not run under plain `git diff`; the case tests nothing"
        )

    return Case(root, TYPED, 7, forbidden=[TEXTCONV_MARKER], marker=marker, after=fixture_is_hostile)


def catastrophic_gitignore(tmp: Path) -> Case:
    root = tmp / "proj"
    (root / ".git").mkdir(parents=True)
    _ordinary(root, TYPED)
    (root / ".gitignore").write_text(f"{HOSTILE_GLOB}\n{HOSTILE_GLOB}.py\n")
    (root / ("a" * 80 + ".py")).write_text("x = 1\n")  # no match: the exponential case; indexed
    (root / ("a" * 80)).mkdir()  # a folder of that name: matched too (no match), and walked
    (root / ("a" * 80) / "inner.py").write_text("y = 2\n")
    (root / ("a" * 40 + "b.py")).write_text(zorblax_lines(IGNORED_MARKER))  # matched: never indexed
    return Case(root, TYPED, 8, forbidden=[IGNORED_MARKER])


def secret_line(tmp: Path) -> Case:
    root = tmp / "proj"
    (root / ".git").mkdir(parents=True)
    typed = "    GITHUB_TOKEN = "
    _ordinary(root, typed)
    for i in range(6):
        (root / f"conf{i}.py").write_text(
            f'def settings_{i}(registry):\n{typed}"{SECRET}"\n    return registry\n'
        )
    return Case(root, typed, 12, forbidden=[SECRET[:12], "ghp_"])


def outside_link(tmp: Path) -> Case:
    root = tmp / "proj"
    (root / ".git").mkdir(parents=True)
    _ordinary(root, TYPED)
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text(zorblax_lines(OUTSIDE_MARKER))
    (root / "linked").symlink_to(outside, target_is_directory=True)  # a folder out of the project
    (root / "evil.py").symlink_to(outside / "evil.py")  # a file out of it
    return Case(root, TYPED, 6, forbidden=[OUTSIDE_MARKER])


def fifos(tmp: Path) -> Case:
    """FIFOs (no writer ever comes) where sources and ignore files are read."""
    root = tmp / "proj"
    (root / ".git" / "info").mkdir(parents=True)
    (root / "pkg").mkdir()
    _ordinary(root, TYPED)
    pipes = [
        root / "pipe.py",
        root / "pkg" / "pipe.py",
        root / ".gitignore",
        root / "pkg" / ".gitignore",
        root / ".git" / "info" / "exclude",
    ]
    for p in pipes:
        os.mkfifo(p)
    return Case(root, TYPED, 6, fifos=pipes)


CASES = [control, git_textconv, catastrophic_gitignore, secret_line, outside_link, fifos]


def within(fn: Callable[[], object], what: str, timeout_s: float = ANSWER_S) -> object:
    """fn() on a daemon thread: its result, or a failure when it has not returned in time (what
    blocks stays blocked there, not in the test)."""
    out: list = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"{what} did not answer within {timeout_s:.0f} s (it hangs)"
    if errors:
        raise errors[0]
    return out[0]


@pytest.fixture
def env(tmp_path, monkeypatch, embedded):  # noqa: F811
    """The machine's caches and home out of reach; the embedded engine for every load; the
    commands' own log handlers off (pytest captures the logs)."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DLM_TOKEN", raising=False)
    monkeypatch.setattr(
        "dlm.coder_model.engine.load_engine", lambda model=None, device="auto": _Kept(embedded)
    )
    monkeypatch.setattr(he, "make_engine_factory", lambda args: lambda: _Kept(embedded))
    monkeypatch.setattr(predict_cli, "setup_logging", lambda level: None)
    return tmp_path


def run_predict(case: Case, capsys) -> str:
    app = case.root / "app.py"
    argv = [
        "predict",
        str(app),
        "--line",
        "1",
        "--col",
        str(len(case.typed)),
        "--device",
        "cpu",
        "--index-timeout",
        str(ANSWER_S - 10),
    ]
    rc = within(lambda: cli.main(argv), "dlm-lsp predict")
    out = capsys.readouterr()
    assert rc == 0, out.err
    # the index was used, and it holds what it should: the hostile files are not in it
    assert f"== repository memory: {case.root}: {case.files} files" in out.out, out
    return out.out + out.err


def _call(url: str, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=ANSWER_S) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def run_http(case: Case, tmp: Path, monkeypatch, capsys) -> str:
    """`dlm-lsp http --workspace ROOT` in a thread, one plain completion of the typed text, and the
    endpoint stopped: the answer's text (and the endpoint's stderr)."""
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    servers: list = []
    real_make_server = he.make_server
    monkeypatch.setattr(
        he, "make_server", lambda *a, **k: servers.append(real_make_server(*a, **k)) or servers[-1]
    )
    argv = [
        "http",
        "--listen",
        "127.0.0.1:0",
        "--device",
        "cpu",
        "--token-file",
        str(token_file),
        "--workspace",
        str(case.root),
        "--min-confidence",
        "0",
        "--deadline-ms",
        "60000",
        "--log-level",
        "WARNING",
    ]
    result: list[int] = []
    done = threading.Thread(target=lambda: result.append(cli.main(argv)), daemon=True)
    done.start()
    try:
        deadline = time.monotonic() + ANSWER_S
        while not servers and done.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert servers, f"dlm-lsp http did not start serving (exit {result}): {capsys.readouterr().err}"
        url = f"http://127.0.0.1:{servers[0].server_address[1]}"
        health: dict = {}
        while time.monotonic() < deadline:
            status, health = _call(url + "/health")
            assert status == 200 and health.get("status") != "failed", health
            if health.get("status") == "ready" and health.get("index", {}).get("state") == "ready":
                break
            time.sleep(0.05)
        else:
            raise AssertionError(
                f"dlm-lsp http: model or index not ready within {ANSWER_S:.0f} s (it hangs): {health}"
            )
        assert health["index"]["files"] == case.files, health
        prompt = f"def handler_9(registry):\n{case.typed}"
        status, body = within(
            lambda: _call(
                url + "/v1/completions", {"model": "dlm", "prompt": prompt, "max_tokens": 64, "stop": ["\n"]}
            ),
            "the /v1/completions request",
        )
        assert status == 200, body
        text = body["choices"][0]["text"]
    finally:
        if servers:
            servers[0].shutdown()
        done.join(ANSWER_S)
    assert not done.is_alive(), "dlm-lsp http did not stop after its server was shut down (it hangs)"
    assert result == [0]
    return json.dumps(text) + "\n" + text + "\n" + capsys.readouterr().err


@pytest.mark.parametrize("make", CASES, ids=[c.__name__ for c in CASES])
def test_a_hostile_folder_is_indexed_safely_by_predict_and_http(make, env, monkeypatch, capsys):
    case = make(env)
    try:
        outputs = {"predict": run_predict(case, capsys), "http": run_http(case, env, monkeypatch, capsys)}
    finally:
        unblock(case.fifos)
    for command, out in outputs.items():
        for text in case.forbidden:
            assert text not in out, (command, text, out)
        for text in case.required:
            assert text in out, (command, text, out)
    if case.marker is not None:
        assert not case.marker.exists(), f"{case.marker} was created: something the folder configures ran"
    case.after()
