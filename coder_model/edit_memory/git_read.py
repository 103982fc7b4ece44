"""Reading a workspace's git history safely when the repository itself may be hostile.

A repository's own configuration (`.git/config`, the committed `.gitattributes`) can name
programs git runs on its behalf: diff textconv drivers, external diffs, the fsmonitor, pagers,
clean/smudge filters, ssh commands, hooks, credential helpers, gpg for signed commits. A
workspace the user merely opens must not run any of them, so every git command here:

- runs the git found on the server's PATH by absolute path, with a minimal environment
  (`git_env`): nothing of the server's environment (no GIT_DIR, GIT_WORK_TREE,
  GIT_ALTERNATE_OBJECT_DIRECTORIES, GIT_CONFIG_*, GIT_SSH*, GIT_ASKPASS, SSH_ASKPASS,
  GIT_EXTERNAL_DIFF, GIT_TRACE*), no system or user configuration, HOME pointing nowhere;
- overrides, on the command line (which wins over the repository's configuration), every key
  that names a program or a file outside the repository (`SAFE_CONFIG`), and passes the
  per-command switches that turn the rest off (`LOG_SAFETY`);
- is refused before it starts when the repository layout could lead git's reads outside the
  workspace (`check_repository`);
- runs in its own process group, under an address-space limit and a wall-clock deadline, and is
  killed (the whole group, SIGKILL) at the deadline, when its caller stops it, or when the
  server exits (PR_SET_PDEATHSIG on Linux, plus an atexit hook).
"""

from __future__ import annotations

import atexit
import os
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

# The address-space limit (RLIMIT_AS) of a git child. `git log -p` itself needs a few tens of MB
# (measured: 87 MB RSS for a 50 MB rewrite with the settings below); the limit leaves room for
# the mapped pack windows (core.packedGitLimit below), the delta-base cache and xdiff's work on
# files up to core.bigFileThreshold, and stops a repository crafted to make git allocate without
# bound (a 50 MB rewrite took git to 416 MB RSS when big files were diffed as text).
GIT_MEMORY_LIMIT = 512 * 2**20
# Files larger than this are diffed as binary ("Binary files differ"), never loaded whole: their
# hunks are generated code or data, not edits worth learning, and diffing them is what costs git
# memory and time.
BIG_FILE = "1m"
# PATH of a git child (git_env).
SAFE_PATH = os.defpath  # "/bin:/usr/bin" on Linux: git's own helpers are found via its exec-path
# `-c` settings for every command. Command-line configuration takes precedence over the
# repository's, so each of these beats what a hostile `.git/config` sets.
SAFE_CONFIG: tuple[str, ...] = (
    "core.fsmonitor=false",  # a program run when git refreshes the index
    "core.hooksPath=" + os.devnull,  # no hooks (no command here runs one; a guard all the same)
    "core.pager=cat",  # git never pages into a pipe; a guard with --no-pager and GIT_PAGER
    "pager.log=false",
    "credential.helper=",  # the empty value clears the list of helpers
    "core.askPass=",  # empty: no askpass program (and GIT_TERMINAL_PROMPT=0: no prompt)
    "core.sshCommand=false",  # the shell builtin, if a transport were ever started
    # No transport at all: a lazy fetch of a missing object (partial clones, refused in
    # check_repository) is the one way `git log` could start one. A repository's
    # protocol.<name>.allow beats protocol.allow, so the known names are pinned one by one.
    "protocol.allow=never",
    "protocol.file.allow=never",
    "protocol.git.allow=never",
    "protocol.ssh.allow=never",
    "protocol.http.allow=never",
    "protocol.https.allow=never",
    "protocol.ext.allow=never",
    "log.showSignature=false",  # verifying a signed commit runs gpg.program
    "gpg.program=false",
    "gpg.ssh.program=false",
    "gpg.x509.program=false",
    "log.mailmap=false",  # mailmap.file may name any file on the machine
    "diff.submodule=short",  # "log" opens the submodule's repository, wherever its gitdir points
    "core.attributesFile=" + os.devnull,  # attributes only from the repository's own tree
    "core.bigFileThreshold=" + BIG_FILE,
    # Bounded mappings and caches, so that git fits GIT_MEMORY_LIMIT on any repository (the
    # 64-bit defaults map 1 GiB pack windows up to many GiB in all).
    "core.packedGitWindowSize=32m",
    "core.packedGitLimit=128m",
    "core.deltaBaseCacheLimit=32m",
)
# Switches of `git log -p` that turn off what configuration or attributes could still start:
# textconv drivers (diff.<driver>.textconv, which also runs the smudge filter on the temporary
# file it feeds the driver), external diffs (diff.external, diff.<driver>.command), signature
# checks, notes and mailmap lookups, a diff.orderFile outside the repository, submodule logs.
# Clean/smudge/process filters run only when git converts between a blob and a worktree file;
# with textconv and external diffs off, `git log -p` never does.
LOG_SAFETY: tuple[str, ...] = ("--no-textconv", "--no-ext-diff", "--no-show-signature", "--no-notes",
                               "--no-use-mailmap", "--submodule=short", "-O" + os.devnull)

