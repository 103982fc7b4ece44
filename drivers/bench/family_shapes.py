"""Step latency of a dream-family model: full pass vs dual-cache block pass, and tokens/s.

    python -m dlm.drivers.bench.family_shapes [--shape qwen2.5-0.5b] [--context 1024] [--slots 32]

Builds a model of the given shape with random weights (no download; the
weights do not change the cost of a step), lays out `context` tokens around a
span of `slots` masks, and times:
  full   : one denoising step without a cache (every token through the network)
  cached : one step with the approximate dual cache (only the span's window)
  decode : a whole infill with threshold decoding + dual cache (random weights
           commit about one slot per step, the worst case; trained models
           commit several)
Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import time

from dlm.coder_model.devices import add_device_argument

SHAPES = {
    # Qwen2.5-0.5B / Open-dCoder-0.5B dimensions (tied embeddings)
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_layers": 24,
        "num_heads": 14,
        "num_kv_heads": 2,
        "head_dim": 64,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_embeddings": True,
    },
    # Dream-v0 / Dream-Coder-v0 / DiffuCoder 7B (Qwen2.5-7B dimensions)
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "num_layers": 28,
        "num_heads": 28,
        "num_kv_heads": 4,
        "head_dim": 128,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_embeddings": False,
    },
    "tiny": {
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "tie_embeddings": True,
    },
}


def build_random(shape: str, device: str, dtype, impl: str, seed: int = 0):
    import torch
    from dlm.coder_model.families.arch import FamilyArch, FamilyTokens
    from dlm.coder_model.families.transformer import BidirectionalLM

    arch = FamilyArch(
        family="dream",
        model_type="dream",
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        qkv_bias=True,
        shift_logits=True,
        **SHAPES[shape],
    )
    # weights drawn on the CPU, then moved: the CUDA generator stays out of it, so a CUDA graph capture
    # that failed earlier in the same process (its generator left mid-capture) cannot break this build
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = BidirectionalLM(arch, impl=impl)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen))
    model.eval()
    V = arch.vocab_size
    tokens = FamilyTokens(mask_id=V - 2, eos_ids=(V - 3,), pad_id=V - 3, bos_id=None)
    return model, tokens


def _time(fn, repeat: int, sync) -> tuple[float, float]:
    """Median wall ms and median process CPU ms (all threads) of fn.

    CPU time is reported because a shared machine stretches wall time: on an
    idle machine a step's wall time is about its CPU time / threads used.
    """
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    add_device_argument(ap)
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="default: bfloat16 on cuda, float32 on cpu",
    )
    ap.add_argument("--impl", default="auto", help="dlm.kernels impl: auto | triton | reference")
    ap.add_argument("--context", type=int, default=1024, help="context tokens (3/4 prefix, 1/4 suffix)")
    ap.add_argument("--slots", type=int, default=32, help="masked span length L")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--no-decode", action="store_true", help="skip the whole-infill measurement")
    args = ap.parse_args(argv)

    import torch
    from dlm.coder_model.checkpoint import resolve_device
    from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
    from dlm.coder_model.types import SamplerParams

    if args.threads:
        torch.set_num_threads(args.threads)
    device = str(resolve_device(args.device))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    model, tokens = build_random(args.shape, device, dtype, args.impl)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"built {args.shape} ({n_params / 1e6:.0f}M params, {dtype}) on {device} "
        f"in {time.perf_counter() - t0:.1f}s; threads={torch.get_num_threads()}"
    )

    L = args.slots
    P = args.context * 3 // 4
    S = args.context - P
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, model.arch.vocab_size - 8, (P,), generator=g).tolist()
    suffix = torch.randint(0, model.arch.vocab_size - 8, (S,), generator=g).tolist()
    dec = InfillDecoder(
        model, tokens, InfillOptions(lengths=(), dual_cache=True, refresh_every=4, add_bos=False)
    )
    ids = torch.tensor([prefix + [tokens.mask_id] * L + suffix], device=device)

    full = _time(lambda: dec._full(ids, P, L, want_kv=False), args.repeat, sync)
    _, ctx = dec._full(ids, P, L, want_kv=True)
    cached = _time(lambda: dec._window(ids, P, L, ctx), args.repeat, sync)
    rows = [("full step (no cache)", full, P + L + S), ("cached step (dual cache)", cached, L + 1)]
    print(f"\ncontext {P}+{S} tokens, span L={L}, median of {args.repeat}")
    print(
        "| step | tokens through the network | wall ms | CPU ms (all threads) "
        "| tokens/s at 1 slot/step | at 4 slots/step |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (ms, cpu_ms), n in rows:
        print(f"| {name} | {n} | {ms:.1f} | {cpu_ms:.1f} | {1e3 / ms:.2f} | {4e3 / ms:.2f} |")
    if not args.no_decode:
        params = SamplerParams(steps=L, block_len=L, threshold=0.9)
        t = time.perf_counter()
        r = dec.infill(prefix, suffix, params)
        sync()
        ms = (time.perf_counter() - t) * 1e3
        print(
            f"\nwhole infill (threshold 0.9, dual cache refresh every 4, random weights): {r.steps} steps, "
            f"{r.committed} slots committed in {ms:.0f} ms (prefill {r.prefill_ms:.0f} ms) -> "
            f"{r.committed / ms * 1e3:.1f} tokens/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
