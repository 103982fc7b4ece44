"""The GPU runbook: CUDA tests, GPU benchmarks and a training run in two device calls.

    python -m dlm.drivers.training.gpu_runbook prepare --corpus data/corpus   # here, on the CPU
    # then, with the device tool, back to back, the `run` arguments prepare printed:
    #   call1: bash drivers/training/gpu_runbook.sh call1   carry .carry/run .carry/whl .carry/corpus [.carry/edits]
    #   call2: bash drivers/training/gpu_runbook.sh call2   carry .carry/run .carry/whl
    python -m dlm.drivers.training.gpu_runbook collect DIR1 DIR2 --into runs/gpu   # the fetched $OUTs
    python -m dlm.drivers.training.gpu_runbook --rehearse --corpus DIR   # all of it on this CPU, tiny

The device machine (a lent H200: torch and triton, 16 cores, no network) takes
commands of at most 10 minutes and 2,000 characters; a session gets 15 minutes
of it in all, the machine's start (a minute or two) and every idle second
included, and the machine goes back 30 s after a call. What travels is the
checkout plus the git-ignored paths named in `carry` (64 MiB in all), and
results come back only through $OUT (at most 8 files of at most 16 MiB, 64 MiB
together). The agenda is cut to two calls of at most 6 minutes each, issued
back to back, with the rest of the 15 minutes as margin for a slow start:

prepare (CPU, before any device call) fills `.carry/` (git-ignored):
  .carry/corpus  the corpus packed by `corpus pack` (xz parts, <= 35 MiB each)
  .carry/edits   the edit-histories data set's train split, when it fits beside
                 the corpus (the real_edit examples of the training mix)
  .carry/whl     wheels of what the server and its tests need and the machine
                 lacks (pygls, lsprotocol, cattrs, tree-sitter and its
                 grammars, pytest-lsp, pytest-asyncio; cp312 x86-64, the
                 versions installed here); torch, triton, safetensors,
                 tokenizers, msgpack, numpy, pytest and transformers are there
  .carry/run     plan.json: every setting of the two calls
It counts what each call sends (the checkout as git sees it plus its carry) and
refuses a plan over the limit, and prints the exact `run` arguments.

Nothing is pip-installed from the network there: gpu_runbook.sh installs the
carried wheels with `pip --no-index` into the work folder when they are missing
and makes the checkout importable as `dlm` by linking lsp/, coder_model/ and
kernels/ into a namespace folder on PYTHONPATH (what the package-dir mapping
of an install does), so no build step or `pip install -e .` is needed.

call1 (<= 6 min) reports torch/triton/GPU, unpacks the corpus into the work
  folder /tmp/dlm-gpu (outside the checkout), starts training as a new process
  session (`setsid`: a command's other processes are killed when it returns, a
  session leader runs on while the machine stays warm) with bf16 autocast,
  torch.compile, fused AdamW and a cosine schedule sized to the minutes left,
  and runs the CUDA tests (tests/cuda) while the first steps compile. The
  training network is the plain PyTorch one (impl="reference"); the tests
  check the Triton kernels and the CUDA serving path against it. A failure
  stops training (its process group is ended): nothing trained beside wrong
  kernels is brought back as a result. If training dies before its first
  checkpoint with torch.compile, it is started once more without. The call
  returns with the first checkpoint, the logs and the test report.
call2 (<= 6 min) carries the plan and the wheels. While training runs on, it
  measures (kernel table, model step table, `dlm-lsp bench --device cuda` with
  a workspace indexed (the repository memory on), `dlm-lsp serve` with 1/8/32
  loopback clients through the remote bench) into $OUT/*.txt (they share the
  GPU with the training run, and say so); then it stops training (SIGTERM: the
  step in flight ends and the final checkpoint is written) and brings back the
  final checkpoint (bf16 weights in shards < 16 MiB), training.json and the
  loss log.
collect (CPU, afterwards) takes the fetched $OUT folders, rebuilds the most
  advanced checkpoint, converts it to fp32 shards and prints the commands that
  evaluate it side by side with the embedded one.

Issue call2 as soon as call1 returns and give the machine back after call2:
the machine stays warm only ~30 s, and a machine given back takes the training
run with it. Every call copies the newest checkpoint it finds into its own $OUT,
so a call2 that is cut short or a machine that is lost still leaves call1's
checkpoint: `collect` takes whichever is most advanced. A call2 that finds no
training run (a fresh machine) says so and still does its measurements.

In $OUT each call leaves `callN.log` (what it printed), `callN-files.tar.xz`
(configs, tokenizer, logs, benchmark outputs) and the weight shards as plain
files, named after the call's checkpoint (`model-0000K-of-0000N.safetensors`);
at most 8 files. The model the plan trains is the `cpu-small` preset, the
embedded model's shape (6.3M parameters, 12.7 MB of bf16 weights): the shape
that meets the CPU latency target through the server. `cpu-base` (15.7M, 31 MiB
of bf16 weights, which still come back in one call) was trained on an H200 and
wrote much better code, but on a 2-vCPU CPU its step took 1.85 times as long
and most answers missed the deadline (BENCHMARKS.md "GPU: one H200 lease").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

MIB = 1 << 20
TREE_LIMIT = 64 * MIB  # the working tree that travels: checkout + carried paths
TREE_MARGIN = 1 * MIB  # files others add to the checkout between prepare and the call
OUT_FILES, OUT_FILE_BYTES, OUT_TOTAL = 8, 16 * MIB, 64 * MIB
COMMAND_CHARS = 2000
CARRY = Path(".carry")  # git-ignored; DLM_RUNBOOK_CARRY moves it (the rehearsal does, to leave a real plan alone)
SCRIPT = "drivers/training/gpu_runbook.sh"
DEFAULT_WORK = "/tmp/dlm-gpu"
# What the server and the tests import that the device image lacks (KINDS.md's package list):
# carried as wheels at the versions installed here, where they were tested.
WHEELS = ("pygls", "lsprotocol", "cattrs", "attrs", "tree-sitter", "tree-sitter-python", "tree-sitter-javascript",
          "tree-sitter-typescript", "tree-sitter-rust", "tree-sitter-go", "tree-sitter-c", "tree-sitter-cpp",
          "tree-sitter-java", "pytest-lsp", "pytest-asyncio")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                   "manylinux1_x86_64", "manylinux_2_5_x86_64")


# ----------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    """Every setting of the two calls (prepare writes it to .carry/run/plan.json)."""

    device: str = "cuda"
    work: str = DEFAULT_WORK
    # seconds each call may run: two of at most 6 minutes (the lease's budget: 15 minutes of device
    # time in all, the machine's start and the transfers included); timeout_s adds a margin on top
    call_seconds: tuple[int, int] = (300, 300)
    call_margin_s: int = 30  # timeout_s = call_seconds + this, at most 360
    copy_margin_s: int = 35  # left at the end of a call to copy the checkpoint into $OUT
    tests: list[str] = field(default_factory=lambda: ["tests/cuda", "-m", "cuda"])
    tests_timeout_s: int = 200
    # training (python -m dlm.drivers.training.train): the schedule is sized to the minutes left in
    # call1 (--steps 0: the trainer times steps train.SIZE_FROM..SIZE_TO, after compilation, and fits the
    # cosine to the rest)
    preset: str = "cpu-small"  # the embedded shape: the largest measured to meet the CPU latency target
    tokenizer: str = "coder_model/checkpoints/default/tokenizer.json"  # the embedded model's vocabulary
    context: int = 512
    block: int = 32
    batch: int = 256
    workers: int = 12  # of 16 cores: example building and tokenisation (the CUDA tests use the rest)
    dtype: str = "bf16"
    compile: bool = True
    save_every_minutes: float = 1.5
    save_dtype: str = "bf16"
    eval_every: int = 250
    valid_examples: int = 512
    extra_train_args: list[str] = field(default_factory=list)
    stop_wait_s: int = 30  # after SIGTERM: the step in flight ends and the final checkpoint is written
    setup_s: int = 20  # the trainer's start before its --minutes clock runs (tokenizer, validation set)
    # the measurements of call2, with the GPU to themselves: (file name in $OUT, command, timeout s)
    benches: list[tuple[str, list[str], int]] = field(default_factory=lambda: [
        ("bench_kernels.txt", ["-m", "dlm.drivers.bench.kernel_timing", "--reps", "100"], 60),
        # the 0.5B dream shape carries the one-request tokens/s Target; the 7B one does not fit the call
        ("bench_step.txt", ["-m", "dlm.drivers.bench.denoise_step", "--device", "cuda", "--quick", "--models",
                            "embedded,native-qwen2.5-0.5b,dream-qwen2.5-0.5b"], 75),
        ("bench_lsp.txt", ["-m", "dlm.lsp.cli", "bench", "--device", "cuda", "--keystrokes", "240",
                           "--workspace", "."], 75),
        ("bench_remote.txt", ["-m", "dlm.drivers.bench.remote_serving", "--device", "cuda", "--clients", "1,8,32",
                              "--requests", "16", "--keystrokes", "40"], 75),
    ])

    @property
    def tokens_per_step(self) -> int:
        return self.batch * (self.context + self.block)

    def train_minutes(self, started_in_call1_s: float) -> float:
        """Wall minutes the run may take so that its final checkpoint is written inside call1."""
        left = self.call_seconds[0] - started_in_call1_s - self.copy_margin_s - self.stop_wait_s - self.setup_s
        return max(0.2, left / 60)

    def train_args(self, corpus: str, out: str, minutes: float, edits: str) -> list[str]:
        return ["-m", "dlm.drivers.training.train", "--corpus", corpus, "--out", out,
                "--preset", self.preset, "--tokenizer", self.tokenizer, "--device", self.device,
                "--dtype", self.dtype, "--compile", "true" if self.compile else "false",
                "--workers", str(self.workers), "--batch", str(self.batch), "--context", str(self.context),
                "--block", str(self.block), "--steps", "0", "--minutes", f"{minutes:.2f}",
                "--save-every", str(10**9), "--save-every-minutes", str(self.save_every_minutes),
                "--save-dtype", self.save_dtype, "--eval-every", str(self.eval_every),
                "--valid-examples", str(self.valid_examples),
                # the carried edit histories (train and valid splits), or a path that is absent when they
                # were not carried: the trainer then leaves the real_edit examples out of the mix
                "--edit-histories", edits, *self.extra_train_args]

    @classmethod
    def load(cls, path: Path) -> Plan:
        raw = json.loads(path.read_text())
        raw["call_seconds"] = tuple(raw["call_seconds"])
        raw["benches"] = [tuple(b) for b in raw["benches"]]
        return cls(**raw)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")


def rehearsal_plan(work: str) -> Plan:
    """The same agenda on this CPU in seconds: a tiny model, tiny benches, CUDA tests collected and skipped."""
    return Plan(
        device="cpu", work=work, call_seconds=(110, 200), copy_margin_s=5, stop_wait_s=10, setup_s=10,
        tests=["tests/cuda", "-m", "cuda"], tests_timeout_s=120,
        preset="test-tiny", context=64, block=16, batch=4, workers=1, dtype="fp32",
        compile=False, save_every_minutes=0.05, save_dtype="bf16", eval_every=20, valid_examples=8,
        benches=[
            ("bench_kernels.txt", ["-m", "dlm.drivers.bench.kernel_timing", "--quick"], 120),
            ("bench_step.txt", ["-m", "dlm.drivers.bench.denoise_step", "--device", "cpu", "--context", "64",
                                "--slots", "8", "--reps", "1"], 60),
            ("bench_lsp.txt", ["-m", "dlm.lsp.cli", "bench", "--device", "cpu", "--keystrokes", "6",
                               "--workspace", "kernels"], 90),
            ("bench_remote.txt", ["-m", "dlm.drivers.bench.remote_serving", "--device", "cpu", "--clients", "1,2",
                                  "--requests", "2", "--keystrokes", "4"], 90),
        ],
    )


# ----------------------------------------------------------------------------- sizes and commands


def tree_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return total


def checkout_bytes(root: Path) -> int:
    """What the device tool sends of the checkout: tracked and untracked-not-ignored files, and shared/."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    names = {n for n in out.decode("utf-8", "surrogateescape").split("\0") if n}
    total = 0
    for n in names:
        p = root / n
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    shared = root / "shared"
    if shared.is_dir():
        total += tree_bytes([shared])
    return total