_include = re.compile(rb"\[\s*include", re.IGNORECASE)  # [include] and [includeIf "..."]
_lazy_fetch = re.compile(rb"partialclone|promisor", re.IGNORECASE)
_CONFIG_MAX = 1 << 20


class UnsafeRepository(Exception):
    """The repository's layout or configuration could lead git outside the workspace: not read."""


def check_repository(root: str) -> str | None:
    """The git directory of the repository at `root` (None: there is none), after checking that
    git reading it stays within the workspace; raises UnsafeRepository (its message says why)."""
    git_dir = os.path.join(root, ".git")
    try:
        st = os.lstat(git_dir)
    except (FileNotFoundError, NotADirectoryError):
        # Git itself would walk up to a parent's repository: one outside the workspace, not read.
        return None
    except OSError as e:
        raise UnsafeRepository(f"{git_dir} cannot be inspected: {e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRepository(f"{git_dir} is a symbolic link (to {os.readlink(git_dir)!r})")
    if stat.S_ISREG(st.st_mode):
        # A linked worktree's or a submodule's `.git` file: "gitdir: <path>" names a repository
        # elsewhere, and a worktree's shares a commondir elsewhere again. Whatever it names is
        # the checkout's choice, so it is not followed.
        raise UnsafeRepository(f"{git_dir} is a file ({_gitdir_line(git_dir)}): "
                               "its repository lies elsewhere")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRepository(f"{git_dir} is not a directory")
    # `commondir` makes the refs, objects and config those of another directory; `alternates`
    # adds object stores anywhere on the machine. Either leads git's reads outside the workspace.
    for name in ("commondir", os.path.join("objects", "info", "alternates")):
        if os.path.lexists(os.path.join(git_dir, name)):
            raise UnsafeRepository(f"{os.path.join(git_dir, name)} exists: "
                                   "it points git at another directory")
    for name in ("config", "config.worktree"):
        path = os.path.join(git_dir, name)
        try:
            with open(path, "rb") as f:
                text = f.read(_CONFIG_MAX + 1)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UnsafeRepository(f"{path} cannot be read: {e}") from None
        if len(text) > _CONFIG_MAX:
            raise UnsafeRepository(f"{path} is larger than {_CONFIG_MAX} bytes: not checked")
        # include.path / includeIf.<cond>.path pull in any file on the machine as configuration.
        # Git's parser accepts a section header anywhere a line may hold one (after another
        # header, after whitespace), so any "[include" is refused, comments included.
        if _include.search(text):
            raise UnsafeRepository(f"{path} has an [include] or [includeIf] section")
        # A partial clone fetches missing objects on demand through the remote the repository
        # configures (any transport or remote helper): nothing may be fetched.
        if _lazy_fetch.search(text):
            raise UnsafeRepository(f"{path} configures a partial clone (objects fetched on demand)")
    link = _symlink_in(git_dir)
    if link:
        raise UnsafeRepository(f"{link} is a symbolic link: git would read what it points at")
    return git_dir


def _gitdir_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "replace").strip().splitlines()[0][:300]
    except (OSError, IndexError):
        return "unreadable"


def _symlink_in(git_dir: str) -> str | None:
    """The first symbolic link among the parts of the git directory `git log` reads (HEAD,
    config, refs, packed-refs, shallow, grafts, the object store's directories and packs), or
    None. Loose objects themselves are not listed (there may be very many; a link there reads
    as a corrupt object, nothing more)."""
    for name in ("HEAD", "config", "config.worktree", "packed-refs", "shallow", "index", "info",
                 os.path.join("info", "grafts"), "objects", os.path.join("objects", "info"),
                 os.path.join("objects", "pack"), "refs"):
        path = os.path.join(git_dir, name)
        if os.path.islink(path):
            return path
    objects = os.path.join(git_dir, "objects")
    for sub in ("", "pack"):
        try:
            with os.scandir(os.path.join(objects, sub)) as it:
                for e in it:
                    if e.is_symlink():
                        return e.path
        except OSError:
            continue
    for dirpath, dirnames, filenames in os.walk(os.path.join(git_dir, "refs")):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                return path
    return None


