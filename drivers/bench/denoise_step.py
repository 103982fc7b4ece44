"""Cost of one denoising step of real model shapes, kernels on vs off, eager vs CUDA graph.

    python -m dlm.drivers.bench.denoise_step --device cuda            # the full table on a GPU
    python -m dlm.drivers.bench.denoise_step --device cuda --quick    # shorter contexts, fewer repetitions
    python -m dlm.drivers.bench.denoise_step --device cpu             # embedded model only, reference ops

Rows (random weights for every shape but the embedded one: the weights do not
change what a step costs):
  embedded             the shipped native checkpoint
  embedded-copy        the same with a copy head added (model.CopyHead, fresh weights): its
                       step scores the mixture in plain torch (the fused kernel knows no head)
  native qwen2.5-0.5b  the native `dlm` network at Qwen2.5-0.5B dimensions
  dream qwen2.5-7b     the dream-family network (Dream-Coder / DiffuCoder 7B
                       dimensions), its dual-cache step
  dream qwen2.5-0.5b   the same at Open-dCoder-0.5B dimensions (--models;
                       dream-tiny is a seconds-long check of the path)

A native step is the forward over the L masked slots against Tc cached context
tokens plus the unmask scores (what `sampler.generate` runs per step); a dream
step is the dual-cache block pass (`InfillDecoder._window`, block + one token
against the cached context K/V). Each runs with the reference ops ("off") and
the Triton kernels ("on"), eager and replayed as a CUDA graph (the launch
overhead of a step is a large share of it at these sizes). Then tokens/s of one
whole request at the 0.5B shape: `generate` on the native network and
`InfillDecoder.infill` on the dream one (random weights commit about one slot
per step and never write an end token: the worst case).

CUDA timings use `dlm.drivers.bench.kernel_timing.Timer` (CUDA events, median). On the CPU
only the reference ops run (the Triton kernels need a GPU outside the
interpreter), timed by the wall clock, and there are no graphs. Speed is
measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from dlm.coder_model.devices import add_device_argument

# Qwen2.5-0.5B dimensions (config.json of the HF release) for the native network
QWEN05B_NATIVE = {
    "vocab_size": 151936, "dim": 896, "n_layers": 24, "n_heads": 14, "n_kv_heads": 2, "ffn_dim": 4864,
    "rope_theta": 1000000.0, "max_seq_len": 8192, "tie_embeddings": True,
}
# dream-<shape> takes any shape of dlm.drivers.bench.family_shapes.SHAPES (dream-tiny for a quick check)
MODELS = ("embedded", "embedded-copy", "native-qwen2.5-0.5b", "dream-qwen2.5-7b", "dream-qwen2.5-0.5b", "dream-tiny")
GPU_DEFAULT = "embedded,native-qwen2.5-0.5b,dream-qwen2.5-7b"
CPU_DEFAULT = "embedded"


class WallTimer:
    """CPU counterpart of drivers.bench.kernel_timing.Timer: median wall-clock ms over `reps` calls."""

    def __init__(self, reps: int, warmup: int) -> None:
        self.reps, self.warmup = reps, warmup

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)


# ----------------------------------------------------------------------------- models


def random_native_model(cfg_kwargs: dict, device: str, dtype):
    """The native DLM at the given dimensions, random weights (norms 1, the rest N(0, 0.02))."""
    import torch
    from dlm.coder_model.config import ModelConfig
    from dlm.coder_model.model import DLM

    cfg = ModelConfig(**cfg_kwargs)
    with torch.device(device):
        model = DLM(cfg, impl="reference")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.to(dtype).eval()


def native_step_fn(model, cache, block, pos, rule: str, impl: str) -> Callable[[], object]:
    """One native denoising step: forward over the block (1, L) against the cache, then scores."""
    from dlm import kernels
    from dlm.kernels import reference as reference_ops

    def step():
        model.impl = impl
        hidden = model.forward(block, start_pos=len(cache), context_len=len(cache), cache=cache)[0]  # (L, dim)
        if model.copy_head is not None:  # as BlockDecoder._score does for a copy-head model
            return reference_ops.confidence_from_logits(model.log_probs(hidden[pos], cache), rule)
        return kernels.unmask_scores(hidden, model.lm_head_weight, pos, rule, impl=impl)

    return step


def graphed(torch, fn: Callable[[], object]) -> Callable[[], object]:
    """fn captured as a CUDA graph; returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # compile the Triton kernels and warm the allocator outside capture
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


# ----------------------------------------------------------------------------- tables


def _row(name: str, tc: int, L: int, label: str, eager: float, graph: str) -> None:
    print(f"{name:<22} {tc:>5} {L:>3} {label:<8} {eager:9.3f} {graph:>9}")
    sys.stdout.flush()