CALLS = ("call1", "call2")
CALL_CARRY = {"call1": ("run", "whl", "corpus", "edits"), "call2": ("run", "whl")}


def carry_dir() -> Path:
    return Path(os.environ.get("DLM_RUNBOOK_CARRY") or CARRY)


def carry_paths() -> dict[str, Path]:
    c = carry_dir()
    return {"run": c / "run", "whl": c / "whl", "corpus": c / "corpus", "edits": c / "edits"}


def run_arguments(plan: Plan) -> dict[str, dict]:
    """The device tool's `run` arguments for each call."""
    args = {}
    for i, name in enumerate(CALLS):
        cmd = f"bash {SCRIPT} {name}"
        if plan.work != DEFAULT_WORK:
            cmd = f"DLM_GPU_WORK={plan.work} {cmd}"
        carry = [str(carry_paths()[k]) for k in CALL_CARRY[name]]
        args[name] = {"command": cmd, "carry": carry, "timeout_s": min(600, plan.call_seconds[i] + plan.call_margin_s)}
    return args


def carry_report(root: Path, plan: Plan) -> tuple[list[str], bool]:
    """Lines of the per-call size table, and whether every call fits."""
    base = checkout_bytes(root)
    lines = [(f"checkout (tracked + untracked-not-ignored): {base / MIB:.1f} MiB; limit {TREE_LIMIT / MIB:.0f} MiB "
             f"per call, {TREE_MARGIN / MIB:.0f} MiB kept free")]
    ok = True
    for name, a in run_arguments(plan).items():
        carried = tree_bytes([root / c for c in a["carry"]])
        total = base + carried
        fits = total + TREE_MARGIN <= TREE_LIMIT and len(a["command"]) <= COMMAND_CHARS
        ok = ok and fits
        lines.append(f"  {name}: carry {carried / MIB:5.1f} MiB -> {total / MIB:5.1f} MiB sent, command "
                     f"{len(a['command'])} chars: {'ok' if fits else 'TOO BIG'}")
    return lines, ok


