"""The native `dlm` denoiser: a Llama-style transformer with the native mask.

RMSNorm, rotary embeddings, SwiGLU, grouped-query attention. The attention is
causal over the context and bidirectional inside the masked block (docs/architecture.md §4),
so the K/V of context tokens never depend on the block and can be cached
exactly (coder_model.cache). Logits are unshifted: block slot i predicts the
token at slot i.

All ops go through `dlm.kernels` with the model's `impl` ("auto" picks the
Triton kernels on CUDA and the PyTorch reference elsewhere).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dlm import kernels
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.config import ModelConfig
from dlm.kernels import reference as reference_ops
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def qkv(self, x: torch.Tensor, rope: tuple, positions: torch.Tensor, impl: str):
        B, T, _ = x.shape  # x: (B, T, dim)
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, Hq, T, D)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hk, T, D)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = kernels.apply_rotary(q, k, rope[0], rope[1], positions, impl=impl)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        B, H, T, D = o.shape  # (B, Hq, T, D)
        return self.wo(o.transpose(1, 2).reshape(B, T, H * D))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)


class CopyHead(nn.Module):
    """Pointer-generator copy head: a block slot may copy a context token.

    A model of 6M parameters trained on ~40M tokens does not learn induction-style copying
    (`def __init__(self, x):` ... `self.x = ` gets no `x`), so copying is given to it: each
    block slot's final hidden state makes a query, each context position two keys, one for
    copying the token at that position and one for copying the token after it (the induction
    shift: "what followed the token like me"). One softmax runs over both key sets of all
    context positions; its weights are scattered onto the copied token ids. A gate
    g = sigmoid(w.h + b) mixes: p = (1 - g) * softmax(lm logits) + g * p_copy.
    The keys of a context position depend only on the causal context (like its K/V), so the
    server computes them at prefill and keeps them in the PrefixCache.
    """

    N_KEY_SETS = 2  # copy the token at j; copy the token at j + 1
    GATE_BIAS_INIT = -2.0  # g ~ 0.12 at a warm start: the LM's distribution is mostly kept

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dim = cfg.copy_dim
        self.wq = nn.Linear(cfg.dim, cfg.copy_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, self.N_KEY_SETS * cfg.copy_dim, bias=False)
        self.gate = nn.Linear(cfg.dim, 1)

    def keys(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, n, dim) context hidden states -> keys (B, n, N_KEY_SETS, copy_dim)."""
        B, n, _ = hidden.shape
        return self.wk(hidden).view(B, n, self.N_KEY_SETS, self.dim)

    def mixture(self, logits: torch.Tensor, hidden: torch.Tensor, keys: torch.Tensor,
                ctx_ids: torch.Tensor, ctx_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Probabilities (B, L, V) of the mixture, fp32.

        logits (B, L, V) of the LM head; hidden (B, L, dim) of the block slots; keys
        (B, n, 2, d) and ids (B, n) of the context; ctx_valid (B, n) bool (left padding) or None.
        """
        B, n = ctx_ids.shape
        p_lm = torch.softmax(logits.float(), dim=-1)
        if n == 0:
            return p_lm
        ok = torch.ones(B, n, dtype=torch.bool, device=ctx_ids.device) if ctx_valid is None else ctx_valid
        # the token after position j (none after the last one): the induction set's values
        nxt = torch.cat([ctx_ids[:, 1:], ctx_ids[:, :1]], dim=1)
        ok_nxt = torch.cat([ok[:, 1:] & ok[:, :-1], torch.zeros_like(ok[:, :1])], dim=1)
        values = torch.cat([ctx_ids, nxt], dim=1)  # (B, 2n)
        ok2 = torch.cat([ok, ok_nxt], dim=1)  # (B, 2n)
        k = keys.float().transpose(1, 2).reshape(B, self.N_KEY_SETS * n, self.dim)  # (B, 2n, d)
        q = self.wq(hidden).float()  # (B, L, d)
        scores = (q @ k.transpose(1, 2)) / self.dim**0.5  # (B, L, 2n)
        scores = scores.masked_fill(~ok2[:, None, :], -1e9)  # finite: a row with no source stays a number
        attn = torch.softmax(scores, dim=-1) * ok2[:, None, :]
        p_copy = torch.zeros_like(p_lm).scatter_add_(-1, values[:, None, :].expand(-1, q.shape[1], -1), attn)
        g = torch.sigmoid(self.gate(hidden).float()) * ok2.any(1)[:, None, None]  # no source: no copy
        return (1 - g) * p_lm + g * p_copy


class DLM(nn.Module):
    def __init__(self, cfg: ModelConfig, impl: str = "auto") -> None:
        super().__init__()
        if cfg.model_type != "dlm":
            raise ValueError(f"DLM builds model_type 'dlm', not {cfg.model_type!r}")
        self.config = cfg
        self.impl = impl
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.copy_head = CopyHead(cfg) if cfg.copy_head else None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- helpers -------------------------------------------------------------
    @property
    def lm_head_weight(self) -> torch.Tensor:  # (V, dim)
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables (max_seq_len, head_dim/2), built lazily on the weights' device
        (the model may have been built on the meta device)."""
        dev = self.tok_emb.weight.device
        if self._rope is None or self._rope[0].device != dev:
            self._rope = reference_ops.rotary_tables(
                self.config.head_dim, self.config.max_seq_len, self.config.rope_theta, device=dev
            )
        return self._rope

    def init_weights(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name == "copy_head.gate.bias":
                nn.init.constant_(p, CopyHead.GATE_BIAS_INIT)
            else:
                std = 0.02 / (2 * self.config.n_layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else 0.02
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_head_weight.t()  # (..., V)

    def log_probs(self, hidden: torch.Tensor, cache: PrefixCache | None = None) -> torch.Tensor:
        """Log-probabilities (M, V), fp32, of block slots with final hidden states (M, dim);
        with a copy head, of the mixture over the context in `cache` (its tokens and copy keys)."""
        logits = self.logits(hidden).float()
        if self.copy_head is None:
            return torch.log_softmax(logits, dim=-1)
        if cache is None or cache.copy_k is None:
            raise ValueError("a copy-head model scores block slots against its context: pass the PrefixCache")
        ids = torch.tensor([cache.tokens], dtype=torch.long, device=hidden.device)
        p = self.copy_head.mixture(logits[None], hidden[None], cache.copy_k, ids)[0]
        return p.clamp_min(1e-30).log()

    def _norm(self, x, norm: RMSNorm, residual=None):
        if self.training:
            # autograd path: torch's fused rms_norm avoids the reference's fp32 round trips
            summed = x if residual is None else x + residual
            return F.rms_norm(summed, (summed.shape[-1],), norm.weight, norm.eps), summed
        return kernels.rms_norm(x, norm.weight, norm.eps, residual, impl=self.impl)

    # -- forward passes ------------------------------------------------------
    def forward(
        self,
        ids: torch.Tensor,
        *,
        start_pos: int = 0,
        context_len: int | None = None,
        cache: PrefixCache | None = None,
        write_cache: bool = False,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final (normed) hidden states (B, T, dim) of `ids` (B, T).

        Inference: `ids` are the positions start_pos..start_pos+T-1; `cache`
        holds the K/V of positions [0, start_pos) (so start_pos == len(cache));
        positions < context_len are context (causal), the rest the masked
        block. `write_cache=True` appends the new K/V to the cache (context
        prefill only; B must be 1).
        Training: `attn_mask` (B, 1, T, T) bool, True = may attend, built by
        the caller for left-padded batches; no cache.
        """
        B, T = ids.shape
        if cache is not None and len(cache) != start_pos:
            raise ValueError(f"start_pos={start_pos} but the cache holds {len(cache)} positions")
        if start_pos + T > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {start_pos + T} tokens exceeds max_seq_len={self.config.max_seq_len}; "
                "shorten the context window"
            )
        ctx = start_pos + T if context_len is None else context_len
        positions = torch.arange(start_pos, start_pos + T, device=ids.device)
        rope = self.rope()
        x = self.tok_emb(ids)  # (B, T, dim)
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, layer.attn_norm, residual)
            q, k, v = layer.attn.qkv(h, rope, positions, self.impl)
            if attn_mask is not None:
                rep = layer.attn.n_heads // layer.attn.n_kv_heads
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
                    # torch 2.13's CPU SDPA with a boolean mask is 2x slower in bf16
                    # than in fp32 (backward dominated); the casts are cheap at these sizes
                    with torch.autocast("cpu", enabled=False):
                        o = F.scaled_dot_product_attention(
                            q.float(), k.float(), v.float(), attn_mask=attn_mask).to(q.dtype)
                else:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            else:
                kv = cache.kv(i) if cache is not None else None
                o = kernels.attention(q, k, v, context_len=ctx, kv_cache=kv, impl=self.impl)
                if write_cache:
                    cache.append(i, k, v)
            x = layer.attn.out(o)
            h, residual = self._norm(x, layer.ffn_norm, residual)
            x = layer.ffn(h)
        out, _ = self._norm(x, self.norm, residual)
        if write_cache:
            cache.tokens.extend(ids[0].tolist())
            if self.copy_head is not None:
                cache.append_copy_keys(self.copy_head.keys(out))
        return out

    def prefill(self, ids: list[int], cache: PrefixCache) -> int:
        """Make `cache` hold the K/V of the context `ids`, reusing its longest
        common prefix. Returns how many tokens were reused."""
        reuse = cache.common_prefix(ids)
        cache.truncate(reuse)
        if reuse < len(ids):
            new = torch.tensor([ids[reuse:]], dtype=torch.long, device=self.tok_emb.weight.device)
            self.forward(new, start_pos=reuse, context_len=len(ids), cache=cache, write_cache=True)
        return reuse

    def forward_blocks(self, blocks: list[torch.Tensor], caches: list[PrefixCache]) -> list[torch.Tensor]:
        """One denoising step for many requests in one pass.

        blocks[j]: (L_j,) block tokens of request j, whose context K/V are in
        caches[j]. The linear layers run on all requests' tokens packed into one
        (1, sum L_j, dim) matrix; attention runs per request against its own
        cache. Returns the final hidden states (L_j, dim) per request.
        """
        dev = self.tok_emb.weight.device
        sizes = [int(b.numel()) for b in blocks]
        packed = torch.cat([b.to(dev) for b in blocks]).unsqueeze(0)  # (1, N)
        positions = [
            torch.arange(len(c), len(c) + n, device=dev) for c, n in zip(caches, sizes)
        ]
        rope = self.rope()
        x = self.tok_emb(packed)  # (1, N, dim)
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, layer.attn_norm, residual)
            outs = []
            for j, (hj, c) in enumerate(zip(h.split(sizes, dim=1), caches)):
                q, k, v = layer.attn.qkv(hj, rope, positions[j], self.impl)
                o = kernels.attention(q, k, v, context_len=len(c), kv_cache=c.kv(i), impl=self.impl)
                outs.append(layer.attn.out(o))
            x = torch.cat(outs, dim=1)
            h, residual = self._norm(x, layer.ffn_norm, residual)
            x = layer.ffn(h)
        out, _ = self._norm(x, self.norm, residual)
        return list(out[0].split(sizes, dim=0))


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", impl: str = "auto") -> DLM:
    """A randomly initialised model (training, tests)."""
    model = DLM(cfg, impl=impl)
    model.init_weights()
    return model.to(device)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
