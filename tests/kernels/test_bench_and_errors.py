"""kernels/bench.py on a machine without a GPU, and the launchers' error messages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the bench prints the full table (run it by hand)")
def test_bench_runs_precheck_and_explains_on_cpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the bench must set it itself
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([sys.executable, "-m", "dlm.kernels.bench"], capture_output=True, text=True, env=env, check=False,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pre-check passed" in p.stdout
    assert "check attention step" in p.stdout and "ok" in p.stdout
    assert "Timings need an NVIDIA GPU" in p.stdout


def test_cpu_tensors_without_interpreter_get_a_clear_error(tops, monkeypatch):
    monkeypatch.setattr(tops, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1.*impl='reference'"):
        tops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)


def test_launchers_reject_bad_shapes(tops):
    with pytest.raises(ValueError, match="positions"):
        tops.apply_rotary(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.ones(9, 4), torch.ones(9, 4),
                          torch.arange(4))
    with pytest.raises(ValueError, match="kv_cache"):
        q = torch.randn(1, 2, 3, 16)
        tops.attention(q, q, q, context_len=0, kv_cache=(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)))
    with pytest.raises(TypeError, match="dtype"):
        tops.rms_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4), 1e-6)