# ----------------------------------------------------------------------------- prepare


def download_wheels(dest: Path, python_version: str = "3.12") -> list[Path]:
    """pip download the WHEELS at the versions installed here, for the device's Python and platform."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = []
    for name in WHEELS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise SystemExit(f"prepare: {name} is not installed here, so its tested version is unknown; "
                             "install the dev extras (pip install -e '.[dev]') or pass --no-wheels") from None
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(dest)]
    for plat in WHEEL_PLATFORMS:
        cmd += ["--platform", plat]
    p = subprocess.run(cmd + pins, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"prepare: pip download of the wheels failed (it needs the network):\n{p.stderr[-2000:]}\n"
                         "fix the network or pass --no-wheels (then the LSP tests and benches cannot run there)")
    return sorted(dest.glob("*.whl"))


def pack_edit_histories(src: Path, dest: Path) -> list[Path]:
    """The edit histories' train and valid records (the test split stays here: it is held out), one
    gzip file per repository as in the data set, so that training reads them where they land."""
    import gzip

    from dlm.drivers.training.commit_edits import split_of_commit

    files = sorted(src.glob("*.jsonl.gz"))
    if not files:
        raise SystemExit(f"prepare: {src} holds no *.jsonl.gz edit records; pass --edit-histories with the "
                         "edit-histories data set's folder, or --no-edits")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    written = []
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fin, gzip.open(dest / f.name, "wt", encoding="utf-8",
                                                                    compresslevel=9) as fout:
            for line in fin:
                if line.strip() and split_of_commit(json.loads(line)["commit"]) != "test":
                    fout.write(line)
        written.append(dest / f.name)
    return written


def prepare(root: Path, corpus: Path, plan: Plan, wheels: bool, part_mib: float, edits: Path | None = None) -> int:
    from dlm.drivers.training import corpus as corpus_mod

    if not hasattr(corpus_mod, "pack"):
        raise SystemExit("prepare: this checkout's corpus module has no `pack`; update the checkout")
    if not (corpus / "manifest.json").is_file():
        raise SystemExit(f"prepare: {corpus} holds no built corpus (manifest.json); build it with "
                         "`python -m dlm.drivers.training.corpus build --out data/corpus` first")
    paths = {k: root / v for k, v in carry_paths().items()}
    parts = corpus_mod.pack(corpus, paths["corpus"], int(part_mib * MIB))
    print(f"corpus: {len(parts)} part(s), {tree_bytes(parts) / MIB:.1f} MiB in {paths['corpus']}")
    if edits is not None:
        written = pack_edit_histories(edits, paths["edits"])
        print(f"edit histories: {len(written)} file(s), {tree_bytes(written) / MIB:.1f} MiB (train and valid "
              f"splits) in {paths['edits']}")
    if wheels:
        got = download_wheels(paths["whl"])
        print(f"wheels: {len(got)} in {paths['whl']}, {tree_bytes(got) / MIB:.1f} MiB")
    else:
        print(f"wheels: not downloaded (--no-wheels); the device's LSP tests and benches need {', '.join(WHEELS)}")
    plan.save(paths["run"] / "plan.json")
    print(f"plan: {paths['run'] / 'plan.json'}: preset {plan.preset}, batch {plan.batch} x "
          f"{plan.context}+{plan.block} tokens, training to the end of call1 (about "
          f"{plan.train_minutes(30):.1f} min), checkpoint every {plan.save_every_minutes} min, work folder {plan.work}")
    lines, ok = carry_report(root, plan)
    print("\n".join(lines))
    if not ok:
        print("prepare: a call would send more than the device tool takes; carry a smaller corpus "
              "(or fewer wheels) and prepare again", file=sys.stderr)
        return 1
    print("\nDevice tool `run` arguments, issued back to back (the machine stays warm ~30 s after a call), "
          "then give_back:")
    for name, a in run_arguments(plan).items():
        print(f"  {name}: {json.dumps(a)}")
    print("then: python -m dlm.drivers.training.gpu_runbook collect <call1 files_at> <call2 files_at> "
          "--into runs/gpu")
    return 0


# ----------------------------------------------------------------------------- on the device


class Call:
    """One device call: its log (stdout and $OUT/<name>.log), its deadline, its $OUT."""

    def __init__(self, name: str, plan: Plan, out: Path, root: Path) -> None:
        self.name, self.plan, self.out, self.root = name, plan, out, root
        self.work = Path(plan.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + plan.call_seconds[int(name[-1]) - 1]
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work / f"{name}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        self.bundle: dict[str, Path] = {}  # name in the tarball -> file
        self.loose: dict[str, Path] = {}  # name in $OUT -> file (weights, benchmark tables)

    def say(self, msg: str) -> None:
        line = f"[{self.name} {self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def python(self, args: list[str], timeout: float, log_to: Path | None = None,
               env: dict | None = None) -> tuple[int | None, str]:
        """Run `python args` from the checkout; (return code or None on timeout, output)."""
        timeout = max(1.0, min(timeout, self.left() - self.plan.copy_margin_s))
        try:
            p = subprocess.run([sys.executable, *args], cwd=self.root, capture_output=True, text=True,
                               timeout=timeout, env=env, check=False)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc, text = None, out + err + f"\n[timed out after {timeout:.0f} s]\n"
        if log_to is not None:
            log_to.parent.mkdir(parents=True, exist_ok=True)
            log_to.write_text(text)
        return rc, text

    # -- training state --------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    def train_pid(self) -> int | None:
        f = self.work / "train.pid"
        return int(f.read_text()) if f.is_file() else None

    def training_alive(self) -> bool:
        pid = self.train_pid()
        if pid is None:
            return False
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)  # our own child (call1 started it)
            if done:
                return False
        except ChildProcessError:
            pass  # started by an earlier call: not our child
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        stat = Path(f"/proc/{pid}/stat")
        return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))

    def progress(self) -> str:
        log = self.run_dir / "loss_log.jsonl"
        if not log.is_file():
            return "no loss log yet"
        lines = log.read_text().splitlines()
        if not lines:
            return "loss log empty"
        rec = json.loads(lines[-1])
        tps = rec.get("tokens_per_s")
        return (f"step {rec.get('step')} loss {rec.get('loss')} "
                + (f"valid {rec['valid_loss']} " if "valid_loss" in rec else "")
                + (f"{tps / 1e3:.0f}k tokens/s " if tps else "") + f"t {rec.get('t')} s")

    # -- $OUT ------------------------------------------------------------------------
    def snapshot_checkpoint(self, which: str) -> Path | None:
        """Copy run/<which> into the work folder, consistently (the trainer may be saving it right now)."""
        src = self.run_dir / which
        state = "training.json" if which == "final" else "trainer_state.json"
        for _attempt in range(5):
            if not (src / state).is_file():
                return None
            before = (src / state).stat().st_mtime_ns
            dst = self.work / f"snap-{self.name}-{which}"
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            try:
                for f in src.iterdir():
                    if f.name == "optimizer.safetensors":
                        continue  # fp32 optimizer moments: needed to resume here, too big to bring back
                    if f.is_file():
                        shutil.copy2(f, dst / f.name)
                if (src / state).stat().st_mtime_ns == before and _complete(dst):
                    return dst
            except (FileNotFoundError, OSError):
                pass
            time.sleep(2)
        return None

    def add_checkpoint(self, snap: Path) -> None:
        for f in sorted(snap.iterdir()):
            if f.suffix == ".safetensors":
                self.loose[f.name] = f
            else:
                self.bundle[f"checkpoint/{f.name}"] = f

    def finish(self) -> None:
        """Write $OUT: the loose files, one tarball of the rest, this log; within the tool's limits."""
        room = OUT_FILES - 2  # the tarball and the log take two of the 8 files
        total = 0
        kept: dict[str, Path] = {}
        # weights first: they cannot go into the tarball (a file over 16 MiB does not come back)
        for name, f in sorted(self.loose.items(), key=lambda kv: (not kv[0].endswith(".safetensors"), kv[0])):
            size = f.stat().st_size
            weights = name.endswith(".safetensors")
            if not weights and (len(kept) >= room or size > 4 * MIB):
                self.bundle[name] = f  # a table without a file of its own goes into the tarball
                continue
            if size > OUT_FILE_BYTES or len(kept) >= room or total + size > OUT_TOTAL - 4 * MIB:
                self.say(f"NOT returned: {name} ({size / MIB:.1f} MiB; $OUT takes {OUT_FILES} files of at most "
                         f"{OUT_FILE_BYTES // MIB} MiB, {OUT_TOTAL // MIB} MiB in all)")
                continue
            kept[name] = f
            total += size
        for name, f in kept.items():
            shutil.copy2(f, self.out / name)
        tar_path = self.out / f"{self.name}-files.tar.xz"
        with tarfile.open(tar_path, "w:xz") as tar:
            for arc, f in sorted(self.bundle.items()):
                if f.is_file():
                    tar.add(f, arcname=arc)
        self.say(f"$OUT: {len(kept)} file(s) {total / MIB:.1f} MiB + {tar_path.name} "
                 f"({tar_path.stat().st_size / MIB:.2f} MiB: {len(self.bundle)} files) + {self.name}.log")
        self._log.close()
        shutil.copy2(self.log_path, self.out / f"{self.name}.log")


