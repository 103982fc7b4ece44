"""Run untrusted Python (a model's completed program) in a limited subprocess."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    killed: bool = False  # the sandbox killed the process group at the wall-clock timeout

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0


# Sets the limits, then becomes the program's interpreter (exec). A launcher
# process instead of Popen(preexec_fn=...): preexec_fn is unsafe while other
# threads run (the engine's inference thread, torch's pools) and can deadlock.
_LAUNCH = (
    "import os,resource as R,sys;m,c,f=map(int,sys.argv[1:4]);"
    "R.setrlimit(R.RLIMIT_AS,(m,m));R.setrlimit(R.RLIMIT_CPU,(c,c+1));"
    "R.setrlimit(R.RLIMIT_FSIZE,(f,f));R.setrlimit(R.RLIMIT_CORE,(0,0));"
    "os.execv(sys.argv[4],[sys.argv[4],'-I',sys.argv[5]])"
)


def run_sandboxed(
    code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 1024, file_mb: int = 16,
    python: str = sys.executable, max_output: int = 1 << 20,
) -> SandboxResult:
    """Run untrusted Python `code` in a subprocess: fresh temp dir as cwd, isolated
    interpreter (-I), a minimal environment, address-space / CPU-time / file-size
    limits, its own process group (killed as a whole at `timeout_s` of wall time).
    stdout/stderr go to files in the temp dir, so a program that prints forever
    hits the file-size limit instead of filling this process's memory."""
    with tempfile.TemporaryDirectory(prefix="dlm-sandbox-") as d:
        prog = Path(d) / "main.py"
        prog.write_text(code, encoding="utf-8")
        out_p, err_p = Path(d) / "stdout", Path(d) / "stderr"
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8"}
        t0 = time.perf_counter()
        with open(out_p, "wb") as out_f, open(err_p, "wb") as err_f:
            limits = [str(memory_mb << 20), str(max(1, math.ceil(timeout_s))), str(file_mb << 20)]
            proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _LAUNCH, *limits, python, str(prog)], cwd=d, stdin=subprocess.PIPE,
                stdout=out_f, stderr=err_f, env=env, start_new_session=True,
            )
            timed_out = killed = False
            try:
                proc.communicate(stdin.encode("utf-8"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with _suppress_lookup():
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                proc.wait()
            except BrokenPipeError:  # exited before reading its input
                proc.wait()
        wall = time.perf_counter() - t0
        rc = proc.returncode
        if rc is not None and rc < 0 and -rc in (signal.SIGXCPU, signal.SIGKILL) and not timed_out:
            timed_out = -rc == signal.SIGXCPU  # CPU limit reached: a timeout too
        read = lambda p: p.read_bytes()[:max_output].decode("utf-8", errors="replace")
        return SandboxResult(rc, read(out_p), read(err_p), timed_out, wall, killed)


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        return typ is not None and issubclass(typ, ProcessLookupError)
