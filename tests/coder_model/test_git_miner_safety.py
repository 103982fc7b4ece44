"""The git miner (coder_model.edit_memory: mine, GitMiner, git_read) against a hostile repository:
nothing the repository configures runs, git reads nothing outside the workspace, and a git
child is bounded in time and memory and dies with the server."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from dlm.coder_model.edit_memory import GitMiner, git_read, mine

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and rlimits")

DEFAULT_TAIL = 'cat "$1" 2>/dev/null'  # what a hostile script does after leaving its marker


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgSign=false", "-c", "core.hooksPath=" + os.devnull, *args],
                          check=True, capture_output=True, text=True, env=env).stdout


def _repo(tmp_path: Path, attributes: str | None = None) -> Path:
    """A repository with an ordinary history: two edits of m.py (a rename, then an argument)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    if attributes is not None:
        (repo / ".gitattributes").write_text(attributes)
        _git(repo, "add", ".gitattributes")
    (repo / "m.py").write_text("count = 1\nprint(count)\n")
    _git(repo, "add", "m.py")
    _git(repo, "commit", "-qm", "one")
    (repo / "m.py").write_text("total = 1\nprint(total)\n")
    _git(repo, "commit", "-qam", "two")
    (repo / "m.py").write_text("total = 1\nprint(total, 2)\n")
    _git(repo, "commit", "-qam", "three")
    return repo


def _marker_script(tmp_path: Path, name: str, tail: str = DEFAULT_TAIL) -> tuple[Path, Path]:
    """An executable that creates `tmp_path/MARK-name` when run (then `tail`): (script, marker)."""
    marker = tmp_path / f"MARK-{name}"
    script = tmp_path / f"hostile-{name}"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\n{tail}\n")
    script.chmod(0o755)
    return script, marker


def _assert_mined(repo: Path):
    stats = mine(str(repo), 10, 1_000_000, timeout_s=10)
    assert stats is not None
    assert stats.commits == 3
    assert stats.head == _git(repo, "rev-parse", "HEAD").strip()
    assert stats.kinds  # the hunks were read and their patterns counted
    return stats


def _assert_refused(path: Path, caplog, why: str) -> None:
    """Mining `path` is refused, and the log says `why`."""
    assert mine(str(path), 10, 1_000_000, timeout_s=10) is None
    assert why in caplog.text


