"""The objective's variants: t distributions, stratified t, complementary masks, loss weighting."""

from __future__ import annotations

import pytest
import torch
from dlm.drivers.training.objective import (
    Objective,
    diffusion_loss,
    sample_masks,
    sample_t,
    sample_uniforms,
    weighted_loss,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_stratified_uniforms_put_one_draw_in_each_stratum():
    for seed in range(5):
        u = sample_uniforms(16, True, gen(seed))
        strata = sorted((u * 16).floor().long().tolist())
        assert strata == list(range(16))
    # the order is shuffled: which row gets which noise level is random
    assert not torch.equal(sample_uniforms(16, True, gen(0)).argsort(), torch.arange(16))
    # independent draws do not cover every stratum in general
    covered = [len(set((sample_uniforms(16, False, gen(s)) * 16).floor().long().tolist())) for s in range(5)]
    assert min(covered) < 16


@pytest.mark.parametrize("stratified", [False, True])
def test_t_distributions_stay_in_their_ranges(stratified):
    n = 4096
    uni = sample_t(n, Objective(t_dist="uniform", stratified_t=stratified, eps=1e-3), gen())
    assert uni.shape == (n, 1) and uni.min() >= 1e-3 and uni.max() <= 1.0
    clipped = sample_t(n, Objective(t_dist="clipped", stratified_t=stratified, t_min=0.3), gen())
    assert clipped.min() >= 0.3 and clipped.max() <= 1.0
    assert clipped.mean().item() == pytest.approx(0.65, abs=0.02)  # U(0.3, 1)
    ln = sample_t(n, Objective(t_dist="logit_normal", stratified_t=stratified), gen())
    assert 0.0 < ln.min() and ln.max() < 1.0
    # bell-shaped around 0.5: far more mass in the middle than a uniform t has
    middle = ((ln > 0.25) & (ln < 0.75)).float().mean().item()
    assert middle == pytest.approx(0.71, abs=0.03)  # P(|N(0,1)| < logit(0.75) = 1.0986)
    assert ln.median().item() == pytest.approx(0.5, abs=0.03)


def test_complementary_masks_are_complements_and_their_noise_levels_add_to_one():
    t = sample_t(8, Objective(), gen())
    masked, t_rows = sample_masks(t, 32, complementary=True, gen=gen(1))
    assert masked.shape == (8, 32)
    assert torch.equal(masked[4:], ~masked[:4])  # every slot masked in exactly one copy
    assert torch.allclose(t_rows[:4] + t_rows[4:], torch.ones(4, 1))
    with pytest.raises(ValueError, match="even batch"):
        sample_masks(sample_t(5, Objective(), gen()), 8, complementary=True, gen=gen())


def test_independent_masks_mask_at_least_one_slot_per_row():
    t = torch.full((64, 1), 1e-3)  # almost nothing would be masked
    masked, t_rows = sample_masks(t, 8, complementary=False, gen=gen())
    assert masked.any(1).all() and torch.equal(t_rows, t)


def test_loss_weighting_equals_the_formulas():
    ce = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 1.5, 2.5]])
    masked = torch.tensor([[True, False, True, False], [False, True, True, True]])
    t = torch.tensor([[0.5], [0.25]])
    # 1/t (the ELBO): sum(ce * mask / t) / (B * L)
    elbo = ((1.0 + 3.0) / 0.5 + (0.5 + 1.5 + 2.5) / 0.25) / 8
    assert weighted_loss(ce, masked, t, "inv_t").item() == pytest.approx(elbo)
    # plain cross-entropy: the mean over the 5 masked slots, t plays no part
    assert weighted_loss(ce, masked, t, "ce").item() == pytest.approx((1 + 3 + 0.5 + 1.5 + 2.5) / 5)
    # a complementary row with nothing masked (t -> 0) adds nothing rather than NaN
    none = torch.zeros_like(masked)
    assert weighted_loss(ce, none, torch.zeros(2, 1), "inv_t").item() == 0.0
    assert weighted_loss(ce, none, torch.zeros(2, 1), "ce").item() == 0.0


def test_objective_rejects_unknown_settings():
    with pytest.raises(ValueError, match="t_dist"):
        Objective(t_dist="beta")
    with pytest.raises(ValueError, match="loss_weight"):
        Objective(loss_weight="sqrt")
    with pytest.raises(ValueError, match="t_min"):
        Objective(t_min=1.5)


@pytest.mark.parametrize("obj", [
    Objective(),
    Objective(stratified_t=True, t_dist="clipped"),
    Objective(t_dist="logit_normal", loss_weight="ce"),
    Objective(complementary=True, stratified_t=True, loss_weight="ce"),
])
def test_every_variant_trains_the_model(tiny_model, obj):
    model, tok = tiny_model
    model.train()
    ids = torch.randint(20, 300, (4, 24))
    targets = torch.randint(20, 300, (4, 8))
    if obj.complementary:  # the batch holds each sequence twice
        ids[2:], targets[2:] = ids[:2], targets[:2]
    valid = torch.ones(4, 24, dtype=torch.bool)
    loss, acc = diffusion_loss(model, ids, targets, valid, 16, tok, gen(), objective=obj)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and loss.item() > 0 and 0.0 <= acc.item() <= 1.0
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad(set_to_none=True)
    model.eval()


def test_a_row_that_starts_from_a_draft_shows_the_draft_and_is_scored_on_every_slot(tiny_model):
    """--draft-start: where `starts` holds a draft, the block's unmasked slots hold the draft's
    tokens (not the answer's) and every slot counts in the loss; the other rows are unchanged."""
    model, tok = tiny_model
    seen = {}

    class Spy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model
            self.copy_head = None

        def forward(self, x, attn_mask=None):
            seen["x"] = x.clone()
            return self.inner(x, attn_mask=attn_mask)

        def logits(self, hidden):
            return self.inner.logits(hidden)

    ids = torch.randint(20, 300, (2, 24))
    targets = torch.randint(20, 300, (2, 8))
    starts = torch.full((2, 8), -1, dtype=torch.long)
    starts[0] = torch.randint(20, 300, (8,))
    valid = torch.ones(2, 24, dtype=torch.bool)
    obj = Objective(loss_weight="ce")
    loss, acc = diffusion_loss(Spy(), ids, targets, valid, 16, tok, gen(), objective=obj, starts=starts)
    block = seen["x"][:, 16:]
    shown0 = block[0] != tok.mask_id
    assert torch.equal(block[0][shown0], starts[0][shown0]) and shown0.any()
    shown1 = block[1] != tok.mask_id
    assert torch.equal(block[1][shown1], targets[1][shown1])
    assert torch.isfinite(loss) and 0.0 <= acc.item() <= 1.0
    # with every draft slot right, a row from a draft is scored on slots the model sees: its loss
    # differs from the loss of the same row started from masks
    same, _ = diffusion_loss(model, ids, targets, valid, 16, tok, gen(), objective=obj,
                             starts=torch.full((2, 8), -1, dtype=torch.long))
    assert not torch.isclose(loss, same)
