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
    from dlm.coder_model.layout import LAYOUT_VERSION

    # this code's layout, so that the weights' format is what is refused
    (pick / "config.json").write_text(json.dumps({**model.config.to_dict(), "layout_version": LAYOUT_VERSION}))
    tok.save(pick / "tokenizer.json")
    (pick / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="safetensors only"):
        load_model(pick)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)


# -- token layout versions ---------------------------------------------------------------------


def test_a_saved_checkpoint_records_the_layout_it_was_trained_in(tiny_model, tmp_path):
    from dlm.coder_model.layout import LAYOUT_VERSION

    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["layout_version"] == LAYOUT_VERSION
    load_model(tmp_path, impl="reference")  # and it loads


def test_the_embedded_checkpoint_speaks_a_layout_this_code_speaks_and_loads():
    from dlm.coder_model.budget import model_budget
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir, layout_version, read_config
    from dlm.coder_model.layout import SUPPORTED_LAYOUTS

    raw = read_config(embedded_checkpoint_dir())
    assert layout_version(raw) in SUPPORTED_LAYOUTS
    model, tok = load_model(None, impl="reference")
    assert model.config.vocab_size >= tok.vocab_size
    # it was trained with no drafts section: it is served none
    assert model.config.drafts_window == 0 and model_budget(model.config).max_drafts == 0


def test_a_layout_2_checkpoint_with_a_drafts_window_is_refused(tiny_model, tmp_path):
    d = _with_layout(tiny_model, tmp_path, 2)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "drafts_window": 16}))
    with pytest.raises(CheckpointError, match="drafts_window is 16 but layout 2 has no drafts section"):
        load_model(d, impl="reference")
    (d / "config.json").write_text(json.dumps({**cfg, "drafts_window": 16, "layout_version": 3}))
    model, _ = load_model(d, impl="reference")
    assert model.config.drafts_window == 16


def _with_layout(tiny_model, tmp_path, version):
    model, tok = tiny_model
    save_checkpoint(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if version is None:
        del cfg["layout_version"]
    else:
        cfg["layout_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_a_newer_layout_is_refused_with_what_to_do(tiny_model, tmp_path):
    from dlm.coder_model.layout import LAYOUT_VERSION

    d = _with_layout(tiny_model, tmp_path, LAYOUT_VERSION + 1)
    with pytest.raises(CheckpointError) as err:
        load_model(d, impl="reference")
    msg = str(err.value)
    assert f"token layout version {LAYOUT_VERSION + 1}" in msg and "layouts 2 and 3" in msg
    assert "upgrade dlm-lsp" in msg


def test_an_older_layout_is_refused_but_a_warm_start_may_read_it(tiny_model, tmp_path):
    # a layout-1 checkpoint (before insertion while typing) under code of layouts 2 and 3: the
    # file records none (= 1)
    d = _with_layout(tiny_model, tmp_path, None)
    with pytest.raises(CheckpointError, match=r"token layout version 1, but .* layouts 2 and 3.*--init"):
        load_model(d, impl="reference")
    model, _ = load_model(d, impl="reference", any_layout=True)  # training it puts it in layout 2
    assert model.config.vocab_size == tiny_model[0].config.vocab_size


@pytest.mark.parametrize("bad", ["two", 0, 1.5, True])
def test_a_malformed_layout_version_is_named(tiny_model, tmp_path, bad):
    d = _with_layout(tiny_model, tmp_path, bad)
    with pytest.raises(CheckpointError, match="layout_version is .* not a layout version"):
        load_model(d, impl="reference")
