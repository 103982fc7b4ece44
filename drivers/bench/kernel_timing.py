"""Kernel benchmark: Triton kernels vs the PyTorch reference (docs/architecture.md §6).

    python -m dlm.drivers.bench.kernel_timing            # full table on a CUDA GPU
    python -m dlm.drivers.bench.kernel_timing --quick    # fewer repetitions, fewer shapes

On a GPU it first checks every kernel against the reference at the benchmark
shapes (a kernel that is fast and wrong is worthless), then prints per op:
bytes and flops (counted from the shapes, before timing), kernel and reference
time (CUDA events around each call, median of many, L2 flushed between calls
so bandwidth figures are HBM figures), achieved GB/s and the fraction of the
GPU's HBM bandwidth, and torch.nn.functional.scaled_dot_product_attention
where it applies. The cost of a whole denoising step of real model shapes
(kernels on vs off, CUDA graphs) is `python -m dlm.drivers.bench.denoise_step`:
this package imports only torch and triton (docs/architecture.md §1).

Without a GPU it runs the correctness pre-check in the Triton interpreter on
small CPU shapes and exits, saying that timings need a GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# HBM bandwidth by device name (bytes/s, vendor spec); the measured copy
# bandwidth is printed next to it, and --hbm-gbps overrides.
HBM_SPEC = [
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM
    ("GH200", 4.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("L4", 0.3e12),
    ("A10G", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12),
]

# Qwen2.5-0.5B dimensions (config.json of the HF release): the op shapes below
QWEN05B = {
    "vocab_size": 151936, "dim": 896, "n_layers": 24, "n_heads": 14, "n_kv_heads": 2, "ffn_dim": 4864,
    "rope_theta": 1000000.0, "max_seq_len": 8192, "tie_embeddings": True,
}


@dataclass
class Case:
    op: str
    shape: str
    dtype: str
    bytes: float
    flops: float
    kernel: Callable[[], object]
    reference: Callable[[], object]
    sdpa: Callable[[], object] | None = None
    check: Callable[[], str] | None = None  # returns "" when correct, else what is wrong
    results: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- helpers


def _ensure_interpreter_if_cpu(torch) -> bool:
    """On a machine without CUDA the kernels can only run in the interpreter, which must be
    switched on before dlm.kernels.triton_ops defines them."""
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    mod = sys.modules.get("dlm.kernels.triton_ops")
    if mod is not None and not mod.INTERPRET:
        import importlib

        importlib.reload(mod)
    return True


def _max_err(a, b) -> float:
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def _SDPA_GQA(torch) -> bool:
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


def _tol(dtype) -> float:
    import torch

    return 2e-2 if dtype == torch.bfloat16 else 2e-4


# ----------------------------------------------------------------------------- cases


def make_cases(device: str, dtype, quick: bool, small: bool) -> list[Case]:
    """Benchmark shapes (small=True: tiny shapes for the CPU interpreter pre-check)."""
    import torch
    from dlm.kernels import reference as ref
    from dlm.kernels import triton_ops as tops

    es = torch.tensor([], dtype=dtype).element_size()
    dn = str(dtype).replace("torch.", "")
    cases: list[Case] = []

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=device) * scale).to(dtype)

    # --- rms_norm + residual: a denoising block (L rows) and a prefill
    rows_list = [5] if small else ([32, 2048] if quick else [32, 256, 2048])
    d = 40 if small else QWEN05B["dim"]
    for rows in rows_list:
        x, r, w = rnd(rows, d), rnd(rows, d), rnd(d)

        def chk(x=x, r=r, w=w):
            y, s = tops.rms_norm(x, w, 1e-6, r)
            ty, ts = ref.rms_norm(x.float(), w.float(), 1e-6, r.float())
            e = max(_max_err(y, ty), _max_err(s, ts))
            return "" if e <= _tol(dtype) * 4 else f"max error {e:.3g}"

        cases.append(Case(
            "rms_norm+res", f"{rows}x{d}", dn, bytes=(4 * rows * d + d) * es, flops=5.0 * rows * d,
            kernel=lambda x=x, r=r, w=w: tops.rms_norm(x, w, 1e-6, r),
            reference=lambda x=x, r=r, w=w: ref.rms_norm(x, w, 1e-6, r), check=chk,
        ))

    # --- rotary
    Hq, Hk, D = (4, 1, 32) if small else (QWEN05B["n_heads"], QWEN05B["n_kv_heads"], 64)
    cos, sin = ref.rotary_tables(D, 8192 if not small else 64, 1e6, device=device)
    for T in ([7] if small else [32, 2048]):
        q = rnd(1, T, Hq, D).transpose(1, 2)
        k = rnd(1, T, Hk, D).transpose(1, 2)
        pos = torch.arange(T, device=device) + 3

        def chk(q=q, k=k, pos=pos):
            a, b = tops.apply_rotary(q, k, cos, sin, pos)
            ta, tb = ref.apply_rotary(q.float(), k.float(), cos, sin, pos)
            e = max(_max_err(a, ta), _max_err(b, tb))
            return "" if e <= _tol(dtype) else f"max error {e:.3g}"

        cases.append(Case(
            "apply_rotary", f"T={T} Hq={Hq} Hk={Hk} D={D}", dn,
            bytes=2 * T * (Hq + Hk) * D * es + T * D * 4, flops=6.0 * T * (Hq + Hk) * D,
            kernel=lambda q=q, k=k, pos=pos: tops.apply_rotary(q, k, cos, sin, pos),
            reference=lambda q=q, k=k, pos=pos: ref.apply_rotary(q, k, cos, sin, pos), check=chk,
        ))

    # --- attention: (label, Tq, Tc, context_len, bidirectional)
    if small:
        attn = [("step", 5, 37, 37, False), ("step-1slot", 1, 20, 20, False), ("prefill", 23, 0, 16, False),
                ("bidir", 6, 9, 9, True)]
    else:
        attn = [("step", 32, 512, 512, False), ("step", 32, 2048, 2048, False), ("step", 32, 8192, 8192, False),
                ("step-1slot", 1, 2048, 2048, False), ("prefill", 2048, 0, 2016, False),
                ("dream-bidir", 32, 2048, 2048, True)]
        if quick:
            attn = [attn[1], attn[4]]
    for label, Tq, Tc, ctx, bidir in attn:
        q = rnd(1, Tq, Hq, D).transpose(1, 2)  # (1, Hq, Tq, D), a view as the model makes it
        k, v = rnd(1, Hk, Tq, D), rnd(1, Hk, Tq, D)
        cache = (rnd(1, Hk, Tc, D), rnd(1, Hk, Tc, D)) if Tc else None
        Tk = Tc + Tq
        # visible (query, key) pairs under the mask: exact count for the flops
        mask = ref.attention_mask(Tq, Tk, ctx, bidir, device="cpu")
        pairs = int(mask.sum())
        kv_bytes = 2 * Hk * Tk * D * es
        full_k = torch.cat([cache[0], k], 2) if cache else k
        full_v = torch.cat([cache[1], v], 2) if cache else v
        all_see_all = bool(mask.all())
        sdpa_mask = None if all_see_all else mask.to(device)

        if not _SDPA_GQA(torch):  # torch < 2.5: expand the kv heads once, outside the timing
            full_k, full_v = (t.repeat_interleave(Hq // Hk, 1) for t in (full_k, full_v))

        def sdpa(q=q, fk=full_k, fv=full_v, m=sdpa_mask):
            # on K/V already concatenated (a contiguous cache buffer), GQA native where torch has it
            kw = {"enable_gqa": True} if _SDPA_GQA(torch) else {}
            return torch.nn.functional.scaled_dot_product_attention(q, fk, fv, attn_mask=m, **kw)

        def chk(q=q, k=k, v=v, cache=cache, ctx=ctx, bidir=bidir):
            o = tops.attention(q, k, v, context_len=ctx, kv_cache=cache, bidirectional=bidir)
            up = None if cache is None else (cache[0].float(), cache[1].float())
            t = ref.attention(q.float(), k.float(), v.float(), context_len=ctx, kv_cache=up, bidirectional=bidir)
            e = _max_err(o, t)
            return "" if e <= _tol(dtype) else f"max error {e:.3g}"

        cases.append(Case(
            f"attention {label}", f"Tq={Tq} Tc={Tc} ctx={ctx} Hq={Hq}/Hk={Hk} D={D}", dn,
            bytes=2 * Tq * Hq * D * es + kv_bytes, flops=4.0 * Hq * pairs * D,
            kernel=lambda q=q, k=k, v=v, cache=cache, ctx=ctx, bidir=bidir: tops.attention(
                q, k, v, context_len=ctx, kv_cache=cache, bidirectional=bidir),
            reference=lambda q=q, k=k, v=v, cache=cache, ctx=ctx, bidir=bidir: ref.attention(
                q, k, v, context_len=ctx, kv_cache=cache, bidirectional=bidir),
            sdpa=sdpa, check=chk,
        ))

    # --- unmask_scores: the LM head over the masked slots
    if small:
        heads = [(37, 40, 500, 5)]
    else:
        heads = [(32, QWEN05B["dim"], QWEN05B["vocab_size"], 32), (32, QWEN05B["dim"], QWEN05B["vocab_size"], 1),
                 (32, 256, 8192, 32)]
        if quick:
            heads = heads[:1]
    for N, dd, V, M in heads:
        hidden = rnd(N, dd)
        w = rnd(V, dd, scale=3 / math.sqrt(dd))
        pos = torch.randperm(N, device=device)[:M]
        for rule in (["margin"] if small else ["max_prob", "entropy"]):

            def chk(hidden=hidden, w=w, pos=pos, rule=rule):
                tok, conf = tops.unmask_scores(hidden, w, pos, rule)
                ttok, tconf = ref.unmask_scores(hidden.float(), w.float(), pos, rule)
                agree = (tok == ttok).float().mean().item()
                e = _max_err(conf, tconf)
                if agree < 0.95 or e > 1e-3:
                    return f"token agreement {agree:.3f}, confidence max error {e:.3g}"
                return ""

            cases.append(Case(
                f"unmask_scores {rule}", f"M={M} d={dd} V={V}", dn,
                bytes=V * dd * es + M * dd * es + M * 12, flops=2.0 * M * V * dd,
                kernel=lambda hidden=hidden, w=w, pos=pos, rule=rule: tops.unmask_scores(hidden, w, pos, rule),
                reference=lambda hidden=hidden, w=w, pos=pos, rule=rule: ref.unmask_scores(hidden, w, pos, rule),
                check=chk,
            ))
    return cases


def precheck(cases: list[Case]) -> bool:
    ok = True
    for c in cases:
        problem = c.check() if c.check else ""
        status = "ok" if not problem else f"WRONG: {problem}"
        print(f"  check {c.op:<26} {c.shape:<40} {c.dtype:<9} {status}")
        ok = ok and not problem
    return ok


# ----------------------------------------------------------------------------- timing


class Timer:
    """CUDA-event timing: median over `reps` calls, each after an L2 flush (optional)."""

    def __init__(self, torch, reps: int, warmup: int, flush_l2: bool):
        self.torch, self.reps, self.warmup = torch, reps, warmup
        # bigger than any L2 (50 MB on H100, 60 MB on H200... use 256 MB)
        self.flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda") if flush_l2 else None

    def __call__(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for i in range(self.reps):
            if self.flush_buf is not None:
                self.flush_buf.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))  # ms


def copy_bandwidth(torch) -> float:
    """Measured device-to-device copy bandwidth (bytes/s, read + write)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = Timer(torch, reps=20, warmup=3, flush_l2=False)(lambda: b.copy_(a))
    return 2 * n / (t / 1e3)


