"""Remote mode with the real (tiny, random) native model on loopback.

The reference is LocalEngine on the same checkpoint: the remote path
(protocol + batching scheduler + forward_blocks + per-client caches) must
give the same suggestion, alone and when requests share forward passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace

import pytest
from dlm.coder_model.remote.client import RemoteEngine, parse_host_port
from dlm.coder_model.remote.listening import read_listening_address
from dlm.coder_model.remote.tcp_server import ServerOptions, ServerThread
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

pytestmark = pytest.mark.timeout(240)

PARAMS = SamplerParams(steps=6, block_len=6, max_blocks=2, threshold=0.5)

SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x):\n"


def typing_prompts(n: int, path: str = "demo.py") -> list[Prompt]:
    """Consecutive keystrokes on one line (the region grows, the prefix stays)."""
    line = "        self.x = x + 1"
    return [Prompt(prefix=SOURCE, region=line[: 10 + k], cursor=10 + k, suffix="\n\nprint(1)\n",
                   language="python", path=path) for k in range(n)]


@pytest.fixture(scope="module")
def local(sharp_checkpoint):
    from dlm.coder_model.engine import load_engine

    eng = load_engine(sharp_checkpoint, "cpu")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def remote_server(sharp_checkpoint):
    from dlm.coder_model.remote.backend import load_scheduler

    # max_batch_tokens: batch on the CPU too (its default there is one request per pass), so that
    # the tests below check batched forward passes against local decoding
    scheduler, name, device = load_scheduler(sharp_checkpoint, "cpu", max_batch=8, max_batch_tokens=4096)
    srv = ServerThread(scheduler, ServerOptions(port=0, model_name=name, device=device)).start()
    yield srv
    srv.stop()


def _key(pred):
    return (pred.text, pred.steps, pred.tokens, pred.cancelled)


def test_same_suggestion_as_local(local, remote_server):
    eng = RemoteEngine("127.0.0.1", remote_server.port)
    try:
        assert eng.wait_connected(20)
        assert eng.status().state == "ready" and eng.status().device == "cpu"
        preds = []
        texts = set()
        for p in typing_prompts(4):
            want = local.predict(p, PARAMS, CancelToken())
            got = eng.predict(p, PARAMS, CancelToken())
            assert not got.cancelled and _key(got) == _key(want)
            preds.append(got)
            texts.add(got.text)
        assert len(texts) > 1 and "" not in texts  # the comparison can tell prompts apart
        # consecutive keystrokes of one document reuse the client's prefix cache on the server
        assert len(preds) == 4 and preds[0].cached_tokens == 0
        assert all(p.cached_tokens > 0 for p in preds[1:])
        assert preds[1].context_tokens > preds[1].cached_tokens
    finally:
        eng.close()


def test_batched_requests_match_local(local, remote_server):
    """Four clients at once: their steps share forward passes; each answer equals the local one."""
    prompts = [typing_prompts(1, path=f"f{i}.py")[0] for i in range(4)]
    prompts = [Prompt(p.prefix, p.region + " " * i, p.cursor, p.suffix, language="python", path=p.path)
               for i, p in enumerate(prompts)]
    want = [_key(local.predict(p, PARAMS, CancelToken())) for p in prompts]
    engines = [RemoteEngine("127.0.0.1", remote_server.port) for _ in prompts]
    got: dict[int, tuple] = {}
    barrier = threading.Barrier(len(prompts))

    def go(i):
        barrier.wait()
        got[i] = _key(engines[i].predict(prompts[i], PARAMS, CancelToken()))

    try:
        assert all(e.wait_connected(20) for e in engines)
        before = remote_server.stats.max_batch_seen
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len({w[0] for w in want}) > 1
        assert [got[i] for i in range(len(prompts))] == want
        assert max(before, remote_server.stats.max_batch_seen) > 1
    finally:
        for e in engines:
            e.close()


def test_cancel_with_real_model(remote_server):
    eng = RemoteEngine("127.0.0.1", remote_server.port)
    try:
        assert eng.wait_connected(20)
        cancel = CancelToken()
        cancel.cancel()
        assert eng.predict(typing_prompts(1)[0], PARAMS, cancel).cancelled  # never sent
        # after a cancelled request the next one on the same document is still right
        pred = eng.predict(typing_prompts(2)[1], PARAMS, CancelToken())
        assert not pred.cancelled
    finally:
        eng.close()


def test_serve_cli_end_to_end(sharp_checkpoint, local, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("cli-token-0123456789abcdef\n")
    os.chmod(token_file, 0o600)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", "127.0.0.1:0", "--model", sharp_checkpoint,
         "--device", "cpu", "--token-file", str(token_file), "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        address = read_listening_address(proc.stderr, 120)
        assert address, "dlm-lsp serve did not report its port"
        port = parse_host_port(address)[1]
        eng = RemoteEngine("127.0.0.1", port, token=token_file.read_text().strip())
        try:
            assert eng.wait_connected(20)
            p = typing_prompts(1)[0]
            assert _key(eng.predict(p, PARAMS, CancelToken())) == _key(local.predict(p, PARAMS, CancelToken()))
        finally:
            eng.close()
    finally:
        proc.terminate()
        proc.wait(20)


def test_serve_cli_refuses_public_bind_without_token():
    env = {k: v for k, v in os.environ.items() if k != "DLM_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "dlm.lsp.cli", "serve", "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 2
    assert "without a token" in out.stderr and "--token-file" in out.stderr


def test_remote_bench_runs(sharp_checkpoint, capsys):
    import argparse

    from dlm.drivers.bench.remote_serving import add_remote_arguments, run_remote_bench

    parser = argparse.ArgumentParser()
    add_remote_arguments(parser)
    args = parser.parse_args(["--model", sharp_checkpoint, "--device", "cpu", "--clients", "1,2",
                              "--requests", "2", "--keystrokes", "3", "--steps", "2", "--block-len", "4",
                              "--max-blocks", "1"])
    assert run_remote_bench(args) == 0
    out = capsys.readouterr().out
    assert "| added by the hop |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [r.split("|")[2].strip() for r in rows] == ["2", "4"]  # requests completed per client count


# ------------------------------------------------------------ budget, isolation, large prompts


@pytest.fixture(scope="module")
def narrow_checkpoint(sharp_checkpoint, tmp_path_factory):
    """The sharp tiny model declared as trained on 96-token contexts, far below LayoutBudget()'s 2048."""
    from dlm.coder_model.checkpoint import load_model, save_checkpoint

    model, tok = load_model(sharp_checkpoint, "cpu")
    model.config.context_window = 96
    d = tmp_path_factory.mktemp("narrow_ckpt")
    save_checkpoint(model, tok, d)
    return str(d)


