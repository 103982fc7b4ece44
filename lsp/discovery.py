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
(NUL bytes) and non-UTF-8 content, files with a private key or an access token
in them, minified code (a line over `MAX_LINE_CHARS`), and files that changed
while being read. It never raises for a file: a skipped file has a reason.
"""

from __future__ import annotations

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

from dlm.coder_model.languages import language_for_path
from dlm.lsp.gitignore import IgnoreStack, Rules

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
# Content that makes any file a secret: private keys and well-known token shapes.
SECRET_CONTENT = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"|PuTTY-User-Key-File-\d"
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{36,}\b|\bgithub_pat_[A-Za-z0-9_]{40,}\b"  # GitHub tokens
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|\bAIza[0-9A-Za-z_\-]{35}\b"  # Google API keys
    r"|\bsk_live_[0-9A-Za-z]{16,}"  # Stripe live keys
)
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
    """A .gitignore's text ('' if missing, unreadable, not a regular file or too large)."""
    got = _read_regular(path, MAX_IGNORE_FILE_BYTES)
    if isinstance(got, str):
        return ""
    data, _ = got
    return data.decode("utf-8", errors="replace")


def ignore_stack(root: str, patterns: list[str] | tuple[str, ...] = ()) -> IgnoreStack:
    """The ignore rules that apply at a root before walking it: the `exclude` option, the
    git top's `.git/info/exclude`, the `.gitignore` files from the git top down to the root
    (when the root is inside a git work tree) and the root's own."""
    stack = IgnoreStack()
    if patterns:
        stack.final = Rules("", [p for p in patterns if isinstance(p, str)])
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


def path_allowed(root: str, rel: str, ignore: IgnoreStack) -> str:
    """Why `rel` under `root` may not be indexed ('' when it may), for a single path that
    did not come from `walk` (an open buffer, a watched-file event): the same rules, with
    the `.gitignore` files of its directories read if the walk has not read them."""
    parts = rel.split("/")
    if not rel or "" in parts or ".." in parts or "." in parts:
        return "outside the root"
    if any(is_vendored_dir(p) for p in parts[:-1]):
        return "vendored"
    if not is_source_name(rel):
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
    """The text of one source file, or the reason it is skipped (a short word; never raises)."""
    got = _read_regular(path, max_file_bytes)
    if isinstance(got, str):
        return got
    data, st = got
    if b"\0" in data:
        return "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8"
    text = text.removeprefix("\ufeff")
    if SECRET_CONTENT.search(text):
        return "secret_content"
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        return "minified"
    return Source(text, st.st_size, st.st_mtime_ns)


def check_text(text: str, max_file_bytes: int) -> str:
    """Why an open buffer's text may not be indexed ('' when it may): the content rules of
    `read_source` for text that comes from the editor instead of the disk."""
    if len(text) > max_file_bytes or len(text.encode("utf-8", errors="replace")) > max_file_bytes:
        return "too_large"
    if "\0" in text:
        return "binary"
    if SECRET_CONTENT.search(text):
        return "secret_content"
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        return "minified"
    return ""


def _read_regular(path: str, max_bytes: int) -> tuple[bytes, os.stat_result] | str:
    """(bytes, stat) of a regular file of at most `max_bytes`, or why not."""
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return "vanished"
    except OSError as exc:  # EACCES, ELOOP (a symlink), ENXIO (a socket), ...
        log.debug("index: cannot open %s: %s", path, exc)
        return "unreadable"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "special"
        if st.st_size > max_bytes:
            return "too_large"
        chunks: list[bytes] = []
        got = 0
        while got <= st.st_size:  # one byte more than it should have: did it grow?
            chunk = os.read(fd, min(1 << 20, st.st_size + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns) or got != st.st_size:
            log.debug("index: %s changed while being read; it will be read again later", path)
            return "changed"
        return b"".join(chunks), st
    except OSError as exc:
        log.debug("index: cannot read %s: %s", path, exc)
        return "unreadable"
    finally:
        os.close(fd)
