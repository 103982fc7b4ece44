"""On the CPU the model takes one core fewer than the process may use (devices.cpu_threads),
so the server's event loop and indexer keep a core; OMP_NUM_THREADS, when set, is the user's
choice and is left alone."""

from __future__ import annotations

import os

import pytest
from dlm.coder_model import devices
from dlm.coder_model.devices import cpu_threads
from interpreter_checks import python_child


def test_none_when_omp_num_threads_is_set(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for value in ("1", "3", "16"):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert cpu_threads() is None


@pytest.mark.parametrize(("cores", "want"), [(1, 1), (2, 1), (8, 7)])
def test_one_core_fewer_than_the_affinity_allows(monkeypatch, cores, want):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the affinity counts, not the machine's cores
    assert cpu_threads() == want


def test_without_sched_getaffinity_the_cpu_count_counts(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert devices.cpu_threads() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert devices.cpu_threads() == 1


CHILD = """
import json, os, sys
cores = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, cores)
import torch
from dlm.coder_model.engine import load_engine
load_engine(None, "cpu")
print(json.dumps({"cores": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}))
"""


def _affinity() -> int:
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_getaffinity/sched_setaffinity on this platform")
    return len(os.sched_getaffinity(0))


def test_load_engine_on_two_cores_leaves_the_model_one_thread(tmp_path):
    if _affinity() < 2:
        pytest.skip("needs at least 2 cores in this process's affinity")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = python_child(CHILD, cwd=tmp_path, env=env)
    assert out["cores"] == 2
    assert out["threads"] == 1


def test_load_engine_keeps_the_users_omp_num_threads(tmp_path):
    if _affinity() < 2:
        pytest.skip("needs at least 2 cores in this process's affinity")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = python_child(CHILD, cwd=tmp_path, env=env)
    assert out["threads"] == 2
