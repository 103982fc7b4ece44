"""Shared fixtures: a tiny random native checkpoint built in the test session."""

from __future__ import annotations

import os

import pytest

# Keep the 2-core CI machine responsive: tests run small models.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TOKENIZER_TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n",
    "function f(x) { return x * 2; }\nconst y = f(3);\n",
]


def make_tiny_checkpoint(directory, seed: int = 0, preset: str = "test-tiny", **overrides):
    from dlm.coder_model.checkpoint import save_checkpoint
    from dlm.coder_model.config import ModelConfig
    from dlm.coder_model.model import DLM
    from dlm.coder_model.tokenizer import train_tokenizer

    tok = train_tokenizer(iter(TOKENIZER_TEXTS * 20), vocab_size=400)
    cfg = ModelConfig.preset(preset, vocab_size=max(tok.vocab_size, 400), **overrides)
    model = DLM(cfg, impl="reference")
    model.init_weights(seed)
    save_checkpoint(model, tok, directory)
    return directory


@pytest.fixture(scope="session")
def make_checkpoint():
    """make_tiny_checkpoint(directory, seed=0, preset="test-tiny", **config overrides), for tests that
    need a checkpoint of their own shape."""
    return make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Path (str) of a tiny random native checkpoint (config.json, tokenizer.json, model.safetensors)."""
    d = tmp_path_factory.mktemp("tiny_ckpt")
    make_tiny_checkpoint(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """(model, tokenizer) of the tiny checkpoint, reference kernels, CPU."""
    from dlm.coder_model.checkpoint import load_model

    return load_model(tiny_checkpoint, device="cpu", impl="reference")