def _complete(ckpt: Path) -> bool:
    """Every weight file the checkpoint names is there and readable."""
    from safetensors import safe_open

    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        files = set(json.loads(index.read_text())["weight_map"].values())
    else:
        files = {"model.safetensors"}
    if not (ckpt / "config.json").is_file() or not (ckpt / "tokenizer.json").is_file():
        return False
    for name in files:
        try:
            with safe_open(str(ckpt / name), framework="pt") as f:
                list(f.keys())
        except Exception:  # noqa: BLE001 - a torn or missing shard: not complete
            return False
    return True


def _env_report(call: Call) -> None:
    import torch

    call.say(f"python {sys.version.split()[0]}; torch {torch.__version__}; cuda available "
             f"{torch.cuda.is_available()}" + (f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available()
                                                else ""))
    try:
        import triton

        call.say(f"triton {triton.__version__}")
    except ImportError:
        call.say("triton: not importable (the kernels-on rows and CUDA kernel tests need it)")
    missing = []
    for mod in ("pygls", "lsprotocol", "tree_sitter", "pytest_lsp", "safetensors", "tokenizers", "msgpack",
                "transformers"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    call.say("packages: all importable" if not missing else f"packages MISSING: {', '.join(missing)}")
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False)
        call.say(f"nvidia-smi: {p.stdout.strip() or p.stderr.strip()}")


