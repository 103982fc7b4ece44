"""The copy (pointer-generator) head: a distribution, exact under the prefix cache, learnable,
optional in checkpoints, and used by the sampler and the verifier."""

from __future__ import annotations

import json
import types

import pytest
import torch
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.checkpoint import CheckpointError, load_model, save_checkpoint
from dlm.coder_model.config import ModelConfig
from dlm.coder_model.layout import encode_prompt
from dlm.coder_model.model import DLM
from dlm.coder_model.sampler import generate
from dlm.coder_model.types import MemoryProposal, Prompt, SamplerParams
from dlm.coder_model.verify import score_proposals
from dlm.drivers.training.objective import diffusion_loss
from dlm.drivers.training.train import add_copy_head


def _model(seed=0, copy_head=True, **kw):
    torch.manual_seed(seed)
    m = DLM(ModelConfig.preset("test-tiny", copy_head=copy_head, **kw), impl="reference")
    m.init_weights(seed)
    return m.eval()


def test_without_the_flag_there_is_no_head_and_no_head_weights():
    m = _model(copy_head=False)
    assert m.copy_head is None
    assert not [k for k in m.state_dict() if k.startswith("copy_head.")]
    cache = PrefixCache()
    m.prefill(list(range(5, 25)), cache)
    assert cache.copy_k is None


def test_the_mixture_is_a_distribution_and_padding_is_never_copied():
    m = _model()
    head = m.copy_head
    B, n, L, V = 3, 12, 5, m.config.vocab_size
    ids = torch.randint(10, V, (B, n))
    ids[:, :4] = 7  # left padding: token 7 appears only there
    valid = torch.ones(B, n, dtype=torch.bool)
    valid[:, :4] = False
    h_ctx, h_blk = torch.randn(B, n, 64), torch.randn(B, L, 64)
    keys = head.keys(h_ctx)
    assert keys.shape == (B, n, 2, m.config.copy_dim)
    logits = m.logits(h_blk)
    p = head.mixture(logits, h_blk, keys, ids, valid)
    assert p.shape == (B, L, V) and (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(B, L))
    g = torch.sigmoid(head.gate(h_blk).float())
    # the padding's token gets only the LM's share: no copy mass from the padded positions
    torch.testing.assert_close(p[..., 7], ((1 - g) * torch.softmax(logits, -1))[..., 7])
    # every copied token gets more than the LM's share
    lm_share = (1 - g) * torch.softmax(logits, -1)
    assert (p.gather(-1, ids[:, None, 4:].expand(B, L, -1)) > lm_share.gather(-1, ids[:, None, 4:].expand(B, L, -1))).all()
    # a row with no valid context falls back to the LM alone
    none = torch.zeros(B, n, dtype=torch.bool)
    torch.testing.assert_close(head.mixture(logits, h_blk, keys, ids, none), torch.softmax(logits, -1))


