"""dlm.kernels: the denoiser's ops, each with a PyTorch reference and a Triton kernel.

Every op takes `impl="auto" | "triton" | "reference"`. "auto" resolves once per
process: Triton for CUDA tensors when triton imports, the reference otherwise;
the choice is logged. The environment variable DLM_KERNELS=triton|reference
overrides "auto" (tests use it to run Triton kernels in the interpreter on CPU,
together with TRITON_INTERPRET=1 set before this package is imported).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("dlm.kernels")

IMPLS = ("auto", "triton", "reference")
_auto_choice: dict[str, str] = {}


def resolve_impl(impl: str, device_type: str) -> str:
    """Turn "auto" into "triton" or "reference" for a device type, once."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}: use one of {', '.join(IMPLS)}")
    if impl != "auto":
        return impl
    if device_type not in _auto_choice:
        forced = os.environ.get("DLM_KERNELS", "").strip()
        if forced:
            if forced not in ("triton", "reference"):
                raise ValueError(f"DLM_KERNELS={forced!r}: use triton or reference")
            choice = forced
        elif device_type == "cuda" and _triton_available():
            choice = "triton"
        else:
            choice = "reference"
        _auto_choice[device_type] = choice
        log.info("kernels: impl=auto on %s -> %s", device_type, choice)
    return _auto_choice[device_type]


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no triton"
        return False
    return True


def _ops(impl: str, device_type: str):
    if resolve_impl(impl, device_type) == "triton":
        from dlm.kernels import triton_ops

        return triton_ops
    from dlm.kernels import reference

    return reference


def rms_norm(x, weight, eps, residual=None, *, impl="auto"):
    return _ops(impl, x.device.type).rms_norm(x, weight, eps, residual)


def apply_rotary(q, k, cos, sin, positions, *, impl="auto"):
    return _ops(impl, q.device.type).apply_rotary(q, k, cos, sin, positions)


def attention(q, k, v, *, context_len, kv_cache=None, bidirectional=False, scale=None, impl="auto"):
    return _ops(impl, q.device.type).attention(
        q, k, v, context_len=context_len, kv_cache=kv_cache, bidirectional=bidirectional, scale=scale
    )


def unmask_scores(hidden, lm_head_weight, mask_positions, rule, *, impl="auto"):
    return _ops(impl, hidden.device.type).unmask_scores(hidden, lm_head_weight, mask_positions, rule)


__all__ = ["IMPLS", "apply_rotary", "attention", "resolve_impl", "rms_norm", "unmask_scores"]