def _git_workspace(tmp_path: Path) -> Path:
    """An empty git repository `tmp_path/ws`, beside the one `_repo` makes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _git(ws, "init", "-q")
    return ws


@pytest.mark.parametrize(
    ("attributes", "name", "tail", "script_keys", "settings"),
    [
        pytest.param("*.py diff=x\n", "textconv", DEFAULT_TAIL, ("diff.x.textconv",), (), id="textconv-driver"),
        pytest.param(None, "external", DEFAULT_TAIL, ("diff.external",), (), id="external-diff"),
        pytest.param("*.py diff=x\n", "driver-command", DEFAULT_TAIL, ("diff.x.command",), (),
                     id="diff-driver-command"),
        pytest.param(None, "fsmonitor", "exit 1", ("core.fsmonitor",), (), id="fsmonitor"),
        pytest.param(None, "ssh", "exit 1", ("core.sshCommand",),
                     (("remote.origin.url", "ssh://git.invalid/r.git"),), id="ssh-command"),
        pytest.param(None, "credential", "exit 1", ("credential.helper", "core.askPass"),
                     (("remote.origin.url", "https://git.invalid/r.git"),), id="credential-helper"),
    ],
)
def test_a_command_in_the_repository_config_runs_nothing(tmp_path, attributes, name, tail, script_keys, settings):
    """The repository's config names a hostile script under each of `script_keys` (with `settings`
    besides): mining reads the history and the script never runs."""
    repo = _repo(tmp_path, attributes)
    script, marker = _marker_script(tmp_path, name, tail=tail)
    for key in script_keys:
        _git(repo, "config", key, str(script))
    for key, value in settings:
        _git(repo, "config", key, value)
    _assert_mined(repo)
    assert not marker.exists()


def test_a_pager_in_the_repository_config_runs_nothing(tmp_path):
    repo = _repo(tmp_path)
    pager, pager_marker = _marker_script(tmp_path, "core-pager", tail="cat")
    log_pager, log_marker = _marker_script(tmp_path, "pager-log", tail="cat")
    _git(repo, "config", "core.pager", str(pager))
    _git(repo, "config", "pager.log", str(log_pager))
    _assert_mined(repo)
    assert not pager_marker.exists() and not log_marker.exists()


def test_clean_smudge_and_process_filters_in_the_repository_config_run_nothing(tmp_path):
    # A harmless textconv (cat) is the way `git log -p` would feed a blob through the smudge
    # filter (into the temporary file the driver reads): the filters must stay off even so.
    repo = _repo(tmp_path, "*.py filter=f diff=t\n")
    clean, clean_marker = _marker_script(tmp_path, "clean", tail="cat")
    smudge, smudge_marker = _marker_script(tmp_path, "smudge", tail="cat")
    process, process_marker = _marker_script(tmp_path, "process", tail="exit 1")
    _git(repo, "config", "diff.t.textconv", "cat")
    _git(repo, "config", "filter.f.clean", str(clean))
    _git(repo, "config", "filter.f.smudge", str(smudge))
    _git(repo, "config", "filter.f.process", str(process))
    _assert_mined(repo)
    assert not clean_marker.exists() and not smudge_marker.exists() and not process_marker.exists()


def test_a_hooks_path_in_the_repository_config_runs_nothing(tmp_path):
    repo = _repo(tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "MARK-hook"
    for name in ("post-checkout", "post-index-change", "reference-transaction", "fsmonitor-watchman",
                 "pre-auto-gc", "post-rewrite", "pre-commit"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch '{marker}'\n")
        (hooks / name).chmod(0o755)
    _git(repo, "config", "core.hooksPath", str(hooks))
    _assert_mined(repo)
    assert not marker.exists()


def test_a_gpg_program_for_a_signed_commit_runs_nothing(tmp_path):
    repo = _repo(tmp_path)
    # A commit carrying a (bogus) signature: log.showSignature would hand it to gpg.program.
    tree = _git(repo, "rev-parse", "HEAD^{tree}").strip()
    parent = _git(repo, "rev-parse", "HEAD").strip()
    body = (f"tree {tree}\nparent {parent}\nauthor t <t@example.com> 1700000000 +0000\n"
            "committer t <t@example.com> 1700000000 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n"
            " iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n\nsigned\n")
    (tmp_path / "commit.txt").write_text(body)
    signed = _git(repo, "hash-object", "-t", "commit", "-w", str(tmp_path / "commit.txt")).strip()
    _git(repo, "update-ref", "HEAD", signed)
    script, marker = _marker_script(tmp_path, "gpg", tail="exit 1")
    _git(repo, "config", "log.showSignature", "true")
    _git(repo, "config", "gpg.program", str(script))
    stats = mine(str(repo), 10, 1_000_000, timeout_s=10)
    assert stats is not None and stats.commits == 4 and stats.head == signed and stats.kinds
    assert not marker.exists()


def test_the_servers_git_environment_is_not_inherited(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    (other / "x.py").write_text("x = 1\n")
    _git(other, "add", "x.py")
    _git(other, "commit", "-qm", "other")
    script, marker = _marker_script(tmp_path, "env")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_ALTERNATE_OBJECT_DIRECTORIES", str(other / ".git" / "objects"))
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(script))
    monkeypatch.setenv("GIT_PAGER", str(script))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "diff.external")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(script))
    _assert_mined(repo)  # this repository's three commits, not the other's one
    assert not marker.exists()


def test_a_git_file_pointing_outside_the_workspace_is_refused(tmp_path, caplog):
    outside = _repo(tmp_path)  # a real history, elsewhere
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    assert mine(str(ws), 10, 1_000_000, timeout_s=10) is None
    assert "not mined" in caplog.text and "is a file" in caplog.text


def test_a_symlinked_git_directory_is_refused(tmp_path, caplog):
    outside = _repo(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").symlink_to(outside / ".git")
    _assert_refused(ws, caplog, "symbolic link")


def test_a_symlink_inside_the_git_directory_is_refused(tmp_path, caplog):
    repo = _repo(tmp_path)
    refs = repo / ".git" / "refs" / "heads"
    (refs / "elsewhere").symlink_to(tmp_path / "secret")
    _assert_refused(repo, caplog, "symbolic link")


def test_alternates_are_refused(tmp_path, caplog):
    outside = _repo(tmp_path)
    ws = _git_workspace(tmp_path)
    (ws / ".git" / "objects" / "info" / "alternates").write_text(f"{outside / '.git' / 'objects'}\n")
    # HEAD names a commit only the alternate object store holds
    (ws / ".git" / "refs" / "heads" / "master").write_text(_git(outside, "rev-parse", "HEAD"))
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/master\n")
    _assert_refused(ws, caplog, "alternates")


def test_commondir_is_refused(tmp_path, caplog):
    outside = _repo(tmp_path)
    ws = _git_workspace(tmp_path)
    (ws / ".git" / "commondir").write_text(f"{outside / '.git'}\n")
    _assert_refused(ws, caplog, "commondir")


@pytest.mark.parametrize("section", ['[include]\n\tpath = {target}\n',
                                     '[INCLUDE]\n\tpath = {target}\n',
                                     '[includeIf "gitdir:/"]\n\tpath = {target}\n',
                                     '[core] [IncludeIf "onbranch:*"] path = {target}\n'])
def test_include_path_and_include_if_are_refused(tmp_path, caplog, section):
    repo = _repo(tmp_path, "*.py diff=x\n")
    script, marker = _marker_script(tmp_path, "include")
    target = tmp_path / "included.cfg"  # a file outside the workspace, read as configuration
    target.write_text(f'[diff "x"]\n\ttextconv = {script}\n')
    with open(repo / ".git" / "config", "a") as f:
        f.write(section.format(target=target))
    assert mine(str(repo), 10, 1_000_000, timeout_s=10) is None
    assert "include" in caplog.text.lower()
    assert not marker.exists()


def test_a_partial_clone_is_refused(tmp_path, caplog):
    repo = _repo(tmp_path)
    _git(repo, "config", "remote.origin.url", "ext::sh -c touch% MARK")
    _git(repo, "config", "remote.origin.promisor", "true")
    _git(repo, "config", "extensions.partialClone", "origin")
    _assert_refused(repo, caplog, "partial clone")


def test_a_workspace_without_its_own_git_directory_is_not_mined_from_a_parent(tmp_path):
    repo = _repo(tmp_path)
    sub = repo / "pkg"
    sub.mkdir()
    assert mine(str(sub), 10, 1_000_000, timeout_s=10) is None  # git would find the parent's


def test_the_commit_and_byte_caps_still_hold(tmp_path):
    repo = _repo(tmp_path)
    assert mine(str(repo), 2, 1_000_000, timeout_s=10).commits == 2
    full = git_read.run_git(str(repo), str(repo / ".git"), ["log", "-p", "-U0", "--format=commit %H"],
                            10, 1_000_000)
    cut = mine(str(repo), 10, len(full.out) - 10, timeout_s=10)
    assert cut.commits == 2  # the cut (oldest) commit is dropped, not half-read


def test_a_big_file_rewrite_is_diffed_as_binary(tmp_path):
    repo = _repo(tmp_path)
    (repo / "big.py").write_text("".join(f"a{i} = {i}\n" for i in range(200_000)))  # ~2.4 MB
    _git(repo, "add", "big.py")
    _git(repo, "commit", "-qm", "big")
    (repo / "big.py").write_text("".join(f"b{i} = {i}\n" for i in range(200_000)))
    _git(repo, "commit", "-qam", "rewrite")
    out = git_read.run_git(str(repo), str(repo / ".git"), ["log", *git_read.LOG_SAFETY, "-p", "-U0", "-n1"],
                           10, 10_000_000)
    assert b"Binary files a/big.py and b/big.py differ" in out.out and len(out.out) < 10_000
    assert mine(str(repo), 10, 1_000_000, timeout_s=10).commits == 5


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and awaiting its reaper, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_file(path: Path, timeout_s: float = 3.0) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.01)
    raise AssertionError(f"{path} never written")


def _gone(pid: int, timeout_s: float = 2.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _hanging_git(tmp_path: Path, monkeypatch) -> Path:
    """A `git` first on PATH that answers rev-parse, and for log starts a grandchild, writes
    its pid and then nothing, forever: (the file the grandchild's pid goes to)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "grandchild.pid"
    (bin_dir / "git").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do
          if [ "$a" = rev-parse ]; then echo {"ab" * 20}; exit 0; fi
        done
        sleep 30 &
        echo $! > '{pid_file}'
        exec sleep 30
        """))
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return pid_file


def test_a_git_that_never_writes_is_killed_at_the_time_limit_with_its_process_group(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    pid_file = _hanging_git(tmp_path, monkeypatch)
    t0 = time.monotonic()
    stats = mine(str(repo), 10, 1_000_000, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 2.5
    assert stats is not None and stats.commits == 0
    assert _gone(int(_wait_file(pid_file)))  # the grandchild went with the group


def test_a_child_writing_slowly_is_cut_at_the_deadline(tmp_path):
    t0 = time.monotonic()
    res = git_read.run_limited(["sh", "-c", "while :; do echo line; sleep 0.05; done"], {"PATH": os.defpath},
                               None, 0.6, 1_000_000)
    assert time.monotonic() - t0 < 1.5
    assert res.timed_out and res.returncode is None and res.out.startswith(b"line\n")


def test_a_finished_child_reports_its_exit_status_and_output(tmp_path):
    res = git_read.run_limited(["sh", "-c", "echo out; exit 3"], {"PATH": os.defpath}, None, 5, 1_000)
    assert res.out == b"out\n" and res.returncode == 3 and not res.timed_out and not res.capped


def test_closing_the_miner_kills_the_running_git_and_reports_nothing(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    pid_file = _hanging_git(tmp_path, monkeypatch)
    done = []
    miner = GitMiner(str(repo), done.append, timeout_s=30).start()
    grandchild = int(_wait_file(pid_file))
    t0 = time.monotonic()
    miner.close()
    assert time.monotonic() - t0 < 1.0 and not miner.thread.is_alive()
    assert _gone(grandchild) and done == []


def test_the_memory_limit_applies_to_the_child(tmp_path):
    limits = git_read.run_limited(["sh", "-c", "ulimit -v"], {"PATH": os.defpath}, None, 5, 1_000)
    assert int(limits.out) * 1024 == git_read.GIT_MEMORY_LIMIT
    alloc = git_read.run_limited([sys.executable, "-c", "b = bytearray(2 * 2**30); print('allocated')"],
                                 {"PATH": os.defpath}, None, 5, 1_000)
    assert b"allocated" not in alloc.out and alloc.returncode not in (0, None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_the_server(tmp_path):
    pid_file = tmp_path / "child.pid"
    server = textwrap.dedent(f"""\
        import os, threading, time
        from dlm.coder_model.edit_memory import git_read
        argv = ["sh", "-c", "echo $$ > '{pid_file}'; exec sleep 30"]
        threading.Thread(target=git_read.run_limited, args=(argv, {{"PATH": os.defpath}}, None, 30, 1000),
                         daemon=True).start()
        while not os.path.exists('{pid_file}'):
            time.sleep(0.01)
        os._exit(0)  # no atexit hook, no cleanup: a crash
        """)
    subprocess.run([sys.executable, "-c", server], check=True, timeout=10)
    assert _gone(int(_wait_file(pid_file)))


def test_the_servers_shutdown_stops_every_git_miner():
    """`shutdown` closes the next-edit state, which closes each miner (its process group is killed)."""
    from dlm.lsp.next_edits import NextEdits

    class Miner:
        closed = 0

        def close(self) -> None:
            Miner.closed += 1

    ne = NextEdits()
    ne.miners = {"/a": Miner(), "/b": Miner()}
    ne.close()
    assert Miner.closed == 2 and ne.miners == {}
