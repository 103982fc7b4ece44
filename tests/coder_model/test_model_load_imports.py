"""Loading a checkpoint on the CPU builds the model on the meta device without torch.nn.init's
initialisers (checkpoint.meta_without_init): no torch._dynamo, no sympy in the process (about
150 MB resident in a server that never compiles), the initialisers are the originals again after
the block, and the loaded weights are exactly the safetensors file's tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model, meta_without_init, weight_files
from interpreter_checks import assert_load_imports_nothing_heavy, torch_initialisers


def test_cpu_load_of_the_embedded_checkpoint_imports_neither_dynamo_nor_sympy(tmp_path):
    # the embedded model, loaded with the engine the server uses
    assert_load_imports_nothing_heavy('from dlm.coder_model.engine import load_engine\nload_engine(None, "cpu")',
                                      cwd=tmp_path, what="the model")


def test_the_initialisers_are_skipped_inside_the_block_and_the_originals_after_it():
    originals = torch_initialisers()
    with meta_without_init():
        t = torch.empty(3, 4)
        assert t.device.type == "meta"
        # the usual initialisers are stand-ins inside the block (that is what keeps torch._refs out)
        assert torch.nn.init.normal_ is not originals["normal_"]
        assert torch.nn.init.kaiming_uniform_ is not originals["kaiming_uniform_"]
        assert torch.nn.init.normal_(t) is t
        lin = torch.nn.Linear(4, 5)
        assert lin.weight.device.type == "meta"
    after = torch_initialisers()
    assert after.keys() == originals.keys()
    changed = [name for name in originals if after[name] is not originals[name]]
    assert changed == [], f"torch.nn.init functions not restored: {changed}"
    assert torch.empty(1).device.type == "cpu"
    # and they work again
    w = torch.empty(50, 50)
    torch.nn.init.normal_(w, std=1.0)
    assert w.std() > 0.5


def test_the_initialisers_are_restored_when_the_block_raises():
    originals = torch_initialisers()
    with pytest.raises(RuntimeError, match="boom"), meta_without_init():
        raise RuntimeError("boom")
    after = torch_initialisers()
    assert [name for name in originals if after[name] is not originals[name]] == []
    assert torch.empty(1).device.type == "cpu"


def _assert_model_holds_the_files_tensors(model, directory) -> None:
    from safetensors import safe_open

    state = model.state_dict()
    files = weight_files(Path(directory))
    assert set(files) == set(state)
    for name, path in files.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            want = f.get_tensor(name)
        got = state[name]
        assert got.device.type == "cpu", name
        assert tuple(got.shape) == tuple(want.shape), name
        assert torch.equal(got, want.to(got.dtype)), f"{name} differs from {path.name}"
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.device.type != "meta", f"{name} left on the meta device"


def test_the_embedded_checkpoint_loads_exactly_the_files_tensors():
    model, _ = load_model(None, device="cpu")
    _assert_model_holds_the_files_tensors(model, embedded_checkpoint_dir())


def test_a_tiny_checkpoint_loads_exactly_the_files_tensors(tiny_checkpoint):
    model, _ = load_model(tiny_checkpoint, device="cpu", impl="reference")
    _assert_model_holds_the_files_tensors(model, tiny_checkpoint)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        out = model(ids)
    assert torch.isfinite(out).all()
