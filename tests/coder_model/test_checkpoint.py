"""Checkpoints: bit-exact round trips (single file and shards), clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from dlm.coder_model.checkpoint import CheckpointError, load_model, save_checkpoint


def _equal_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def test_round_trip_single_file(tiny_model, tmp_path):
    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    m2, tok2 = load_model(tmp_path, impl="reference")
    _equal_state(model, m2)
    assert tok2.encode("def f(x):\n  return x") == tok.encode("def f(x):\n  return x")


def test_round_trip_sharded(tiny_model, tmp_path):
    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path, shard_bytes=40_000)
    shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    m2, _ = load_model(tmp_path, impl="reference")
    _equal_state(model, m2)


def _drop_tensor(path, name):
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path))
    del sd[name]
    save_file(sd, str(path))


def test_missing_tensor_is_named(tiny_model, tmp_path):
    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path)
    _drop_tensor(tmp_path / "model.safetensors", "layers.1.ffn.w2.weight")
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) layers\.1\.ffn\.w2\.weight"):
        load_model(tmp_path)


def test_wrong_shape_is_named(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["layers.0.attn.wq.weight"] = torch.zeros(3, 5)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layers\.0\.attn\.wq\.weight .* shape \(3, 5\)"):
        load_model(tmp_path)


def test_missing_shard_and_pickles_refused(tiny_model, tmp_path):
    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path, shard_bytes=40_000)
    sorted(tmp_path.glob("model-*-of-*.safetensors"))[1].unlink()
    with pytest.raises(CheckpointError, match="shard .* is missing"):
        load_model(tmp_path)
    pick = tmp_path / "pickled"
    pick.mkdir()
    (pick / "config.json").write_text(json.dumps(model.config.to_dict()))
    tok.save(pick / "tokenizer.json")
    (pick / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="safetensors only"):
        load_model(pick)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)
