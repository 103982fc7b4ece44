"""Corpus exclusion and splits; the trainer's loss, resume and warm start."""

from __future__ import annotations

import json
import random

import pytest
import torch

from dlm.coder_model.training import corpus
from dlm.coder_model.training.corpus import EXCLUDED_PACKAGES, build_corpus, is_excluded, read_split

CODE = "def f{i}(x):\n    y = x + {i}\n    return y * 2\n\n\nclass C{i}:\n    value = {i}\n" * 3


def _tree(root):
    files = {
        "site-packages/goodpkg/mod{i}.py": CODE,
        "site-packages/django/db/models{i}.py": CODE.replace("f", "dj"),
        "site-packages/scikit_learn-1.5.dist-info/x{i}.py": CODE.replace("f", "sk"),
        "site-packages/sklearn/base{i}.py": CODE.replace("f", "skl"),
        "site-packages/mpl_toolkits/a{i}.py": CODE.replace("f", "mpl"),
        "shared/eval/safim/leak{i}.py": CODE.replace("f", "ev"),
    }
    for i in range(12):
        for rel, text in files.items():
            p = root / rel.format(i=i)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text.format(i=i) + f"# file {rel.format(i=i)}\n")
    # an exact duplicate of a kept file is kept once
    (root / "site-packages/goodpkg/dup.py").write_text((root / "site-packages/goodpkg/mod0.py").read_text())


def test_excluded_packages_and_eval_never_enter_the_corpus(tmp_path):
    _tree(tmp_path / "src")
    manifest = build_corpus([tmp_path / "src"], tmp_path / "out")
    rows = [r for s in ("train", "valid", "test") for r in read_split(tmp_path / "out", s)]
    paths = [r["path"] for r in rows]
    assert len(paths) == 12  # goodpkg only, the duplicate dropped
    assert all("/goodpkg/" in p for p in paths)
    assert sum(sum(c.values()) for c in manifest["counts"].values()) == 12


@pytest.mark.parametrize("pkg", EXCLUDED_PACKAGES)
def test_every_excluded_package_is_recognised(pkg):
    assert is_excluded(f"/usr/lib/python3/site-packages/{pkg}/core.py")
    assert is_excluded(f"/usr/lib/python3/site-packages/{pkg}-9.9.dist-info/RECORD.py")
    assert not is_excluded(f"/usr/lib/python3/site-packages/{pkg}x_other/core.py")


def test_split_is_by_file_and_stable():
    digests = [f"{random.Random(i).getrandbits(160):040x}" for i in range(3000)]
    splits = [corpus.split_of(d) for d in digests]
    assert splits == [corpus.split_of(d) for d in digests]
    share = {s: splits.count(s) / len(splits) for s in ("train", "valid", "test")}
    assert 0.01 < share["test"] < 0.03 and 0.004 < share["valid"] < 0.02


@pytest.fixture
def small_corpus(tmp_path):
    src = tmp_path / "src" / "pkg"
    src.mkdir(parents=True)
    rng = random.Random(0)
    for i in range(400):  # enough files that every split has some
        body = "".join(f"    v{j} = {rng.randint(0, 99)} + x\n" for j in range(rng.randint(3, 12)))
        (src / f"m{i}.py").write_text(f"def fn{i}(x):\n{body}    return x\n\n\nprint(fn{i}(3))\n")
    build_corpus([tmp_path / "src"], tmp_path / "corpus")
    return tmp_path / "corpus"


def _cfg(small_corpus, out, tiny_checkpoint, **kw):
    from dlm.coder_model.training.train import TrainConfig

    base = dict(corpus=str(small_corpus), out=str(out), preset="test-tiny", tokenizer=f"{tiny_checkpoint}/tokenizer.json",
                batch=4, context=96, block=16, steps=4, minutes=30, eval_every=2, save_every=2, valid_examples=4,
                warmup=1, mix="completion=0.5,fim=0.5", threads=1, edit_histories="/nonexistent")
    base.update(kw)
    return TrainConfig(**base)