def _long_prompt(path: str = "long.py") -> Prompt:
    return Prompt(prefix=SOURCE * 6, region="        self.x = x", cursor=10, suffix="\n\nprint(1)\n" * 20,
                  history=("--- a/long.py\n+++ b/long.py\n@@ -1 +1 @@\n-x\n+y\n",) * 8, language="python",
                  path=path)


def test_server_encodes_with_and_announces_the_checkpoints_budget(narrow_checkpoint):
    """Through --remote the model once got 2,048-token contexts it never saw in training."""
    from dlm.coder_model.engine import load_engine
    from dlm.coder_model.layout import LayoutBudget
    from dlm.coder_model.remote.backend import load_scheduler
    from test_server import Raw

    local = load_engine(narrow_checkpoint, "cpu")
    scheduler, name, device = load_scheduler(narrow_checkpoint, "cpu")
    srv = ServerThread(scheduler, ServerOptions(port=0, model_name=name, device=device)).start()
    eng = RemoteEngine("127.0.0.1", srv.port)
    try:
        budget = LayoutBudget.for_window(96)
        assert Raw(srv.port).hello()["budget"] == {"max_context": 96, "max_history": budget.max_history,
                                                    "max_suffix": budget.max_suffix}
        assert eng.wait_connected(20)
        p = _long_prompt()
        want = local.predict(p, PARAMS, CancelToken())
        got = eng.predict(p, PARAMS, CancelToken())
        assert want.context_tokens <= 96 + 16  # the comparison is about a prompt the window cuts
        assert not got.cancelled and _key(got) == _key(want) and got.context_tokens == want.context_tokens
    finally:
        eng.close()
        srv.stop()
        local.close()


