"""Open diffusion-coder checkpoints: the dream and llada families (docs/architecture.md §4).

`load_family_engine(path, device)` reads a checkpoint directory (config.json,
tokenizer.json, safetensors; never code or pickles) and returns an Engine that
infills at the cursor. `detect_family(config)` says which family a config.json
belongs to. Importing this package does not import torch.
"""

from __future__ import annotations

from pathlib import Path


def detect_family(config: dict) -> str:
    from dlm.coder_model.families.loader import detect_family as _detect

    return _detect(config)


def load_family_model(path: str | Path, device: str = "auto", dtype: str = "auto", impl: str = "auto"):
    """(model, tokenizer, tokens, arch) of a dream/llada checkpoint, weights on `device`."""
    # imported here, not at the top: importing this package must not import torch
    import torch
    from dlm.coder_model.checkpoint import read_config, resolve_device
    from dlm.coder_model.families import loader
    from dlm.coder_model.families.transformer import BidirectionalLM

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"--model {path}: not a directory; pass a checkpoint directory")
    config = read_config(path)
    arch = loader.parse_arch(config)
    tokenizer = loader.load_tokenizer(path)
    tokens = loader.resolve_tokens(path, config, arch, tokenizer)
    device = str(resolve_device(device))
    if dtype == "auto":
        dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype)
        if dt is None:
            raise ValueError(f"dtype={dtype!r}: use auto, bfloat16, float16 or float32")
    from dlm.coder_model.checkpoint import meta_without_init

    with meta_without_init():
        model = BidirectionalLM(arch, impl=impl)
    loader.load_weights(model, arch, path, device, dt)
    model.eval()
    return model, tokenizer, tokens, arch


def load_family_engine(path: str | Path, device: str = "auto", options=None):
    """An Engine over the dream/llada checkpoint at `path`.

    Raises ValueError for an unsupported model_type (named, with the supported
    ones listed), a missing tensor (named), or a checkpoint without safetensors.
    """
    from dlm.coder_model.families.family_engine import FamilyEngine, FamilyEngineOptions

    options = options or FamilyEngineOptions()
    model, tokenizer, tokens, arch = load_family_model(path, device, options.dtype, options.impl)
    dev = str(model.embed.weight.device)
    return FamilyEngine(model, tokenizer, tokens, arch, str(path), dev, options)


__all__ = ["detect_family", "load_family_engine", "load_family_model"]
