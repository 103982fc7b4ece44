"""Model-level figures for BENCHMARKS.md: size, step latency, predict latency,
held-out line infilling, diffusion vs autoregressive decoding on the same network.

    python -m dlm.drivers.bench.model_lines --model DIR --corpus data/corpus --lines 100

Held-out lines come from the corpus test split (files never trained on): the
region is one non-blank line emptied down to its indentation, the cursor after
the indentation; exact match compares the predicted region with the original
line (trailing whitespace ignored). The same lines are decoded by the default
diffusion sampler and by the autoregressive baseline on the same network
(threshold=1, one slot per step, left to right).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from dlm.coder_model.budget import model_budget
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.checkpoint import embedded_checkpoint_dir, load_model
from dlm.coder_model.layout import LayoutBudget, encode_prompt
from dlm.coder_model.model import count_parameters
from dlm.coder_model.sampler import generate
from dlm.coder_model.types import Prompt, SamplerParams
from dlm.drivers.bench.answers import around_line, pick_line
from dlm.drivers.figures import print_figures
from dlm.drivers.training.corpus import read_split


def held_out_lines(corpus: Path, n: int, seed: int = 0, prefix_chars: int = 6000, suffix_chars: int = 1500):
    """(prompt, expected region) pairs: one emptied line of a test-split Python file each."""
    rng = random.Random(seed)
    files = [r for r in read_split(corpus, "test") if r["language"] == "python"]
    rng.shuffle(files)
    out = []
    for r in files:
        lines = r["text"].split("\n")
        i = pick_line(rng, lines, 8, 80)
        if i is None:
            continue
        line = lines[i]
        indent = line[: len(line) - len(line.lstrip())]
        before, after = around_line(lines, i)
        before = before[-prefix_chars:]
        if len(before) == prefix_chars and "\n" in before:
            before = before[before.index("\n") + 1 :]
        after = after[:suffix_chars]
        prompt = Prompt(prefix=before, region=indent + "\n", cursor=len(indent), suffix=after,
                        language="python", path=Path(r["path"]).name)
        out.append((prompt, line + "\n"))
        if len(out) >= n:
            break
    return out


def run_lines(model, tok, cases, params: SamplerParams, budget: LayoutBudget):
    em, steps, tokens, wall = 0, 0, 0, 0.0
    for prompt, expected in cases:
        ids = encode_prompt(tok, prompt, budget)
        t0 = time.perf_counter()
        dec = generate(model, tok, ids, params)
        wall += time.perf_counter() - t0
        em += dec.text().rstrip() == expected.rstrip()
        steps += dec.stats.steps
        tokens += dec.stats.committed
    n = max(len(cases), 1)
    return {"exact_match": em / n, "forward_passes": steps / n, "tokens": tokens / n,
            "tokens_per_pass": tokens / max(steps, 1), "ms_per_line": wall / n * 1000}


def step_latency(model, tok, context_tokens: int, block_len: int, reps: int = 20) -> dict:
    """Median time of one denoising step over a cached context, and of the prefill."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(tok.special), tok.vocab_size, (context_tokens,), generator=g).tolist()
    cache = PrefixCache()
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.prefill(ids, cache)
        prefill_ms = (time.perf_counter() - t0) * 1000
        block = torch.full((1, block_len), tok.mask_id)
        times = []
        for _ in range(reps + 3):
            t0 = time.perf_counter()
            model(block, start_pos=len(cache), context_len=len(cache), cache=cache)
            times.append((time.perf_counter() - t0) * 1000)
    return {"context_tokens": context_tokens, "block_len": block_len, "prefill_ms": prefill_ms,
            "step_ms_p50": statistics.median(times[3:])}


def predict_latency(model, tok, cases, params: SamplerParams, budget: LayoutBudget, warm: bool) -> dict:
    """End-to-end sampler time per prediction; warm = the context was cached by an earlier call."""
    times, ctx = [], []
    for prompt, _ in cases:
        ids = encode_prompt(tok, prompt, budget)
        cache = PrefixCache()
        if warm:
            generate(model, tok, ids, params, cache=cache)
        t0 = time.perf_counter()
        generate(model, tok, ids, params, cache=cache)
        times.append((time.perf_counter() - t0) * 1000)
        ctx.append(len(ids))
    times.sort()
    return {"p50_ms": statistics.median(times), "p90_ms": times[min(len(times) - 1, round(0.9 * (len(times) - 1)))],
            "context_tokens_p50": statistics.median(ctx), "n": len(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: embedded)")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--lines", type=int, default=100)
    ap.add_argument("--latency-cases", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    d = Path(args.model) if args.model else embedded_checkpoint_dir()
    model, tok = load_model(d, device="cpu")
    size_mb = sum(p.stat().st_size for p in d.glob("*.safetensors")) / 2**20
    res: dict = {"model": str(d), "parameters": count_parameters(model), "weights_mb": round(size_mb, 1),
                 "threads": torch.get_num_threads()}
    params = SamplerParams()
    budget = LayoutBudget(max_context=2048)  # latency at the 1-2k context of docs/architecture.md §9
    quality_budget = model_budget(model.config)  # what the model was trained on
    res["step"] = [step_latency(model, tok, n, 32) for n in (512, 1536)]
    cases = held_out_lines(args.corpus, args.lines)
    long_cases = [c for c in cases if len(encode_prompt(tok, c[0], budget)) >= 1000][: args.latency_cases]
    res["predict_cold"] = predict_latency(model, tok, long_cases, params, budget, warm=False)
    res["predict_warm"] = predict_latency(model, tok, long_cases, params, budget, warm=True)
    res["context_window"] = model.config.context_window
    res["diffusion"] = run_lines(model, tok, cases, params, quality_budget)
    ar = replace(params, threshold=1.0, order="left_to_right", steps=params.block_len)
    res["autoregressive"] = run_lines(model, tok, cases, ar, quality_budget)
    res["ar_over_diffusion"] = {
        "forward_passes": res["autoregressive"]["forward_passes"] / max(res["diffusion"]["forward_passes"], 1e-9),
        "wall": res["autoregressive"]["ms_per_line"] / max(res["diffusion"]["ms_per_line"], 1e-9),
    }
    return print_figures(res, args.json)


if __name__ == "__main__":
    sys.exit(main())