def test_a_client_cannot_probe_another_clients_cache(remote_server):
    """A second token holder presenting the victim's client id and file path once got the
    victim's cached_tokens back (45 for the exact secret prefix, 20 for a wrong guess)."""
    secret = Prompt(prefix="API_KEY = 'hunter2-0123456789'\n" + SOURCE, region="        self.x", cursor=10,
                    suffix="\n", language="python", path="secret.py")
    guesses = (secret, Prompt("API_KEY = 'x'\n", secret.region, secret.cursor, "\n", path="secret.py"))
    victim = RemoteEngine("127.0.0.1", remote_server.port, client_id="victim")
    probers = [RemoteEngine("127.0.0.1", remote_server.port, client_id="victim") for _ in guesses]
    try:
        assert victim.wait_connected(20) and all(p.wait_connected(20) for p in probers)
        assert not victim.predict(secret, PARAMS, CancelToken()).cancelled
        again = victim.predict(secret, PARAMS, CancelToken())
        assert again.cached_tokens > 0  # the victim reuses its own cache ...
        for prober, guess in zip(probers, guesses):
            probe = prober.predict(guess, PARAMS, CancelToken())
            assert not probe.cancelled and probe.cached_tokens == 0  # ... nobody else sees it
    finally:
        for e in (victim, *probers):
            e.close()


def test_large_prompts_are_cut_before_tokenizing(sharp_checkpoint):
    """A 3.9 MB prompt is cut by characters to a few times the window before the tokenizer sees it;
    an ordinary prompt is encoded exactly as LocalEngine encodes it."""
    from dlm.coder_model.budget import MAX_CHARS_PER_TOKEN
    from dlm.coder_model.checkpoint import load_model
    from dlm.coder_model.layout import encode_prompt
    from dlm.coder_model.remote.backend import ModelBackend

    model, tok = load_model(sharp_checkpoint, "cpu")
    backend = ModelBackend(model, tok)
    ordinary = typing_prompts(1)[0]
    assert backend.prepare(ordinary, PARAMS) == encode_prompt(tok, ordinary, backend.budget)

    seen: list[int] = []
    original_encode = tok.encode

    def counting_encode(text, *args, **kwargs):
        seen.append(len(text))
        return original_encode(text, *args, **kwargs)

    tok.encode = counting_encode
    huge = Prompt(prefix="x = 1\n" * 650_000, region="y = 2", cursor=0, suffix="z = 3\n" * 10_000,
                  history=("-a\n+b\n" * 100_000,), path="huge.py")
    ids = backend.prepare(huge, PARAMS)
    keep = backend.budget.max_context * MAX_CHARS_PER_TOKEN
    assert seen and max(seen) <= keep and sum(seen) <= 2 * keep + 100
    assert len(ids) <= backend.budget.max_context + 64
    tok.encode = original_encode
    with pytest.raises(ValueError, match="region"):
        backend.prepare(Prompt("", "r" * (keep + 1), 0, ""), PARAMS)
    with pytest.raises(ValueError, match="max_seq_len"):
        backend.prepare(ordinary, SamplerParams(block_len=1024, max_blocks=64))


