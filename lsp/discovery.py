"""Which files of a project the repository memory may read, and reading them safely.

`walk(root, limits)` lists a root's source files without opening any of them
(one `scandir` per directory, `lstat` data only). It skips:

- what `.gitignore` excludes (lsp.gitignore: nested files, negation, `dir/`,
  anchored patterns; the `.gitignore` files above the root up to the git top and
  `.git/info/exclude` too), and the `exclude` option's patterns;
- vendored and build folders (`node_modules`, `.git`, `.venv`, `build`, `dist`,
  `target`, `site-packages`, ..., and any directory holding a `pyvenv.cfg`);
- secrets by name, whatever their extension: `.env*`, keys and certificates,
  credential stores, `.ssh/`, `.aws/`, `.gnupg/`, kubeconfig, ... (`is_secret_path`);
- files the model has no language for (the one table, coder_model.languages);
- files over `max_file_bytes` (a 50 MB minified bundle is never opened);
- anything that is not a regular file: symbolic links are never followed (no loop,
  and no link leads out of the project), FIFOs, sockets and devices are never opened.

It stops at `max_files` files or after `max_entries` directory entries (a
monorepo of a million files), and says why.

`read_source(path, max_file_bytes)` opens one file without following a link and
without blocking (`O_NOFOLLOW | O_NONBLOCK`: a file swapped for a FIFO after the
walk cannot hang it), checks again that it is a regular file, and refuses binary
(NUL bytes) and non-UTF-8 content, minified code (a line over `MAX_LINE_CHARS`),
and files that changed while being read; a line holding a private key or an access
token (coder_model.secrets) is emptied, and the file's other lines are kept. It never raises
for a file: a skipped file has a reason.

`read_workspace_file(root, path, max_file_bytes)` is how every part of the server reads
a file of a workspace (the index walk, watched-file events, the next-edit jump scan):
the same rules, with every component under the root opened from the one above it
without following a link, so no link at any depth, whenever it appeared, leads out of
the root.
"""

from __future__ import annotations

import errno
import fnmatch
import itertools
import logging
import os
import re
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dlm.coder_model import secrets
from dlm.coder_model.languages import language_for_path
from dlm.lsp.gitignore import IgnoreStack, IgnoreText, Rules

log = logging.getLogger(__name__)

# Folders of other people's code, tools' caches and build outputs: never the project's source.
VENDORED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".bzr", ".jj", "node_modules", "bower_components", "jspm_packages",
    ".venv", "venv", ".virtualenv", "virtualenv", "__pycache__", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", ".hypothesis", ".tox", ".nox", ".eggs", "site-packages", "dist-packages",
    "build", "dist", "target", "_build", ".gradle", ".m2", ".cargo", ".rustup", ".next", ".nuxt",
    ".svelte-kit", ".parcel-cache", ".turbo", ".cache", ".terraform", ".serverless", ".idea",
    ".vscode", ".vs", "vendor", "third_party", "Pods", "DerivedData", ".ipynb_checkpoints",
    ".direnv", ".pixi", ".conda",
})  # fmt: skip
VENDORED_SUFFIXES = (".egg-info", ".dist-info")

# Secrets. Directories whose every file is one:
SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".gcloud",
                         ".password-store", ".secrets", "secrets"})  # fmt: skip
# File names (lower case, fnmatch patterns) that hold credentials, keys or tokens:
SECRET_NAME_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".npmrc", ".yarnrc", ".yarnrc.yml",
    ".pypirc", ".pgpass", ".my.cnf", ".git-credentials", ".htpasswd", ".dockercfg", "kubeconfig",
    "kubeconfig.*", "*.kubeconfig", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem",
    "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc", "*.ppk",
    "*.crt", "*.cer", "*.der", "*.csr", "*.tfstate", "*.tfstate.*", "*.tfvars", "*credential*",
    "*secret*", "*password*", "*passwd*", "*token*.json", "service-account*.json",
    "*serviceaccount*.json", "known_hosts", "authorized_keys",
)  # fmt: skip
MAX_LINE_CHARS = 10_000  # a longer line is minified or generated code, not source to learn from
MAX_IGNORE_FILE_BYTES = 1_000_000


_SECRET_NAME = re.compile("|".join(fnmatch.translate(p) for p in SECRET_NAME_PATTERNS))


def is_secret_path(rel: str) -> bool:
    """Does this path (relative, '/'-separated) name a secret, by its name or a folder?"""
    parts = rel.lower().split("/")
    if any(p in SECRET_DIRS for p in parts[:-1]):
        return True
    return _SECRET_NAME.match(parts[-1]) is not None