def _copy_latest(call: Call, prefer_final: bool) -> str:
    for which in (("final", "last") if prefer_final else ("last",)):
        snap = call.snapshot_checkpoint(which)
        if snap is not None:
            call.add_checkpoint(snap)
            meta = snap / ("training.json" if which == "final" else "trainer_state.json")
            step = json.loads(meta.read_text()).get("step" if which == "last" else "steps")
            call.say(f"checkpoint {which} at step {step} -> $OUT")
            return which
    call.say("no checkpoint to copy yet")
    return ""


def _add_logs(call: Call) -> None:
    for f in ("loss_log.jsonl",):
        if (call.run_dir / f).is_file():
            call.bundle[f] = call.run_dir / f
    if (call.work / "train.log").is_file():
        call.bundle["train.log"] = call.work / "train.log"


def _stop(call: Call, why: str) -> None:
    """SIGTERM the training run's process group and wait for it: the step in flight ends and the trainer
    writes run/final before it exits (train._StopOnSignal)."""
    pid = call.train_pid()
    if pid is None or not call.training_alive():
        return
    call.say(f"stopping training (pid {pid}): {why}")
    try:
        # the trainer alone: its example-building workers are in the same process group, and a
        # worker killed under it would end the trainer with an error instead of its final checkpoint
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    end = time.monotonic() + call.plan.stop_wait_s
    while call.training_alive() and time.monotonic() < end:
        time.sleep(0.5)
    if call.training_alive():
        call.say(f"training did not stop within {call.plan.stop_wait_s} s: SIGKILL (its last checkpoint stands)")
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _run_tests(call: Call, env: dict) -> tuple[int | None, str]:
    plan = call.plan
    call.say(f"CUDA tests: pytest {' '.join(plan.tests)} (beside the first training steps; a failure stops training)")
    rc, text = call.python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *plan.tests],
                           plan.tests_timeout_s, call.work / "tests_cuda.txt", env=env)
    call.loose["tests_cuda.txt"] = call.work / "tests_cuda.txt"
    summary = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
    call.say(f"CUDA tests: rc {rc}: {summary[0]}")
    return rc, text


