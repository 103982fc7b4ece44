"""Exact prefix KV cache for the native family (DESIGN §4).

The context is causal, so the K/V of a context token depend only on the tokens
before it: the K/V of the longest unchanged token prefix are exact and are
reused across denoising steps and across keystrokes.
"""

from __future__ import annotations

import torch


class PrefixCache:
    """K/V of a token prefix, batch size 1, one entry per layer.

    k[i], v[i]: (1, n_kv_heads, length, head_dim).
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

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

    def clear(self) -> None:
        self.tokens, self.k, self.v = [], [], []

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