def is_vendored_dir(name: str) -> bool:
    return name in VENDORED_DIRS or name.endswith(VENDORED_SUFFIXES)


def is_source_name(rel: str) -> bool:
    """A file the model has a language for (coder_model.languages, the one table)."""
    return language_for_path(rel) != ""


def refusal(root: str) -> str:
    """Why a root must not be indexed ('' when it may): `/`, the home directory and its
    ancestors hold far more than one project, and everyone's secrets."""
    try:
        real = os.path.realpath(root)
    except (OSError, ValueError):
        return f"the workspace root {root!r} is not a usable path"
    home = os.path.realpath(os.path.expanduser("~"))
    if real == os.path.sep:
        return "the workspace root is / (the whole file system)"
    if real == home:
        return f"the workspace root is the home directory {home}"
    if home.startswith(real.rstrip(os.path.sep) + os.path.sep):
        return f"the workspace root {real} holds the home directory {home}"
    return ""


@dataclass(frozen=True)
class Limits:
    max_files: int
    max_file_bytes: int
    max_entries: int  # directory entries looked at, of any kind

    @classmethod
    def for_files(cls, max_files: int, max_file_bytes: int) -> Limits:
        # Most entries of a tree are not source (tests data, images, ...): allow 20 per
        # indexed file before the walk gives up on a tree that is mostly something else.
        return cls(max_files, max_file_bytes, max(100_000, 20 * max_files))


@dataclass(frozen=True)
class Candidate:
    rel: str  # '/'-separated path relative to the root
    size: int
    mtime_ns: int


@dataclass
class WalkResult:
    files: list[Candidate] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    stopped: str = ""  # why the walk stopped early ('' when it saw everything)


def read_ignore_file(path: str) -> str:
    """A .gitignore's text ('' if missing, unreadable or not a regular file), as an
    `IgnoreText` that names the file. One over MAX_IGNORE_FILE_BYTES is not dropped, which
    would index what its first lines exclude: its first MAX_IGNORE_FILE_BYTES, cut at a
    line end, are honoured, a warning is logged, and the text says so (`truncated`,
    `message`); the Rules built from it carry that message in their `warnings`."""
    got = _read_regular(path, MAX_IGNORE_FILE_BYTES)
    if got == "too_large":
        return _read_ignore_head(path, MAX_IGNORE_FILE_BYTES)
    if isinstance(got, str):
        return ""
    data, st = got
    return IgnoreText(data.decode("utf-8", errors="replace"), path, st.st_size, st.st_size)


def _read_ignore_head(path: str, max_bytes: int) -> str:
    """The whole lines of the first `max_bytes` of an ignore file that is larger (opened
    as `_read_regular` opens: no link followed, never blocking, regular files only)."""
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        log.debug("index: cannot open %s: %s", path, exc)
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:  # one byte more: is the last line whole?
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        log.debug("index: cannot read %s: %s", path, exc)
        return ""
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) <= max_bytes:  # it shrank since: all of it
        return IgnoreText(data.decode("utf-8", errors="replace"), path, len(data), len(data))
    keep = max_bytes if data[max_bytes : max_bytes + 1] == b"\n" else data.rfind(b"\n", 0, max_bytes) + 1
    size = max(st.st_size, len(data))
    text = IgnoreText(data[:keep].decode("utf-8", errors="replace"), path, size, keep)
    log.warning("index: %s is %d bytes, over the %d bytes read of an ignore file: only its first "
                "%d bytes (%d lines) are honoured", path, size, max_bytes, keep, len(text.splitlines()))  # fmt: skip
    return text


def ignore_stack(root: str, patterns: list[str] | tuple[str, ...] = ()) -> IgnoreStack:
    """The ignore rules that apply at a root before walking it: the `exclude` option, the
    git top's `.git/info/exclude`, the `.gitignore` files from the git top down to the root
    (when the root is inside a git work tree) and the root's own."""
    stack = IgnoreStack()
    if patterns:
        stack.final = Rules("", [p for p in patterns if isinstance(p, str)],
                            origin="the index.exclude option")  # fmt: skip
    root_path = Path(root)
    # The git work tree the root is in, if any; not a repository at or above the home
    # directory (a dotfiles repository whose .gitignore says `*` is not the project's).
    home = Path(os.path.realpath(os.path.expanduser("~")))
    top = next((p for p in (root_path, *root_path.parents)
                if p != home and p not in home.parents and (p / ".git").exists()), None)  # fmt: skip
    if top is not None:
        outer = root_path.relative_to(top).as_posix()
        outer = "" if outer == "." else outer
        stack.add(Rules.from_text("", read_ignore_file(str(top / ".git" / "info" / "exclude")), outer=outer))
        # The .gitignore files between the git top and the root (the root is a subdirectory).
        for d in [top, *(p for p in reversed(root_path.parents) if top in p.parents)] if outer else []:
            rel_root = root_path.relative_to(d).as_posix()
            stack.add(Rules.from_text("", read_ignore_file(str(d / ".gitignore")), outer=rel_root))
    stack.add(Rules.from_text("", read_ignore_file(os.path.join(root, ".gitignore"))))
    return stack