def _impls(device: str) -> list[tuple[str, str]]:
    # the Triton kernels run on CUDA tensors only (the interpreter is for tests)
    return [("reference", "off"), ("triton", "on")] if device == "cuda" else [("reference", "off")]


def _time_both(torch, timer, fn, device: str, what: str) -> tuple[float, str]:
    eager = timer(fn)
    if device != "cuda":
        return eager, "n/a"
    try:
        return eager, f"{timer(graphed(torch, fn)):9.3f}"
    except Exception as exc:  # noqa: BLE001 - report, keep benchmarking
        print(f"  (CUDA graph capture failed for {what}: {type(exc).__name__}: {exc})")
        return eager, "failed"


def native_rows(torch, name: str, model, timer, device: str, tc_want: int, L: int) -> None:
    from dlm.coder_model.cache import PrefixCache

    cfg = model.config
    g = torch.Generator(device=device).manual_seed(0)
    ctx = torch.randint(0, cfg.vocab_size, (min(tc_want, cfg.max_seq_len - L),), device=device, generator=g)
    cache = PrefixCache()
    with torch.inference_mode():
        model.impl = "reference"
        model.prefill(ctx.tolist(), cache)
    block = torch.randint(0, cfg.vocab_size, (1, L), device=device, generator=g)
    pos = torch.arange(L, device=device)
    for impl, label in _impls(device):
        with torch.inference_mode():
            fn = native_step_fn(model, cache, block, pos, "max_prob", impl)
            eager, graph = _time_both(torch, timer, fn, device, f"{name} kernels {label}")
        _row(name, len(cache), L, label, eager, graph)


def dream_rows(torch, name: str, shape: str, timer, device: str, dtype, tc_want: int, L: int) -> None:
    from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
    from dlm.drivers.bench.family_shapes import build_random

    model, tokens = build_random(shape, device, dtype, impl="reference")
    P = tc_want * 3 // 4
    S = tc_want - P
    g = torch.Generator().manual_seed(1)
    V = model.arch.vocab_size
    prefix = torch.randint(0, V - 8, (P,), generator=g).tolist()
    suffix = torch.randint(0, V - 8, (S,), generator=g).tolist()
    dec = InfillDecoder(model, tokens, InfillOptions(lengths=(), dual_cache=True, add_bos=False))
    ids = torch.tensor([prefix + [tokens.mask_id] * L + suffix], device=device)
    with torch.inference_mode():
        _, ctx = dec._full(ids, P, L, want_kv=True)
        for impl, label in _impls(device):
            model.impl = impl
            fn = (lambda: dec._window(ids, P, L, ctx))
            eager, graph = _time_both(torch, timer, fn, device, f"{name} kernels {label}")
            _row(name, P + S, L, label, eager, graph)


