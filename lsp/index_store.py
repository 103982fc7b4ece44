"""The persisted repository memory of one workspace root, in the user's cache.

Where: `$XDG_CACHE_HOME/dlm-lsp/<sha256 of the root's real path>/index.bin`
(`~/.cache` without XDG_CACHE_HOME), the folder 0700 and the file 0600: the
index holds the project's code, so only its owner may read it. Nothing is ever
written into the project: a cache folder inside the root is refused.

One file: a fixed header (magic, format version, lengths, SHA-256 of the rest),
a JSON header (the root, what each file looked like when indexed, the options
that shaped it) and the memory's own bytes (`RepoMemory.save`). A file that is
truncated, corrupt, from another root or another format is reported by `load`
(and rebuilt by the caller), never trusted. `save` writes a temporary file in
the same folder, fsyncs it and renames it over the old one, so a crash or a full
disk never leaves half a file; on an error the old index stays and the caller
keeps serving from memory.

The cache follows no link: its folders and files are made and opened from the folder
above them (`openat`, `O_NOFOLLOW`), so a link in the place of the `dlm-lsp` folder,
the root's folder, `index.bin` or `lock` neither redirects a write nor has its target
chmod-ed; it is refused with a message ("... is a symbolic link; remove it"), and the
index then runs without persistence. The user's cache folder itself ($XDG_CACHE_HOME
or ~/.cache) may be a link: the user chose it.

Two servers on one root: the first takes a lock (`fcntl.flock`, non-blocking)
on `lock` in the folder and is the only one that writes; the other reads the
persisted index but never writes it (`writable` is False, `message` says why).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

try:
    import fcntl
except ImportError:  # not on POSIX: no lock, so never write (two servers could clash)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

T = TypeVar("T")

APP_DIR = "dlm-lsp"
INDEX_FILE = "index.bin"
LOCK_FILE = "lock"
MAGIC = b"DLMREPO\n"
FORMAT_VERSION = 1
# magic, format version, JSON header length, memory length, SHA-256 of JSON header + memory
_FIXED = struct.Struct(">8sIQQ32s")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


class _Refused(Exception):
    """A link, or something of another kind or owner, where the cache keeps its folder or a file."""


def _link_message(path: Path) -> str:
    return (f"{path} is a symbolic link; remove it: the cache never follows links "
            "(the index stays in memory until then)")  # fmt: skip


def cache_base() -> Path:
    """The user's cache folder: $XDG_CACHE_HOME when set to an absolute path, else ~/.cache."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    return Path(os.path.expanduser("~")) / ".cache"


def root_key(root: str) -> str:
    return hashlib.sha256(os.path.realpath(root).encode("utf-8", errors="surrogateescape")).hexdigest()


def cache_dir_for(root: str) -> Path:
    return cache_base() / APP_DIR / root_key(root)


