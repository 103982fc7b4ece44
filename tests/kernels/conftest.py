"""Run the Triton kernels in the interpreter on CPU tensors.

TRITON_INTERPRET=1 must be set before `dlm.kernels.triton_ops` defines its
kernels: `@triton.jit` decides at definition time whether a kernel is compiled
or interpreted. Setting it here (at collection) covers the usual case; the
`tops` fixture also reloads the module if something in the same pytest process
imported it earlier without the interpreter, so the tests do not depend on
collection order.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest
from kernel_checks import poisoned_empty, seed_torch


def _interpreted_triton_ops():
    mod = sys.modules.get("dlm.kernels.triton_ops")
    if mod is None:
        from dlm.kernels import triton_ops as mod
    if not mod.INTERPRET:
        mod = importlib.reload(mod)  # env var is set now: kernels are redefined as interpreted
    assert mod.INTERPRET, "TRITON_INTERPRET=1 did not take effect; the kernel tests need the interpreter"
    return mod


@pytest.fixture(scope="session")
def tops_module():
    return _interpreted_triton_ops()


@pytest.fixture
def tops(tops_module, monkeypatch):
    """dlm.kernels.triton_ops with every output buffer poisoned (NaN / sentinel ints).

    An element the kernel forgets to write stays NaN (or -7777) and fails the comparison.
    """
    monkeypatch.setattr(tops_module, "_empty", poisoned_empty)
    return tops_module


@pytest.fixture(autouse=True)
def _seeded():
    yield seed_torch()
