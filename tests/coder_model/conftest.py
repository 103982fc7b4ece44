"""Fixtures the coder_model tests share: `engine`, the embedded model loaded once per module on
the CPU, as the server loads it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine():
    from dlm.coder_model.engine import load_engine

    eng = load_engine(None, "cpu")
    yield eng
    eng.close()
