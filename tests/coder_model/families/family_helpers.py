"""Helpers: tiny random checkpoints of the dream and llada families, built with transformers.

dream: a transformers Qwen2ForCausalLM saved with save_pretrained (sharded
safetensors + index), its config.json rewritten to Dream's model_type /
architectures / mask_token_id. llada: a transformers LlamaForCausalLM (LLaDA's
"llama" block is a Llama layer under other names) whose tensors are renamed to
LLaDA's and saved as two safetensors shards with an index and a LLaDA config.
The references run the transformers models with an all-visible 4D attention
mask, i.e. bidirectionally.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n",
]
VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|mask|>"]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXTS * 10, trainer)
    assert tok.get_vocab_size() <= VOCAB
    return tok


def _randomize(model, seed: int) -> None:
    """Make biases and norm weights non-trivial so a wrong mapping shows in the logits."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))


def _tiny_hf_model(config_class, model_class, seed: int, **config):
    """A 2-layer transformers model of the shape both families' checkpoints share, with
    randomized biases and norms; `config` holds what differs per family."""
    import torch

    torch.manual_seed(seed)
    cfg = config_class(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.2,
        **config,
    )
    model = model_class(cfg).eval()
    _randomize(model, seed)
    return model


def make_dream_checkpoint(directory, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer()
    eos, mask = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|mask|>")
    model = _tiny_hf_model(
        Qwen2Config, Qwen2ForCausalLM, seed,
        num_key_value_heads=2, rms_norm_eps=1e-6, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos,
    )  # fmt: skip
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="60KB")
    c = json.loads((directory / "config.json").read_text())
    c.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=mask)
    (directory / "config.json").write_text(json.dumps(c))
    tok.save(str(directory / "tokenizer.json"))
    return model


LLADA_RENAME = [
    ("model.embed_tokens.", "model.transformer.wte."),
    ("model.norm.", "model.transformer.ln_f."),
    ("lm_head.", "model.transformer.ff_out."),
    ("model.layers.", "model.transformer.blocks."),
    ("self_attn.o_proj.", "attn_out."),
    ("self_attn.", ""),
    ("mlp.gate_proj.", "ff_proj."),
    ("mlp.up_proj.", "up_proj."),
    ("mlp.down_proj.", "ff_out."),
    ("input_layernorm.", "attn_norm."),
    ("post_attention_layernorm.", "ff_norm."),
]


def llada_name(hf_name: str) -> str:
    for a, b in LLADA_RENAME:
        hf_name = hf_name.replace(a, b)
    return hf_name


def write_llada(
    directory,
    state: dict,
    d_model: int,
    n_heads: int,
    n_kv: int,
    n_layers: int,
    mlp: int,
    vocab: int,
    mask: int,
    eos: int,
    rope_theta: float = 10000.0,
    eps: float = 1e-5,
) -> None:
    """LLaDA config.json + two safetensors shards with an index."""
    from safetensors.torch import save_file

    names = sorted(state)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: state[k].contiguous() for k in keys}, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    cfg = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "activation_type": "silu",
        "alibi": False,
        "block_type": "llama",
        "block_group_size": 1,
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "n_layers": n_layers,
        "mlp_hidden_size": mlp,
        "mlp_ratio": 4,
        "embedding_size": vocab,
        "vocab_size": vocab,
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "rms_norm_eps": eps,
        "rope": True,
        "rope_theta": rope_theta,
        "scale_logits": False,
        "weight_tying": False,
        "attention_layer_norm": False,
        "mask_token_id": mask,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "max_sequence_length": 512,
    }
    (directory / "config.json").write_text(json.dumps(cfg))