def hbm_peak(name: str, override_gbps: float | None) -> tuple[float | None, str]:
    if override_gbps:
        return override_gbps * 1e9, "--hbm-gbps"
    for key, bw in HBM_SPEC:
        if key in name:
            return bw, f"spec for {key}"
    return None, "unknown GPU: pass --hbm-gbps"


def run_op_table(cases: list[Case], timer: Timer, peak: float | None) -> None:
    hdr = (f"{'op':<24} {'shape':<38} {'dtype':<8} {'MB':>8} {'GFLOP':>8} {'triton ms':>10} {'ref ms':>9} "
           f"{'speedup':>8} {'sdpa ms':>8} {'GB/s':>8} {'%HBM':>6} {'TFLOP/s':>8}")
    print(hdr)
    print("-" * len(hdr))
    for c in cases:
        tk = timer(c.kernel)
        tr = timer(c.reference)
        ts = timer(c.sdpa) if c.sdpa else None
        gbs = c.bytes / (tk / 1e3) / 1e9
        frac = f"{100 * c.bytes / (tk / 1e3) / peak:5.1f}%" if peak else "   n/a"
        sd = f"{ts:8.4f}" if ts is not None else f"{'-':>8}"
        print(f"{c.op:<24} {c.shape:<38} {c.dtype:<8} {c.bytes / 1e6:8.2f} {c.flops / 1e9:8.3f} {tk:10.4f} "
              f"{tr:9.4f} {tr / tk:7.2f}x {sd} {gbs:8.1f} {frac:>6} {c.flops / (tk / 1e3) / 1e12:8.2f}")
        sys.stdout.flush()


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.bench.kernel_timing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 200, quick 50)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth of this GPU in GB/s")
    ap.add_argument("--no-flush", action="store_true", help="do not flush L2 between timed calls")
    args = ap.parse_args(argv)

    import torch

    on_cpu = _ensure_interpreter_if_cpu(torch)
    try:
        import triton
    except ImportError:
        print("triton is not installed: pip install 'dlm-lsp[triton]' (or triton>=3.0) to run the kernels")
        return 1
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)

    if on_cpu:
        print("No CUDA GPU: correctness pre-check only, in the Triton interpreter on small CPU shapes.")
        t0 = time.perf_counter()
        ok = all(precheck(make_cases("cpu", dt, quick=True, small=True)) for dt in (torch.float32, dtype))
        print(f"pre-check {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s.")
        print("Timings need an NVIDIA GPU: run `python -m dlm.drivers.bench.kernel_timing` on a machine with CUDA "
              "(and triton) to print the kernel vs reference table.")
        return 0 if ok else 1

    name = torch.cuda.get_device_name()
    reps = args.reps or (50 if args.quick else 200)
    print(f"GPU: {name}; torch {torch.__version__}; triton {triton.__version__}; dtype {args.dtype}; "
          f"{reps} timed calls per figure (median), L2 {'not ' if args.no_flush else ''}flushed between calls")
    peak, src = hbm_peak(name, args.hbm_gbps)
    copy_bw = copy_bandwidth(torch)
    print(f"HBM peak: {peak / 1e9:.0f} GB/s ({src}); " if peak else f"HBM peak: n/a ({src}); ", end="")
    print(f"measured device copy: {copy_bw / 1e9:.0f} GB/s")

    cases = make_cases("cuda", dtype, quick=args.quick, small=False)
    print("correctness pre-check at the benchmark shapes:")
    if not precheck(cases):
        print("pre-check FAILED: not timing wrong kernels")
        return 1
    timer = Timer(torch, reps=reps, warmup=10, flush_l2=not args.no_flush)
    print()
    run_op_table(cases, timer, peak)
    print("\nwhole denoising steps of model shapes: python -m dlm.drivers.bench.denoise_step --device cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
