"""The dream/llada loaders on the GPU: tiny random checkpoints (tests/coder_model/families/family_helpers.py)
against their transformers references, with the reference ops and with the compiled kernels."""

from __future__ import annotations

import pytest
import torch

FAMILIES = ["dream_ckpt", "llada_ckpt"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_logits_match_transformers_on_cuda(request, cuda_ops, family, impl):
    from dlm.coder_model.families import load_family_model
    from family_helpers import hf_bidirectional_logits

    d, ref = request.getfixturevalue(family)
    model, _tok, tokens, arch = load_family_model(d, device="cuda", dtype="float32", impl=impl)
    assert next(model.parameters()).device.type == "cuda"
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, arch.vocab_size, (2, 23), generator=g)
    ids[0, 5:9] = tokens.mask_id
    with torch.inference_mode():
        hidden, _ = model(ids.cuda(), torch.arange(23, device="cuda"))
        ours = model.logits(hidden).float().cpu()
    want = hf_bidirectional_logits(ref, ids)  # transformers on the CPU, fp32
    tol = 2e-4 if impl == "reference" else 2e-3
    torch.testing.assert_close(ours, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_infill_cuda_triton_equals_cpu_reference(request, cuda_ops, family):
    """A whole infill (length probe, threshold decoding, dual cache) decodes the same span on both paths."""
    from dlm.coder_model.families import load_family_model
    from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
    from dlm.coder_model.types import SamplerParams

    d, _ = request.getfixturevalue(family)
    spans = []
    for device, impl in (("cpu", "reference"), ("cuda", "triton")):
        model, _tok, tokens, _arch = load_family_model(d, device=device, dtype="float32", impl=impl)
        dec = InfillDecoder(model, tokens, InfillOptions(lengths=(4, 8), refresh_every=2))
        r = dec.infill([5, 17, 40, 41, 42], [60, 61, 62], SamplerParams(steps=8, block_len=8, threshold=0.5))
        spans.append((r.length, r.raw, r.steps))
    assert spans[1] == spans[0]