def call1(call: Call) -> int:
    plan = call.plan
    _env_report(call)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DLM_KERNELS")}
    corpus_dir = call.work / "corpus"
    if (corpus_dir / "manifest.json").is_file() and (corpus_dir / "train.jsonl.gz").is_file():
        call.say(f"corpus already unpacked in {corpus_dir}")
    else:
        rc, text = call.python(["-m", "dlm.drivers.training.corpus", "unpack", "--parts",
                                str(carry_paths()["corpus"]), "--out", str(corpus_dir)], 120, call.work / "unpack.txt")
        if rc != 0:
            call.say(f"corpus unpack failed (rc {rc}): {text[-500:]}")
            call.finish()
            return 1
        call.say(f"corpus unpacked into {corpus_dir}")
    edits = call.root / carry_paths()["edits"]
    call.say(f"edit histories: {'carried' if any(edits.glob('*.jsonl.gz')) else 'not carried (no real_edit examples)'}")
    if call.training_alive():
        call.say(f"training already running (pid {call.train_pid()}): not starting another")
    else:
        _start_training(call, corpus_dir, env, plan.compile, edits)
    rc, _text = _run_tests(call, env)
    if rc is None:
        call.say("CUDA tests ran out of their time: correctness unknown (see tests_cuda.txt); training goes on, "
                 "and its checkpoint must not be used before the tests pass")
    elif rc not in (0, 5):
        _stop(call, "the CUDA tests failed")
        call.say("CUDA tests FAILED: training stopped. Read tests_cuda.txt, fix, and start again with call1 "
                 "(do not issue call2).")
        _add_logs(call)
        call.finish()
        return 1
    # training runs to its --minutes (sized to end inside this call); it is started once more without
    # torch.compile if it dies before its first checkpoint (the compiler is what most likely fails on a
    # new image), rather than losing the lease's training run
    retried = False
    while call.training_alive() and call.left() > plan.copy_margin_s + plan.stop_wait_s:
        time.sleep(1)
    if not call.training_alive() and not (call.run_dir / "final").is_dir():
        tail = (call.work / "train.log").read_text(errors="replace")[-1500:]
        call.say(f"training exited early; the end of train.log:\n{tail}")
        if plan.compile and not retried and not (call.run_dir / "last" / "trainer_state.json").is_file():
            retried = True
            _start_training(call, corpus_dir, env, False, edits)
            while call.training_alive() and call.left() > plan.copy_margin_s + plan.stop_wait_s:
                time.sleep(1)
    _stop(call, "the call's copy margin is reached")
    call.say(f"training: {call.progress()}")
    _copy_latest(call, prefer_final=True)
    _report_final(call)
    _add_logs(call)
    call.finish()
    return 0


def _report_final(call: Call) -> None:
    info_path = call.run_dir / "final" / "training.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        call.say(f"final: {info.get('steps')} steps, {info.get('tokens_seen', 0) / 1e6:.1f}M tokens, "
                 f"{info.get('wall_minutes')} min, dtype {info.get('dtype')}, "
                 f"{(info.get('tokens_per_s') or 0) / 1e3:.0f}k tokens/s over the training steps")


