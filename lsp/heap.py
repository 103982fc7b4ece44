"""The process's heap: freed memory goes back to the operating system, and the cyclic garbage
collector's full passes run when no suggestion waits.

Freed memory (glibc's malloc, on Linux).

The index's tables are large arrays built and dropped as it merges them.
glibc serves an allocation above its mmap threshold with its own mapping,
returned to the system when freed; but after each such free it raises the
threshold to that size (up to 32 MB), so later arrays below it come from the
heap, whose freed holes the process keeps. Indexing 13.9M tokens of Python
left 866 MB resident that way, against 624 MB with the threshold fixed at
MMAP_THRESHOLD (fixing it also stops the raising). Elsewhere (macOS, musl,
Windows) this does nothing.

Full collections. CPython's collector scans every tracked object in a full
(generation 2) pass, and it starts one from whatever thread allocates when the
long-lived objects have grown by a quarter. An index of 13.4M tokens holds
about 400k tracked objects (its snippet windows' arrays) and torch another
170k: a full pass takes 70-150 ms holding the GIL, and during a bulk index it
fell on the keystrokes that made the p99 of inline suggestions. With
`defer_full_collections` the automatic passes stop at generation 1, and the
indexer runs the full pass itself (`collect_if_due`) after a quiet spell, or
after FULL_COLLECTION_MAX_S of typing without one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations get their own mapping
# Generation-1 passes between automatic full passes once deferred: never in practice (about 7e9
# allocations); the owner's collect_if_due runs them instead.
DEFERRED_THRESHOLD2 = 1_000_000
FULL_COLLECTION_MAX_S = 600.0  # a full pass runs at least this often, quiet spell or not
FULL_COLLECTION_MIN_S = 30.0  # and at most this often after a quiet spell

_lock = threading.Lock()
_deferred = False
_last_full = time.monotonic()


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold (call once, at the start of a long-running command);
    True when set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; freed memory may stay in the heap")
    return ok


def defer_full_collections() -> None:
    """Stop the collector's automatic full passes (the caller runs `collect_if_due` from a
    thread that can wait; generations 0 and 1 are still collected as usual). Idempotent."""
    global _deferred
    with _lock:
        if _deferred:
            return
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, DEFERRED_THRESHOLD2)
        _deferred = True


def collect_if_due(quiet: bool, now: float | None = None) -> bool:
    """Run a full pass when full passes are deferred and one is due: after a quiet spell (no
    suggestion runs, `quiet`) and FULL_COLLECTION_MIN_S since the last one, or after
    FULL_COLLECTION_MAX_S whatever happens. True when it ran."""
    global _last_full
    now = time.monotonic() if now is None else now
    with _lock:
        if not _deferred:
            return False
        since = now - _last_full
        if not (since >= FULL_COLLECTION_MAX_S or (quiet and since >= FULL_COLLECTION_MIN_S)):
            return False
        if gc.get_count()[2] == 0:  # no generation-1 pass since the last full one: nothing new
            _last_full = now
            return False
        _last_full = now
    gc.collect()
    return True