def walk(
    root: str,
    limits: Limits,
    ignore: IgnoreStack,
    skip_dirs: frozenset[str] = frozenset(),
    pause: Callable[[], bool] = lambda: True,
) -> WalkResult:
    """The source files under `root`, sorted by path, without opening any (see the module
    docstring for what is skipped). `skip_dirs` are absolute directories left out (other
    roots, the cache). `pause()` is called between directories; it may block (predictions
    first) and returns False to abandon the walk."""
    out = WalkResult()
    entries = 0
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        if not pause():
            out.stopped = "stopped"
            return out
        abs_dir, rel_dir = stack.pop()
        if rel_dir:
            ignore.add(Rules.from_text(rel_dir, read_ignore_file(os.path.join(abs_dir, ".gitignore"))))
        try:
            with os.scandir(abs_dir) as it:  # never more than the entries left to look at
                listing = sorted(itertools.islice(it, limits.max_entries - entries + 1), key=lambda e: e.name)
        except OSError as exc:  # unreadable, vanished, or no longer a directory
            log.debug("index: skipping directory %s: %s", abs_dir, exc)
            out.skipped["unreadable_dir"] += 1
            continue
        subdirs: list[tuple[str, str]] = []
        for entry in listing:
            entries += 1
            if entries > limits.max_entries:
                out.stopped = (f"looked at {limits.max_entries} entries under {root} "
                               f"(found {len(out.files)} source files); the rest is not indexed")  # fmt: skip
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            kind = _kind(entry)
            if kind == "dir":
                reason = _dir_skip_reason(entry, rel, ignore, skip_dirs)
                if reason:
                    out.skipped[reason] += 1
                else:
                    subdirs.append((entry.path, rel))
                continue
            if kind != "file":
                out.skipped[kind] += 1  # symlink, special (FIFO, socket, device), vanished
                continue
            if not is_source_name(rel):
                out.skipped["not_source"] += 1
                continue
            if is_secret_path(rel):
                out.skipped["secret"] += 1
                continue
            if ignore.ignored_here(rel, False):
                out.skipped["ignored"] += 1
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                log.debug("index: skipping %s: %s", entry.path, exc)
                out.skipped["vanished"] += 1
                continue
            if st.st_size > limits.max_file_bytes:
                log.debug("index: skipping %s: %d bytes, over maxFileBytes %d", rel, st.st_size,
                          limits.max_file_bytes)  # fmt: skip
                out.skipped["too_large"] += 1
                continue
            out.files.append(Candidate(rel, st.st_size, st.st_mtime_ns))
            if len(out.files) >= limits.max_files:
                out.stopped = (f"reached maxFiles ({limits.max_files} files) under {root}; "
                               "the rest is not indexed (raise index.maxFiles to index more)")  # fmt: skip
                out.files.sort(key=lambda c: c.rel)
                return out
        stack.extend(reversed(subdirs))  # depth first, in name order
    out.files.sort(key=lambda c: c.rel)
    return out


def _kind(entry: os.DirEntry) -> str:
    try:
        if entry.is_symlink():
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        return "vanished"
    return "special"


def _dir_skip_reason(entry: os.DirEntry, rel: str, ignore: IgnoreStack, skip_dirs: frozenset[str]) -> str:
    name = entry.name
    if is_vendored_dir(name):
        return "vendored"
    if name.lower() in SECRET_DIRS:
        return "secret"
    if entry.path in skip_dirs:
        return "other_root"
    if ignore.ignored_here(rel, True):
        return "ignored"
    try:
        if os.path.lexists(os.path.join(entry.path, "pyvenv.cfg")):  # a virtualenv by any name
            return "vendored"
    except OSError:
        return "unreadable_dir"
    return ""


