"""Train the native denoiser with the masked-diffusion loss.

    python -m dlm.drivers.training.train --corpus data/corpus --out runs/v0 --preset cpu-small --minutes 45

Examples become sequences and padded batches in `training.batches` (in
`--workers N` processes); the objective (noise level t per sequence, masks,
loss weighting, and its variants) is `training.objective`. Targets longer than
one block train the second block with the first in the context, as the
sampler's block extension decodes them. `--ar-weight` (default 0.5) adds a
next-token loss on the causal context positions, which the block loss alone
leaves without a direct signal (BENCHMARKS.md has the A/B that chose it);
validation reports the diffusion ELBO alone.

AdamW (fused on CUDA) with linear warm-up and cosine decay, gradient clipping,
`--dtype auto|fp32|bf16` (auto: bf16 autocast only where a measurement at
start finds it faster; `training.precision`), `--compile` (torch.compile on
CUDA), periodic validation, a JSONL loss log, a `--minutes` wall-clock budget,
and resumable state saved every `--save-every` steps and every
`--save-every-minutes` (safetensors + JSON: no pickles; weights in shards
under 16 MiB, `--save-dtype bf16` (the default) halves them; the CPU loader reads them as fp32).

Long runs in the background (one thread, the other cores left for work):

    nohup python -m dlm.drivers.training.train --out runs/long --threads 1 --minutes 240 \
        --save-every-minutes 10 ... > runs/long.log 2>&1 &
    kill -TERM <pid>        # pause: the step in flight finishes, the state is saved, the run exits
    python -m dlm.drivers.training.train --out runs/long --resume ...   # continues where it stopped

The resumable run directory (OUT/last) keeps everything a continuation needs: the
fp32 master weights and AdamW moments (optimizer.safetensors; a bf16 copy of the
weights alone would restart the schedule and lose precision), the step and the
schedule's length, and the data position (the example stream's random state; the
masks of step k are drawn from a generator seeded by k). With `--workers 0` a run
paused and resumed trains exactly the batches and masks an uninterrupted one would.
OUT/final is the committable checkpoint (bf16 by default: ~12 MB for cpu-small),
written whenever a run stops. Every checkpoint records its token layout
(`layout.LAYOUT_VERSION` in config.json); `--resume` refuses a run of another
layout, `--init` warm-starts from one (a new schedule in the current layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from dlm.coder_model.checkpoint import load_model, resolve_device, save_checkpoint
from dlm.coder_model.config import ModelConfig
from dlm.coder_model.layout import LAYOUT_VERSION
from dlm.coder_model.model import DLM, CopyHead, count_parameters
from dlm.coder_model.tokenizer import Tokenizer, train_tokenizer
from dlm.drivers.training.batches import ExampleStream, batches, collate, make_sequence, train_budget
from dlm.drivers.training.corpus import read_split
from dlm.drivers.training.objective import Objective, diffusion_loss
from dlm.drivers.training.precision import choose_dtype

# --steps 0 fits the cosine to --minutes from the time of these steps: after compilation, the data
# workers' start and the recompilations of the first steps (on an H200 steps 10-30 took 0.15 s each,
# the steady state 0.084 s, and a schedule sized on them ended the run at 83% of its minutes)
SIZE_FROM, SIZE_TO = 40, 80
SHARD_BYTES = 16 << 20  # checkpoint shards stay under 16 MiB (git- and review-friendly files)


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
    steps: int = 0  # 0 = derive the schedule from --minutes
    minutes: float = 45.0  # wall-clock budget (also stops a run with --steps)
    clip: float = 1.0
    device: str = "auto"  # cpu, cuda or auto
    dtype: str = "auto"  # auto (measured at start), fp32 or bf16 (autocast)
    compile: bool = False  # torch.compile the model (CUDA only; skipped on CPU)
    workers: int = 0  # example-building processes (0 = in this process, deterministic)
    eval_every: int = 100
    save_every: int = 100
    save_every_minutes: float = 0.0  # also save state this often (0 = by steps only)
    save_dtype: str = "bf16"  # weights in saved checkpoints (the fp32 masters stay in OUT/last): fp32 or bf16
    valid_examples: int = 256
    mix: str = "typing=0.45,completion=0.15,fim=0.15,noop=0.05,synthetic_edit=0.1,real_edit=0.1"
    seed: int = 0
    threads: int = 0
    # objective (training.objective). Defaults: the combination that won the A/B in BENCHMARKS.md
    # ("Training recipe"): valid ELBO 6.32 after 200 steps against 8.01 for uniform t / 1/t weighting;
    # stratified t did not help there and is off
    t_dist: str = "logit_normal"  # uniform, clipped, logit_normal
    stratified_t: bool = False
    complementary: bool = True  # needs an even --batch
    loss_weight: str = "ce"  # ce (mean over masked slots) or inv_t (the ELBO's 1/t)
    eps: float = 1e-3
    t_min: float = 0.1
    ar_weight: float = 0.5  # auxiliary next-token loss on the causal context (0 = off)
    edit_histories: str = ""  # the edit-histories folder ("": $DLM_EDIT_HISTORIES; training.commit_edits)
    # share of typing examples given retrieved snippets of their project's other files
    # (training.project_snippets); the rest have none, as the server has before its index is ready
    snippet_share: float = 0.7
    # share of typing examples given the repository memory's drafts at their cursor
    # (training.project_drafts); above 0 the model gets a drafts section (layout 3, its
    # drafts_window) and, served with no check pass asked, writes from the drafts
    draft_share: float = 0.0
    # share of the examples with drafts whose block starts from the first draft, every slot scored
    # (keep what is right, rewrite what is wrong: coder_model.refine); above 0 the
    # model is served so (ModelConfig.draft_start)
    draft_start: float = 0.0
    # a pointer-generator copy head (model.CopyHead); with --init from a model without one, the
    # head is added (its parameters new, the rest loaded) and trains at copy_lr_mult x the lr
    copy_head: bool = False
    copy_lr_mult: float = 5.0

    def objective(self) -> Objective:
        return Objective(t_dist=self.t_dist, stratified_t=self.stratified_t, complementary=self.complementary,
                         loss_weight=self.loss_weight, eps=self.eps, t_min=self.t_min)


# -- state ------------------------------------------------------------------------
MASTER_PREFIX = "master/"  # fp32 master weights inside optimizer.safetensors


def save_state(path: Path, model, tok, opt, step: int, total: int, cfg: TrainConfig, rng: random.Random,
               tokens_seen: int = 0) -> None:
    """The resumable state: a checkpoint (shards < 16 MiB, `cfg.save_dtype`), the fp32 optimizer
    state with the fp32 master weights beside it (when the checkpoint is not fp32), and the
    trainer's JSON state (step, schedule length, data position). trainer_state.json is written
    last: a reader that sees it sees a complete state."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, tok, path, shard_bytes=SHARD_BYTES, dtype=_SAVE_DTYPES[cfg.save_dtype])
    tensors, meta = {}, {}
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                meta[f"{pid}.{k}"] = v
    if _SAVE_DTYPES[cfg.save_dtype] is not None:
        for name, v in model.state_dict().items():
            tensors[MASTER_PREFIX + name] = v.detach().float().cpu().contiguous().clone()
    save_file(tensors, str(path / "optimizer.safetensors"))
    (path / "trainer_state.json").write_text(json.dumps({
        "step": step, "total": total, "config": asdict(cfg), "scalars": meta,
        "param_groups": opt.state_dict()["param_groups"], "rng": list(rng.getstate()),
        "tokens_seen": tokens_seen,
    }))


