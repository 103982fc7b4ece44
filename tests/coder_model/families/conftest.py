"""Session fixtures: tiny random dream and llada checkpoints (see family_helpers.py)."""

from __future__ import annotations

import pytest
from family_helpers import make_dream_checkpoint, make_llada_checkpoint


@pytest.fixture(scope="session")
def dream_ckpt(tmp_path_factory):
    """(directory, transformers reference model) of a tiny random dream checkpoint."""
    d = tmp_path_factory.mktemp("dream_ckpt")
    return d, make_dream_checkpoint(d)


@pytest.fixture(scope="session")
def llada_ckpt(tmp_path_factory):
    """(directory, transformers reference model) of a tiny random llada checkpoint."""
    d = tmp_path_factory.mktemp("llada_ckpt")
    return d, make_llada_checkpoint(d)
