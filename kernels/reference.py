"""PyTorch reference ops: the specification of every kernel and the CPU path.

Each function here is what the Triton kernel of the same name must compute
(docs/architecture.md §6). Shapes are in the comments next to the code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm fused with the residual add.

    x, residual: (..., d); weight: (d,).
    Returns (normed, summed) where summed = x + residual (or x when residual is
    None) and normed = summed / rms(summed) * weight, computed in fp32 and cast
    back to x.dtype.
    """
    summed = x if residual is None else x + residual
    h = summed.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype), summed


def rotary_tables(
    head_dim: int, max_pos: int, theta: float, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (max_pos, head_dim // 2), fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_pos, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)  # (max_pos, head_dim/2)
    return freqs.cos(), freqs.sin()


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding in the half-split (GPT-NeoX / Llama / Qwen2) convention.

    q: (B, Hq, T, D), k: (B, Hk, T, D), cos/sin: (P, D/2) fp32,
    positions: (T,) or (B, T) int64 absolute positions.
    Returns rotated (q, k) in their input dtype.
    """
    c = cos[positions]  # (T, D/2) or (B, T, D/2)
    s = sin[positions]
    if c.dim() == 2:
        c, s = c[None, None], s[None, None]  # (1, 1, T, D/2)
    else:
        c, s = c[:, None], s[:, None]  # (B, 1, T, D/2)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)

    return rot(q), rot(k)


def attention_mask(
    q_len: int, kv_len: int, context_len: int, bidirectional: bool = False, device=None
) -> torch.Tensor:
    """Boolean (q_len, kv_len) mask, True where a query may attend.

    Queries are the last q_len of the kv_len positions (absolute position of
    query i is kv_len - q_len + i). The native mask: a query inside the context
    (position < context_len) sees context keys up to itself (causal) and never a
    block key; a query in the masked block (position >= context_len) sees every
    key, context and block. `bidirectional=True` (dream/llada) allows all.
    """
    if bidirectional:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # (q, 1)
    kpos = torch.arange(kv_len, device=device)[None, :]  # (1, kv)
    causal_ctx = (kpos <= qpos) & (kpos < context_len)
    in_block = qpos >= context_len
    return causal_ctx | in_block


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    context_len: int,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    bidirectional: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention with the native mask, grouped-query heads and a KV cache.

    q: (B, Hq, Tq, D) queries of the last Tq positions.
    k, v: (B, Hk, Tq, D) keys/values of the same positions as q.
    kv_cache: optional (k_c, v_c), each (B, Hk, Tc, D): keys/values of the Tc
      positions before them (the cached context), so the full key range is
      Tc + Tq and query i sits at absolute position Tc + i.
    context_len: positions < context_len are context (causal), the rest the
      masked block (bidirectional over context + block). See attention_mask.
    Hq must be a multiple of Hk (GQA). Returns (B, Hq, Tq, D) in q.dtype.
    """
    B, Hq, Tq, D = q.shape
    Hk = k.shape[1]
    assert Hq % Hk == 0, f"query heads {Hq} not a multiple of kv heads {Hk}"
    if kv_cache is not None:
        k = torch.cat([kv_cache[0], k], dim=2)  # (B, Hk, Tc+Tq, D)
        v = torch.cat([kv_cache[1], v], dim=2)
    Tk = k.shape[2]
    mask = attention_mask(Tq, Tk, context_len, bidirectional, device=q.device)  # (Tq, Tk)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if q.dtype == torch.float32 and Tq * Tk > 4096:
        # the CPU path: torch's fused attention (no (Tq, Tk) fp32 matrices per head in
        # Python ops); every query sees at least itself or the context, so no row is empty
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if bidirectional else mask, scale=scale, enable_gqa=Hq != Hk
        )
    if Hq != Hk:
        k = k.repeat_interleave(Hq // Hk, dim=1)  # (B, Hq, Tk, D)
        v = v.repeat_interleave(Hq // Hk, dim=1)
    # fp32 math so the reference is the spec the kernels are measured against
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, Hq, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # a query with no visible key outputs 0
    return torch.matmul(probs, v.float()).to(q.dtype)


def confidence_from_logits(logits: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, confidence) per row of fp32 logits (N, V).

    max_prob: p(argmax); margin: p1 - p2 (top two); entropy: -H(p) (higher is
    more confident, so every rule is "bigger is surer").
    """
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    p = logp.exp()
    top2 = p.topk(2, dim=-1)
    token = top2.indices[:, 0]
    if rule == "max_prob":
        conf = top2.values[:, 0]
    elif rule == "margin":
        conf = top2.values[:, 0] - top2.values[:, 1]
    elif rule == "entropy":
        conf = (p * logp).nan_to_num(0.0).sum(-1)  # = -H
    else:
        raise ValueError(f"unknown confidence rule {rule!r}: use max_prob, margin or entropy")
    return token, conf


def unmask_scores(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, mask_positions: torch.Tensor, rule: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """LM head + softmax statistics for the masked slots only.

    hidden: (N, d) final hidden states (already normed); lm_head_weight: (V, d);
    mask_positions: (M,) int64 rows of `hidden` to score.
    Returns token (M,) int64 = argmax, confidence (M,) fp32 per `rule`.
    The Triton kernel streams the vocab in tiles with an online softmax and
    never materialises (M, V); this reference does.
    """
    h = hidden[mask_positions]  # (M, d)
    logits = h.float() @ lm_head_weight.float().t()  # (M, V)
    return confidence_from_logits(logits, rule)