_SAVE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def load_state(path: Path, model, opt) -> tuple[int, int, list, int]:
    """Restore the optimizer (and the fp32 master weights, when saved) from `path`; returns
    (step, schedule length, rng state, tokens seen)."""
    from safetensors.torch import load_file

    st = json.loads((path / "trainer_state.json").read_text())
    # read on the CPU: Optimizer.load_state_dict moves each state to its parameter's device
    # (and `step` where fused AdamW wants it)
    tensors = load_file(str(path / "optimizer.safetensors"))
    masters = {k[len(MASTER_PREFIX):]: v for k, v in tensors.items() if k.startswith(MASTER_PREFIX)}
    if masters:
        with torch.no_grad():
            for name, v in model.state_dict().items():
                v.copy_(masters[name])
    state: dict = {}
    for key, v in tensors.items():
        if key.startswith(MASTER_PREFIX):
            continue
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    for key, v in st["scalars"].items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    groups = st["param_groups"]
    for saved, current in zip(groups, opt.param_groups):
        saved["fused"] = current.get("fused")  # a CPU run resumed on CUDA fuses, and back
    opt.load_state_dict({"state": state, "param_groups": groups})
    return st["step"], st["total"], st["rng"], st.get("tokens_seen", 0)


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


def _validate(cfg: TrainConfig) -> None:
    if cfg.save_dtype not in _SAVE_DTYPES:
        raise SystemExit(f"--save-dtype {cfg.save_dtype!r}: use fp32 or bf16")
    if cfg.complementary and cfg.batch % 2:
        raise SystemExit(f"--complementary needs an even --batch (two copies of each sequence); got {cfg.batch}")
    try:
        cfg.objective()
    except ValueError as exc:
        raise SystemExit(f"objective: {exc}") from exc
    if cfg.draft_start > 0 and cfg.draft_share <= 0:
        raise SystemExit("--draft-start needs --draft-share above 0: a block starts from a draft the example has")


