"""Compile every Triton kernel for sm_90 (H100) ahead of time, without a GPU.

The interpreter does not check what only the GPU compiler checks (loop-carried
types, dot shapes, layouts); this does. Run as a script (the kernels must be
defined with TRITON_INTERPRET unset):  python tests/kernels/aot_compile.py [--fp32] [rms rope attn unmask]
"""
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)
import triton
from dlm.kernels import triton_ops as T
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

assert not T.INTERPRET
target = GPUTarget("cuda", 90, 32)

def sig(fn, ptrs, floats, consts):
    s = {}
    for a in fn.arg_names:
        if a in consts: s[a] = "constexpr"
        elif a in ptrs: s[a] = ptrs[a]
        elif a in floats: s[a] = "fp32"
        else: s[a] = "i32"
    return s

def comp(fn, ptrs, floats, consts, opts):
    t0 = time.time()
    src = ASTSource(fn=fn, signature=sig(fn, ptrs, floats, consts), constexprs=consts)
    k = triton.compile(src, target=target, options=opts)
    print("ok", fn.__name__, {k_: v for k_, v in consts.items() if k_ not in ("DOT_F32",)}, f"{time.time()-t0:.1f}s",
          "regs?", k.metadata.shared if hasattr(k.metadata, "shared") else "")

args = [a for a in sys.argv[1:] if not a.startswith("--")]
which = args or ["rms", "rope", "attn", "unmask"]
for dt in ("bf16", "fp32") if "--fp32" in sys.argv else ("bf16",):
    if "rms" in which:
        for res in (True, False):
            comp(T._rms_norm_kernel, {n: f"*{dt}" for n in "XRWYS"}, {"eps"}, {"HAS_RES": res, "BLOCK_D": 1024}, {"num_warps": 4})
    if "rope" in which:
        p = {n: f"*{dt}" for n in ("Q", "K", "QO", "KO")}; p.update(COS="*fp32", SIN="*fp32", POS="*i64")
        comp(T._rope_kernel, p, set(), {"BLOCK_T": 16, "BLOCK_H": 32}, {"num_warps": 4})
    if "attn" in which:
        prec = "ieee" if dt == "fp32" else "tf32"
        for split in (False, True):
            for bidir in (False, True):
                p = {n: f"*{dt}" for n in ("Q", "K", "V", "KC", "VC")}
                p["O"] = "*fp32" if split else f"*{dt}"; p["ML"] = "*fp32"
                comp(T._attn_fwd_kernel, p, {"qk_scale"}, {"BIDIR": bidir, "SPLIT": split, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 64, "DOT_F32": False, "PREC": prec}, {"num_warps": 4, "num_stages": 2})
        comp(T._attn_combine_kernel, {"OP": "*fp32", "ML": "*fp32", "O": f"*{dt}"}, set(), {"BLOCK_R": 16, "BLOCK_D": 64}, {"num_warps": 4})
    if "unmask" in which:
        prec = "ieee" if dt == "fp32" else "tf32"
        p = {"H": f"*{dt}", "W": f"*{dt}", "POS": "*i64", "PM1": "*fp32", "PM2": "*fp32", "PI": "*i32", "PS": "*fp32", "PT": "*fp32"}
        comp(T._unmask_partial_kernel, p, set(), {"BLOCK_M": 16, "BLOCK_V": 128, "BLOCK_K": 64, "DOT_F32": False, "PREC": prec}, {"num_warps": 4, "num_stages": 3})
        for rule in (0, 1, 2):
            comp(T._unmask_combine_kernel, {"PM1": "*fp32", "PM2": "*fp32", "PI": "*i32", "PS": "*fp32", "PT": "*fp32", "TOK": "*i64", "CONF": "*fp32"}, set(), {"RULE": rule, "BLOCK": 64}, {"num_warps": 2})
