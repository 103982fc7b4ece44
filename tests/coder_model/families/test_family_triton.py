"""The GPU path: the family model on dlm.kernels' Triton kernels (run in the interpreter on CPU)."""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton_ops defines its kernels (see tests/kernels/conftest.py)

import pytest
import torch

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def interpreted():
    mod = sys.modules.get("dlm.kernels.triton_ops")
    if mod is None:
        from dlm.kernels import triton_ops as mod
    if not mod.INTERPRET:
        mod = importlib.reload(mod)
    assert mod.INTERPRET
    return mod


def test_triton_path_matches_reference_with_and_without_cache(interpreted, dream_ckpt):
    from dlm.coder_model.families import load_family_model
    from dlm.coder_model.families.infill import InfillDecoder, InfillOptions

    d, _ = dream_ckpt
    ref, _, tokens, _ = load_family_model(d, device="cpu", dtype="float32", impl="reference")
    tri, *_ = load_family_model(d, device="cpu", dtype="float32", impl="triton")
    prefix, suffix, L = [5, 17, 40, 41, 42, 43, 44], [60, 61, 62, 63], 4
    ids = torch.tensor([prefix + [tokens.mask_id] * L + suffix])

    def full_and_cached(model):
        dec = InfillDecoder(model, tokens, InfillOptions(lengths=()))
        full, ctx = dec._full(ids, len(prefix), L, want_kv=True)  # (L, V) slot logits, context K/V
        return full, dec._window(ids, len(prefix), L, ctx)

    (rf, rc), (tf, tc) = full_and_cached(ref), full_and_cached(tri)
    torch.testing.assert_close(tf, rf, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(tc, rc, atol=2e-3, rtol=2e-3)
