"""The dream/llada loader builds its model like the native one (checkpoint.meta_without_init):
no torch._dynamo or sympy imported on the CPU, torch.nn.init's functions the originals again
afterwards, and every parameter exactly the checkpoint's tensor it is mapped from."""

from __future__ import annotations

import pytest
import torch
from dlm.coder_model.families import load_family_model
from dlm.coder_model.families import loader as family_loader
from family_helpers import make_succ_checkpoint
from interpreter_checks import assert_load_imports_nothing_heavy, torch_initialisers


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_cpu_load_of_a_family_checkpoint_imports_neither_dynamo_nor_sympy(tmp_path, family):
    d = tmp_path / family
    d.mkdir()
    make_succ_checkpoint(d, family)
    load = 'from dlm.coder_model.families import load_family_model\nload_family_model(sys.argv[1], device="cpu")'
    assert_load_imports_nothing_heavy(load, str(d), cwd=tmp_path, what=f"the {family} model")


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_a_family_checkpoint_loads_exactly_its_tensors_and_restores_the_initialisers(tmp_path, family):
    from safetensors import safe_open

    make_succ_checkpoint(tmp_path, family)
    originals = torch_initialisers()
    model, _, _, arch = load_family_model(tmp_path, device="cpu", dtype="float32", impl="reference")
    after = torch_initialisers()
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
