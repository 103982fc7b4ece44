"""Tests that need a CUDA GPU: marked `cuda`, skipped with "needs a CUDA GPU" elsewhere.

Run them alone on a GPU box: `pytest -m cuda tests/cuda` (the GPU runbook,
drivers/training/gpu_runbook.py, does in its first device call). They also
run inside a whole-suite run: the Triton kernels are compiled here, not
interpreted; tests/kernels/conftest.py sets TRITON_INTERPRET=1 for its own
tests at collection, so the `cuda_ops` fixture below takes the variable away
for the duration of these tests, redefines the kernels compiled, and puts both
back afterwards.

The dream/llada tiny checkpoints come from tests/coder_model/families/family_helpers.py
and the kernel criterion from tests/kernels/kernel_checks.py (their folders are put on
sys.path here, as pytest does for its own tests).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
# family_helpers (tiny checkpoints) and kernel_checks (the kernel-vs-reference criterion)
for _folder in (HERE.parent / "coder_model" / "families", HERE.parent / "kernels"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from kernel_checks import poisoned_empty, seed_torch  # after the path above

HAS_CUDA = torch.cuda.is_available()
NEEDS_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is False); run on a GPU box, e.g. via the GPU runbook"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cuda)
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason=NEEDS_CUDA))


def _reload_triton_ops(interpret: str | None):
    if interpret is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = interpret
    mod = sys.modules.get("dlm.kernels.triton_ops")
    if mod is None:
        from dlm.kernels import triton_ops as mod
    if bool(mod.INTERPRET) != (interpret == "1"):
        mod = importlib.reload(mod)
    return mod


@pytest.fixture(scope="session")
def cuda_ops():
    """dlm.kernels.triton_ops with compiled (not interpreted) kernels, for the session's CUDA tests."""
    before = os.environ.get("TRITON_INTERPRET")
    mod = _reload_triton_ops(None)
    assert not mod.INTERPRET, "the Triton interpreter is still on; CUDA tests need compiled kernels"
    yield mod
    _reload_triton_ops(before)


@pytest.fixture
def gpu_tops(cuda_ops, monkeypatch):
    """cuda_ops with every output buffer poisoned (NaN / -7777): an unwritten element fails the comparison."""
    monkeypatch.setattr(cuda_ops, "_empty", poisoned_empty)
    return cuda_ops


@pytest.fixture(autouse=True)
def _seeded():
    yield seed_torch()


@pytest.fixture(scope="session")
def dream_ckpt(tmp_path_factory):
    """(directory, transformers reference model on the CPU) of a tiny random dream checkpoint."""
    pytest.importorskip("transformers")
    from family_helpers import make_dream_checkpoint

    d = tmp_path_factory.mktemp("dream_ckpt_cuda")
    return d, make_dream_checkpoint(d)


@pytest.fixture(scope="session")
def llada_ckpt(tmp_path_factory):
    """(directory, transformers reference model on the CPU) of a tiny random llada checkpoint."""
    pytest.importorskip("transformers")
    from family_helpers import make_llada_checkpoint

    d = tmp_path_factory.mktemp("llada_ckpt_cuda")
    return d, make_llada_checkpoint(d)