def path_allowed(root: str, rel: str, ignore: IgnoreStack, sources_only: bool = True) -> str:
    """Why `rel` under `root` may not be indexed ('' when it may), for a single path that
    did not come from `walk` (an open buffer, a watched-file event): the same rules, with
    the `.gitignore` files of its directories read if the walk has not read them.
    `sources_only=False`: a file of no known language passes too (what may be sent to a
    hosted engine: lsp.hosted_filter)."""
    parts = rel.split("/")
    if not rel or "" in parts or ".." in parts or "." in parts:
        return "outside the root"
    if any(is_vendored_dir(p) for p in parts[:-1]):
        return "vendored"
    if sources_only and not is_source_name(rel):
        return "not_source"
    if is_secret_path(rel):
        return "secret"
    for k in range(1, len(parts)):
        base = "/".join(parts[:k])
        d = os.path.join(root, *parts[:k])
        if os.path.lexists(os.path.join(d, "pyvenv.cfg")):
            return "vendored"
        if not ignore.has_base(base):
            ignore.add(Rules.from_text(base, read_ignore_file(os.path.join(d, ".gitignore"))))
    if ignore.ignored(rel, False):
        return "ignored"
    return ""


@dataclass(frozen=True)
class Source:
    text: str
    size: int
    mtime_ns: int


def read_source(path: str, max_file_bytes: int) -> Source | str:
    """The text of one source file, or the reason it is skipped (a short word; never raises).
    Only the last component of `path` is kept from being a link: a file of a workspace is read
    with `read_workspace_file`, which refuses a link at any component under the root."""
    got = _read_regular(path, max_file_bytes)
    return got if isinstance(got, str) else _source_of(*got)


def read_workspace_file(root: str, path: str | bytes, max_file_bytes: int,
                        between: Callable[[], None] | None = None) -> Source | str:
    """The text of the file `path` of the workspace root `root` (absolute, or relative to the
    root; str or bytes), or the reason it is not read (a short word; never raises, never blocks).

    Every component under the root is opened from the one above it (`openat`, `O_NOFOLLOW`),
    so no link at any depth leads out of the root, whenever it appeared: a folder swapped for a
    link after the walk reads nothing. Only a regular file is opened (`lstat` first, then
    `O_NONBLOCK` and `fstat`: a FIFO or a device is never waited on), at most `max_file_bytes`
    bytes are read, and the content rules of `read_source` apply. The root itself may be a link
    (the user chose it). `between` is called between the pieces of a long file's secret scan
    (the indexer waits there while a suggestion runs)."""
    rel = workspace_rel(root, path)
    if rel is None:
        return "outside_root"
    fd = _open_inside(root, rel)
    if isinstance(fd, str):
        return fd
    try:
        got = _read_fd(fd, max_file_bytes, rel)
    finally:
        os.close(fd)
    return got if isinstance(got, str) else _source_of(*got, between=between)


def workspace_rel(root: str, path: str | bytes) -> str | None:
    """`path` (absolute, or relative to `root`; str or bytes) as a '/'-separated path relative
    to `root`, or None when it is not a file under it (`..`, `.` or empty components). Names that
    are not UTF-8 stay as `os.fsdecode` makes them (surrogate escapes), so they round-trip."""
    try:
        text = os.fsdecode(path)
    except (TypeError, ValueError):
        return None
    if os.path.isabs(text):
        for base in (root, os.path.realpath(root)):
            prefix = base.rstrip("/") + "/"
            if text.startswith(prefix):
                text = text[len(prefix) :]
                break
        else:
            return None
    parts = text.split("/")
    if not text or "\0" in text or any(p in ("", ".", "..") for p in parts):
        return None
    return text


