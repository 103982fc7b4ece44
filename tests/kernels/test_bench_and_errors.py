"""drivers/bench/kernel_timing.py on a machine without a GPU, the kernels package's import boundary,
the model step benchmark (drivers/bench/denoise_step.py) on the CPU, and the launchers' error messages."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the bench prints the full table (run it by hand)")
def test_bench_runs_precheck_and_explains_on_cpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the bench must set it itself
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([sys.executable, "-m", "dlm.drivers.bench.kernel_timing"], capture_output=True, text=True, env=env, check=False,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pre-check passed" in p.stdout
    assert "check attention step" in p.stdout and "ok" in p.stdout
    assert "Timings need an NVIDIA GPU" in p.stdout


def test_kernels_package_imports_only_torch_and_triton():
    """docs/architecture.md §1: kernels/ never imports coder_model or lsp (the model step bench lives in
    drivers/bench)."""
    kernels_dir = Path(__file__).resolve().parents[2] / "kernels"
    offenders = []
    for path in sorted(kernels_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[:2] in (["dlm", "coder_model"],
                                                                                 ["dlm", "lsp"])]
    assert not offenders, offenders
    assert list(kernels_dir.glob("*.py")), "kernels/ not found next to tests/"


def test_step_bench_on_cpu_prints_reference_rows_and_refuses_bad_models():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "dlm.drivers.bench.denoise_step", "--device", "cpu", "--context", "64",
           "--slots", "8", "--reps", "1", "--models", "embedded,embedded-copy,dream-tiny"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith(("embedded ", "embedded-copy ", "dream tiny "))]
    # one reference ("off") row per model, Tc = 64 context tokens, L = 8, no graph on the CPU
    assert [(r[-4], r[-3], r[-2] != "", r[-1]) for r in rows] == [("8", "off", True, "n/a")] * 3, p.stdout
    assert "skipped on the CPU" in p.stdout
    bad = subprocess.run(cmd[:3] + ["--models", "embedded,gpt-5"], capture_output=True, text=True, env=env,
                         check=False, timeout=120)
    assert bad.returncode == 2 and "unknown gpt-5" in bad.stderr and "dream-tiny" in bad.stderr


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
