"""The masked-diffusion training objective and its variants.

For each sequence a noise level t is drawn, every block slot is masked with
probability t, and the model is scored by cross-entropy on the masked slots.
The variants (flags of the trainer, chosen by the A/B in BENCHMARKS.md,
"Training recipe"):

- `t_dist`: how t is drawn. `uniform`: t ~ U(eps, 1) (the ELBO's own
  distribution); `clipped`: t ~ U(t_min, 1) (very lightly masked blocks
  give a near-zero-information, high-variance 1/t-weighted loss); `logit_normal`:
  t = sigmoid(N(mu, sigma)), bell-shaped around sigmoid(mu).
- `stratified_t`: the batch's B uniforms u are (i + U(0,1)) / B in a random
  order (a low-discrepancy sample) before the inverse CDF of `t_dist`, so
  every batch covers the whole noise range: lower gradient variance.
- `complementary`: the batch holds B/2 sequences twice; the second copy's mask
  is the complement of the first, so every block slot is trained once per
  pair (tokens per step are unchanged).
- `loss_weight`: `inv_t`: sum(ce * mask / t) / (B * L), the masked-diffusion
  ELBO; `ce`: mean cross-entropy over the masked slots (no 1/t).

Validation always reports the ELBO with uniform t (`diffusion_loss` with its
defaults), so runs with different objectives are compared on one metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

T_DISTS = ("uniform", "clipped", "logit_normal")
LOSS_WEIGHTS = ("inv_t", "ce")


@dataclass(frozen=True)
class Objective:
    """How noise levels and masks are drawn and how the loss is weighted."""

    t_dist: str = "uniform"
    stratified_t: bool = False
    complementary: bool = False
    loss_weight: str = "inv_t"
    eps: float = 1e-3  # floor of t for `uniform` (1/t stays finite)
    t_min: float = 0.1  # floor of t for `clipped`
    logit_mu: float = 0.0  # logit-normal location (0: centred on t = 0.5)
    logit_sigma: float = 1.0

    def __post_init__(self) -> None:
        if self.t_dist not in T_DISTS:
            raise ValueError(f"t_dist={self.t_dist!r}: use one of {', '.join(T_DISTS)}")
        if self.loss_weight not in LOSS_WEIGHTS:
            raise ValueError(f"loss_weight={self.loss_weight!r}: use one of {', '.join(LOSS_WEIGHTS)}")
        if not 0.0 < self.eps < 1.0 or not 0.0 < self.t_min < 1.0:
            raise ValueError(f"eps={self.eps}, t_min={self.t_min}: both must lie in (0, 1)")
        if self.logit_sigma <= 0:
            raise ValueError(f"logit_sigma={self.logit_sigma}: must be > 0")


def sample_uniforms(batch: int, stratified: bool, gen: torch.Generator) -> torch.Tensor:
    """(batch,) values in [0, 1); stratified: exactly one in each [i/B, (i+1)/B), shuffled."""
    u = torch.rand(batch, generator=gen)
    if not stratified:
        return u
    strata = torch.randperm(batch, generator=gen).to(u.dtype)
    return (strata + u) / batch


def sample_t(batch: int, obj: Objective, gen: torch.Generator) -> torch.Tensor:
    """(batch, 1) noise levels in (0, 1] by the inverse CDF of `obj.t_dist`."""
    u = sample_uniforms(batch, obj.stratified_t, gen)
    if obj.t_dist == "uniform":
        t = obj.eps + (1 - obj.eps) * u
    elif obj.t_dist == "clipped":
        t = obj.t_min + (1 - obj.t_min) * u
    else:  # logit-normal: Phi^-1(u) keeps the stratification through the transform
        z = math.sqrt(2.0) * torch.erfinv((2 * u - 1).clamp(-1 + 1e-6, 1 - 1e-6))
        t = torch.sigmoid(obj.logit_mu + obj.logit_sigma * z).clamp(obj.eps, 1.0)
    return t[:, None]


def sample_masks(t: torch.Tensor, block: int, complementary: bool, gen: torch.Generator):
    """Masks (B, L) bool and the noise level per row (B, 1) that weights its loss.

    Independent masks put at least one masked slot in every row (a row with
    none trains nothing). Complementary: rows B/2.. are the complements of rows
    ..B/2 (the same sequences), their noise level 1 - t; the first half's t is
    used, the second half's entries of `t` are ignored.
    """
    B = t.shape[0]
    if not complementary:
        masked = torch.rand(B, block, generator=gen) < t  # (B, L)
        none = ~masked.any(1)
        masked[none, torch.randint(0, block, (int(none.sum()),), generator=gen)] = True
        return masked, t
    if B % 2:
        raise ValueError(f"complementary masks need an even batch (two copies of each sequence); got {B}")
    half = B // 2
    first = torch.rand(half, block, generator=gen) < t[:half]  # (B/2, L)
    masked = torch.cat([first, ~first])  # (B, L)
    t_rows = torch.cat([t[:half], 1 - t[:half]])  # (B, 1)
    return masked, t_rows


def weighted_loss(ce: torch.Tensor, masked: torch.Tensor, t: torch.Tensor, weight: str) -> torch.Tensor:
    """Scalar loss from per-slot cross-entropy `ce` (B, L), mask (B, L) and t (B, 1).

    inv_t: sum(ce * mask / t) / (B * L); ce: sum(ce * mask) / sum(mask).
    """
    B, L = ce.shape
    m = masked.to(ce.dtype)
    if weight == "inv_t":
        # a complementary row with t -> 0 has no masked slots: clamp keeps 0/0 out
        return (ce * m / t.clamp_min(1e-6)).sum() / (B * L)
    return (ce * m).sum() / m.sum().clamp_min(1.0)


def native_train_mask(valid: torch.Tensor, tc: int) -> torch.Tensor:
    """(B, 1, T, T) bool: the native mask over left-padded rows.

    Context queries see earlier valid context keys; block queries see all valid
    keys. Padding queries see themselves only (their output is never used;
    this avoids an all-masked row).
    """
    T = valid.shape[1]  # valid: (B, T)
    dev = valid.device
    q = torch.arange(T, device=dev)[:, None]
    k = torch.arange(T, device=dev)[None, :]
    base = ((k <= q) & (k < tc)) | (q >= tc)  # (T, T)
    m = base[None] & valid[:, None, :]  # (B, T, T)
    m = m | torch.eye(T, dtype=torch.bool, device=dev)[None]
    return m[:, None]


def diffusion_loss(model, ids, targets, valid, tc, tok, gen: torch.Generator, eps: float = 1e-3,
                   ar_weight: float = 0.0, objective: Objective | None = None, starts=None):
    """Masked-diffusion loss; ids' block slots are replaced by noised targets here.

    ids (B, T), targets (B, L), valid (B, T) on the model's device; `gen` is a
    CPU generator (noise is drawn on the CPU, then moved: the same draws on
    every device). Without `objective`: uniform t in (eps, 1], independent
    masks, 1/t weighting (the ELBO; what validation reports).

    With `ar_weight` > 0 an auxiliary next-token loss on the causal context is
    added (weight x mean cross-entropy over valid context positions). Why: a
    step's block has 32 slots but its context ~250 tokens whose hidden states
    get no direct signal; the native mask makes the context a causal LM, so
    next-token targets are free there and train the K/V the block reads. The
    context outputs are never used at inference, so nothing else changes.
    `starts` (B, L): a row's block start where it starts from a draft (-1: from masks). Such a
    row's unmasked slots hold the draft's tokens, not the answer's, and every slot is scored:
    the model learns to keep what is right and rewrite what is wrong (coder_model.refine).
    Returns (loss, accuracy on the scored slots).
    """
    obj = objective or Objective(eps=eps)
    B, L = targets.shape
    dev = ids.device
    t = sample_t(B, obj, gen)  # (B, 1)
    masked, t_rows = sample_masks(t, L, obj.complementary, gen)  # (B, L), (B, 1)
    masked, t_rows = masked.to(dev), t_rows.to(dev)
    shown = targets
    scored = masked
    if starts is not None:
        starts = starts.to(dev)
        drafted = (starts[:, :1] >= 0).expand_as(targets)  # (B, L)
        shown = torch.where(drafted, starts, targets)
        scored = masked | drafted
        t_rows = torch.where(drafted[:, :1], torch.ones_like(t_rows), t_rows)  # scored whole: no 1/t
    block_in = torch.where(masked, torch.full_like(targets, tok.mask_id), shown)
    x = ids.clone()
    x[:, tc:] = block_in
    hidden = model(x, attn_mask=native_train_mask(valid, tc))  # (B, T, dim)
    logits = model.logits(hidden[:, tc:]).float()  # (B, L, V)
    copy_head = getattr(model, "copy_head", None)
    if copy_head is None:
        ce = F.cross_entropy(logits.reshape(B * L, -1), targets.reshape(-1), reduction="none").view(B, L)
        predicted = logits.argmax(-1)
    else:
        # the pointer-generator mixture over the prompt before the block (left padding excluded:
        # its hidden states are never attended and its ids are <pad>)
        keys = copy_head.keys(hidden[:, :tc])
        probs = copy_head.mixture(logits, hidden[:, tc:], keys, ids[:, :tc], valid[:, :tc])  # (B, L, V)
        ce = -probs.gather(-1, targets[..., None]).squeeze(-1).clamp_min(1e-30).log()
        predicted = probs.argmax(-1)
    loss = weighted_loss(ce, scored, t_rows, obj.loss_weight)
    acc = ((predicted == targets) & scored).sum() / scored.sum().clamp_min(1)
    if ar_weight > 0 and tc > 1:
        pairs = valid[:, : tc - 1] & valid[:, 1:tc]  # (B, tc-1): position q predicts q+1
        nxt = torch.where(pairs, ids[:, 1:tc], torch.full_like(ids[:, 1:tc], -100))
        ar_logits = model.logits(hidden[:, : tc - 1]).float()  # (B, tc-1, V)
        ar = F.cross_entropy(ar_logits.reshape(-1, ar_logits.shape[-1]), nxt.reshape(-1), ignore_index=-100)
        loss = loss + ar_weight * ar
    return loss, acc