def link_under(root: str, rel: str) -> str:
    """'symlink' when a component of `rel` under `root` is a symbolic link, else '' (components
    that do not exist yet, a new buffer's, are no link). For text that does not come from the
    disk (an open buffer): a file reached through a link is not the workspace's."""
    here = root
    for name in rel.split("/"):
        here = os.path.join(here, name)
        try:
            st = os.lstat(here)
        except OSError:
            return ""
        if stat.S_ISLNK(st.st_mode):
            return "symlink"
    return ""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = (os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_NOCTTY", 0))  # fmt: skip


def _open_inside(root: str, rel: str) -> int | str:
    """A read-only descriptor of the regular file `rel` under `root`, opened one component at a
    time from the root's descriptor without following a link, or why not."""
    if os.open not in os.supports_dir_fd or os.stat not in os.supports_dir_fd or not _NOFOLLOW:
        # No openat here: lstat each component, then open the last without following it.
        if link_under(root, rel):
            return "symlink"
        try:
            return _checked_fd(os.open(os.path.join(root, rel), _FILE_FLAGS))
        except FileNotFoundError:
            return "vanished"
        except OSError as exc:
            return "symlink" if exc.errno == errno.ELOOP else "unreadable"
    try:
        dfd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return "vanished"
    except OSError as exc:
        log.debug("index: cannot open the root %s: %s", root, exc)
        return "unreadable"
    try:
        *folders, name = rel.split("/")
        for i, step in enumerate([*folders, name]):
            last = i == len(folders)
            try:
                st = os.stat(step, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return "vanished"
            except OSError as exc:  # EACCES, ENOTDIR, ...
                log.debug("index: cannot look at %s under %s: %s", step, root, exc)
                return "unreadable"
            if stat.S_ISLNK(st.st_mode):
                return "symlink"
            if not last and not stat.S_ISDIR(st.st_mode):
                return "vanished"  # a file where the path has a folder
            if last and not stat.S_ISREG(st.st_mode):
                return "special"  # a FIFO, socket or device is never opened
            try:
                fd = os.open(step, (_FILE_FLAGS if last else _DIR_FLAGS | _NOFOLLOW), dir_fd=dfd)
            except FileNotFoundError:
                return "vanished"
            except OSError as exc:  # ELOOP: it became a link since the lstat
                return "symlink" if exc.errno in (errno.ELOOP, errno.EMLINK) else "unreadable"
            os.close(dfd)
            dfd = fd
            if last:
                fd, dfd = dfd, -1
                return _checked_fd(fd)
        return "vanished"
    finally:
        if dfd >= 0:
            os.close(dfd)


def _checked_fd(fd: int) -> int | str:
    """`fd` when it is a regular file (closed otherwise, and why)."""
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return "unreadable"
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return "special"
    return fd


def _source_of(data: bytes, st: os.stat_result, between: Callable[[], None] | None = None) -> Source | str:
    """The content rules of `read_source` for a file's bytes."""
    if b"\0" in data:
        return "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8"
    text = text.removeprefix("\ufeff")
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        return "minified"
    # A line holding a secret (coder_model.secrets) is emptied; the file's other lines are indexed.
    # In pieces: one scan of a megabyte holds the GIL for 100-400 ms, long enough to stall a
    # suggestion computed meanwhile.
    text, masked = secrets.mask_in_pieces(text, between or _no_pause)
    if masked:
        log.debug("index: %d line(s) holding a secret masked", masked)
    return Source(text, st.st_size, st.st_mtime_ns)


def _no_pause() -> None:
    pass


def check_text(text: str, max_file_bytes: int) -> str:
    """Why an open buffer's text may not be indexed ('' when it may): the content rules of
    `read_source` for text that comes from the editor instead of the disk. A secret does not
    refuse a buffer: RepoMemory.update_file empties its line (coder_model.secrets), whoever calls it."""
    if len(text) > max_file_bytes or len(text.encode("utf-8", errors="replace")) > max_file_bytes:
        return "too_large"
    if "\0" in text:
        return "binary"
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        return "minified"
    return ""


def _read_regular(path: str, max_bytes: int) -> tuple[bytes, os.stat_result] | str:
    """(bytes, stat) of a regular file of at most `max_bytes`, or why not (its last component
    is not followed if it is a link; `_open_inside` checks every component under a root)."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except FileNotFoundError:
        return "vanished"
    except OSError as exc:  # EACCES, ELOOP (a symlink), ENXIO (a socket), ...
        log.debug("index: cannot open %s: %s", path, exc)
        return "unreadable"
    try:
        return _read_fd(fd, max_bytes, path)
    finally:
        os.close(fd)


def _read_fd(fd: int, max_bytes: int, what: str) -> tuple[bytes, os.stat_result] | str:
    """(bytes, stat) of the open regular file `fd`: at most `max_bytes` (one byte more is
    read to tell a file that grew), or why not. Never blocks: `fd` is checked to be a regular
    file first (a FIFO or a device is never read)."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "special"
        if st.st_size > max_bytes:
            return "too_large"
        chunks: list[bytes] = []
        got = 0
        want = min(st.st_size, max_bytes) + 1  # one byte more than it should have: did it grow?
        while got < want:
            chunk = os.read(fd, min(1 << 20, want - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            return "too_large"
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) or got != st.st_size:
            log.debug("index: %s changed while being read; it will be read again later", what)
            return "changed"
        return b"".join(chunks), st
    except OSError as exc:
        log.debug("index: cannot read %s: %s", what, exc)
        return "unreadable"
