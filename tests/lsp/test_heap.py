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
