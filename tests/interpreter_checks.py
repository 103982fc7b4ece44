"""What the coder_model tests check in a fresh interpreter or of torch's state: a Python child
that answers one JSON line, the check that loading a model imports no heavy module, and torch's
weight initialisers (which a meta-device load must leave as they were)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Modules a CPU model load must not import: they cost seconds at start-up.
HEAVY = ("torch._dynamo", "sympy")

# The child imports torch first: the modules must be absent then (else the check says nothing),
# and still absent after `load` (Python that loads a model) has run.
HEAVY_CHILD = """
import json, sys
import torch
before = {m: m in sys.modules for m in %(heavy)r}
%(load)s
after = {m: m in sys.modules for m in %(heavy)r}
print(json.dumps({"before": before, "after": after}))
"""


def child_env() -> dict[str, str]:
    """This process's environment, with one OpenMP thread unless it says otherwise."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def python_child(code: str, *argv: str, cwd, env: dict[str, str]) -> dict:
    """Runs `code` in a fresh interpreter (with `argv`): the JSON of its last stdout line; an
    AssertionError with its stderr's end when it fails."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_load_imports_nothing_heavy(load: str, *argv: str, cwd, what: str) -> None:
    """Running `load` in a fresh interpreter after torch imports none of HEAVY."""
    out = python_child(HEAVY_CHILD % {"heavy": HEAVY, "load": load}, *argv, cwd=cwd, env=child_env())
    assert out["before"] == {m: False for m in HEAVY}, f"importing torch alone imports {out['before']}"
    assert out["after"] == {m: False for m in HEAVY}, f"loading {what} imported {out['after']}"


def torch_initialisers() -> dict[str, object]:
    """torch.nn.init's functions by name, as they are now."""
    import torch

    return {
        name: getattr(torch.nn.init, name)
        for name in dir(torch.nn.init)
        if not name.startswith("__") and callable(getattr(torch.nn.init, name))
    }
