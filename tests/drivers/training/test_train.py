"""The trainer: loss, resume, warm start, time budget, checkpoints, workers, dtype choice."""

from __future__ import annotations

import gzip
import json
import random

import pytest
import torch
from dlm.drivers.training.train import TrainConfig, main, train


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A corpus directory in read_split's format (train/valid/test .jsonl.gz), built here."""
    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    splits = {"train": 60, "valid": 8, "test": 4}
    for split, n in splits.items():
        with gzip.open(d / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i in range(n):
                body = "".join(f"    v{j} = {rng.randint(0, 99)} + x\n" for j in range(rng.randint(3, 12)))
                text = f"def fn{i}(x):\n{body}    return x\n\n\nprint(fn{i}(3))\n"
                f.write(json.dumps({"path": f"/src/pkg/{split}{i}.py", "language": "python", "text": text}) + "\n")
    return d


def _cfg(small_corpus, out, tiny_checkpoint, **kw):
    base = {"corpus": str(small_corpus), "out": str(out), "preset": "test-tiny",
            "tokenizer": f"{tiny_checkpoint}/tokenizer.json", "batch": 4, "context": 96, "block": 16, "steps": 4,
            "minutes": 30, "eval_every": 2, "save_every": 2, "valid_examples": 4, "warmup": 1,
            "mix": "completion=0.5,fim=0.5", "threads": 1, "edit_histories": "/nonexistent", "dtype": "fp32"}
    base.update(kw)
    return TrainConfig(**base)


def _steps(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "loss_log.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------
# loss


def test_diffusion_loss_only_counts_masked_slots(tiny_model):
    from dlm.drivers.training.objective import diffusion_loss

    model, tok = tiny_model
    ids = torch.randint(20, 300, (2, 24))
    targets = torch.randint(20, 300, (2, 8))
    valid = torch.ones(2, 24, dtype=torch.bool)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    loss1, _ = diffusion_loss(model, ids, targets, valid, 16, tok, g1, 1e-3)
    # changing the targets' context-side copy (ids[:, 16:]) changes nothing: the block is re-noised
    ids2 = ids.clone()
    ids2[:, 16:] = 5
    loss2, _ = diffusion_loss(model, ids2, targets, valid, 16, tok, g2, 1e-3)
    assert torch.isfinite(loss1) and loss1.item() == pytest.approx(loss2.item())


def test_ar_auxiliary_loss_is_next_token_cross_entropy_on_valid_context(tiny_model):
    import torch.nn.functional as F
    from dlm.drivers.training.objective import diffusion_loss, native_train_mask

    model, tok = tiny_model
    model.eval()
    tc = 16
    ids = torch.randint(20, 300, (2, 24))
    ids[1, :5] = tok.pad_id
    targets = torch.randint(20, 300, (2, 8))
    valid = torch.ones(2, 24, dtype=torch.bool)
    valid[1, :5] = False  # row 1 is left-padded: its first 5 positions are not context
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    with torch.no_grad():
        base, _ = diffusion_loss(model, ids, targets, valid, tc, tok, g1, 1e-3)
        both, _ = diffusion_loss(model, ids, targets, valid, tc, tok, g2, 1e-3, ar_weight=0.5)
        # reference: the context is causal under the native mask, so the block's content
        # does not change context hidden states; score next tokens of valid pairs only
        hidden = model(ids, attn_mask=native_train_mask(valid, tc))
        logits = model.logits(hidden[:, : tc - 1]).float()
        ces = [F.cross_entropy(logits[0], ids[0, 1:tc], reduction="none"),
               F.cross_entropy(logits[1, 5:], ids[1, 6:tc], reduction="none")]
        ar = torch.cat(ces).mean()
    assert both.item() == pytest.approx(base.item() + 0.5 * ar.item(), rel=1e-4)


# ---------------------------------------------------------------------------
# runs


def test_resume_continues_from_the_saved_step(small_corpus, tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    train(_cfg(small_corpus, out, tiny_checkpoint, steps=2))  # stops after 2 steps, state saved
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["step"] == 2
    saved_opt = load_file(str(out / "last" / "optimizer.safetensors"))
    assert saved_opt and all(torch.isfinite(t).all() for t in saved_opt.values())

    # resume with a longer schedule (--steps above the saved total stretches it): the run
    # continues at step 3 with the saved optimizer state
    final = train(_cfg(small_corpus, out, tiny_checkpoint, steps=4), resume=True)
    assert _steps(out) == [1, 2, 3, 4]
    assert json.loads((final / "training.json").read_text())["steps"] == 4


def test_a_paused_run_resumes_exactly_where_it_stopped(small_corpus, tmp_path, tiny_checkpoint, monkeypatch):
    """SIGTERM pauses a run after the step in flight; --resume then trains the same steps, with
    the same learning rates, batches and masks, as a run never paused: the same losses and the
    same final weights (the fp32 masters are kept beside the bf16 checkpoint)."""
    import signal

    from dlm.coder_model.checkpoint import load_model
    from dlm.drivers.training import train as train_mod

    def log(out):
        return [json.loads(line) for line in (out / "loss_log.jsonl").read_text().splitlines()]

    kw = {"steps": 5, "save_every": 1000, "eval_every": 1000, "save_dtype": "bf16", "warmup": 2}
    whole = train(_cfg(small_corpus, tmp_path / "whole", tiny_checkpoint, **kw))

    real_lr_at = train_mod.lr_at

    def lr_at_then_term(step, total, cfg):
        if step == 1:  # during the second step: the run finishes it, saves and stops
            signal.raise_signal(signal.SIGTERM)
        return real_lr_at(step, total, cfg)

    monkeypatch.setattr(train_mod, "lr_at", lr_at_then_term)
    paused = tmp_path / "paused"
    train(_cfg(small_corpus, paused, tiny_checkpoint, **kw))
    state = json.loads((paused / "last" / "trainer_state.json").read_text())
    assert (state["step"], state["total"]) == (2, 5)  # the schedule's length is kept
    monkeypatch.setattr(train_mod, "lr_at", real_lr_at)
    resumed = train(_cfg(small_corpus, paused, tiny_checkpoint, **kw), resume=True)

    a, b = log(tmp_path / "whole"), log(paused)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert [(r["loss"], r["lr"]) for r in a] == [(r["loss"], r["lr"]) for r in b]
    wa, _ = load_model(whole, impl="reference")
    wb, _ = load_model(resumed, impl="reference")
    for k, v in wa.state_dict().items():
        assert torch.equal(v, wb.state_dict()[k]), k
    info = json.loads((resumed / "training.json").read_text())
    assert info["steps"] == 5 and info["tokens_seen"] == 5 * 4 * (96 + 16) and info["layout_version"] >= 1


def test_a_schedule_sized_by_minutes_is_fixed_after_its_timed_steps_and_kept_on_pause(small_corpus, tmp_path,
                                                                                tiny_checkpoint, monkeypatch):
    import signal

    from dlm.drivers.training import train as train_mod

    real_lr_at = train_mod.lr_at

    def lr_at_then_term(step, total, cfg):
        if step == train_mod.SIZE_TO + 1:
            signal.raise_signal(signal.SIGTERM)
        return real_lr_at(step, total, cfg)

    monkeypatch.setattr(train_mod, "lr_at", lr_at_then_term)
    out = tmp_path / "sized"
    train(_cfg(small_corpus, out, tiny_checkpoint, steps=0, minutes=30, save_every=1000, eval_every=1000))
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    # sized from the time of steps SIZE_FROM..SIZE_TO (after compilation), not from the run's start
    assert state["step"] == train_mod.SIZE_TO + 2 and train_mod.SIZE_TO + 10 <= state["total"] < 10**9


def test_the_committable_checkpoint_is_bf16_and_half_the_size(small_corpus, tmp_path, tiny_checkpoint):
    from dlm.coder_model.model import count_parameters
    from safetensors import safe_open

    final = train(_cfg(small_corpus, tmp_path / "half", tiny_checkpoint, steps=1))  # save_dtype: bf16 default
    files = sorted(final.glob("model*.safetensors"))
    n, dtypes = 0, set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                t = f.get_tensor(k)
                n += t.numel()
                dtypes.add(t.dtype)
    from dlm.coder_model.checkpoint import load_model

    model, _ = load_model(final, impl="reference")
    assert dtypes == {torch.bfloat16} and n == count_parameters(model)
    size = sum(p.stat().st_size for p in files)
    assert 2 * n <= size <= 2 * n + 64 * 1024  # 2 bytes a weight, + the headers
    # the resumable state keeps the fp32 masters (a bf16 copy alone would lose precision)
    with safe_open(str(tmp_path / "half" / "last" / "optimizer.safetensors"), framework="pt") as f:
        masters = [k for k in f.keys() if k.startswith("master/")]  # noqa: SIM118
        assert masters and {f.get_tensor(k).dtype for k in masters} == {torch.float32}


def test_warm_start_loads_weights(small_corpus, tmp_path, tiny_checkpoint):
    from dlm.coder_model.checkpoint import load_model

    final = train(_cfg(small_corpus, tmp_path / "warm", tiny_checkpoint, steps=1, init=tiny_checkpoint,
                       tokenizer="", lr=0.0, min_lr_ratio=0.0, save_dtype="fp32"))
    a, _ = load_model(final)
    b, _ = load_model(tiny_checkpoint)
    for k, v in a.state_dict().items():  # lr 0: the weights are the initial checkpoint's
        torch.testing.assert_close(v, b.state_dict()[k], rtol=0, atol=1e-6)


def test_warm_start_adds_a_copy_head_trains_it_faster_and_resumes_with_it(small_corpus, tmp_path, tiny_checkpoint,
                                                                          capsys):
    from dlm.coder_model.checkpoint import load_model

    out = tmp_path / "copy"
    cfg = _cfg(small_corpus, out, tiny_checkpoint, steps=2, init=tiny_checkpoint, tokenizer="", copy_head=True,
               copy_lr_mult=3.0, save_dtype="fp32")
    final = train(cfg)
    assert "copy head added" in capsys.readouterr().err
    a, _ = load_model(final)
    b, _ = load_model(tiny_checkpoint)
    assert a.copy_head is not None and b.copy_head is None
    assert json.loads((final / "config.json").read_text())["copy_head"] is True
    groups = json.loads((out / "last" / "trainer_state.json").read_text())["param_groups"]
    assert [g["lr_scale"] for g in groups] == [1.0, 1.0, 3.0]
    assert groups[2]["lr"] == pytest.approx(3.0 * groups[0]["lr"])
    # a resume keeps the head (the saved config says so) and its optimizer group
    train(_cfg(small_corpus, out, tiny_checkpoint, steps=3, init=tiny_checkpoint, tokenizer="", copy_head=True,
               copy_lr_mult=3.0), resume=True)
    assert _steps(out) == [1, 2, 3]


def test_minutes_budget_stops_a_run_and_saves_its_state(small_corpus, tmp_path, tiny_checkpoint):
    # a budget of 0 minutes has run out after the first step, even with --steps 50
    out = tmp_path / "budget"
    final = train(_cfg(small_corpus, out, tiny_checkpoint, steps=50, minutes=0.0, save_every=1000))
    assert _steps(out) == [1]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 1
    assert json.loads((final / "training.json").read_text())["steps"] == 1


def test_save_every_minutes_saves_between_step_saves(small_corpus, tmp_path, tiny_checkpoint):
    out = tmp_path / "timed"
    # save_every=1000 steps never fires in 3 steps; a tiny minute interval saves after every step
    train(_cfg(small_corpus, out, tiny_checkpoint, steps=3, save_every=1000, save_every_minutes=1e-9,
               eval_every=1000))
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 3


def test_bf16_checkpoint_loads_on_cpu_as_fp32_and_predicts(small_corpus, tmp_path, tiny_checkpoint, monkeypatch):
    from dlm.coder_model.checkpoint import INDEX_NAME, load_model
    from dlm.coder_model.engine import LocalEngine
    from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
    from dlm.drivers.training import train as train_mod
    from safetensors import safe_open

    # shards of at most 64 KiB: the tiny model then needs several, as a big one needs several of 16 MiB
    monkeypatch.setattr(train_mod, "SHARD_BYTES", 64 << 10)
    final = train(_cfg(small_corpus, tmp_path / "bf16", tiny_checkpoint, steps=1, save_dtype="bf16"))
    shards = sorted(final.glob("model-*.safetensors"))
    assert (final / INDEX_NAME).exists() and len(shards) > 1
    assert all(p.stat().st_size <= (64 << 10) + 4096 for p in shards)  # + the safetensors header
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    model, tok = load_model(final, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    engine = LocalEngine(model, tok)
    try:
        pred = engine.predict(Prompt(prefix="def f(x):\n", region="    return x\n", cursor=4, suffix="",
                                     language="python", path="f.py"),
                              SamplerParams(block_len=16, max_blocks=1), CancelToken())
    finally:
        engine.close()
    assert not pred.cancelled and pred.steps >= 1


def test_compile_is_skipped_on_cpu_with_a_log_line(small_corpus, tmp_path, tiny_checkpoint, capsys):
    train(_cfg(small_corpus, tmp_path / "c", tiny_checkpoint, steps=1, compile=True, device="cpu"))
    assert "--compile skipped on CPU" in capsys.readouterr().err


def test_cli_parses_boolean_flags_and_objective(small_corpus, tmp_path, tiny_checkpoint):
    out = tmp_path / "cli"
    argv = ["--corpus", str(small_corpus), "--out", str(out), "--preset", "test-tiny",
            "--tokenizer", f"{tiny_checkpoint}/tokenizer.json", "--batch", "4", "--context", "96", "--block", "16",
            "--steps", "1", "--valid-examples", "4", "--warmup", "1", "--mix", "completion=1",
            "--threads", "1", "--edit-histories", "/nonexistent", "--dtype", "fp32",
            "--stratified-t", "--complementary", "--compile", "false", "--t-dist", "clipped", "--loss-weight", "ce"]
    assert main(argv) == 0
    cfg = json.loads((out / "final" / "training.json").read_text())["config"]
    assert cfg["stratified_t"] is True and cfg["complementary"] is True and cfg["compile"] is False
    assert cfg["t_dist"] == "clipped" and cfg["loss_weight"] == "ce"


def test_bad_objective_settings_are_refused(small_corpus, tmp_path, tiny_checkpoint):
    with pytest.raises(SystemExit, match="even --batch"):
        train(_cfg(small_corpus, tmp_path / "x", tiny_checkpoint, batch=5, complementary=True))
    with pytest.raises(SystemExit, match="t_dist"):
        train(_cfg(small_corpus, tmp_path / "y", tiny_checkpoint, t_dist="gaussian"))
    with pytest.raises(SystemExit, match="save-dtype"):
        train(_cfg(small_corpus, tmp_path / "z", tiny_checkpoint, save_dtype="fp16"))


# ---------------------------------------------------------------------------
# batches from worker processes


def test_worker_batches_have_the_same_form_as_in_process_batches(small_corpus, tiny_checkpoint):
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.drivers.training.batches import ExampleStream, batches

    tok = Tokenizer.from_file(f"{tiny_checkpoint}/tokenizer.json")
    cfg = _cfg(small_corpus, "/unused", tiny_checkpoint, complementary=True)
    got = {}
    for workers in (0, 2):
        stream = ExampleStream(cfg, "train", random.Random(0))
        it = batches(tok, stream, cfg, random.Random(0), workers, seed=0)
        got[workers] = [next(it) for _ in range(4)]
    for bs in got.values():
        for ids, targets, valid, tc, starts in bs:
            assert ids.shape == (4, tc + 16) and targets.shape == (4, 16) and valid.shape == ids.shape
            assert starts.shape == targets.shape and (starts == -1).all()  # no drafts: from masks
            assert ids.dtype == targets.dtype == torch.long and valid.dtype == torch.bool
            assert (ids[~valid] == tok.pad_id).all()  # left padding
            assert torch.equal(ids[:2], ids[2:]) and torch.equal(targets[:2], targets[2:])  # complementary copies
    # two workers with their own seeds make different batches, not the same one twice
    worker_targets = [t for _, t, _, _, _ in got[2]]
    assert not all(torch.equal(worker_targets[0], t) for t in worker_targets[1:])


# ---------------------------------------------------------------------------
# dtype by measurement


def test_dtype_auto_picks_the_measured_faster_and_logs_both():
    from dlm.drivers.training.precision import choose_dtype

    logs = []
    cpu = torch.device("cpu")
    slow_bf16 = {"fp32": 0.01, "bf16": 0.1}  # AVX2-only CPU: bf16 emulated
    assert choose_dtype("auto", 64, 128, 32, cpu, log=logs.append, timer=slow_bf16.__getitem__) == "fp32"
    assert "fp32 10.00 ms" in logs[-1] and "bf16 100.00 ms" in logs[-1]
    fast_bf16 = {"fp32": 0.03, "bf16": 0.01}  # AMX or a GPU
    assert choose_dtype("auto", 64, 128, 32, cpu, log=logs.append, timer=fast_bf16.__getitem__) == "bf16"
    # an explicit choice is not measured
    assert choose_dtype("bf16", 64, 128, 32, cpu, log=logs.append, timer=slow_bf16.__getitem__) == "bf16"
    with pytest.raises(ValueError, match="--dtype"):
        choose_dtype("fp16", 64, 128, 32, cpu, log=logs.append)


def test_time_linear_measures_both_dtypes_with_an_injected_clock():
    from dlm.drivers.training.precision import time_linear

    # the clock reads 0 before the 3 timed reps and 3 after them: 1 s per call, in either dtype
    for dtype in ("fp32", "bf16"):
        clock = iter([0.0, 3.0]).__next__
        assert time_linear(dtype, 16, 32, 8, torch.device("cpu"), backward=True, reps=3,
                           clock=clock) == pytest.approx(1.0)
