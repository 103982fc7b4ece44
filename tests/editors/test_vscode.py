"""The VS Code extension builds (`npm ci && npm run compile`) and its unit tests pass (`npm test`).

`npm ci` needs the npm registry (or a warm npm cache). Without a network the build
test skips, naming the network error; any other failure of `npm ci`, and every
failure of `npm run compile` / `npm test`, fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[2] / "editors" / "vscode"

# What npm prints when it cannot reach the registry (DNS, refused, reset, timeouts,
# no route; ENOTCACHED: offline and not in the cache).
NETWORK_ERROR = re.compile(
    r"\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ESOCKETTIMEDOUT|ENETUNREACH|EHOSTUNREACH"
    r"|ENETDOWN|ERR_SOCKET_TIMEOUT|ENOTCACHED|UNABLE_TO_GET_ISSUER_CERT_LOCALLY|SELF_SIGNED_CERT_IN_CHAIN)\b"
    r"|getaddrinfo|request to https?://\S+ failed|network request to \S+ failed"
    r"|network (is unreachable|connectivity)|This is a problem related to network connectivity"
)

# npm's own retries: give up on an unreachable registry in about a minute, not ten.
CI_ARGS = ["ci", "--no-audit", "--no-fund", "--prefer-offline", "--fetch-retries=1",
           "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=10000", "--fetch-timeout=60000"]  # fmt: skip


def network_error(output: str) -> str | None:
    """The network error in npm's output (None when the failure is something else)."""
    m = NETWORK_ERROR.search(output)
    return m.group(0) if m else None


def build_and_test(npm: str, ext: Path) -> str:
    """npm ci, compile, test in `ext`; returns the test output. Skips when npm ci has no network."""
    try:
        r = subprocess.run([npm, *CI_ARGS], cwd=ext, check=False, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("npm ci did not finish in 600 s (no network to the npm registry?)")
    if r.returncode != 0:
        out = r.stdout + r.stderr
        why = network_error(out)
        if why:
            pytest.skip(f"npm ci cannot reach the npm registry ({why}); the extension build needs it once")
        pytest.fail(f"npm ci failed (not a network error):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    for step in (["run", "compile"], ["test"]):
        r = subprocess.run([npm, *step], cwd=ext, check=False, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"npm {' '.join(step)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_vscode_extension_builds_and_unit_tests_pass():
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: install Node.js 20+ to build the VS Code extension")
    out = build_and_test(npm, EXT)
    assert (EXT / "out" / "extension.js").exists()
    assert "# fail 0" in out


def test_network_errors_are_told_apart_from_build_errors():
    assert network_error("npm error code ENOTFOUND\nnpm error syscall getaddrinfo\n") == "ENOTFOUND"
    assert network_error("npm error code EAI_AGAIN\nnpm error request to https://registry.npmjs.org/x failed")
    assert network_error("npm error errno ECONNREFUSED")
    assert network_error("npm error network This is a problem related to network connectivity.")
    assert (
        network_error("src/logic.ts(3,1): error TS2322: Type 'string' is not assignable to type 'number'.")
        is None
    )
    assert network_error("npm error code EUSAGE\nnpm error `npm ci` can only install packages when your "
                         "package.json and package-lock.json are in sync.") is None  # fmt: skip


def fake_npm(tmp: Path, ci: tuple[int, str], compile_rc: int = 0) -> str:
    """An `npm` that answers `ci` with (rc, message) and `run compile` with compile_rc."""
    npm = tmp / "npm"
    npm.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = ci ]; then echo {ci[1]!r} >&2; exit {ci[0]}; fi\n'
        f'if [ "$1" = run ]; then echo "error TS2322: bad" ; exit {compile_rc}; fi\n'
        'echo "# fail 0"\n'
    )
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    return str(npm)


@pytest.mark.skipif(os.name == "nt", reason="the fake npm is a shell script")
def test_no_network_skips_but_build_failures_fail(tmp_path):
    offline = fake_npm(tmp_path, (1, "npm error code ENOTFOUND getaddrinfo ENOTFOUND registry.npmjs.org"))
    with pytest.raises(pytest.skip.Exception, match="cannot reach the npm registry"):
        build_and_test(offline, tmp_path)
    broken_lock = fake_npm(tmp_path, (1, "npm error code EUSAGE lock file out of sync"))
    with pytest.raises(pytest.fail.Exception, match="not a network error"):
        build_and_test(broken_lock, tmp_path)
    bad_compile = fake_npm(tmp_path, (0, "added 10 packages"), compile_rc=2)
    with pytest.raises(AssertionError, match="npm run compile failed"):
        build_and_test(bad_compile, tmp_path)
    assert "# fail 0" in build_and_test(fake_npm(tmp_path, (0, "added 10 packages")), tmp_path)