def build_model(cfg: TrainConfig, resume: bool, last: Path) -> tuple[DLM, Tokenizer, bool]:
    if resume and (last / "trainer_state.json").exists():
        model, tok = load_model(last, device="cpu", impl="reference")
        return model, tok, True
    if cfg.init:
        # the weights of any layout: training them here puts them in the current one
        model, tok = load_model(cfg.init, device="cpu", impl="reference", any_layout=True)
        print(f"[train] warm start from {cfg.init} (trained now in token layout {LAYOUT_VERSION})",
              file=sys.stderr)
        if cfg.copy_head and model.copy_head is None:
            model = add_copy_head(model, cfg.seed)
            n_new = count_parameters(model.copy_head)
            print(f"[train] copy head added: {n_new} new parameters initialised (gate bias "
                  f"{CopyHead.GATE_BIAS_INIT}), the other weights loaded from {cfg.init}", file=sys.stderr)
        return model, tok, False
    tok = build_tokenizer(cfg)
    mcfg = ModelConfig.preset(cfg.preset, vocab_size=max(tok.vocab_size, 256), copy_head=cfg.copy_head)
    model = DLM(mcfg, impl="reference")
    model.init_weights(cfg.seed)
    return model, tok, False


def add_copy_head(model: DLM, seed: int = 0) -> DLM:
    """A copy of `model` with a freshly initialised copy head; every other weight is kept."""
    cfg = dataclasses.replace(model.config, copy_head=True)
    new = DLM(cfg, impl=model.impl)
    new.init_weights(seed)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("copy_head.") for k in missing), (missing, unexpected)
    return new