def _start_training(call: Call, corpus_dir: Path, env: dict, compile_model: bool, edits: Path) -> None:
    plan = call.plan
    minutes = plan.train_minutes(call.elapsed())
    args = plan.train_args(str(corpus_dir), str(call.run_dir), minutes, str(edits))
    if not compile_model:
        args[args.index("--compile") + 1] = "false"
    (call.work / "train_command.txt").write_text(" ".join([sys.executable, *args]) + "\n")
    call.bundle["train_command.txt"] = call.work / "train_command.txt"
    with open(call.work / "train.log", "ab") as log:
        # a new session: the device tool ends a call's processes when it returns, not a session leader
        proc = subprocess.Popen([sys.executable, *args], cwd=call.root, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    (call.work / "train.pid").write_text(str(proc.pid))
    call.say(f"training started (pid {proc.pid}, setsid, compile {compile_model}): batch {plan.batch} x "
             f"{plan.tokens_per_step // plan.batch} tokens, the cosine sized to --minutes {minutes:.1f}")


def call2(call: Call) -> int:
    plan = call.plan
    if call.training_alive():
        # call1 ends its run; one still alive here (call1 cut short) would share the GPU with the timings
        _stop(call, "the measurements need the GPU to themselves")
        _copy_latest(call, prefer_final=True)
        _add_logs(call)
    elif call.train_pid() is None:
        call.say("no training run on this machine (a fresh machine: the warm one was given back); "
                 "call1's $OUT holds the checkpoint to collect")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DLM_KERNELS")}
    for fname, args, timeout in plan.benches:
        if call.left() < 20:
            call.say(f"{fname}: skipped, the call is out of time")
            continue
        path = call.work / "bench" / fname
        t = time.monotonic()
        rc, text = call.python(args, timeout, None, env=env)
        header = f"# python {' '.join(args)}\n# rc {rc}; {time.monotonic() - t:.0f} s; the GPU to itself\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + text)
        call.loose[fname] = path
        call.say(f"{fname}: rc {rc} in {time.monotonic() - t:.0f} s")
    call.finish()
    return 0


# ----------------------------------------------------------------------------- collect


def collect(out_dirs: list[Path], into: Path, shard_mib: int = 16) -> Path:
    """Rebuild the most advanced checkpoint from fetched $OUT folders, save it as fp32 shards in `into`."""
    import torch
    from dlm.coder_model.checkpoint import load_model, save_checkpoint

    best: tuple[tuple[int, int], Path, Path] | None = None
    into.mkdir(parents=True, exist_ok=True)
    for n, d in enumerate(out_dirs):
        tars = sorted(d.glob("call*-files.tar.xz"))
        if not tars:
            raise SystemExit(f"collect: {d} holds no callN-files.tar.xz; pass the folders the device tool fetched")
        stage = into / f"from-{tars[0].name.split('-')[0]}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        with tarfile.open(tars[0], "r:xz") as tar:
            tar.extractall(stage, filter="data")
        ck = stage / "checkpoint"
        for f in d.iterdir():
            if f.suffix == ".safetensors":  # weights come back as files of their own, beside the tarball
                ck.mkdir(exist_ok=True)
                shutil.copy2(f, ck / f.name)
            elif f.suffix in (".txt", ".log"):
                shutil.copy2(f, stage / f.name)
        if not (ck / "config.json").is_file():
            continue
        if (ck / "training.json").is_file():
            rank = (1, int(json.loads((ck / "training.json").read_text()).get("steps", 0)))
        else:
            rank = (0, int(json.loads((ck / "trainer_state.json").read_text()).get("step", 0)))
        if not _complete(ck):
            print(f"collect: the checkpoint from {d} is incomplete (a shard did not come back); skipped")
            continue
        if best is None or rank >= best[0]:  # a tie: the later call's copy
            best = (rank, ck, stage)
    if best is None:
        raise SystemExit("collect: no complete checkpoint in " + ", ".join(map(str, out_dirs)))
    (final_or_last, step), ck, stage = best
    model, tok = load_model(ck, device="cpu", impl="reference")  # bf16 shards are read as fp32 on the CPU
    dest = into / "final"
    save_checkpoint(model, tok, dest, shard_bytes=shard_mib * MIB - 64 * 1024, dtype=torch.float32)
    for name in ("training.json", "trainer_state.json"):
        if (ck / name).is_file():
            shutil.copy2(ck / name, dest / name)
    logs = [p for p in sorted(into.glob("from-*/loss_log.jsonl"))]
    if logs:
        shutil.copy2(max(logs, key=lambda p: p.stat().st_size), into / "loss_log.jsonl")
    kind = "final" if final_or_last else "intermediate (last)"
    print(f"collect: {kind} checkpoint at step {step} from {stage.name} -> {dest} (fp32 shards < {shard_mib} MiB)")
    print("benchmark tables and logs: " + ", ".join(str(p.relative_to(into)) for p in sorted(into.glob("from-*/*"))
                                                     if p.suffix in (".txt", ".log")))
    print("\nEvaluate it side by side with the embedded model (same commands, --model differs):")
    for cmd in (f"python -m dlm.drivers.evaluation.evaluate --model {dest} --limit 40 --safim --safim-limit 40",
                "python -m dlm.drivers.evaluation.evaluate --limit 40 --safim --safim-limit 40   # embedded",
                f"python -m dlm.drivers.bench.model_lines --model {dest} --lines 100",
                "python -m dlm.drivers.bench.model_lines --lines 100   # embedded",
                f"dlm-lsp bench --model {dest} --keystrokes 400",
                "dlm-lsp bench --keystrokes 400   # embedded"):
        print(f"  {cmd}")
    return dest


# ----------------------------------------------------------------------------- rehearsal


def check_out_dir(out: Path) -> list[str]:
    """What is wrong with a $OUT folder under the device tool's rules (empty list: nothing)."""
    import re

    problems = []
    files = [f for f in out.rglob("*") if f.is_file()]
    if len(files) > OUT_FILES:
        problems.append(f"{out}: {len(files)} files, more than {OUT_FILES}")
    total = 0
    for f in files:
        rel = f.relative_to(out)
        size = f.stat().st_size
        total += size
        if size > OUT_FILE_BYTES:
            problems.append(f"{rel}: {size / MIB:.1f} MiB, over {OUT_FILE_BYTES // MIB} MiB")
        if len(rel.parts) > 3 or not all(re.fullmatch(r"[A-Za-z0-9._-]+", p) for p in rel.parts):
            problems.append(f"{rel}: too deep or a name outside [A-Za-z0-9._-]")
    if total > OUT_TOTAL:
        problems.append(f"{out}: {total / MIB:.1f} MiB in all, over {OUT_TOTAL // MIB} MiB")
    return problems


def rehearse(root: Path, corpus: Path, base: Path | None, keep: bool = False, edits: Path | None = None) -> int:
    """prepare, call1, call2 and collect on this CPU, with the rehearsal plan; checks every $OUT."""
    base = Path(tempfile.mkdtemp(prefix="dlm-rehearsal-")) if base is None else base
    base.mkdir(parents=True, exist_ok=True)
    work = base / "work"
    before = os.environ.get("DLM_RUNBOOK_CARRY")
    os.environ["DLM_RUNBOOK_CARRY"] = str(base / "carry")  # not the checkout's .carry: a real plan stays
    try:
        return _rehearse(root, corpus, base, work, keep, edits)
    finally:
        if before is None:
            os.environ.pop("DLM_RUNBOOK_CARRY", None)
        else:
            os.environ["DLM_RUNBOOK_CARRY"] = before


def _rehearse(root: Path, corpus: Path, base: Path, work: Path, keep: bool, edits: Path | None) -> int:
    plan = rehearsal_plan(str(work))
    print(f"== rehearsal in {base}: device cpu, preset {plan.preset}, calls of {plan.call_seconds} s")
    rc = prepare(root, corpus, plan, wheels=False, part_mib=35, edits=edits)
    if rc:
        return rc
    outs = []
    for name in CALLS:
        out = base / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        env = {**os.environ, "OUT": str(out), "DLM_GPU_WORK": str(work), "DLM_PYTHON": sys.executable,
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        env.pop("TRITON_INTERPRET", None)
        print(f"== {name}: bash {SCRIPT} {name}  (OUT={out})", flush=True)
        p = subprocess.run(["bash", SCRIPT, name], cwd=root, env=env, check=False)
        problems = check_out_dir(out)
        if name == "call1" and not list(out.glob("*.safetensors")):
            problems.append(f"{name} brought back no checkpoint weights")
        if name == "call2":
            problems += [f"call2 brought back no {b}" for b, _, _ in plan.benches if not (out / b).is_file()]
        listing = ", ".join(f"{f.name} ({f.stat().st_size / 1024:.0f} KiB)" for f in sorted(out.iterdir()))
        print(f"== {name}: rc {p.returncode}; $OUT: {listing}")
        if p.returncode != 0 or problems:
            print(f"rehearsal FAILED at {name}: rc {p.returncode}; " + "; ".join(problems), file=sys.stderr)
            return 1
        outs.append(out)
    print("== collect", flush=True)
    dest = collect(outs, base / "collected")
    from dlm.coder_model.checkpoint import load_model

    model, _tok = load_model(dest, device="cpu")
    dtypes = {str(p.dtype) for p in model.parameters()}
    print(f"== rehearsal passed: {dest} loads on the CPU ({sum(p.numel() for p in model.parameters())} "
          f"parameters, {', '.join(sorted(dtypes))})")
    if not keep:
        _stop_training(work)
    return 0


def _stop_training(work: Path) -> None:
    pid_file = work / "train.pid"
    if pid_file.is_file():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlm.drivers.training.gpu_runbook",
                                 description=__doc__.split("\n\n")[0],
                                 epilog="The module docstring (python -c 'import dlm.drivers.training.gpu_runbook "
                                        "as m; print(m.__doc__)') explains the calls.")
    ap.add_argument("--rehearse", action="store_true",
                    help="run prepare, call1, call2 and collect on this CPU with a tiny model (needs --corpus)")
    ap.add_argument("--rehearsal-dir", type=Path, default=None, help="where the rehearsal works (default: a temp dir)")
    sub = ap.add_subparsers(dest="stage")
    pp = sub.add_parser("prepare", help="pack .carry/ and print the device tool's run arguments (on the CPU)")
    for p in (ap, pp):
        p.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="built corpus folder")
        p.add_argument("--edit-histories", type=Path, default=None, metavar="DIR",
                       help="the edit-histories data set: its train and valid splits travel to the device for "
                            "the real_edit examples (default: none carried)")
    pp.add_argument("--no-wheels", action="store_true", help="do not pip download the server's wheels")
    pp.add_argument("--part-mib", type=float, default=35.0, help="corpus part size")
    pp.add_argument("--preset", default=Plan.preset)
    pp.add_argument("--batch", type=int, default=Plan.batch)
    pp.add_argument("--context", type=int, default=Plan.context)
    pp.add_argument("--workers", type=int, default=Plan.workers)
    for name in CALLS:
        sub.add_parser(name, help=f"{name} on the device (via {SCRIPT}); reads .carry/run/plan.json")
    cp = sub.add_parser("collect", help="rebuild the fetched checkpoint as fp32 shards (on the CPU)")
    cp.add_argument("out_dirs", nargs="+", type=Path, help="the fetched $OUT folder of each call")
    cp.add_argument("--into", type=Path, default=Path("runs/gpu"))
    args = ap.parse_args(argv)
    root = Path.cwd()

    if args.rehearse:
        return rehearse(root, args.corpus, args.rehearsal_dir, edits=args.edit_histories)
    if args.stage == "prepare":
        plan = Plan(preset=args.preset, batch=args.batch, context=args.context, workers=args.workers)
        err = _check_preset_fits(plan.preset, plan.save_dtype)
        if err:
            print(f"prepare: {err}", file=sys.stderr)
            return 2
        return prepare(root, args.corpus, plan, wheels=not args.no_wheels, part_mib=args.part_mib,
                       edits=args.edit_histories)
    if args.stage in CALLS:
        plan_path = root / carry_paths()["run"] / "plan.json"
        if not plan_path.is_file():
            print(f"{args.stage}: {plan_path} is missing; run `prepare` on the CPU and carry {carry_paths()['run']}",
                  file=sys.stderr)
            return 2
        plan = Plan.load(plan_path)
        out = os.environ.get("OUT")
        if not out:
            print(f"{args.stage}: $OUT is not set; the device tool sets it (the rehearsal sets a temp dir)",
                  file=sys.stderr)
            return 2
        call = Call(args.stage, plan, Path(out), root)
        return {"call1": call1, "call2": call2}[args.stage](call)
    if args.stage == "collect":
        collect(args.out_dirs, args.into)
        return 0
    ap.print_help()
    return 2


def _check_preset_fits(preset: str, save_dtype: str) -> str:
    """'' when the preset's saved weights fit what one call brings back, else why not."""
    from dlm.coder_model.config import PRESETS, ModelConfig

    if preset not in PRESETS:
        return f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}"
    c = ModelConfig.preset(preset)
    hd = c.dim // c.n_heads
    per_layer = c.dim * (c.n_heads * hd) * 2 + c.dim * (c.n_kv_heads * hd) * 2 + 3 * c.dim * c.ffn_dim + 2 * c.dim
    params = c.n_layers * per_layer + c.vocab_size * c.dim * (1 if c.tie_embeddings else 2) + c.dim
    size = params * (2 if save_dtype == "bf16" else 4)
    budget = OUT_TOTAL - 6 * MIB  # tokenizer, logs, the tarball
    if size > budget:
        return (f"preset {preset} saves {size / MIB:.0f} MiB of {save_dtype} weights, more than the "
                f"{budget / MIB:.0f} MiB one device call can bring back through $OUT; pick a smaller preset")
    return ""


if __name__ == "__main__":
    sys.exit(main())
