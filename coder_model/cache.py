"""Exact prefix KV cache for the native family (docs/architecture.md §4).

The context is causal, so the K/V of a context token depend only on the tokens
before it: the K/V of the longest unchanged token prefix are exact and are
reused across denoising steps and across keystrokes.
"""

from __future__ import annotations

import torch


class PrefixCache:
    """K/V of a token prefix, batch size 1, one entry per layer.

    k[i], v[i]: (1, n_kv_heads, length, head_dim). copy_k: (1, length, 2, copy_dim), the
    copy head's keys of the same positions (model.CopyHead; None for a model without one):
    like K/V they depend on the causal prefix only, so they are exact under the same reuse.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.copy_k: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def common_prefix(self, ids: list[int]) -> int:
        n = min(len(ids), len(self.tokens))
        i = 0
        # compare in chunks first: contexts are long and mostly equal
        while i + 256 <= n and self.tokens[i : i + 256] == ids[i : i + 256]:
            i += 256
        while i < n and self.tokens[i] == ids[i]:
            i += 1
        return i

    def truncate(self, n: int) -> None:
        if n >= len(self.tokens):
            return
        self.tokens = self.tokens[:n]
        self.k = [k[:, :, :n] for k in self.k]
        self.v = [v[:, :, :n] for v in self.v]
        if self.copy_k is not None:
            self.copy_k = self.copy_k[:, :n]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.tokens or layer >= len(self.k):
            return None
        return self.k[layer], self.v[layer]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append K/V (1, Hk, T, D) of new positions for one layer."""
        if layer < len(self.k):
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        else:
            self.k.append(k)
            self.v.append(v)

    def append_copy_keys(self, keys: torch.Tensor) -> None:
        """Append the copy head's keys (1, T, 2, d) of new positions."""
        self.copy_k = keys if self.copy_k is None else torch.cat([self.copy_k, keys], dim=1)

    def clear(self) -> None:
        self.tokens, self.k, self.v, self.copy_k = [], [], [], None

    def nbytes(self) -> int:
        extra = [] if self.copy_k is None else [self.copy_k]
        return sum(t.numel() * t.element_size() for t in self.k + self.v + extra)
