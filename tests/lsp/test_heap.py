"""dlm.lsp.heap.fix_mmap_threshold: glibc's mmap threshold is fixed on Linux (freed index
tables go back to the system); elsewhere it does nothing and says so."""

from __future__ import annotations

import ctypes
import platform
import sys

import pytest
from dlm.lsp import heap


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="needs Linux with glibc"
)
def test_true_on_linux_with_glibc():
    assert heap.fix_mmap_threshold() is True
    assert heap.fix_mmap_threshold() is True  # calling it again is harmless


def test_false_off_linux(monkeypatch):
    def no_libc(*args, **kwargs):
        raise AssertionError("libc must not be opened off Linux")

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert heap.fix_mmap_threshold() is False
    monkeypatch.setattr(sys, "platform", "win32")
    assert heap.fix_mmap_threshold() is False


def test_false_on_a_linux_libc_without_mallopt(monkeypatch):
    class NoMallopt:  # musl has no mallopt symbol
        pass

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: NoMallopt())
    assert heap.fix_mmap_threshold() is False


def test_false_when_mallopt_refuses(monkeypatch):
    calls = []

    class Refusing:
        def __init__(self) -> None:
            def mallopt(param, value):
                calls.append((param, value))
                return 0

            self.mallopt = mallopt

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Refusing())
    assert heap.fix_mmap_threshold() is False
    assert calls == [(heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD)]


def test_deferred_full_collections_run_when_quiet_or_overdue(monkeypatch):
    """Once deferred, the collector's automatic full passes stop (generation 2's threshold is out
    of reach) and collect_if_due runs them: after a quiet spell at most every FULL_COLLECTION_MIN_S,
    and after FULL_COLLECTION_MAX_S even while suggestions run."""
    import gc

    saved = gc.get_threshold()
    monkeypatch.setattr(heap, "_deferred", False)
    try:
        assert heap.collect_if_due(True, 1e9) is False  # not deferred: the collector's own passes run
        heap.defer_full_collections()
        heap.defer_full_collections()  # idempotent
        assert gc.get_threshold()[:2] == saved[:2] and gc.get_threshold()[2] == heap.DEFERRED_THRESHOLD2
        passes = []
        monkeypatch.setattr(heap.gc, "collect", lambda *a: passes.append(a) or 0)
        monkeypatch.setattr(heap.gc, "get_count", lambda: (0, 0, 3))  # generation-1 passes since the last full one
        monkeypatch.setattr(heap, "_last_full", 1000.0)
        assert heap.collect_if_due(True, 1000.0 + heap.FULL_COLLECTION_MIN_S - 1) is False  # too soon
        assert heap.collect_if_due(False, 1000.0 + heap.FULL_COLLECTION_MIN_S + 1) is False  # typing
        assert heap.collect_if_due(True, 1000.0 + heap.FULL_COLLECTION_MIN_S + 1) is True
        assert len(passes) == 1
        t = 1000.0 + heap.FULL_COLLECTION_MIN_S + 1
        assert heap.collect_if_due(False, t + heap.FULL_COLLECTION_MAX_S) is True  # overdue, typing or not
        assert len(passes) == 2
        monkeypatch.setattr(heap.gc, "get_count", lambda: (0, 0, 0))  # nothing reached generation 2
        assert heap.collect_if_due(True, t + 2 * heap.FULL_COLLECTION_MAX_S) is False and len(passes) == 2
    finally:
        gc.set_threshold(*saved)