def git_env(root: str, git_dir: str) -> dict[str, str]:
    """The whole environment of a git child: the repository pinned by GIT_DIR/GIT_WORK_TREE
    (no discovery, and core.worktree in the repository's config has no say), no system or user
    configuration, no prompts, no optional lock-taking writes."""
    return {
        "PATH": SAFE_PATH,
        "HOME": os.devnull,  # ~/.gitconfig, ~/.config/git/* do not exist under it
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_DIR": git_dir,
        "GIT_WORK_TREE": root,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_NO_LAZY_FETCH": "1",  # honoured from git 2.44; check_repository refuses partial clones anyway
        "GIT_PROTOCOL_FROM_USER": "0",
    }


def git_argv(git: str, *args: str) -> list[str]:
    argv = [git, "--no-pager"]
    for kv in SAFE_CONFIG:
        argv += ["-c", kv]
    return argv + list(args)


@dataclass
class Output:
    out: bytes
    returncode: int | None  # None: killed before it finished (deadline, stop, or the byte cap)
    capped: bool = False  # stdout reached max_bytes; the rest was not read
    timed_out: bool = False
    stopped: bool = False


# Process groups of the children alive now: killed when the server exits normally (PDEATHSIG
# covers the other ways it dies, on Linux).
_live: set[int] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    with _live_lock:
        groups = list(_live)
    for pgid in groups:
        _killpg(pgid)


atexit.register(kill_all)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if sys.platform.startswith("linux"):
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int
else:  # no PDEATHSIG: the atexit hook and the deadline remain
    _prctl = None
PR_SET_PDEATHSIG = 1
_SIGKILL = int(signal.SIGKILL)


def _child_setup(memory_bytes: int, parent_pid: int):
    """The preexec function of a child: the address-space limit, and (Linux) SIGKILL when the
    thread that started it exits (the kernel ties PDEATHSIG to that thread): the reading
    thread, which returns only after killing the child, or the whole server. It runs between
    fork and exec in a multi-threaded server, so it only calls into C: the ctypes function and
    the limits are prepared here, in the parent; no import, no lock, no logging."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    prctl = _prctl

    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before the signal was armed
                os._exit(127)

    return setup


def run_limited(argv: list[str], env: dict[str, str], cwd: str | None, timeout_s: float, max_bytes: int,
                memory_bytes: int = GIT_MEMORY_LIMIT, stop: threading.Event | None = None) -> Output:
    """Runs `argv` in its own session and process group under `memory_bytes` of address space,
    reads at most `max_bytes` of its stdout until `timeout_s` (monotonic) or `stop` is set, then
    kills the whole group. Raises OSError (or SubprocessError) when it cannot start."""
    deadline = time.monotonic() + timeout_s
    # preexec_fn in a threaded server: safe here, _child_setup's function only calls into C.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, cwd=cwd, close_fds=True, start_new_session=True,
                            preexec_fn=_child_setup(memory_bytes, os.getpid()))  # noqa: PLW1509
    pgid = proc.pid  # start_new_session: the child leads its own group
    with _live_lock:
        _live.add(pgid)
    res = Output(b"", None)
    chunks: list[bytes] = []
    size = 0
    eof = False
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    poller = select.poll()  # not select.select: a busy server's descriptors may exceed FD_SETSIZE
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        os.set_blocking(fd, False)
        while size < max_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                res.timed_out = True
                break
            if stop is not None and stop.is_set():
                res.stopped = True
                break
            if not poller.poll(min(left, 0.2) * 1000):
                continue
            try:
                chunk = os.read(fd, min(65536, max_bytes - size))
            except BlockingIOError:
                continue
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            size += len(chunk)
        res.capped = size >= max_bytes
        if eof:  # let it finish (exit status) within the deadline; not reaped yet: the group stays ours
            res.timed_out = not _exited(proc, deadline)
    finally:
        _killpg(pgid)  # the group: git and anything it started
        proc.wait()
        proc.stdout.close()
        with _live_lock:
            _live.discard(pgid)
    res.out = b"".join(chunks)
    if eof and not res.timed_out:
        res.returncode = proc.returncode
    return res


def _exited(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether the child exits before `deadline`, without reaping it (its pid, the group's id,
    is not reused while it is a zombie, so killing the group afterwards hits nobody else)."""
    if not hasattr(os, "waitid"):  # reaps it: the group's id may then be reused (a narrow race)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def run_git(root: str, git_dir: str, args: list[str], timeout_s: float, max_bytes: int,
            stop: threading.Event | None = None) -> Output | None:
    """`git <args>` on the checked repository at `root` with everything above; None: no git."""
    git = shutil.which("git")
    if git is None:
        return None
    return run_limited(git_argv(os.path.abspath(git), *args), git_env(root, git_dir), root, timeout_s,
                       max_bytes, stop=stop)