def test_incremental_prefill_keeps_the_same_copy_keys_as_a_full_one():
    m = _model()
    ctx = torch.randint(5, 512, (40,)).tolist()
    full = PrefixCache()
    m.prefill(ctx, full)
    inc = PrefixCache()
    m.prefill(ctx[:17], inc)
    m.prefill(ctx[:30] + [3, 4, 5], inc)  # reuses 17, writes a suffix that is then cut
    reused = m.prefill(ctx, inc)  # keeps the common prefix (30), truncates the rest, extends
    assert reused == 30 and inc.tokens == ctx and inc.copy_k.shape == full.copy_k.shape == (1, 40, 2, 64)
    torch.testing.assert_close(inc.copy_k, full.copy_k)
    # and the block's log-probabilities read from the cache equal an uncached pass over everything
    block = torch.randint(5, 512, (1, 8))
    block[0, 2] = 2
    with torch.no_grad():
        h = m(block, start_pos=40, context_len=40, cache=inc)[0]
        cached = m.log_probs(h, inc)
        whole = m(torch.cat([torch.tensor([ctx]), block], 1), context_len=40)
        logits = m.logits(whole[:, 40:]).float()
        p = m.copy_head.mixture(logits, whole[:, 40:], m.copy_head.keys(whole[:, :40]), torch.tensor([ctx]))
    torch.testing.assert_close(cached, p[0].log(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cached.exp().sum(-1), torch.ones(8))


def _copy_task(gen, batch, n=20, block=8, vocab=512):
    """Context: filler tokens from [10, 250) with ONE token from [250, vocab) at a random place;
    left padding of random length. The block repeats that token: only copying finds it (the LM
    head alone has 1 in 262 to guess it)."""
    tc = n
    ids = torch.randint(10, 250, (batch, tc + block), generator=gen)
    valid = torch.ones(batch, tc + block, dtype=torch.bool)
    rare = torch.randint(250, vocab, (batch,), generator=gen)
    for b in range(batch):
        pad = int(torch.randint(0, 6, (1,), generator=gen))
        valid[b, :pad] = False
        ids[b, :pad] = 0
        at = int(torch.randint(pad, tc - 1, (1,), generator=gen))
        ids[b, at] = rare[b]
    targets = rare[:, None].expand(batch, block).clone()
    ids[:, tc:] = targets
    return ids, targets, valid, tc


def _train_on_copy_task(model, steps=40, lr=1e-2):
    tok = types.SimpleNamespace(mask_id=1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        ids, targets, valid, tc = _copy_task(gen, 16)
        loss, _acc = diffusion_loss(model, ids, targets, valid, tc, tok, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    egen = torch.Generator().manual_seed(123)
    ids, targets, valid, tc = _copy_task(egen, 64)
    with torch.no_grad():
        _loss, acc = diffusion_loss(model, ids, targets, valid, tc, tok, egen)
    return float(acc)


def test_a_tiny_model_with_the_head_learns_to_copy_and_one_without_does_not():
    torch.manual_seed(0)
    with_head = _train_on_copy_task(_model(copy_head=True).train())
    without = _train_on_copy_task(_model(copy_head=False).train())
    assert with_head > 0.8, with_head  # chance: 1/262 guessing, 1/20 picking a context token at random
    assert without < 0.2, without


def test_an_old_config_without_the_field_loads(tmp_path, make_checkpoint):
    make_checkpoint(tmp_path)
    cfg_path = tmp_path / "config.json"
    raw = json.loads(cfg_path.read_text())
    for k in ("copy_head", "copy_dim"):
        raw.pop(k, None)
    cfg_path.write_text(json.dumps(raw))
    model, _tok = load_model(tmp_path)
    assert model.copy_head is None


def test_the_loader_refuses_weights_and_config_that_disagree_on_the_head(tmp_path, make_checkpoint):
    plain, headed = tmp_path / "plain", tmp_path / "headed"
    make_checkpoint(plain)
    make_checkpoint(headed, copy_head=True)
    model, _ = load_model(headed)
    assert model.copy_head is not None
    for d, says in ((plain, True), (headed, False)):
        raw = json.loads((d / "config.json").read_text())
        raw["copy_head"] = says
        (d / "config.json").write_text(json.dumps(raw))
        with pytest.raises(CheckpointError, match="copy head"):
            load_model(d)


def test_a_head_added_to_a_trained_model_keeps_its_weights_and_saves_and_loads(tmp_path, make_checkpoint):
    make_checkpoint(tmp_path / "old")
    old, tok = load_model(tmp_path / "old")
    new = add_copy_head(old)
    assert new.copy_head is not None and new.copy_head.gate.bias.item() == pytest.approx(-2.0)
    for k, v in old.state_dict().items():
        assert torch.equal(new.state_dict()[k], v)
    save_checkpoint(new, tok, tmp_path / "new")
    again, _ = load_model(tmp_path / "new")
    assert again.copy_head is not None
    torch.testing.assert_close(again.copy_head.wk.weight, new.copy_head.wk.weight)


PROMPT = Prompt(prefix="class P:\n    def __init__(self, x, y):\n", region="        self.", cursor=13,
                suffix="\n", path="m.py", language="python", insert=True)


def test_the_sampler_and_the_verifier_run_with_a_head_model(tmp_path, make_checkpoint):
    make_checkpoint(tmp_path, copy_head=True)
    model, tok = load_model(tmp_path)
    ids = encode_prompt(tok, PROMPT)
    for params in (SamplerParams(block_len=8, steps=4, max_blocks=2),
                   SamplerParams(block_len=8, steps=8, rule="margin", temperature=0.7, seed=1)):
        dec = generate(model, tok, ids, params)
        assert dec.done and dec.stats.steps >= 1
        assert all(t >= 0 for t in dec.output)
        # the same request twice, the second through the warm cache: the same tokens
        cache = PrefixCache()
        a = generate(model, tok, ids, params, cache=cache)
        b = generate(model, tok, ids, params, cache=cache)
        assert a.output == b.output == dec.output
    cache = PrefixCache()
    model.prefill(ids, cache)
    scores, ran = score_proposals(model, tok, cache, PROMPT.region, PROMPT.cursor,
                                  (MemoryProposal("x = x", 0.5), MemoryProposal("y = y", 0.4)), 8, insert=True)
    assert ran == 2 and all(s is not None and 0.0 < s <= 1.0 for s in scores)


@pytest.mark.timeout(240)
def test_remote_batched_steps_of_a_head_model_answer_as_local_does(tmp_path, make_checkpoint):
    """The remote server's batched passes (forward_blocks) score each request's mixture against its
    own cache's copy keys: the answers equal LocalEngine's."""
    import threading

    from dlm.coder_model.engine import load_engine
    from dlm.coder_model.remote.backend import load_scheduler
    from dlm.coder_model.remote.client import RemoteEngine
    from dlm.coder_model.remote.tcp_server import ServerOptions, ServerThread
    from dlm.coder_model.types import CancelToken

    make_checkpoint(tmp_path / "raw", copy_head=True)
    model, tok = load_model(tmp_path / "raw")
    with torch.no_grad():  # sharpened (as the remote tests' sharp_checkpoint), the gate half open
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(10.0)
        model.copy_head.gate.weight.zero_()
        model.copy_head.gate.bias.zero_()
    save_checkpoint(model, tok, tmp_path / "sharp")
    ckpt = str(tmp_path / "sharp")
    params = SamplerParams(steps=6, block_len=6, max_blocks=2, threshold=0.5)
    source = "class Point:\n    def __init__(self, x, y):\n"
    prompts = [Prompt(prefix=source, region="        self." + "xy"[i % 2] * (1 + i), cursor=14 + i, suffix="\n",
                      language="python", path=f"f{i}.py") for i in range(3)]
    local = load_engine(ckpt, "cpu")
    want = [local.predict(p, params, CancelToken()).text for p in prompts]
    local.close()
    scheduler, name, device = load_scheduler(ckpt, "cpu", max_batch=8, max_batch_tokens=4096)
    srv = ServerThread(scheduler, ServerOptions(port=0, model_name=name, device=device)).start()
    engines = [RemoteEngine("127.0.0.1", srv.port) for _ in prompts]
    got: dict[int, str] = {}
    barrier = threading.Barrier(len(prompts))

    def go(i):
        barrier.wait()
        got[i] = engines[i].predict(prompts[i], params, CancelToken()).text

    try:
        assert all(e.wait_connected(20) for e in engines)
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(set(want)) > 1  # the comparison can tell prompts apart
        assert [got[i] for i in range(len(prompts))] == want
    finally:
        for e in engines:
            e.close()
        srv.stop()
