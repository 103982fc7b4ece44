"""The GPU runbook (drivers/training/gpu_runbook.py): its plan and carry accounting against the
device tool's limits, the $OUT packing and collect, and (slow) the whole rehearsal on the CPU."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from dlm.drivers.training import gpu_runbook as rb

ROOT = Path(__file__).resolve().parents[3]


def test_training_ends_inside_call1_with_its_checkpoint_written_before_the_copy():
    plan = rb.Plan()
    started = 40.0  # training starts after the environment report and the corpus unpack
    ends = started + plan.setup_s + plan.train_minutes(started) * 60  # its clock starts after its setup
    # --minutes ends the run; after it the final checkpoint is written (within stop_wait_s) and copied
    assert ends + plan.stop_wait_s + plan.copy_margin_s <= plan.call_seconds[0]
    assert ends - started - plan.setup_s >= 2.5 * 60  # minutes of training, not seconds: the throughput is measured over them
    args = plan.train_args("/w/corpus", "/w/run", plan.train_minutes(started), "/w/edits")
    for flag, value in (("--device", "cuda"), ("--dtype", "bf16"), ("--compile", "true"), ("--save-dtype", "bf16"),
                        ("--steps", "0"), ("--edit-histories", "/w/edits")):
        assert args[args.index(flag) + 1] == value
    assert plan.workers + 2 <= 16  # the CUDA tests run beside the example workers on the machine's 16 cores


def test_run_arguments_fit_the_device_tool_and_a_15_minute_lease():
    plan = rb.Plan()
    args = rb.run_arguments(plan)
    assert list(args) == ["call1", "call2"]
    for a in args.values():
        assert len(a["command"]) <= rb.COMMAND_CHARS and len(a["carry"]) <= 8
        assert a["timeout_s"] <= 6 * 60  # two commands of at most 6 minutes each
        assert a["command"].startswith("bash drivers/training/gpu_runbook.sh call")
    assert args["call1"]["carry"] == [".carry/run", ".carry/whl", ".carry/corpus", ".carry/edits"]
    assert args["call2"]["carry"] == [".carry/run", ".carry/whl"]
    # both timeouts, a machine start of two minutes, the transfers and the 30 s idle inside 15 minutes
    assert sum(a["timeout_s"] for a in args.values()) + 120 + 60 + 30 <= 15 * 60
    # the measurements fit call2 with the GPU to themselves
    assert sum(t for _, _, t in plan.benches) <= plan.call_seconds[1]
    assert (ROOT / rb.SCRIPT).is_file()


def _git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("/.carry/\n/ignored.bin\n")
    (repo / "tracked.bin").write_bytes(b"t" * (3 << 20))
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    (repo / "untracked.txt").write_bytes(b"u" * (1 << 20))  # not ignored: the tool sends it too
    (repo / "ignored.bin").write_bytes(b"i" * (5 << 20))  # ignored and not carried: stays here
    return repo


def test_carry_accounting_counts_checkout_and_each_calls_carry(tmp_path, monkeypatch):
    monkeypatch.delenv("DLM_RUNBOOK_CARRY", raising=False)
    repo = _git_repo(tmp_path)
    base = 3 * rb.MIB + 1 * rb.MIB + len("/.carry/\n/ignored.bin\n")
    assert rb.checkout_bytes(repo) == base
    (repo / ".carry" / "corpus").mkdir(parents=True)
    (repo / ".carry" / "whl").mkdir()
    (repo / ".carry" / "run").mkdir()
    (repo / ".carry" / "run" / "plan.json").write_text("{}")
    (repo / ".carry" / "whl" / "a.whl").write_bytes(b"w" * (2 << 20))
    with open(repo / ".carry" / "corpus" / "corpus-00000.jsonl.xz", "wb") as f:
        f.truncate(30 << 20)  # sparse: counted by size, as the tool counts it
    lines, ok = rb.carry_report(repo, rb.Plan())
    assert ok, lines
    assert "call1: carry  32.0 MiB ->  36.0 MiB sent" in lines[1]
    assert "call2: carry   2.0 MiB ->   6.0 MiB sent" in lines[2]
    assert len(lines) == 3
    with open(repo / ".carry" / "corpus" / "corpus-00001.jsonl.xz", "wb") as f:
        f.truncate(28 << 20)  # 4 + 2 + 58 MiB = 64 MiB: no room left for the 1 MiB kept free
    lines, ok = rb.carry_report(repo, rb.Plan())
    assert not ok and "call1" in lines[1] and lines[1].endswith("TOO BIG") and lines[2].endswith("ok")


def test_prepare_refuses_a_preset_whose_weights_cannot_come_back():
    assert rb._check_preset_fits("cpu-base", "bf16") == ""
    why = rb._check_preset_fits("gpu-40m", "bf16")
    assert "gpu-40m" in why and "smaller preset" in why
    assert "unknown preset" in rb._check_preset_fits("gpu-9000b", "bf16")
    r = subprocess.run([sys.executable, "-m", "dlm.drivers.training.gpu_runbook", "prepare", "--preset",
                        "gpu-150m", "--no-wheels", "--corpus", "/nonexistent"], capture_output=True, text=True,
                       cwd=ROOT, check=False, timeout=120)
    assert r.returncode == 2 and "gpu-150m" in r.stderr and not (ROOT / ".carry" / "run" / "plan.json").exists()


def test_out_dir_rules():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        for i in range(8):
            (out / f"f{i}.txt").write_text("x")
        assert rb.check_out_dir(out) == []
        (out / "f8.txt").write_text("x")
        (out / "bad name.txt").write_text("x")
        with open(out / "big.safetensors", "wb") as f:
            f.truncate(17 << 20)
        problems = " | ".join(rb.check_out_dir(out))
        assert "11 files" in problems and "big.safetensors: 17.0 MiB" in problems and "bad name.txt" in problems


def _fake_call(tmp_path: Path, name: str) -> rb.Call:
    plan = rb.Plan(work=str(tmp_path / "work"), copy_margin_s=1)
    return rb.Call(name, plan, tmp_path / f"out-{name}", ROOT)


def test_a_calls_checkpoint_comes_back_through_out_and_collect_makes_fp32_shards(tmp_path, tiny_checkpoint):
    """An intermediate (last) checkpoint saved in bf16 by the trainer, copied into $OUT by call1 and by call2
    (call2 takes one when it finds call1's run still alive, beside its four tables), then rebuilt by collect
    as fp32: the most advanced copy wins."""
    import torch
    from dlm.coder_model.checkpoint import load_model, save_checkpoint

    model, tok = load_model(tiny_checkpoint, device="cpu")
    outs = []
    for name, step in (("call1", 5), ("call2", 9)):
        call = _fake_call(tmp_path, name)
        last = call.run_dir / "last"
        save_checkpoint(model, tok, last, shard_bytes=64 << 10, dtype=torch.bfloat16)  # several shards
        (last / "optimizer.safetensors").write_bytes(b"not brought back")
        (last / "trainer_state.json").write_text(json.dumps({"step": step}))
        (call.run_dir / "loss_log.jsonl").write_text(json.dumps({"step": step, "loss": 1.0}) + "\n")
        if name == "call2":
            for t in ("bench_kernels", "bench_step", "bench_lsp", "bench_remote"):
                (call.work / f"{t}.txt").write_text(t)
                call.loose[f"{t}.txt"] = call.work / f"{t}.txt"
        assert rb._copy_latest(call, prefer_final=True) == "last"
        rb._add_logs(call)
        call.finish()
        assert rb.check_out_dir(call.out) == []
        shards = sorted(p.name for p in call.out.glob("*.safetensors"))
        assert len(shards) >= 2 and "optimizer.safetensors" not in shards
        with tarfile.open(call.out / f"{name}-files.tar.xz") as tar:
            names = set(tar.getnames())
        assert {"checkpoint/config.json", "checkpoint/tokenizer.json", "checkpoint/trainer_state.json",
                "loss_log.jsonl"} <= names
        assert (call.out / f"{name}.log").is_file()
        outs.append(call.out)
    assert len(list(outs[1].iterdir())) == 8  # shards + tables up to the limit; the rest is in the tarball
    dest = rb.collect(outs, tmp_path / "collected")
    assert json.loads((dest / "trainer_state.json").read_text())["step"] == 9
    back, _ = load_model(dest, device="cpu")
    assert {p.dtype for p in back.parameters()} == {torch.float32}
    for (n, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), n  # bf16 storage, read back as fp32 exactly


def test_collect_explains_a_folder_that_is_not_an_out(tmp_path):
    with pytest.raises(SystemExit, match="no callN-files.tar.xz"):
        rb.collect([tmp_path], tmp_path / "c")


def test_calls_refuse_to_run_without_a_plan_or_out(tmp_path):
    env = {**os.environ, "DLM_RUNBOOK_CARRY": str(tmp_path / "nothing"), "OUT": str(tmp_path / "o")}
    r = subprocess.run([sys.executable, "-m", "dlm.drivers.training.gpu_runbook", "call2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 2 and "plan.json is missing" in r.stderr and "prepare" in r.stderr


def make_tiny_corpus(d: Path) -> Path:
    """{train,valid,test}.jsonl.gz + manifest.json of this repository's own Python files (a built corpus's layout)."""
    files = [p for p in sorted((ROOT / "coder_model").rglob("*.py")) if 300 < p.stat().st_size < 40_000][:40]
    rows = [{"path": str(p.relative_to(ROOT)), "language": "python", "text": p.read_text(), "source": "test",
             "license": "Apache-2.0"} for p in files]
    splits = {"train": rows[:-6], "valid": rows[-6:-3], "test": rows[-3:]}
    d.mkdir(parents=True)
    for split, rs in splits.items():
        with gzip.open(d / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rs)
    (d / "manifest.json").write_text(json.dumps({"splits": {s: {"files": len(r)} for s, r in splits.items()}}))
    return d


@pytest.mark.slow
def test_rehearsal_end_to_end_on_cpu(tmp_path):
    """prepare, call1 and call2 through the shell script with OUT in temp dirs (device cpu, test-tiny, seconds;
    the CUDA tests collected and skipped), every $OUT within the tool's limits, then collect: ~3 min on 2 cores."""
    corpus = make_tiny_corpus(tmp_path / "corpus")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "dlm.drivers.training.gpu_runbook", "--rehearse", "--corpus",
                        str(corpus), "--rehearsal-dir", str(tmp_path / "rh")], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=False, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "CUDA tests: rc 0" in r.stdout and "skipped" in r.stdout
    assert "training started" in r.stdout and "checkpoint final" in r.stdout
    for t in ("bench_kernels.txt: rc 0", "bench_step.txt: rc 0", "bench_lsp.txt: rc 0", "bench_remote.txt: rc 0"):
        assert t in r.stdout
    assert "== rehearsal passed" in r.stdout
    assert not (ROOT / ".carry" / "run" / "plan.json").exists() or os.environ.get("DLM_RUNBOOK_CARRY")
    shutil.rmtree(tmp_path / "rh", ignore_errors=True)


def test_stopping_training_signals_the_trainer_alone_so_its_workers_outlive_the_final_save(tmp_path):
    """SIGTERM goes to the trainer, not its process group: its data workers (same group) must still be
    alive while it finishes the step in flight and writes its final checkpoint."""
    import signal as sig
    import time

    script = tmp_path / "trainer.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "def stop(*_):\n"
        "    time.sleep(0.3)  # as a final save takes a while: a worker signalled with it is gone by now\n"
        "    alive = worker.poll() is None\n"
        f"    open({str(tmp_path / 'seen')!r}, 'w').write('worker alive' if alive else 'worker dead')\n"
        "    worker.kill()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').write('1')\n"
        "time.sleep(60)\n")
    call = _fake_call(tmp_path, "call1")
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    (call.work / "train.pid").write_text(str(proc.pid))
    try:
        for _ in range(200):
            if (tmp_path / "ready").exists():
                break
            time.sleep(0.05)
        time.sleep(0.3)  # the worker is started
        rb._stop(call, "test")
        proc.wait(timeout=30)
        assert (tmp_path / "seen").read_text() == "worker alive"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, sig.SIGKILL)
        call.finish()
