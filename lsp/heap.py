"""Freed memory goes back to the operating system (glibc's malloc, on Linux).

The index's tables are large arrays built and dropped as it merges them.
glibc serves an allocation above its mmap threshold with its own mapping,
returned to the system when freed; but after each such free it raises the
threshold to that size (up to 32 MB), so later arrays below it come from the
heap, whose freed holes the process keeps. Indexing 13.9M tokens of Python
left 866 MB resident that way, against 624 MB with the threshold fixed at
MMAP_THRESHOLD (fixing it also stops the raising). Elsewhere (macOS, musl,
Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 256 * 1024  # bytes: larger allocations get their own mapping


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
