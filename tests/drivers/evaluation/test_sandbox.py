"""The sandbox that runs model-completed programs: timeouts, limits, isolation."""

from __future__ import annotations

from dlm.drivers.evaluation import safim as sf
from dlm.drivers.evaluation import sandbox as sb


def test_sandbox_kills_an_infinite_loop_and_counts_it_as_a_fail():
    r = sb.run_sandboxed("while True:\n    pass\n", timeout_s=1.0)
    assert r.timed_out and not r.ok
    # a program that sleeps uses no CPU time: only the wall-clock timeout can stop it, and
    # the sandbox reports that it killed the process group (rather than waiting for it)
    r = sb.run_sandboxed("import time\nwhile True:\n    time.sleep(0.05)\n", timeout_s=1.0)
    assert r.timed_out and r.killed and not r.ok and r.returncode == -9
    r = sb.run_sandboxed("print('quick')\n", timeout_s=5.0)
    assert r.ok and not r.killed and not r.timed_out
    tests = ((("", ("done",)),))
    assert not sf.passes_tests("while True:\n    pass\nprint('done')\n", tests, timeout_s=1.0)
    assert sf.passes_tests("print('done')\n", tests, timeout_s=5.0)


def test_sandbox_limits_memory_and_isolates_cwd(tmp_path):
    r = sb.run_sandboxed("x = bytearray(4 << 30)\nprint('allocated')\n", memory_mb=256)
    assert not r.ok and "allocated" not in r.stdout and "MemoryError" in r.stderr
    r = sb.run_sandboxed("import os\nprint(os.listdir('.'))\nopen('junk.txt', 'w').write('x')\n")
    assert r.ok and "'main.py'" in r.stdout  # a fresh temp dir, removed afterwards
    r = sb.run_sandboxed("import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)\n", "abc")
    assert r.stdout == "ABC" and r.returncode == 3 and not r.ok


