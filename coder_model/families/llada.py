"""The llada family: LLaDA 8B (Base/Instruct) and LLaDA 1.5.

config.json `model_type: "llada"`, `architectures: ["LLaDAModelLM"]`, OLMo-style
fields (d_model, n_heads, n_kv_heads, n_layers, mlp_hidden_size, ...). Weights:
`model.transformer.wte.weight`, `model.transformer.blocks.N.{attn_norm,q_proj,
k_proj,v_proj,attn_out,ff_norm,ff_proj,up_proj,ff_out}.weight`,
`model.transformer.ln_f.weight`, `model.transformer.ff_out.weight` (absent with
weight_tying). The "llama" block is a Llama layer under other names: SwiGLU
with ff_proj as the gate, up_proj as the up projection, ff_out as the down
projection. Logits are not shifted: position i predicts the token at i.
Mask token `<|mdm_mask|>` = 126336.
"""

from __future__ import annotations

from dlm.coder_model.families.arch import FamilyArch, require, tensor_name_map

MODEL_TYPES = ("llada",)
DEFAULT_MASK_ID = {"llada": 126336}

# Fields whose other values would change the network; each must match or the
# checkpoint is refused with the field named (computing a different function
# silently would give confident garbage).
_REQUIRED_VALUES = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "alibi": (False, None),
    "rope": (True, None),
    "input_emb_norm": (False, None),
    "scale_logits": (False, None),
    "attention_layer_norm": (False, None),
    "block_group_size": (1, None),
    "include_bias": (False, None),
}


def parse_config(cfg: dict) -> FamilyArch:
    mt = str(cfg.get("model_type", "")).lower()
    for key, allowed in _REQUIRED_VALUES.items():
        if cfg.get(key) not in allowed:
            raise ValueError(
                f"LLaDA config.json has {key}={cfg.get(key)!r}; this loader supports "
                f"{key} in {[a for a in allowed if a is not None]} (the released LLaDA 8B / 1.5 "
                "checkpoints): use one of those"
            )
    d_model = int(require(cfg, "d_model", mt))
    heads = int(require(cfg, "n_heads", mt))
    kv = cfg.get("n_kv_heads") or (1 if cfg.get("multi_query_attention") else heads)
    mlp = cfg.get("mlp_hidden_size") or int(cfg.get("mlp_ratio", 4)) * d_model
    vocab = int(cfg.get("embedding_size") or require(cfg, "vocab_size", mt))
    return FamilyArch(
        family="llada",
        model_type=mt,
        vocab_size=vocab,
        hidden_size=d_model,
        num_layers=int(require(cfg, "n_layers", mt)),
        num_heads=heads,
        num_kv_heads=int(kv),
        head_dim=d_model // heads,
        intermediate_size=int(mlp),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        tie_embeddings=bool(cfg.get("weight_tying", False)),
        shift_logits=False,
    )


# our module in a layer -> LLaDA's (a Llama layer under OLMo's names)
_LAYER_MODULES = {
    "attn_norm": "attn_norm", "mlp_norm": "ff_norm",
    "q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "attn_out",
    "gate": "ff_proj", "up": "up_proj", "down": "ff_out",
}  # fmt: skip


def tensor_names(arch: FamilyArch) -> dict[str, str]:
    """Our parameter name -> the checkpoint's tensor name."""
    t = "model.transformer."
    return tensor_name_map(arch, embed=t + "wte", norm=t + "ln_f", lm_head=t + "ff_out",
                           layer=t + "blocks.{i}.", layer_modules=_LAYER_MODULES)