class IndexStore:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.dir = cache_dir_for(root)
        self.path = self.dir / INDEX_FILE
        self.writable = False
        self.message = ""  # why this server does not write the index ('' when it does)
        self.persist = True  # False: a link or a stranger's file in the cache's place; no load, no save
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # the cache folder, opened without following a link

    # ---- the folder and the lock -----------------------------------------------------------------
    def open(self) -> None:
        """Make the folder (0700) and take the root's lock; sets `writable` and `message`."""
        real_dir = os.path.realpath(self.dir)
        if real_dir == self.root or real_dir.startswith(self.root.rstrip(os.sep) + os.sep):
            self._read_only(f"the cache folder {self.dir} is inside the project {self.root}; "
                            "nothing is written into a project, so the index stays in memory "
                            "(set XDG_CACHE_HOME outside the project to keep it between runs)")  # fmt: skip
            return
        try:
            self.dir.parent.parent.mkdir(parents=True, exist_ok=True)  # ~/.cache: the user's own
            self._dir_fd = self._open_dir(create=True)
            for name in (INDEX_FILE, LOCK_FILE):
                self._refuse_link(name)
        except _Refused as exc:
            self._no_persistence(str(exc))
            return
        except OSError as exc:
            self._read_only(f"cannot use the cache folder {self.dir} ({exc}); the index stays in "
                            "memory (check that XDG_CACHE_HOME or ~/.cache is writable)")  # fmt: skip
            return
        if fcntl is None:
            self._read_only("no file locking on this platform; the index stays in memory")
            return
        lock = self.dir / LOCK_FILE
        try:
            fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, 0o600,
                         dir_fd=self._dir_fd)  # fmt: skip
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # it became a link since it was looked at
                self._no_persistence(_link_message(lock))
            else:
                self._read_only(f"cannot open the lock {lock} ({exc}); the index stays in memory")
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            self._no_persistence(f"the lock {lock} is not a file of yours; remove it "
                                 "(the index stays in memory until then)")  # fmt: skip
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self._read_only(f"another dlm-lsp holds the index of {self.root} (lock {lock}); "
                            "this one reads it but keeps its changes in memory")  # fmt: skip
            return
        self._lock_fd = fd
        self.writable = True
        try:
            names = os.listdir(self._dir_fd)
            stale = [n for n in names if n.startswith(f".{INDEX_FILE}.") and n.endswith(".tmp")]
        except OSError:
            stale = []
        for name in stale:  # a save cut short (we hold the lock)
            try:
                os.unlink(name, dir_fd=self._dir_fd)
            except OSError:
                pass

    def _open_dir(self, create: bool) -> int:
        """The cache folder's descriptor: from the user's cache down, the `dlm-lsp` folder and
        the root's folder (made 0700 when `create`) are opened from the one above without
        following a link, and must be the user's (a looser mode is tightened on the folder
        itself, never on a link's target). _Refused for a link or a stranger's folder;
        FileNotFoundError when it is not there (and not `create`)."""
        fd = os.open(self.dir.parent.parent, _DIR_FLAGS)  # the user's cache: a link there is theirs
        try:
            for name, path in ((APP_DIR, self.dir.parent), (self.dir.name, self.dir)):
                if create:
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise _Refused(_link_message(path))
                if not stat.S_ISDIR(st.st_mode):
                    raise _Refused(f"{path} is not a folder; remove it (the index stays in memory "
                                   "until then)")  # fmt: skip
                try:
                    sub = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link since the lstat
                        raise _Refused(_link_message(path)) from exc
                    raise
                os.close(fd)
                fd = sub
                st = os.fstat(fd)
                if st.st_uid != os.getuid():
                    raise _Refused(f"the cache folder {path} belongs to another user; the index stays in "
                                   "memory (fix the folder's owner or XDG_CACHE_HOME)")  # fmt: skip
                if create and st.st_mode & 0o077:
                    os.fchmod(fd, 0o700)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _refuse_link(self, name: str) -> None:
        """_Refused when the cache folder's `name` is a link (a missing one is fine)."""
        try:
            st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise _Refused(_link_message(self.dir / name))

    def _no_persistence(self, message: str) -> None:
        """Something in the cache's place that it must not use: said once, and the index runs in
        memory only (nothing loaded from there, nothing written there)."""
        self.persist = False
        self.writable = False
        self.message = message
        log.warning("index: %s", message)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def _read_only(self, message: str) -> None:
        self.writable = False
        self.message = message
        log.info("index: %s", message)

    def close(self) -> None:
        for fd in (self._lock_fd, self._dir_fd):
            if fd is not None:
                try:
                    os.close(fd)  # the lock's releases the flock
                except OSError:
                    pass
        self._lock_fd = self._dir_fd = None
        self.writable = False

    # ---- load and save ---------------------------------------------------------------------------
    def load(self, read_memory: Callable[[BinaryIO], T]) -> tuple[T, dict[str, Any]] | None:
        """(memory, JSON header) from the persisted index, or None when there is none or it
        cannot be trusted (logged: truncated, corrupt, another root or format); the caller
        rebuilds. Never raises for a bad file. Nothing is loaded through a link, nor from a file
        that is not a regular file of the user's."""
        if not self.persist:
            return None
        try:
            dir_fd = self._dir_fd if self._dir_fd is not None else self._open_dir(create=False)
        except FileNotFoundError:
            return None
        except (_Refused, OSError) as exc:
            log.warning("index: cannot read %s (%s); rebuilding the index", self.path, exc)
            return None
        try:
            fd = os.open(INDEX_FILE, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = _link_message(self.path) if exc.errno == errno.ELOOP else str(exc)
            log.warning("index: cannot read %s (%s); rebuilding the index", self.path, why)
            return None
        finally:
            if dir_fd != self._dir_fd:
                os.close(dir_fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            log.warning("index: %s is not a file of yours; rebuilding the index", self.path)
            return None
        with os.fdopen(fd, "rb") as fh:
            try:
                return self._load(fh, read_memory)
            except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, rebuild
                log.warning("index: the persisted index %s is unusable (%s); rebuilding it", self.path, exc)
                return None

    def _load(self, fh: BinaryIO, read_memory: Callable[[BinaryIO], T]) -> tuple[T, dict[str, Any]]:
        if self.writable and os.fstat(fh.fileno()).st_mode & 0o077:
            os.fchmod(fh.fileno(), 0o600)  # written by something looser: only the owner reads it
        fixed = fh.read(_FIXED.size)
        if len(fixed) < _FIXED.size:
            raise ValueError("truncated: shorter than its fixed header")
        magic, version, header_len, memory_len, digest = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise ValueError("not a dlm-lsp repository index")
        if version != FORMAT_VERSION:
            raise ValueError(f"format {version}, this server reads {FORMAT_VERSION}")
        size = os.fstat(fh.fileno()).st_size
        if size != _FIXED.size + header_len + memory_len:
            raise ValueError(f"truncated or padded: {size} bytes, the header says "
                             f"{_FIXED.size + header_len + memory_len}")  # fmt: skip
        h = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            h.update(chunk)
        if h.digest() != digest:
            raise ValueError("corrupt: checksum mismatch")
        fh.seek(_FIXED.size)
        header = json.loads(fh.read(header_len).decode("utf-8"))
        if not isinstance(header, dict) or header.get("root") != self.root:
            raise ValueError(
                f"it indexes another root ({header.get('root') if isinstance(header, dict) else '?'})"
            )
        fh.seek(_FIXED.size + header_len)
        memory = read_memory(fh)  # the memory's bytes run to the end of the file
        return memory, header

    def save(self, write_memory: Callable[[BinaryIO], None], header: dict[str, Any]) -> bool:
        """Persist atomically (temp file, fsync, rename); True when written. Only a writable
        store writes. An error (a full disk, a vanished folder) is logged and the previous
        index, if any, stays as it was."""
        if not self.writable or self._dir_fd is None:
            return False
        header = {**header, "root": self.root}
        dir_fd = self._dir_fd
        tmp = f".{INDEX_FILE}.{os.getpid()}.tmp"
        try:
            try:  # a save of ours cut short (a link there is removed, not followed)
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
            with os.fdopen(fd, "w+b") as fh:
                head = json.dumps(header, separators=(",", ":")).encode("utf-8")
                fh.write(b"\0" * _FIXED.size)
                fh.write(head)
                write_memory(fh)
                fh.flush()
                end = fh.tell()
                memory_len = end - _FIXED.size - len(head)
                fh.seek(_FIXED.size)
                h = hashlib.sha256()
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                fh.seek(0)
                fh.write(_FIXED.pack(MAGIC, FORMAT_VERSION, len(head), memory_len, h.digest()))
                fh.flush()
                os.fsync(fh.fileno())
            try:
                self._refuse_link(INDEX_FILE)
            except _Refused as exc:
                os.unlink(tmp, dir_fd=dir_fd)
                self._no_persistence(str(exc))
                return False
            os.replace(tmp, INDEX_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # renames, never follows
            try:
                os.fsync(dir_fd)
            except OSError:
                pass
            return True
        except Exception as exc:  # noqa: BLE001 - ENOSPC, EIO, a memory that cannot save: keep serving
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            hint = " (free some disk space)" if getattr(exc, "errno", None) == errno.ENOSPC else ""
            log.warning("index: could not save the index of %s to %s (%s); serving it from memory, and "
                        "the files it lacks on disk are read again at the next start%s",
                        self.root, self.path, exc, hint)  # fmt: skip
            return False