def test_bad_params_of_one_client_do_not_fail_anothers_batch(remote_server):
    """NaN temperature or oversized blocks from client B once failed all of client A's requests."""
    from dlm.coder_model.remote.wire import predict_message
    from test_server import Raw

    prompts = [typing_prompts(4, path=f"a{i}.py")[3] for i in range(4)]
    a = [RemoteEngine("127.0.0.1", remote_server.port) for _ in prompts]
    b = Raw(remote_server.port)
    got: dict[int, object] = {}

    def go(i):
        got[i] = a[i].predict(prompts[i], PARAMS, CancelToken())

    try:
        assert all(e.wait_connected(20) for e in a)
        b.hello()
        nan = predict_message(1, prompts[0], PARAMS)
        nan["params"]["temperature"] = float("nan")
        # past the model's max_seq_len (4096), within the caps and the server's time bound
        too_long = predict_message(2, prompts[0], SamplerParams(block_len=512, max_blocks=8, steps=1))
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        b.send(nan)
        b.send(too_long)
        for t in threads:
            t.join(120)
        answers = {f["id"]: f for f in (b.recv_frame(), b.recv_frame())}
        assert answers[1]["code"] == "bad_request" and "temperature" in answers[1]["message"]
        # refused by length, or (on a loaded machine, where the server's measured step time is longer)
        # by the time bound first: either way one client's bad request, not a failed batch
        assert answers[2]["code"] == "bad_request" and any(
            w in answers[2]["message"] for w in ("max_seq_len", "deadline of a default request"))
        assert len(got) == len(prompts)
        assert all(not p.cancelled and p.text for p in got.values())
    finally:
        b.close()
        for e in a:
            e.close()


def test_memory_proposals_travel_and_the_server_checks_them_as_local_does(local, remote_server):
    """The repository memory's proposals go in the prompt to a server that announces the feature,
    and its denoiser checks them exactly as LocalEngine does: the same pick, the same confidence."""
    from dlm.coder_model.types import MemoryProposal

    proposals = (MemoryProposal("x + 1", 0.6), MemoryProposal("y", 0.3), MemoryProposal("x * 2", 0.1))
    p = replace(typing_prompts(1)[0], proposals=proposals)
    eng = RemoteEngine("127.0.0.1", remote_server.port)
    try:
        assert eng.wait_connected(20)
        # a block the proposals fit in, and every proposal checked (the check asked for, and no fast
        # path: memory_first above 1)
        params = replace(PARAMS, block_len=32, max_blocks=1, memory_first=2.0, verify_passes=2)
        want = local.predict(p, params, CancelToken())
        got = eng.predict(p, params, CancelToken())
        assert not got.cancelled and got.text == want.text and got.steps == want.steps == 2
        assert got.confidence == pytest.approx(want.confidence)
        assert got.text in {p.region[: p.cursor] + x.text + p.region[p.cursor :] for x in proposals}
        # every proposal's own confidence comes back too (the editor's alternatives)
        assert [t for t, _ in got.proposal_confidences] == [t for t, _ in want.proposal_confidences]
        assert [c for _, c in got.proposal_confidences] == pytest.approx([c for _, c in want.proposal_confidences])
        assert len(want.proposal_confidences) >= 2
    finally:
        eng.close()


def test_proposals_on_the_wire_are_bounded():
    from dlm.coder_model.remote.wire import ProtocolError, prompt_from_wire

    base = {"prefix": "", "region": "x", "cursor": 0, "suffix": ""}
    assert prompt_from_wire({**base, "proposals": [["a", 0.5]]}, 1).proposals[0].text == "a"
    for bad in ([["a", 2.0]], [["a", float("nan")]], [["a"]], [[1, 0.5]], [["a", True]], [["a", 0.1]] * 17,
                [["x" * 2000, 0.5]], "a"):
        with pytest.raises(ProtocolError, match="proposals"):
            prompt_from_wire({**base, "proposals": bad}, 1)
