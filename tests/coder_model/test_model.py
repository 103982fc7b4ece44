"""The native denoiser: shapes, the native mask, the exact prefix cache."""

from __future__ import annotations

import torch
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.config import ModelConfig
from dlm.coder_model.model import DLM, build_model


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    m = DLM(ModelConfig.preset("test-tiny", **kw), impl="reference")
    m.init_weights(seed)
    return m.eval()


def test_forward_shapes_and_gqa():
    for kv in (1, 2, 4):
        m = _model(n_kv_heads=kv)
        ids = torch.randint(0, 512, (3, 17))
        h = m(ids, context_len=9)
        assert h.shape == (3, 17, 64)
        assert m.logits(h).shape == (3, 17, 512)
        assert torch.isfinite(h).all()


def test_context_never_sees_block():
    m = _model()
    ctx = torch.randint(0, 512, (1, 20))
    b1, b2 = torch.randint(0, 512, (1, 8)), torch.randint(0, 512, (1, 8))
    h1 = m(torch.cat([ctx, b1], 1), context_len=20)
    h2 = m(torch.cat([ctx, b2], 1), context_len=20)
    # context hidden states are identical whatever the block holds ...
    torch.testing.assert_close(h1[:, :20], h2[:, :20], rtol=0, atol=0)
    # ... and the block does see the context: changing the context changes the block
    ctx2 = ctx.clone()
    ctx2[0, 3] = (ctx2[0, 3] + 1) % 512
    h3 = m(torch.cat([ctx2, b1], 1), context_len=20)
    assert not torch.allclose(h1[:, 20:], h3[:, 20:])


def test_changing_a_block_token_never_changes_context_kv():
    m = _model()
    ctx = torch.randint(0, 512, (20,)).tolist()
    c1, c2 = PrefixCache(), PrefixCache()
    m.prefill(ctx, c1)
    m.prefill(ctx, c2)
    b1 = torch.randint(0, 512, (1, 8))
    b2 = b1.clone()
    b2[0, 5] = (b2[0, 5] + 7) % 512
    m(b1, start_pos=20, context_len=20, cache=c1)
    m(b2, start_pos=20, context_len=20, cache=c2)
    for layer in range(m.config.n_layers):
        assert torch.equal(c1.k[layer], c2.k[layer]) and torch.equal(c1.v[layer], c2.v[layer])
        assert c1.k[layer].shape[2] == 20  # a denoising step does not write the cache


def test_block_is_bidirectional():
    m = _model()
    ids = torch.randint(0, 512, (1, 28))
    h1 = m(ids, context_len=20)
    ids2 = ids.clone()
    ids2[0, 27] = (ids2[0, 27] + 1) % 512  # last block slot
    h2 = m(ids2, context_len=20)
    assert not torch.allclose(h1[:, 20], h2[:, 20])  # first block slot sees the last one


def test_cached_prefill_matches_full_forward():
    m = _model()
    ids = torch.randint(0, 512, (40,)).tolist()
    block = torch.randint(0, 512, (1, 8))
    full = m(torch.cat([torch.tensor([ids]), block], 1), context_len=40)[:, 40:]
    cache = PrefixCache()
    m.prefill(ids[:25], cache)  # an earlier keystroke's context
    reused = m.prefill(ids, cache)  # shares 25 tokens
    assert reused == 25 and len(cache) == 40
    step = m(block, start_pos=40, context_len=40, cache=cache)
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_forward_blocks_packs_requests_like_single_steps():
    m = _model()
    caches, blocks, singles = [], [], []
    for n in (12, 30):
        ids = torch.randint(0, 512, (n,)).tolist()
        c = PrefixCache()
        m.prefill(ids, c)
        b = torch.randint(0, 512, (8,))
        caches.append(c)
        blocks.append(b)
        singles.append(m(b[None], start_pos=n, context_len=n, cache=c)[0])
    packed = m.forward_blocks(blocks, caches)
    for a, b in zip(packed, singles):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_build_model_param_count_matches_preset():
    m = build_model(ModelConfig.preset("test-tiny"))
    n = sum(p.numel() for p in m.parameters())
    cfg = m.config
    per_layer = (cfg.dim * cfg.dim * 2 + 2 * cfg.dim * cfg.n_kv_heads * cfg.head_dim
                 + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim)
    assert n == cfg.vocab_size * cfg.dim + cfg.n_layers * per_layer + cfg.dim
