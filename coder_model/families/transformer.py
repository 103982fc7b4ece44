"""The bidirectional transformer both families share, run on dlm.kernels ops.

Parameter names here are ours; each family module maps them to its checkpoint's
names. The model is built on the meta device and its tensors are assigned
straight from safetensors (see loader.py), so no CPU copy of the weights exists
when the target is a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dlm import kernels
from dlm.coder_model.families.arch import FamilyArch
from dlm.kernels.reference import rotary_tables
from torch import nn

# Per layer: (k, v), each (B, Hk, Tc, D) with rotary already applied.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class _Norm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d))


class Block(nn.Module):
    def __init__(self, a: FamilyArch) -> None:
        super().__init__()
        hq, hk, d = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.hidden_size
        self.attn_norm = _Norm(d)
        self.q = nn.Linear(d, hq, bias=a.qkv_bias)
        self.k = nn.Linear(d, hk, bias=a.qkv_bias)
        self.v = nn.Linear(d, hk, bias=a.qkv_bias)
        self.o = nn.Linear(hq, d, bias=False)
        self.mlp_norm = _Norm(d)
        self.gate = nn.Linear(d, a.intermediate_size, bias=False)
        self.up = nn.Linear(d, a.intermediate_size, bias=False)
        self.down = nn.Linear(a.intermediate_size, d, bias=False)


class BidirectionalLM(nn.Module):
    """Embedding -> N blocks -> RMSNorm; `logits()` applies the LM head."""

    def __init__(self, arch: FamilyArch, impl: str = "auto") -> None:
        super().__init__()
        self.arch = arch
        self.impl = impl
        self.embed = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.num_layers))
        self.norm = _Norm(arch.hidden_size)
        self.lm_head = (
            None if arch.tie_embeddings else nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        )
        self._cos: torch.Tensor | None = None  # (P, D/2) fp32, grown on demand
        self._sin: torch.Tensor | None = None

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight  # (V, d)

    def _rotary(self, max_pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos is None or self._cos.shape[0] < max_pos or self._cos.device != torch.device(device):
            size = max(max_pos, 2 * (0 if self._cos is None else self._cos.shape[0]), 1024)
            self._cos, self._sin = rotary_tables(self.arch.head_dim, size, self.arch.rope_theta, device)
        return self._cos, self._sin

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache | None = None,
        want_kv: bool = False,
        max_pos: int | None = None,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """Final normed hidden states of `ids`, attending to themselves and `kv_cache`.

        ids: (B, T) int64; positions: (T,) int64 absolute positions of ids.
        kv_cache: per layer (k, v) (B, Hk, Tc, D) of other positions (any order:
          attention is bidirectional, so key order does not matter once rotary
          has been applied).
        max_pos: the largest of `positions`, when the caller knows it: reading it from the device
          tensor is a host sync, which a CUDA graph capture of this call cannot contain.
        Returns hidden (B, T, d) and, if want_kv, the per-layer (k, v) of ids
        (B, Hk, T, D), rotary applied.
        """
        a, impl = self.arch, self.impl
        B, T = ids.shape
        cos, sin = self._rotary((int(positions.max()) if max_pos is None else max_pos) + 1, ids.device)
        x = self.embed(ids)  # (B, T, d)
        new_kv: KVCache = []
        # Each rms_norm call also adds the residual (fused), so the norm that
        # opens block i+1 closes block i; the last one is the final norm.
        norms = [blk.attn_norm.weight for blk in self.layers] + [self.norm.weight]
        normed, resid = kernels.rms_norm(x, norms[0], a.rms_norm_eps, impl=impl)
        for i, blk in enumerate(self.layers):
            q = blk.q(normed).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)  # (B, Hq, T, D)
            k = blk.k(normed).view(B, T, a.num_kv_heads, a.head_dim).transpose(1, 2)  # (B, Hk, T, D)
            v = blk.v(normed).view(B, T, a.num_kv_heads, a.head_dim).transpose(1, 2)
            q, k = kernels.apply_rotary(q, k, cos, sin, positions, impl=impl)
            if want_kv:
                new_kv.append((k, v))
            att = kernels.attention(
                q,
                k,
                v,
                context_len=0,
                kv_cache=None if kv_cache is None else kv_cache[i],
                bidirectional=True,
                impl=impl,
            )  # (B, Hq, T, D)
            att = blk.o(att.transpose(1, 2).reshape(B, T, a.num_heads * a.head_dim))  # (B, T, d)
            normed, resid = kernels.rms_norm(
                att, blk.mlp_norm.weight, a.rms_norm_eps, residual=resid, impl=impl
            )
            mlp = blk.down(F.silu(blk.gate(normed)) * blk.up(normed))  # (B, T, d)
            normed, resid = kernels.rms_norm(mlp, norms[i + 1], a.rms_norm_eps, residual=resid, impl=impl)
        return normed, (new_kv if want_kv else None)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) normed hidden -> (..., V) fp32 logits."""
        return (hidden @ self.head_weight.t()).float()
