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
        self._lock_fd: int | None = None

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
            self.dir.parent.mkdir(mode=0o700, exist_ok=True)  # dlm-lsp/: no one else lists the roots
            self.dir.mkdir(mode=0o700, exist_ok=True)
            st = os.stat(self.dir)
            if st.st_uid != os.getuid():
                self._read_only(f"the cache folder {self.dir} belongs to another user; "
                                "the index stays in memory (fix the folder's owner or XDG_CACHE_HOME)")  # fmt: skip
                return
            if st.st_mode & 0o077:
                os.chmod(self.dir, 0o700)
        except OSError as exc:
            self._read_only(f"cannot use the cache folder {self.dir} ({exc}); the index stays in "
                            "memory (check that XDG_CACHE_HOME or ~/.cache is writable)")  # fmt: skip
            return
        if fcntl is None:
            self._read_only("no file locking on this platform; the index stays in memory")
            return
        try:
            fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._read_only(f"cannot open the lock {self.dir / LOCK_FILE} ({exc}); the index stays in memory")
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self._read_only(f"another dlm-lsp holds the index of {self.root} (lock {self.dir / LOCK_FILE}); "
                            "this one reads it but keeps its changes in memory")  # fmt: skip
            return
        self._lock_fd = fd
        self.writable = True
        for stale in self.dir.glob(f".{INDEX_FILE}.*.tmp"):  # a save cut short (we hold the lock)
            try:
                stale.unlink()
            except OSError:
                pass

    def _read_only(self, message: str) -> None:
        self.writable = False
        self.message = message
        log.info("index: %s", message)

    def close(self) -> None:
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)  # releases the flock
            except OSError:
                pass
            self._lock_fd = None
        self.writable = False

    # ---- load and save ---------------------------------------------------------------------------
    def load(self, read_memory: Callable[[BinaryIO], T]) -> tuple[T, dict[str, Any]] | None:
        """(memory, JSON header) from the persisted index, or None when there is none or it
        cannot be trusted (logged: truncated, corrupt, another root or format); the caller
        rebuilds. Never raises for a bad file."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("index: cannot read %s (%s); rebuilding the index", self.path, exc)
            return None
        with fh:
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
        if not self.writable:
            return False
        header = {**header, "root": self.root}
        tmp = self.dir / f".{INDEX_FILE}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
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
            os.replace(tmp, self.path)
            _fsync_dir(self.dir)
            return True
        except Exception as exc:  # noqa: BLE001 - ENOSPC, EIO, a memory that cannot save: keep serving
            try:
                os.unlink(tmp)
            except OSError:
                pass
            hint = " (free some disk space)" if getattr(exc, "errno", None) == errno.ENOSPC else ""
            log.warning("index: could not save the index of %s to %s (%s); serving it from memory, and "
                        "the files it lacks on disk are read again at the next start%s",
                        self.root, self.path, exc, hint)  # fmt: skip
            return False


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
