"""The dream/llada loader builds its model like the native one (checkpoint.meta_without_init):
no torch._dynamo or sympy imported on the CPU, torch.nn.init's functions the originals again
afterwards, and every parameter exactly the checkpoint's tensor it is mapped from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from dlm.coder_model.families import load_family_model
from dlm.coder_model.families import loader as family_loader
from family_helpers import make_succ_checkpoint

HEAVY = ("torch._dynamo", "sympy")

CHILD = """
import json, sys
import torch
before = {m: m in sys.modules for m in %(heavy)r}
from dlm.coder_model.families import load_family_model
load_family_model(sys.argv[1], device="cpu")
after = {m: m in sys.modules for m in %(heavy)r}
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_cpu_load_of_a_family_checkpoint_imports_neither_dynamo_nor_sympy(tmp_path, family):
    d = tmp_path / family
    d.mkdir()
    make_succ_checkpoint(d, family)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD % {"heavy": HEAVY}, str(d)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == {m: False for m in HEAVY}, f"importing torch alone imports {out['before']}"
    assert out["after"] == {m: False for m in HEAVY}, f"loading the {family} model imported {out['after']}"


def _initialisers() -> dict[str, object]:
    return {
        name: getattr(torch.nn.init, name)
        for name in dir(torch.nn.init)
        if not name.startswith("__") and callable(getattr(torch.nn.init, name))
    }


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_a_family_checkpoint_loads_exactly_its_tensors_and_restores_the_initialisers(tmp_path, family):
    from safetensors import safe_open

    make_succ_checkpoint(tmp_path, family)
    originals = _initialisers()
    model, _, _, arch = load_family_model(tmp_path, device="cpu", dtype="float32", impl="reference")
    after = _initialisers()
    assert [name for name in originals if after[name] is not originals[name]] == []
    assert torch.empty(1).device.type == "cpu"

    names = family_loader._FAMILIES[arch.family].tensor_names(arch)
    params = dict(model.named_parameters())
    assert set(names) == set(params)
    files = family_loader._tensor_files(tmp_path)
    for ours, theirs in names.items():
        with safe_open(str(files[theirs]), framework="pt", device="cpu") as f:
            want = f.get_tensor(theirs).to(torch.float32)
            assert params[ours].device.type == "cpu", ours
            assert torch.equal(params[ours].detach(), want), f"{ours} differs from the checkpoint's {theirs}"
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.device.type != "meta", f"{name} left on the meta device"
