"""Model configuration: one dataclass, named presets (gpt-fast style)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelConfig:
    """Shape of the native `dlm` denoiser (a Llama-style transformer).

    The attention mask is the native one (docs/architecture.md §4): causal over the context,
    bidirectional inside the masked block; logits are unshifted (slot i predicts
    the token at slot i).
    """

    model_type: str = "dlm"
    vocab_size: int = 8192
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 704  # SwiGLU hidden size
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096
    tie_embeddings: bool = True
    # context tokens the model was trained with; inference windows default to it
    # (rotary positions far beyond training extrapolate badly)
    context_window: int = 2048
    # tokens of the repository memory's drafts section the model was trained with (layout 3,
    # coder_model.layout.render_drafts); 0: it reads no drafts (served them, it only checks them)
    drafts_window: int = 0
    # trained to start its block from the memory's best draft and rewrite what is wrong
    # (coder_model.refine; the trainer's --draft-start): served so when it writes from drafts
    draft_start: bool = False
    # a pointer-generator copy head (model.CopyHead): block slots may copy a context token (or the
    # token after it) instead of generating one; off for a checkpoint whose config.json has none
    copy_head: bool = False
    copy_dim: int = 64  # query/key width of the copy head

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.copy_dim < 1:
            raise ValueError(f"copy_dim={self.copy_dim} must be >= 1")
        if self.draft_start and not self.drafts_window:
            raise ValueError("draft_start needs a drafts window (drafts_window > 0): the model starts from a "
                             "draft its context holds")
        if not 0 <= self.drafts_window < self.context_window:
            raise ValueError(f"drafts_window={self.drafts_window} must be >= 0 and below "
                             f"context_window={self.context_window}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"config.json has fields this version does not know: {unknown}; "
                "upgrade dlm-lsp or remove them"
            )
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict] = {
    # random models built in tests
    "test-tiny": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128),
    # the objective A/B on the 2-core CPU (BENCHMARKS.md "Training recipe"): ~1M parameters,
    # several arms train side by side in minutes
    "cpu-ab": dict(vocab_size=2048, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352),
    # trained on the 2-core CPU (the embedded model): ~6M parameters, 2.1M of them embeddings
    "cpu-small": dict(vocab_size=8192, dim=256, n_layers=6, n_heads=8, n_kv_heads=2, ffn_dim=704),
    # ~16M: on a 2-vCPU CPU its step takes 1.85 times cpu-small's and most answers miss the 250 ms
    # deadline through the server (BENCHMARKS.md "GPU: one H200 lease"): a GPU-serving shape
    "cpu-base": dict(vocab_size=8192, dim=384, n_layers=8, n_heads=6, n_kv_heads=2, ffn_dim=1024),
    # shapes for training on a GPU
    "gpu-40m": dict(vocab_size=8192, dim=512, n_layers=12, n_heads=8, n_kv_heads=2, ffn_dim=1408),
    "gpu-150m": dict(vocab_size=16384, dim=768, n_layers=18, n_heads=12, n_kv_heads=4, ffn_dim=2048),
}
