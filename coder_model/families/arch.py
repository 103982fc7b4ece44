"""The shape of an open diffusion-coder checkpoint, independent of its family.

Both supported families (dream: Qwen2-shaped weights; llada: LLaDA's own
names) are the same network: pre-norm RMSNorm blocks, grouped-query attention
with half-split rotary embeddings, a SwiGLU MLP and an LM head, run with
bidirectional attention. They differ in weight names, q/k/v biases and in how
logits line up with positions (`shift_logits`). A family module turns a
config.json into a `FamilyArch` and names every tensor; `transformer.py` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyArch:
    family: str  # "dream" | "llada"
    model_type: str  # as written in config.json
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool
    tie_embeddings: bool
    # True: the logits at position i predict the token at i+1 (Dream and the
    # Qwen2-initialised coders keep the AR alignment); False: position i
    # predicts itself (LLaDA).
    shift_logits: bool

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"config has {self.num_heads} attention heads and {self.num_kv_heads} kv heads: "
                "the heads must be a multiple of the kv heads"
            )


@dataclass(frozen=True)
class FamilyTokens:
    """Special token ids the infill decoder needs."""

    mask_id: int
    eos_ids: tuple[int, ...]  # end of content: eos, pad, end-of-turn
    pad_id: int | None
    bos_id: int | None


def require(cfg: dict, key: str, model_type: str):
    """A config.json field the architecture cannot be built without."""
    if key not in cfg or cfg[key] is None:
        raise ValueError(
            f"config.json (model_type {model_type!r}) has no {key!r}: the checkpoint is incomplete; "
            "re-download its config.json"
        )
    return cfg[key]


def tensor_name_map(
    arch: FamilyArch, *, embed: str, norm: str, lm_head: str, layer: str, layer_modules: dict[str, str]
) -> dict[str, str]:
    """Our parameter name -> the checkpoint's tensor name, for a family whose checkpoint calls
    the embedding `embed`, the final norm `norm`, the LM head `lm_head` (absent when tied), and
    the modules of layer i `layer.format(i=i)` + `layer_modules[ours]`. q/k/v have biases when
    `arch.qkv_bias`."""
    names = {"embed.weight": f"{embed}.weight", "norm.weight": f"{norm}.weight"}
    for i in range(arch.num_layers):
        prefix = layer.format(i=i)
        for ours, theirs in layer_modules.items():
            names[f"layers.{i}.{ours}.weight"] = f"{prefix}{theirs}.weight"
            if arch.qkv_bias and ours in ("q", "k", "v"):
                names[f"layers.{i}.{ours}.bias"] = f"{prefix}{theirs}.bias"
    if not arch.tie_embeddings:
        names["lm_head.weight"] = f"{lm_head}.weight"
    return names


def as_id_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
