"""Checkpoints: a directory with config.json, tokenizer.json and safetensors weights.

Weights are `model.safetensors`, or shards `model-0000K-of-0000N.safetensors`
with `model.safetensors.index.json` (Hugging Face's layout). Only safetensors
are read, so loading a checkpoint never executes code. The model is built on
the meta device and the tensors are assigned (`load_state_dict(assign=True)`),
read with safetensors' memory map straight to the target device.

config.json records the token layout the weights were trained with
(`layout_version`; a checkpoint without it has version 1, the embedded one's).
The loader refuses a layout this code does not speak (`layout.SUPPORTED_LAYOUTS`):
a model fed prompts in a layout it never saw writes nonsense without an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from dlm.coder_model.config import ModelConfig
from dlm.coder_model.layout import DRAFTS_LAYOUT, LAYOUT_VERSION, SUPPORTED_LAYOUTS
from dlm.coder_model.model import DLM
from dlm.coder_model.tokenizer import Tokenizer

INDEX_NAME = "model.safetensors.index.json"
LAYOUT_KEY = "layout_version"  # in config.json, beside the model's shape
UNRECORDED_LAYOUT = 1  # a checkpoint saved before layouts had versions: the embedded checkpoint's
SINGLE_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message says why and what to do."""


def embedded_checkpoint_dir() -> Path:
    """The checkpoint shipped inside the package."""
    return Path(__file__).resolve().parent / "checkpoints" / "default"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is available; use --device cpu or auto")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"--device {device!r}: use cpu, cuda or auto")
    return torch.device(device)


def _state_dict_for_save(model: DLM) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    # tied lm_head shares the embedding: safetensors refuses shared storage
    return {k: v.detach().contiguous() for k, v in sd.items()}


def save_checkpoint(
    model: DLM, tok: Tokenizer, directory: str | Path, shard_bytes: int | None = None,
    dtype: torch.dtype | None = None, layout_version: int = LAYOUT_VERSION,
) -> Path:
    """Write config.json (with the layout version the weights were trained in: this code's, by
    default), tokenizer.json and the weights (sharded when the tensors exceed `shard_bytes`)."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_dict(), LAYOUT_KEY: layout_version}
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save(d / "tokenizer.json")
    for old in list(d.glob("model*.safetensors")) + [d / INDEX_NAME]:
        old.unlink(missing_ok=True)
    sd = _state_dict_for_save(model)
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    sd = {k: v.cpu() for k, v in sd.items()}
    meta = {"format": "pt"}
    total = sum(v.numel() * v.element_size() for v in sd.values())
    if shard_bytes is None or total <= shard_bytes:
        save_file(sd, str(d / SINGLE_NAME), metadata=meta)
        return d
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in sd.items():
        nb = t.numel() * t.element_size()
        if shards[-1] and size + nb > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nb
    n = len(shards)
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(d / fname), metadata=meta)
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return d


def weight_files(d: Path) -> dict[str, Path]:
    """tensor name -> file holding it."""
    if (d / INDEX_NAME).exists():
        try:
            index = json.loads((d / INDEX_NAME).read_text())
            weight_map = index["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{d / INDEX_NAME} is not a valid shard index ({exc}); re-save the checkpoint")
        files = {}
        for name, fname in weight_map.items():
            p = d / fname
            if not p.exists():
                raise CheckpointError(f"shard {fname} named in {INDEX_NAME} is missing from {d}")
            files[name] = p
        return files
    single = d / SINGLE_NAME
    if not single.exists():
        if list(d.glob("*.bin")) or list(d.glob("*.pt")) or list(d.glob("*.pth")):
            raise CheckpointError(
                f"{d} holds only pickle weights (.bin/.pt); dlm-lsp reads safetensors only, because "
                "loading pickles can execute code. Convert the checkpoint to safetensors."
            )
        raise CheckpointError(f"{d} has neither {SINGLE_NAME} nor {INDEX_NAME}; is it a checkpoint directory?")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def checkpoint_file(d: str | Path, name: str, what_to_do: str) -> Path:
    """`d/name`, a file every checkpoint directory holds; CheckpointError says it is missing."""
    path = Path(d) / name
    if not path.is_file():
        raise CheckpointError(f"{d} has no {name}; {what_to_do}")
    return path


def read_config(d: str | Path) -> dict:
    """config.json of a checkpoint directory (any family); CheckpointError says what is wrong."""
    cfg_path = checkpoint_file(
        d, "config.json", "pass --model a checkpoint directory (config.json, tokenizer.json, *.safetensors)")
    try:
        return json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg_path}: cannot read it as JSON ({exc}); re-download the checkpoint") from exc


def layout_version(raw: dict, where: str | Path = "config.json") -> int:
    """The token layout version a checkpoint's config.json records (1 when it records none)."""
    v = raw.get(LAYOUT_KEY, UNRECORDED_LAYOUT)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CheckpointError(f"{where}: {LAYOUT_KEY} is {v!r}, not a layout version (a whole number >= 1); "
                              "fix config.json or re-save the checkpoint")
    return v


