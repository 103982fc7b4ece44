"""FamilyEngine over real (tiny) checkpoints, and loader errors that name what is wrong."""

from __future__ import annotations

import json

import pytest
from dlm.coder_model.budget import clip_after, clip_before
from dlm.coder_model.families import detect_family, load_family_engine
from dlm.coder_model.families.family_engine import FamilyEngineOptions
from dlm.coder_model.families.infill import InfillOptions
from dlm.coder_model.types import CancelToken, Engine, Prompt, SamplerParams
from family_helpers import make_succ_checkpoint


def test_detect_family():
    assert detect_family({"model_type": "Dream", "architectures": ["DreamModel"]}) == "dream"
    assert detect_family({"model_type": "qwen2"}) == "dream"
    assert detect_family({"model_type": "llada", "architectures": ["LLaDAModelLM"]}) == "llada"
    assert detect_family({"architectures": ["LLaDAModelLM"]}) == "llada"
    with pytest.raises(ValueError) as e:
        detect_family({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    msg = str(e.value)
    assert "'gpt2'" in msg and "dream" in msg and "llada" in msg and "qwen2" in msg


def test_unsupported_model_type_names_it(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    )
    with pytest.raises(ValueError, match="'mamba'.*supported model_type values: dlm, dream, llada, qwen2"):
        load_family_engine(tmp_path, "cpu")


def test_missing_tensor_is_named(tmp_path):
    make_succ_checkpoint(tmp_path, "dream", drop="model.layers.0.mlp.down_proj.weight")
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' is missing"):
        load_family_engine(tmp_path, "cpu")


def test_missing_llada_tensor_is_named(tmp_path):
    make_succ_checkpoint(tmp_path, "llada", drop="model.transformer.blocks.0.attn_out.weight")
    with pytest.raises(ValueError, match=r"'model\.transformer\.blocks\.0\.attn_out\.weight' is missing"):
        load_family_engine(tmp_path, "cpu")


def test_config_that_does_not_match_weights(tmp_path):
    make_succ_checkpoint(tmp_path, "dream", intermediate_size=12)
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight.*shape \(8, 16\).*\(12, 16\)"):
        load_family_engine(tmp_path, "cpu")


def test_unsupported_llada_variant_names_the_field(tmp_path):
    make_succ_checkpoint(tmp_path, "llada", block_type="sequential")
    with pytest.raises(ValueError, match="block_type='sequential'"):
        load_family_engine(tmp_path, "cpu")


def test_autoregressive_qwen2_is_refused(tmp_path):
    make_succ_checkpoint(
        tmp_path, "dream", model_type="qwen2", architectures=["Qwen2ForCausalLM"], mask_token_id=None
    )
    with pytest.raises(ValueError, match="no mask token.*autoregressive"):
        load_family_engine(tmp_path, "cpu")


def test_pickle_weights_are_never_loaded(tmp_path):
    make_succ_checkpoint(tmp_path, "dream")
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pytorch_model.bin: pickle files are never loaded"):
        load_family_engine(tmp_path, "cpu")


@pytest.fixture(scope="module")
def dream_engine(dream_ckpt):
    d, _ = dream_ckpt
    eng = load_family_engine(d, "cpu", FamilyEngineOptions(impl="reference"))
    yield eng
    eng.close()


def test_engine_inserts_the_infill_at_the_cursor(dream_engine):
    eng = dream_engine
    assert isinstance(eng, Engine)
    st = eng.status()
    assert st.state == "ready" and st.extra["family"] == "dream" and st.device == "cpu"
    prompt = Prompt(
        prefix="def add(a, b):\n", region="    return a + b", cursor=10, suffix="\n\nfor i in x:\n"
    )
    params = SamplerParams(steps=8, block_len=8, threshold=0.9)
    pred = eng.predict(prompt, params, CancelToken())
    assert not pred.cancelled and pred.steps >= 1
    assert pred.text.startswith("    return") and pred.text.endswith(" a + b")
    # the inserted text is exactly the decoder's content tokens for this prompt's layout
    pre, suf = eng.encode_prompt(prompt)
    r = eng.decoder.infill(pre, suf, params)
    assert pred.text == "    return" + eng.tokenizer.decode(r.tokens, skip_special_tokens=True) + " a + b"
    assert pred.tokens == len(r.tokens) + (1 if r.ended else 0)
    assert pred.context_tokens == len(pre) + len(suf)


def test_engine_cancelled_and_failed_requests_keep_it_working(dream_engine, monkeypatch):
    eng = dream_engine
    c = CancelToken()
    c.cancel()
    p = Prompt(prefix="", region="x = 1", cursor=5, suffix="")
    assert eng.predict(p, SamplerParams(block_len=4), c).cancelled
    empty = eng.predict(
        Prompt(prefix="", region="", cursor=0, suffix=""), SamplerParams(block_len=4), CancelToken()
    )
    assert not empty.cancelled  # an empty file still gets a prediction
    real = eng.decoder.infill

    def fail_once(*a, **k):
        monkeypatch.setattr(eng.decoder, "infill", real)
        raise RuntimeError("simulated device failure")

    monkeypatch.setattr(eng.decoder, "infill", fail_once)
    with pytest.raises(RuntimeError, match="simulated device failure"):
        eng.predict(p, SamplerParams(block_len=4), CancelToken())  # re-raised in the caller
    assert not eng.predict(p, SamplerParams(block_len=4), CancelToken()).cancelled  # the thread lives on


def test_lead_load_engine_dispatches_to_families(dream_ckpt):
    from dlm.coder_model.engine import load_engine
    from dlm.coder_model.families.family_engine import FamilyEngine

    d, _ = dream_ckpt
    eng = load_engine(str(d), "cpu")
    try:
        assert isinstance(eng, FamilyEngine)
    finally:
        eng.close()


def test_windows_clip_long_text_at_line_boundaries():
    text = "".join(f"line {i}\n" for i in range(5000))
    pre = clip_before(text, 100)
    assert len(pre) <= 800 and text.endswith(pre) and pre.startswith("line ")
    suf = clip_after(text, 100)
    assert len(suf) <= 800 and text.startswith(suf) and suf.endswith("\n")
    assert clip_before("short", 100) == "short"


def test_infill_options_validate():
    with pytest.raises(ValueError, match="refresh_every"):
        InfillOptions(refresh_every=0)
    with pytest.raises(ValueError, match="lengths"):
        InfillOptions(lengths=(0,))