def request_rows(torch, device: str, dtype, native_model, tc_want: int, L: int) -> None:
    """Tokens/s of one whole request at the 0.5B shape, native generate and dream infill (CUDA only)."""
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir
    from dlm.coder_model.families.infill import InfillDecoder, InfillOptions
    from dlm.coder_model.sampler import generate
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.coder_model.types import SamplerParams
    from dlm.drivers.bench.family_shapes import build_random

    sync = torch.cuda.synchronize
    params = SamplerParams(steps=L, block_len=L, max_blocks=1, threshold=0.9)
    impl = "triton"
    print(f"{'request':<34} {'ctx':>5} {'L':>3} {'steps':>5} {'tokens':>6} {'ms':>9} {'tokens/s':>9}")
    if native_model is not None:
        # the embedded tokenizer: output_head keeps only its rows of the 152k head, as for any checkpoint
        tok = Tokenizer.from_file(embedded_checkpoint_dir() / "tokenizer.json")
        g = torch.Generator().manual_seed(2)
        ctx = torch.randint(16, tok.vocab_size, (tc_want,), generator=g).tolist()
        native_model.impl = impl
        generate(native_model, tok, ctx, params)  # warm-up: compiles the kernels
        sync()
        t = time.perf_counter()
        dec = generate(native_model, tok, ctx, params)
        sync()
        ms = (time.perf_counter() - t) * 1e3
        s = dec.stats
        print(f"{'native qwen2.5-0.5b generate':<34} {tc_want:>5} {L:>3} {s.steps:>5} {s.committed:>6} "
              f"{ms:9.1f} {s.committed / ms * 1e3:9.1f}")
    model, tokens = build_random("qwen2.5-0.5b", device, dtype, impl=impl)
    dec = InfillDecoder(model, tokens, InfillOptions(lengths=(), dual_cache=True, refresh_every=4, add_bos=False))
    g = torch.Generator().manual_seed(3)
    V = model.arch.vocab_size
    P = tc_want * 3 // 4
    prefix = torch.randint(0, V - 8, (P,), generator=g).tolist()
    suffix = torch.randint(0, V - 8, (tc_want - P,), generator=g).tolist()
    dec.infill(prefix, suffix, params)  # warm-up
    sync()
    t = time.perf_counter()
    r = dec.infill(prefix, suffix, params)
    sync()
    ms = (time.perf_counter() - t) * 1e3
    print(f"{'dream qwen2.5-0.5b infill (dual cache)':<34} {tc_want:>5} {L:>3} {r.steps:>5} {r.committed:>6} "
          f"{ms:9.1f} {r.committed / ms * 1e3:9.1f}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.bench.denoise_step", description=__doc__.split("\n\n")[0])
    add_device_argument(ap)
    ap.add_argument("--models", default=None,
                    help=f"comma list of {', '.join(MODELS)} (default: {GPU_DEFAULT} on cuda, {CPU_DEFAULT} on cpu)")
    ap.add_argument("--quick", action="store_true", help="context 1024 instead of 2048, fewer repetitions")
    ap.add_argument("--context", type=int, default=None, help="cached context tokens Tc (default 2048, quick 1024)")
    ap.add_argument("--slots", type=int, default=32, help="masked block length L")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per figure (default 50 cuda, 3 cpu)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                    help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--no-request", action="store_true", help="skip the tokens/s of one whole request")
    args = ap.parse_args(argv)

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA GPU here; run on a GPU machine or pass --device cpu",
              file=sys.stderr)
        return 2
    names = [m.strip() for m in (args.models or (GPU_DEFAULT if device == "cuda" else CPU_DEFAULT)).split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if device == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            print("triton is not installed: the kernels-on rows need it (pip install 'triton>=3.0')", file=sys.stderr)
            return 1
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    tc = args.context or (1024 if args.quick else 2048)
    L = args.slots
    if device == "cuda":
        from dlm.drivers.bench.kernel_timing import Timer

        reps = args.reps or (20 if args.quick else 50)
        timer = Timer(torch, reps=reps, warmup=5, flush_l2=False)
        print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; dtype {str(dtype)[6:]}; "
              f"median of {reps} CUDA-event timings per figure")
    else:
        reps = args.reps or 3
        timer = WallTimer(reps=reps, warmup=1)
        print(f"CPU ({torch.get_num_threads()} threads); torch {torch.__version__}; dtype {str(dtype)[6:]}; "
              f"median of {reps} wall-clock timings; reference ops only (kernels need a GPU), no CUDA graphs")
    torch.manual_seed(0)

    print("\none denoising step (native: block forward + unmask scores; dream: dual-cache block pass):")
    hdr = f"{'model':<22} {'Tc':>5} {'L':>3} {'kernels':<8} {'eager ms':>9} {'graph ms':>9}"
    print(hdr)
    print("-" * len(hdr))
    native05 = None
    for name in names:
        if name in ("embedded", "embedded-copy"):
            from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model
            from dlm.drivers.training.train import add_copy_head

            try:
                m, _tok = load_model(embedded_checkpoint_dir(), device=device, impl="reference", dtype=dtype)
            except Exception as exc:  # noqa: BLE001 - the table goes on without it, saying why
                print(f"embedded model: skipped ({type(exc).__name__}: {exc})")
                continue
            if name == "embedded-copy" and m.copy_head is None:
                m = add_copy_head(m.float().cpu()).to(device=device, dtype=dtype).eval()
            native_rows(torch, name, m, timer, device, tc, L)
        elif name == "native-qwen2.5-0.5b":
            native05 = random_native_model(QWEN05B_NATIVE, device, dtype)
            native_rows(torch, "native qwen2.5-0.5b", native05, timer, device, tc, L)
        else:
            shape = name.removeprefix("dream-")
            dream_rows(torch, f"dream {shape}", shape, timer, device, dtype, tc, L)
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.no_request:
        return 0
    if device != "cuda":
        # a 0.5B request on the CPU takes minutes (docs/model-card.md: ~1 token/s per core); not worth a table
        print("\nwhole-request tokens/s at the Qwen2.5-0.5B shape: skipped on the CPU (run with --device cuda)")
        return 0
    print(f"\none whole request at the Qwen2.5-0.5B shape (random weights, threshold 0.9, up to {L} steps):")
    if native05 is None:
        native05 = random_native_model(QWEN05B_NATIVE, device, dtype)
    request_rows(torch, device, dtype, native05, tc, L)
    return 0


if __name__ == "__main__":
    sys.exit(main())
