"""Train the native denoiser with the masked-diffusion loss.

    python -m dlm.coder_model.training.train --corpus data/corpus --out runs/v0 --preset cpu-small --minutes 45

Each example (coder_model.examples / edit_examples) becomes one sequence:
left padding, the context tokens of the native layout, then one block of L
slots holding the target region, <eom> and <pad>. For each sequence
t ~ U(eps, 1), every block slot is masked with probability t, and the loss is
the cross-entropy on the masked slots weighted by 1/t (divided by L): the
masked-diffusion ELBO. Targets longer than one block train the second block
with the first in the context, as the sampler's block extension decodes them.
`--ar-weight` (default 0.5) adds a next-token loss on the causal context
positions, which the block loss alone leaves without a direct signal
(BENCHMARKS.md has the A/B that chose it); validation reports the diffusion
loss alone.

AdamW with linear warm-up and cosine decay, gradient clipping, bf16 autocast
(CPUs with AMX run it several times faster than fp32), periodic validation,
a JSONL loss log, and resumable state (safetensors + JSON: no pickles).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dlm.coder_model.training import examples as ex_mod
from dlm.coder_model.checkpoint import load_model, save_checkpoint
from dlm.coder_model.config import ModelConfig
from dlm.coder_model.training.corpus import read_split
from dlm.coder_model.layout import LayoutBudget, encode_prompt, encode_target, target_block
from dlm.coder_model.model import DLM, count_parameters
from dlm.coder_model.tokenizer import Tokenizer, train_tokenizer


@dataclass
class TrainConfig:
    corpus: str = "data/corpus"
    out: str = "runs/v0"
    preset: str = "cpu-small"
    tokenizer: str = ""  # existing tokenizer.json; empty = train one on the corpus
    init: str = ""  # warm start from this checkpoint's weights and tokenizer (new schedule)
    vocab_size: int = 8192
    batch: int = 32
    context: int = 384  # context tokens per sequence (left-padded)
    block: int = 32  # L
    max_blocks: int = 2
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.05
    warmup: int = 50
    steps: int = 0  # 0 = derive from --minutes
    minutes: float = 45.0
    clip: float = 1.0
    precision: str = "bf16"  # bf16 autocast or fp32
    eval_every: int = 100
    save_every: int = 100
    valid_examples: int = 256
    mix: str = "completion=0.45,fim=0.3,noop=0.05,synthetic_edit=0.1,real_edit=0.1"
    seed: int = 0
    threads: int = 0
    eps: float = 1e-3
    ar_weight: float = 0.5  # auxiliary next-token loss on the causal context (0 = off)
    edit_histories: str = "../shared/data/edit-histories"


# -- examples -------------------------------------------------------------------
class ExampleStream:
    """Mixed examples from the corpus files (and the edit histories), seeded."""

    def __init__(self, cfg: TrainConfig, split: str, rng: random.Random) -> None:
        self.rng = rng
        self.files = [(r["path"], r["language"], r["text"]) for r in read_split(Path(cfg.corpus), split)]
        if not self.files:
            raise SystemExit(f"corpus split {split!r} in {cfg.corpus} is empty; build it with "
                             "python -m dlm.coder_model.training.corpus")
        weights = dict(kv.split("=") for kv in cfg.mix.split(","))
        self.builders = {"completion": ex_mod.completion_example, "fim": ex_mod.fim_example}
        self.real_edits = None
        try:  # the edit builders (issue 5) are optional: train without them if absent
            from dlm.coder_model.training import edit_examples as ed
        except ImportError:
            ed = None
        if ed is not None:
            for kind, fn in (("synthetic_edit", "synthetic_edit_example"), ("noop", "noop_example")):
                if hasattr(ed, fn):
                    self.builders[kind] = getattr(ed, fn)
            if hasattr(ed, "real_edit_examples") and Path(cfg.edit_histories).is_dir():
                hist_split = {"train": "train", "valid": "valid", "test": "test"}[split]
                self.real_edits = ed.real_edit_examples(hist_split, rng, data_dir=cfg.edit_histories)
        self.kinds = [k for k in weights if k in self.builders or (k == "real_edit" and self.real_edits)]
        self.weights = [float(weights[k]) for k in self.kinds]
        print(f"[train] example kinds {dict(zip(self.kinds, self.weights))}", file=sys.stderr)

    def __iter__(self):
        return self

    def __next__(self) -> ex_mod.Example:
        while True:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            if kind == "real_edit":
                try:
                    ex = next(self.real_edits)
                except StopIteration:
                    self.kinds.remove("real_edit")
                    continue
            else:
                path, lang, text = self.files[self.rng.randrange(len(self.files))]
                ex = self.builders[kind](text, self.rng, path=Path(path).name, language=lang)
            if ex is not None:
                return ex


def make_sequence(tok: Tokenizer, ex: ex_mod.Example, cfg: TrainConfig, rng: random.Random):
    """(context ids, block target ids) or None when the target needs more blocks than allowed."""
    budget = LayoutBudget.for_window(cfg.context)
    ctx = encode_prompt(tok, ex.prompt, budget)
    tgt = encode_target(tok, ex.target)
    n_blocks = math.ceil(len(tgt) / cfg.block)
    if n_blocks > cfg.max_blocks:
        return None
    b = rng.randrange(n_blocks)
    ctx = ctx + tgt[: b * cfg.block]  # earlier blocks are context (block diffusion)
    return ctx, target_block(tok, tgt, b, cfg.block)


def collate(tok: Tokenizer, seqs, cfg: TrainConfig):
    """Left-pad contexts to one length so every block starts at the same position.

    Returns ids (B, T), targets (B, L), key_valid (B, T), context length Tc.
    """
    tc = max(len(c) for c, _ in seqs)
    B, L = len(seqs), cfg.block
    ids = torch.full((B, tc + L), tok.pad_id, dtype=torch.long)
    valid = torch.zeros((B, tc + L), dtype=torch.bool)
    targets = torch.empty((B, L), dtype=torch.long)
    for i, (c, t) in enumerate(seqs):
        ids[i, tc - len(c) : tc] = torch.tensor(c)
        valid[i, tc - len(c) :] = True
        targets[i] = torch.tensor(t)
    return ids, targets, valid, tc


def native_train_mask(valid: torch.Tensor, tc: int) -> torch.Tensor:
    """(B, 1, T, T) bool: the native mask over left-padded rows.

    Context queries see earlier valid context keys; block queries see all valid
    keys. Padding queries see themselves only (their output is never used;
    this avoids an all-masked row).
    """
    B, T = valid.shape
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    base = ((k <= q) & (k < tc)) | (q >= tc)  # (T, T)
    m = base[None] & valid[:, None, :]  # (B, T, T)
    m = m | torch.eye(T, dtype=torch.bool)[None]
    return m[:, None]


def diffusion_loss(model: DLM, ids, targets, valid, tc, tok, gen: torch.Generator, eps: float,
                   ar_weight: float = 0.0):
    """Masked-diffusion loss; ids' block slots are replaced by noised targets here.

    With `ar_weight` > 0 an auxiliary next-token loss on the causal context is
    added (weight x mean cross-entropy over valid context positions). Why: a
    step's block has 32 slots but its context ~250 tokens whose hidden states
    get no direct signal; the native mask makes the context a causal LM, so
    next-token targets are free there and train the K/V the block reads. The
    context outputs are never used at inference, so nothing else changes.
    """
    B, L = targets.shape
    t = eps + (1 - eps) * torch.rand(B, 1, generator=gen)  # (B, 1)
    masked = torch.rand(B, L, generator=gen) < t  # (B, L)
    none = ~masked.any(1)
    masked[none, torch.randint(0, L, (int(none.sum()),), generator=gen)] = True
    block_in = torch.where(masked, torch.full_like(targets, tok.mask_id), targets)
    x = ids.clone()
    x[:, tc:] = block_in
    hidden = model(x, attn_mask=native_train_mask(valid, tc))  # (B, T, dim)
    logits = model.logits(hidden[:, tc:]).float()  # (B, L, V)
    ce = F.cross_entropy(logits.reshape(B * L, -1), targets.reshape(-1), reduction="none").view(B, L)
    loss = ((ce * masked) / t).sum() / (B * L)
    acc = ((logits.argmax(-1) == targets) & masked).sum() / masked.sum()
    if ar_weight > 0 and tc > 1:
        pairs = valid[:, : tc - 1] & valid[:, 1:tc]  # (B, tc-1): position q predicts q+1
        nxt = torch.where(pairs, ids[:, 1:tc], torch.full_like(ids[:, 1:tc], -100))
        ar_logits = model.logits(hidden[:, : tc - 1]).float()  # (B, tc-1, V)
        ar = F.cross_entropy(ar_logits.reshape(-1, ar_logits.shape[-1]), nxt.reshape(-1), ignore_index=-100)
        loss = loss + ar_weight * ar
    return loss, acc


# -- state ------------------------------------------------------------------------
def save_state(path: Path, model, tok, opt, step: int, total: int, cfg: TrainConfig, rng: random.Random) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, tok, path)
    tensors, meta = {}, {}
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.contiguous()
            else:
                meta[f"{pid}.{k}"] = v
    save_file(tensors, str(path / "optimizer.safetensors"))
    (path / "trainer_state.json").write_text(json.dumps({
        "step": step, "total": total, "config": asdict(cfg), "scalars": meta,
        "param_groups": opt.state_dict()["param_groups"], "rng": list(rng.getstate()),
    }))


def load_state(path: Path, model, opt) -> tuple[int, int, list]:
    from safetensors.torch import load_file

    st = json.loads((path / "trainer_state.json").read_text())
    tensors = load_file(str(path / "optimizer.safetensors"))
    state: dict = {}
    for key, v in tensors.items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    for key, v in st["scalars"].items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": st["param_groups"]})
    return st["step"], st["total"], st["rng"]


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    prog = min(1.0, (step - cfg.warmup) / max(1, total - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def progress(step: int, total: int, loss: float, extra: str) -> None:
    width = 30
    done = int(width * step / max(total, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss:.3f} {extra}   ")
    sys.stderr.flush()


# -- main -------------------------------------------------------------------------
def build_tokenizer(cfg: TrainConfig) -> Tokenizer:
    if cfg.tokenizer:
        return Tokenizer.from_file(cfg.tokenizer)
    rng = random.Random(cfg.seed)
    texts = [r["text"] for r in read_split(Path(cfg.corpus), "train")]
    rng.shuffle(texts)
    sample, size = [], 0
    for t in texts:  # ~40 MB is plenty for an 8k vocabulary
        sample.append(t)
        size += len(t)
        if size > 40_000_000:
            break
    t0 = time.time()
    tok = train_tokenizer(iter(sample), vocab_size=cfg.vocab_size)
    print(f"[train] tokenizer: {tok.vocab_size} tokens in {time.time() - t0:.0f}s", file=sys.stderr)
    return tok


def train(cfg: TrainConfig, resume: bool = False) -> Path:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    last = out / "last"
    rng = random.Random(cfg.seed)
    if resume and (last / "trainer_state.json").exists():
        model, tok = load_model(last, device="cpu", impl="reference")
        model.train()
    elif cfg.init:
        resume = False
        model, tok = load_model(cfg.init, device="cpu", impl="reference")
        model.train()
        print(f"[train] warm start from {cfg.init}", file=sys.stderr)
    else:
        resume = False
        tok = build_tokenizer(cfg)
        mcfg = ModelConfig.preset(cfg.preset, vocab_size=max(tok.vocab_size, 256))
        model = DLM(mcfg, impl="reference")
        model.init_weights(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    step, total = 0, cfg.steps
    if resume:
        step, total, rng_state = load_state(last, model, opt)
        version, internal, gauss = rng_state
        rng.setstate((version, tuple(internal), gauss))
        if cfg.steps > total:  # a longer schedule: the cosine is stretched from here on
            print(f"[train] schedule extended from {total} to {cfg.steps} steps", file=sys.stderr)
            total = cfg.steps
        print(f"[train] resumed at step {step}/{total}", file=sys.stderr)
    model.config.context_window = cfg.context  # saved in config.json: the inference window
    n_params = count_parameters(model)
    print(f"[train] {cfg.preset}: {n_params / 1e6:.2f}M parameters", file=sys.stderr)

    stream = ExampleStream(cfg, "train", rng)
    vrng = random.Random(1234)
    vstream = ExampleStream(cfg, "valid", vrng)
    valid_seqs = []
    while len(valid_seqs) < cfg.valid_examples:
        s = make_sequence(tok, next(vstream), cfg, vrng)
        if s:
            valid_seqs.append(s)
    gen = torch.Generator().manual_seed(cfg.seed + step)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    log = open(out / "loss_log.jsonl", "a")
    t_start = time.time()
    deadline = t_start + cfg.minutes * 60
    if not total:
        total = 10**9  # fixed after the first timed steps

    def evaluate() -> float:
        model.eval()
        vgen = torch.Generator().manual_seed(99)
        losses = []
        with torch.no_grad(), amp:
            for i in range(0, len(valid_seqs), cfg.batch):
                ids, targets, valid, tc = collate(tok, valid_seqs[i : i + cfg.batch], cfg)
                loss, _ = diffusion_loss(model, ids, targets, valid, tc, tok, vgen, cfg.eps)
                losses.append(loss.item())
        model.train()
        return sum(losses) / len(losses)

    model.train()
    while step < total:
        t0 = time.time()
        seqs = []
        while len(seqs) < cfg.batch:
            s = make_sequence(tok, next(stream), cfg, rng)
            if s:
                seqs.append(s)
        ids, targets, valid, tc = collate(tok, seqs, cfg)
        lr = lr_at(step, total, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        with amp:
            loss, acc = diffusion_loss(model, ids, targets, valid, tc, tok, gen, cfg.eps, cfg.ar_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip).item()
        opt.step()
        step += 1
        dt = time.time() - t0
        if cfg.steps == 0 and step == 10 and total == 10**9:
            # size the cosine schedule to the time budget
            elapsed = time.time() - t_start
            total = max(20, int(cfg.minutes * 60 / (elapsed / 10) * 0.97))
            print(f"\n[train] {elapsed / 10:.2f}s/step -> schedule of {total} steps", file=sys.stderr)
        rec = {"step": step, "loss": round(loss.item(), 4), "acc": round(acc.item(), 4), "lr": lr,
               "gnorm": round(gnorm, 3), "s_per_step": round(dt, 3), "t": round(time.time() - t_start, 1)}
        if step % cfg.eval_every == 0 or step == total:
            rec["valid_loss"] = round(evaluate(), 4)
        log.write(json.dumps(rec) + "\n")
        log.flush()
        progress(step, total, loss.item(), f"acc {acc.item():.2f} lr {lr:.1e} {dt:.2f}s/step"
                 + (f" valid {rec['valid_loss']:.3f}" if "valid_loss" in rec else ""))
        if step % cfg.save_every == 0 or step == total:
            save_state(last, model, tok, opt, step, total, cfg, rng)
        if time.time() > deadline and cfg.steps == 0:
            if step < total:
                save_state(last, model, tok, opt, step, total, cfg, rng)
            break
    log.close()
    final = out / "final"
    save_checkpoint(model, tok, final)
    (final / "training.json").write_text(json.dumps({
        "config": asdict(cfg), "steps": step, "parameters": n_params,
        "wall_minutes": round((time.time() - t_start) / 60, 1),
        "tokens_seen": step * cfg.batch * (cfg.context + cfg.block),
    }, indent=2))
    print(f"\n[train] done: {step} steps, checkpoint in {final}", file=sys.stderr)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, default in asdict(TrainConfig()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(default), default=default)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last")
    args = vars(ap.parse_args(argv))
    resume = args.pop("resume")
    train(TrainConfig(**args), resume=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