def train(cfg: TrainConfig, resume: bool = False) -> Path:
    _validate(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
        try:  # no inter-op pool either: a background run on one thread leaves the rest free
            torch.set_num_interop_threads(cfg.threads)
        except RuntimeError:  # only settable before the first parallel work (a second run in-process)
            pass
    torch.manual_seed(cfg.seed)
    dev = resolve_device(cfg.device)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    last = out / "last"
    rng = random.Random(cfg.seed)
    model, tok, resume = build_model(cfg, resume, last)
    model.to(dev).train()
    body = [(n, p) for n, p in model.named_parameters() if not n.startswith("copy_head.")]
    decay = [p for n, p in body if p.dim() >= 2]
    no_decay = [p for n, p in body if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}]
    if model.copy_head is not None:
        # the new head starts from scratch on a warm-started body: it learns at a higher rate
        groups.append({"params": list(model.copy_head.parameters()), "weight_decay": 0.0,
                       "lr_scale": cfg.copy_lr_mult})
    opt = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(0.9, 0.95), fused=dev.type == "cuda",  # fused: one kernel for all parameters
    )
    step, total, tokens_seen = 0, cfg.steps, 0
    if resume:
        step, total, rng_state, tokens_seen = load_state(last, model, opt)
        version, internal, gauss = rng_state
        rng.setstate((version, tuple(internal), gauss))
        if cfg.steps > total:  # a longer schedule: the cosine is stretched from here on
            print(f"[train] schedule extended from {total} to {cfg.steps} steps", file=sys.stderr)
            total = cfg.steps
        print(f"[train] resumed at step {step}/{total}", file=sys.stderr)
    model.config.context_window = cfg.context  # saved in config.json: the inference window
    model.config.drafts_window = train_budget(cfg).max_drafts  # and the drafts section it reads
    model.config.draft_start = cfg.draft_start > 0 and cfg.draft_share > 0  # and where its block starts
    n_params = count_parameters(model)
    print(f"[train] {cfg.preset}: {n_params / 1e6:.2f}M parameters on {dev}", file=sys.stderr)
    mc = model.config
    dtype = choose_dtype(cfg.dtype, mc.dim, mc.ffn_dim, min(cfg.batch * (cfg.context + cfg.block), 8192), dev)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    fwd = model
    if cfg.compile and dev.type == "cuda":
        fwd = torch.compile(model)  # shares parameters with `model`; saving uses `model`
    elif cfg.compile:
        print("[train] --compile skipped on CPU (compilation costs more than it saves here)", file=sys.stderr)

    stream = ExampleStream(cfg, "train", rng)
    print(f"[train] example kinds {dict(zip(stream.kinds, stream.weights))}, {cfg.workers} worker(s)",
          file=sys.stderr)
    if cfg.workers and resume:
        print("[train] note: with --workers the resumed example stream is reseeded, not replayed", file=sys.stderr)
    vrng = random.Random(1234)
    vstream = ExampleStream(cfg, "valid", vrng)
    valid_seqs = []
    while len(valid_seqs) < cfg.valid_examples:
        s = make_sequence(tok, next(vstream), cfg, vrng)
        if s:
            valid_seqs.append(s)
    train_batches = batches(tok, stream, cfg, rng, cfg.workers, seed=cfg.seed + step,
                            pin_memory=dev.type == "cuda")
    objective = cfg.objective()
    gen = torch.Generator()
    t_start = time.time()
    deadline = t_start + cfg.minutes * 60
    last_save = t_start
    if not total:
        total = 10**9  # fixed after the first timed steps
    tokens_per_step = cfg.batch * (cfg.context + cfg.block)

    def evaluate() -> float:
        model.eval()
        vgen = torch.Generator().manual_seed(99)
        losses = []
        with torch.no_grad(), amp:
            for i in range(0, len(valid_seqs), cfg.batch):
                ids, targets, valid, tc, _ = collate(tok, valid_seqs[i : i + cfg.batch], cfg)  # from masks: the ELBO
                ids, targets, valid = ids.to(dev), targets.to(dev), valid.to(dev)
                loss, _ = diffusion_loss(fwd, ids, targets, valid, tc, tok, vgen, cfg.eps)
                losses.append(loss.item())
        model.train()
        return sum(losses) / len(losses)

    stop = _StopOnSignal()
    step_start, train_s = step, 0.0
    sized_from = t_start
    with stop, open(out / "loss_log.jsonl", "a") as log:
        while step < total:
            t0 = time.time()
            gen.manual_seed(cfg.seed * 1_000_003 + step)  # step k's masks: the same after a resume
            ids, targets, valid, tc, starts = next(train_batches)
            ids = ids.to(dev, non_blocking=True)
            targets, valid = targets.to(dev, non_blocking=True), valid.to(dev, non_blocking=True)
            lr = lr_at(step, total, cfg)
            for g in opt.param_groups:
                g["lr"] = lr * g.get("lr_scale", 1.0)
            with amp:
                loss, acc = diffusion_loss(fwd, ids, targets, valid, tc, tok, gen, cfg.eps, cfg.ar_weight,
                                           objective, starts=starts)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip).item()
            opt.step()
            step += 1
            dt = time.time() - t0
            train_s += dt
            tokens_seen += tokens_per_step
            if cfg.steps == 0 and total == 10**9 and step - step_start == SIZE_FROM:
                sized_from = time.time()
            if cfg.steps == 0 and total == 10**9 and step - step_start == SIZE_TO:
                # size the cosine schedule to the time budget (what is left of it, when a run that
                # was paused before this point resumes), timed on steps SIZE_FROM..SIZE_TO: the
                # first steps carry torch.compile's compilation and the workers' start
                per_step = (time.time() - sized_from) / (SIZE_TO - SIZE_FROM)
                total = max(step + 10, step + int((deadline - time.time()) / per_step * 0.97))
                print(f"\n[train] {per_step:.3f}s/step -> schedule of {total} steps", file=sys.stderr)
            rec = {"step": step, "loss": round(loss.item(), 4), "acc": round(acc.item(), 4), "lr": lr,
                   "gnorm": round(gnorm, 3), "s_per_step": round(dt, 3),
                   "tokens_per_s": round(tokens_per_step / max(dt, 1e-9)), "t": round(time.time() - t_start, 1)}
            if step % cfg.eval_every == 0 or step == total:
                rec["valid_loss"] = round(evaluate(), 4)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            progress(step, total, loss.item(), f"acc {acc.item():.2f} lr {lr:.1e} {dt:.2f}s/step"
                     + (f" valid {rec['valid_loss']:.3f}" if "valid_loss" in rec else ""))
            now = time.time()
            by_time = cfg.save_every_minutes > 0 and now - last_save >= cfg.save_every_minutes * 60
            if step % cfg.save_every == 0 or step == total or by_time:
                save_state(last, model, tok, opt, step, total, cfg, rng, tokens_seen)
                last_save = now
            if now > deadline or stop.signal:
                if step < total:
                    why = f"signal {stop.signal}" if stop.signal else f"--minutes {cfg.minutes}"
                    print(f"\n[train] {why}: stopped at step {step}/{total}; state saved in {last} "
                          "(continue with --resume)", file=sys.stderr)
                    save_state(last, model, tok, opt, step, total, cfg, rng, tokens_seen)
                break
    elapsed = time.time() - t_start
    final = out / "final"
    save_checkpoint(model, tok, final, shard_bytes=SHARD_BYTES, dtype=_SAVE_DTYPES[cfg.save_dtype])
    steps_here = step - step_start
    (final / "training.json").write_text(json.dumps({
        "config": asdict(cfg), "steps": step, "parameters": n_params, "dtype": dtype, "device": str(dev),
        "threads": torch.get_num_threads(), "machine": machine_name(dev),
        "layout_version": LAYOUT_VERSION, "wall_minutes": round(elapsed / 60, 1),
        "tokens_seen": tokens_seen,
        # this invocation's training steps only (not validation or saving): the machine's speed
        "tokens_per_s": round(steps_here * tokens_per_step / train_s) if train_s else None,
    }, indent=2))
    print(f"\n[train] done: {step} steps, checkpoint in {final}", file=sys.stderr)
    return final


class _StopOnSignal:
    """SIGTERM/SIGINT ask the run to stop after the step in flight (saving its state) instead
    of killing it mid-write: how a long background run is paused. Installed only in the main
    thread (Python's rule); elsewhere a run stops by --minutes alone."""

    def __init__(self) -> None:
        self.signal: str = ""
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def machine_name(dev: torch.device) -> str:
    """What trained: the GPU's name, or the CPU's model name (lscpu's) for the BENCHMARKS row."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _flag(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, default in asdict(TrainConfig()).items():
        name = f"--{f.replace('_', '-')}"
        if isinstance(default, bool):  # --compile, or --compile false
            ap.add_argument(name, type=_flag, nargs="?", const=True, default=default)
        else:
            ap.add_argument(name, type=type(default), default=default)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last")
    args = vars(ap.parse_args(argv))
    resume = args.pop("resume")
    train(TrainConfig(**args), resume=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
