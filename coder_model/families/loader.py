"""Read an open checkpoint directory: config.json, tokenizer.json, safetensors.

Loading never executes code from the checkpoint: no trust_remote_code, no
pickle; only JSON and safetensors are read. Tensors go from the file straight
to the target device and dtype, one at a time, into a model built on the meta
device, so a GPU load never holds a CPU copy of the whole model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dlm.coder_model.families import dream, llada
from dlm.coder_model.families.arch import FamilyArch, FamilyTokens, as_id_tuple

log = logging.getLogger("dlm.coder_model.families")

_FAMILIES = {"dream": dream, "llada": llada}
# model_type (lowercased) -> family; the "dlm" native type is handled by the lead's engine.
SUPPORTED_MODEL_TYPES = {mt: fam for fam, mod in _FAMILIES.items() for mt in mod.MODEL_TYPES}
_ARCHITECTURES = {"DreamModel": "dream", "LLaDAModelLM": "llada"}
# Mask token spellings in the tokenizers of the supported checkpoints.
_MASK_TOKENS = ("<|mask|>", "<|mdm_mask|>", "[MASK]", "<mask>")
# Tokens that end the content of an infill span, where the tokenizer has them.
_END_TOKENS = ("<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<|dlm_pad|>")


def detect_family(config: dict) -> str:
    """ "dream" or "llada" from config.json's model_type and architectures.

    Raises ValueError naming an unsupported model_type and listing the supported ones.
    """
    mt = str(config.get("model_type", "")).lower()
    archs = config.get("architectures") or []
    if mt in SUPPORTED_MODEL_TYPES:
        return SUPPORTED_MODEL_TYPES[mt]
    for a in archs:
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a]
    supported = ", ".join(sorted(set(SUPPORTED_MODEL_TYPES) | {"dlm"}))
    raise ValueError(
        f"unsupported checkpoint: model_type {config.get('model_type')!r} (architectures {archs}); "
        f"supported model_type values: {supported}. Use a Dream / Dream-Coder / DiffuCoder / Open-dCoder "
        "or LLaDA checkpoint, or the embedded dlm model"
    )


def parse_arch(config: dict) -> FamilyArch:
    return _FAMILIES[detect_family(config)].parse_config(config)


def load_tokenizer(path: str | Path):
    from dlm.coder_model.checkpoint import checkpoint_file
    from tokenizers import Tokenizer

    tok_path = checkpoint_file(path, "tokenizer.json", "only the Hugging Face `tokenizers` format is read: "
                               "download tokenizer.json with the checkpoint")
    try:
        return Tokenizer.from_file(str(tok_path))
    except Exception as e:
        raise ValueError(f"{tok_path}: not a valid tokenizers file ({e}); re-download it") from e


def _json_if_exists(p: Path) -> dict:
    try:
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}


def resolve_tokens(path: str | Path, config: dict, arch: FamilyArch, tokenizer) -> FamilyTokens:
    """Mask/EOS/pad/BOS ids from config.json, generation_config.json, then the tokenizer."""
    gen = _json_if_exists(Path(path) / "generation_config.json")
    vocab = tokenizer.get_vocab(with_added_tokens=True) if tokenizer is not None else {}
    mask_id = config.get("mask_token_id", gen.get("mask_token_id"))
    if mask_id is None:
        mask_id = next((vocab[t] for t in _MASK_TOKENS if t in vocab), None)
    if mask_id is None:
        mask_id = _FAMILIES[arch.family].DEFAULT_MASK_ID.get(arch.model_type)
    if mask_id is None:
        raise ValueError(
            f"{path}: model_type {arch.model_type!r} with no mask token (no mask_token_id in config.json or "
            f"generation_config.json, none of {list(_MASK_TOKENS)} in tokenizer.json): this looks like an "
            "autoregressive model, not a diffusion coder. Add mask_token_id to config.json if it is one"
        )
    mask_id = int(mask_id)
    if not 0 <= mask_id < arch.vocab_size:
        raise ValueError(f"{path}: mask_token_id {mask_id} is outside the vocabulary ({arch.vocab_size})")
    pad = config.get("pad_token_id", gen.get("pad_token_id"))
    eos = as_id_tuple(config.get("eos_token_id")) + as_id_tuple(gen.get("eos_token_id"))
    eos += tuple(vocab[t] for t in _END_TOKENS if t in vocab)
    if pad is not None:
        eos += (int(pad),)
    eos = tuple(dict.fromkeys(i for i in eos if i != mask_id and 0 <= i < arch.vocab_size))
    bos = config.get("bos_token_id", gen.get("bos_token_id"))
    return FamilyTokens(
        mask_id=mask_id,
        eos_ids=eos,
        pad_id=None if pad is None else int(pad),
        bos_id=None if bos is None else int(bos),
    )


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it (single file or sharded with index)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"{index}: no valid weight_map ({e}); re-download the index") from e
        return {name: path / fname for name, fname in wm.items()}
    single = path / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    hint = (
        f" (found {', '.join(others)}: pickle files are never loaded, they can execute code)"
        if others
        else ""
    )
    raise ValueError(
        f"{path}: no model.safetensors or model.safetensors.index.json{hint}; "
        "download the safetensors weights of the checkpoint"
    )


def load_weights(model, arch: FamilyArch, path: str | Path, device, dtype) -> None:
    """Assign every parameter of a meta-device `model` from the checkpoint's safetensors."""
    import torch
    from safetensors import safe_open

    path = Path(path)
    names = _FAMILIES[arch.family].tensor_names(arch)
    files = _tensor_files(path)
    missing = [theirs for theirs in names.values() if theirs not in files]
    if missing:
        raise ValueError(
            f"{path}: checkpoint tensor {missing[0]!r} is missing"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f" for a {arch.family} model with {arch.num_layers} layers; the download is incomplete "
            "or config.json does not match the weights"
        )
    params = dict(model.named_parameters())
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for ours, theirs in names.items():
        by_file.setdefault(files[theirs], []).append((ours, theirs))
    dev = torch.device(device)
    # safe_open wants "cuda:N" (an index) to load onto a GPU directly.
    open_dev = (
        f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        if (dev.type == "cuda")
        else str(dev)
    )
    state = {}
    for fpath, pairs in by_file.items():
        with safe_open(str(fpath), framework="pt", device=open_dev) as f:
            for ours, theirs in pairs:
                t = f.get_tensor(theirs)
                want = tuple(params[ours].shape)
                if tuple(t.shape) != want:
                    raise ValueError(
                        f"{fpath.name}: tensor {theirs!r} has shape {tuple(t.shape)}, config.json implies "
                        f"{want}; config.json does not match the weights"
                    )
                state[ours] = t.to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