def make_llada_checkpoint(directory, seed: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    eos, mask = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|mask|>")
    model = _tiny_hf_model(
        LlamaConfig, LlamaForCausalLM, seed,
        num_key_value_heads=4, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
    )  # fmt: skip
    state = {llada_name(k): v for k, v in model.state_dict().items()}
    write_llada(directory, state, 64, 4, 4, 2, 96, VOCAB, mask, eos)
    tok.save(str(directory / "tokenizer.json"))
    return model


def hf_bidirectional_logits(model, ids):
    """Logits (B, T, V) fp32 of a transformers causal LM run with full (non-causal) attention."""
    import torch

    B, T = ids.shape
    with torch.no_grad():
        return model(ids, attention_mask=torch.zeros(B, 1, T, T)).logits.float()


# --- a constructed "successor" model -------------------------------------------------------------
# Vocabulary of 16: 0..13 content, 14 end-of-text, 15 mask. One block whose attention and MLP
# outputs are zero, so the final hidden state at a position is (normed) one-hot of its token, and an
# LM head that maps token t to t+1 with high confidence and the mask token to 7 with lower
# confidence. Read with the right alignment a shifted model therefore counts up from the last
# prefix token; read unshifted every slot only sees a mask and says 7.
SUCC_V, SUCC_EOS, SUCC_MASK = 16, 14, 15


def succ_state(family: str) -> dict:
    import torch
    from dlm.coder_model.families import dream, llada
    from dlm.coder_model.families.arch import FamilyArch

    arch = FamilyArch(
        family, family, SUCC_V, 16, 1, 2, 1, 8, 8, 10000.0, 1e-6, family == "dream", False, family == "dream"
    )
    head = torch.zeros(SUCC_V, 16)
    for t in range(SUCC_EOS + 1):
        head[(t + 1) % (SUCC_EOS + 1), t] = 3.0
    head[7, SUCC_MASK] = 1.0
    ours = {
        "embed.weight": torch.eye(SUCC_V, 16),
        "norm.weight": torch.ones(16),
        "lm_head.weight": head,
        "layers.0.attn_norm.weight": torch.ones(16),
        "layers.0.mlp_norm.weight": torch.ones(16),
        "layers.0.q.weight": torch.randn(16, 16) * 0.1,
        "layers.0.k.weight": torch.randn(8, 16) * 0.1,
        "layers.0.v.weight": torch.randn(8, 16) * 0.1,
        "layers.0.o.weight": torch.zeros(16, 16),
        "layers.0.gate.weight": torch.randn(8, 16) * 0.1,
        "layers.0.up.weight": torch.randn(8, 16) * 0.1,
        "layers.0.down.weight": torch.zeros(16, 8),
    }
    if family == "dream":
        for n in "qkv":
            ours[f"layers.0.{n}.bias"] = torch.zeros(16 if n == "q" else 8)
    names = (dream if family == "dream" else llada).tensor_names(arch)
    return {names[k]: v for k, v in ours.items()}


def word_tokenizer(n: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def make_succ_checkpoint(directory, family: str, drop: str | None = None, **config_overrides):
    from safetensors.torch import save_file

    state = succ_state(family)
    if drop is not None:
        del state[drop]
    if family == "dream":
        save_file(state, str(directory / "model.safetensors"))
        cfg = {
            "model_type": "Dream",
            "architectures": ["DreamModel"],
            "vocab_size": SUCC_V,
            "hidden_size": 16,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "mask_token_id": SUCC_MASK,
            "eos_token_id": SUCC_EOS,
            "pad_token_id": SUCC_EOS,
        }
        cfg.update(config_overrides)
        (directory / "config.json").write_text(json.dumps(cfg))
    else:
        write_llada(directory, state, 16, 2, 1, 1, 8, SUCC_V, SUCC_MASK, SUCC_EOS, eps=1e-6)
        if config_overrides:
            cfg = json.loads((directory / "config.json").read_text())
            cfg.update(config_overrides)
            (directory / "config.json").write_text(json.dumps(cfg))
    word_tokenizer(SUCC_V).save(str(directory / "tokenizer.json"))
    return directory
