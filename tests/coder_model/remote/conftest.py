"""Fixtures of the remote-mode tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sharp_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny random model with weights scaled x10: its greedy output then depends on the
    prompt (the unscaled one writes the same special token everywhere, which would make a
    mismatched or mis-batched answer undetectable)."""
    import torch
    from dlm.coder_model.checkpoint import load_model, save_checkpoint

    model, tok = load_model(tiny_checkpoint, "cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(10.0)
    d = tmp_path_factory.mktemp("sharp_ckpt")
    save_checkpoint(model, tok, d)
    return str(d)
