"""The dream family: Qwen2-shaped weights, bidirectional attention, shifted logits.

Checkpoints: Dream-v0 (Base/Instruct 7B), Dream-Coder-v0 (7B), DiffuCoder
(7B Base/Instruct/cpGRPO) — config.json `model_type: "Dream"`,
`architectures: ["DreamModel"]` — and Open-dCoder (0.5B), which ships a plain
Qwen2 config (`model_type: "qwen2"`) and is told apart from an autoregressive
Qwen2 by having a mask token. Weight names are Qwen2's
(`model.layers.N.self_attn.q_proj.weight`, q/k/v biases, `model.norm.weight`,
`lm_head.weight` unless the embeddings are tied). These models were
initialised from Qwen2.5 and keep its alignment: the logits at position i
predict the token at i+1 (their samplers shift logits right by one).
"""

from __future__ import annotations

from dlm.coder_model.families.arch import FamilyArch, require, tensor_name_map

MODEL_TYPES = ("dream", "qwen2")
DEFAULT_MASK_ID = {"dream": 151666}  # "<|mask|>" in Dream's tokenizer


def parse_config(cfg: dict) -> FamilyArch:
    mt = str(cfg.get("model_type", "")).lower()
    heads = int(require(cfg, "num_attention_heads", mt))
    hidden = int(require(cfg, "hidden_size", mt))
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling and str(rope_scaling.get("rope_type", rope_scaling.get("type", "default"))) != "default":
        raise ValueError(
            f"config.json rope_scaling={rope_scaling!r} is not supported (only plain rotary): "
            "remove rope_scaling for contexts within max_position_embeddings"
        )
    return FamilyArch(
        family="dream",
        model_type=mt,
        vocab_size=int(require(cfg, "vocab_size", mt)),
        hidden_size=hidden,
        num_layers=int(require(cfg, "num_hidden_layers", mt)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(require(cfg, "intermediate_size", mt)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        shift_logits=True,
    )


# our module in a layer -> Qwen2's
_LAYER_MODULES = {
    "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
}  # fmt: skip


def tensor_names(arch: FamilyArch) -> dict[str, str]:
    """Our parameter name -> the checkpoint's tensor name."""
    return tensor_name_map(arch, embed="model.embed_tokens", norm="model.norm", lm_head="lm_head",
                           layer="model.layers.{i}.", layer_modules=_LAYER_MODULES)