def check_layout(raw: dict, d: str | Path) -> None:
    """Refuse a checkpoint trained in a token layout this code does not speak, saying what to do."""
    v = layout_version(raw, Path(d) / "config.json")
    if v in SUPPORTED_LAYOUTS:
        if v < DRAFTS_LAYOUT and raw.get("drafts_window", 0):
            raise CheckpointError(f"{Path(d) / 'config.json'}: drafts_window is {raw['drafts_window']} but "
                                  f"layout {v} has no drafts section (layout {DRAFTS_LAYOUT} has); set "
                                  "drafts_window to 0 or layout_version to the layout the weights were trained in")
        return
    if v > LAYOUT_VERSION:
        todo = "upgrade dlm-lsp to a version that speaks it, or use a checkpoint of this version's layout"
    else:
        todo = (f"use a checkpoint trained in layout {' or '.join(map(str, SUPPORTED_LAYOUTS))} (the embedded "
                "one is), install the older "
                "dlm-lsp this checkpoint was made with, or fine-tune it into the current layout with "
                f"python -m dlm.drivers.training.train --init {d}")
    raise CheckpointError(
        f"{d} was trained with token layout version {v}, but this dlm-lsp builds prompts in layouts "
        f"{' and '.join(map(str, SUPPORTED_LAYOUTS))}; the model would read prompts in a layout it never saw. To fix: {todo}."
    )


_INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_", "orthogonal_")


@contextmanager
def meta_without_init() -> Iterator[None]:
    """Build modules on the meta device without running torch.nn.init's initialisers: the
    weights are loaded next. On the meta device an initialiser dispatches through torch._refs,
    which imports torch._dynamo and sympy: 150 MB resident in a server that never compiles.
    (The initialisers are module functions, swapped for the block's length: build models on
    one thread at a time.)"""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS if hasattr(torch.nn.init, name)}

    def keep(tensor, *args, **kwargs):
        return tensor

    for name in saved:
        setattr(torch.nn.init, name, keep)
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def load_model(
    directory: str | Path | None = None, device: str = "cpu", impl: str = "auto",
    dtype: torch.dtype | None = None, any_layout: bool = False,
) -> tuple[DLM, Tokenizer]:
    """Load a native `dlm` checkpoint; None loads the embedded one.

    A checkpoint of another token layout is refused (`check_layout`) unless `any_layout`: the
    trainer's warm start (`--init`) reads old weights to train them in the current layout.
    """
    from safetensors import safe_open

    d = Path(directory) if directory is not None else embedded_checkpoint_dir()
    if not d.is_dir():
        raise CheckpointError(f"model directory {d} does not exist; pass --model DIR of a checkpoint")
    raw = read_config(d)
    if raw.get("model_type", "dlm") != "dlm":
        raise CheckpointError(
            f"{d} is a {raw.get('model_type')!r} checkpoint, not the native 'dlm' family; "
            "load it with dlm.coder_model.engine.load_engine"
        )
    if not any_layout:
        check_layout(raw, d)
    else:
        layout_version(raw, d / "config.json")
    try:
        cfg = ModelConfig.from_dict({k: v for k, v in raw.items() if k != LAYOUT_KEY})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{d / 'config.json'}: {exc}") from exc
    tok = Tokenizer.from_file(d / "tokenizer.json")
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tok.vocab_size} tokens but the model's vocab_size is {cfg.vocab_size}; "
            "the tokenizer.json does not belong to these weights"
        )
    dev = resolve_device(device) if isinstance(device, str) else device

    with meta_without_init():
        model = DLM(cfg, impl=impl)
    expected = {k: v for k, v in model.state_dict().items()}
    files = weight_files(d)
    missing = sorted(set(expected) - set(files))
    unexpected = sorted(set(files) - set(expected))
    head_missing = [k for k in missing if k.startswith("copy_head.")]
    head_unexpected = [k for k in unexpected if k.startswith("copy_head.")]
    if head_missing and len(head_missing) == len(missing):
        raise CheckpointError(
            f"{d / 'config.json'} says copy_head: true, but the weights have no copy head "
            f"({', '.join(head_missing[:3])} missing); set copy_head to false in config.json, or fine-tune "
            "a copy head onto these weights with python -m dlm.drivers.training.train --init DIR --copy-head")
    if head_unexpected and len(head_unexpected) == len(unexpected) and not cfg.copy_head:
        raise CheckpointError(
            f"the weights in {d} have a copy head ({', '.join(head_unexpected[:3])}), but config.json does not "
            "say copy_head: true; add \"copy_head\": true (and its copy_dim) to config.json")
    if missing:
        raise CheckpointError(f"checkpoint {d} is missing tensor(s) {', '.join(missing[:5])}; it does not "
                              "match its config.json (re-save it, or fix config.json)")
    if unexpected:
        raise CheckpointError(f"checkpoint {d} has unexpected tensor(s) {', '.join(unexpected[:5])} for "
                              "this config.json; was it saved by a different model shape?")
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        # safe_open memory-maps the file; tensors go straight to the device
        with safe_open(str(path), framework="pt", device=str(dev)) as f:
            for name in names:
                t = f.get_tensor(name)
                want = expected[name]
                if tuple(t.shape) != tuple(want.shape):
                    raise CheckpointError(
                        f"tensor {name} in {path.name} has shape {tuple(t.shape)}, config.json expects "
                        f"{tuple(want.shape)}; the weights do not match the config"
                    )
                state[name] = t.to(dtype) if dtype is not None else t.float() if t.dtype == torch.bfloat16 and dev.type == "cpu" else t
    model.load_state_dict(state, assign=True, strict=True)
    model.eval()
    return model, tok