def test_diffusion_loss_only_counts_masked_slots(tiny_model):
    from dlm.coder_model.training.train import diffusion_loss

    model, tok = tiny_model
    ids = torch.randint(20, 300, (2, 24))
    targets = torch.randint(20, 300, (2, 8))
    valid = torch.ones(2, 24, dtype=torch.bool)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    loss1, _ = diffusion_loss(model, ids, targets, valid, 16, tok, g1, 1e-3)
    # changing the targets' context-side copy (ids[:, 16:]) changes nothing: the block is re-noised
    ids2 = ids.clone()
    ids2[:, 16:] = 5
    loss2, _ = diffusion_loss(model, ids2, targets, valid, 16, tok, g2, 1e-3)
    assert torch.isfinite(loss1) and loss1.item() == pytest.approx(loss2.item())


def test_ar_auxiliary_loss_is_next_token_cross_entropy_on_valid_context(tiny_model):
    import torch.nn.functional as F

    from dlm.coder_model.training.train import diffusion_loss, native_train_mask

    model, tok = tiny_model
    model.eval()
    tc = 16
    ids = torch.randint(20, 300, (2, 24))
    ids[1, :5] = tok.pad_id
    targets = torch.randint(20, 300, (2, 8))
    valid = torch.ones(2, 24, dtype=torch.bool)
    valid[1, :5] = False  # row 1 is left-padded: its first 5 positions are not context
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    with torch.no_grad():
        base, _ = diffusion_loss(model, ids, targets, valid, tc, tok, g1, 1e-3)
        both, _ = diffusion_loss(model, ids, targets, valid, tc, tok, g2, 1e-3, ar_weight=0.5)
        # reference: the context is causal under the native mask, so the block's content
        # does not change context hidden states; score next tokens of valid pairs only
        hidden = model(ids, attn_mask=native_train_mask(valid, tc))
        logits = model.logits(hidden[:, : tc - 1]).float()
        ces = [F.cross_entropy(logits[0], ids[0, 1:tc], reduction="none"),
               F.cross_entropy(logits[1, 5:], ids[1, 6:tc], reduction="none")]
        ar = torch.cat(ces).mean()
    assert both.item() == pytest.approx(base.item() + 0.5 * ar.item(), rel=1e-4)


def test_resume_continues_from_the_saved_step(small_corpus, tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file

    from dlm.coder_model.training.train import train

    out = tmp_path / "run"
    train(_cfg(small_corpus, out, tiny_checkpoint, steps=2))  # stops after 2 steps, state saved
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["step"] == 2
    saved_opt = load_file(str(out / "last" / "optimizer.safetensors"))
    assert saved_opt and all(torch.isfinite(t).all() for t in saved_opt.values())

    # resume with a longer schedule (--steps above the saved total stretches it): the run
    # continues at step 3 with the saved optimizer state
    final = train(_cfg(small_corpus, out, tiny_checkpoint, steps=4), resume=True)
    steps = [json.loads(line)["step"] for line in (out / "loss_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert json.loads((final / "training.json").read_text())["steps"] == 4


def test_warm_start_loads_weights(small_corpus, tmp_path, tiny_checkpoint):
    from dlm.coder_model.checkpoint import load_model
    from dlm.coder_model.training.train import train

    final = train(_cfg(small_corpus, tmp_path / "warm", tiny_checkpoint, steps=1, init=tiny_checkpoint,
                       tokenizer="", lr=0.0, min_lr_ratio=0.0))
    a, _ = load_model(final)
    b, _ = load_model(tiny_checkpoint)
    for k, v in a.state_dict().items():  # lr 0: the weights are the initial checkpoint's
        torch.testing.assert_close(v, b.state_dict()[k], rtol=0, atol=1e-6)
