"""The evaluation driver end to end on a tiny model; oracle-length decoding; real-edit cases."""

from __future__ import annotations

import gzip
import json

import pytest
from dlm.drivers.evaluation import evaluate as ev
from dlm.drivers.evaluation import safim as sf

# ---------------------------------------------------------------------------
# end to end on the tiny random checkpoint

PROGRAM = "def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return add(x, x)\n\n\nprint(twice(add(1, 2)))\n"


def test_evaluate_end_to_end_on_a_tiny_checkpoint(tiny_checkpoint, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with gzip.open(corpus / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(3):
            f.write(json.dumps({"path": f"/src/m{i}.py", "language": "python", "text": PROGRAM * (i + 1)}) + "\n")
    out = tmp_path / "report.json"
    argv = ["--model", tiny_checkpoint, "--device", "cpu", "--limit", "1", "--corpus", str(corpus),
            "--kinds", "completion,noop", "--json", str(out)]
    safim_ok = True
    try:
        sf.safim_dir()
        argv += ["--safim", "--safim-tasks", "block", "--safim-limit", "1", "--safim-max-blocks", "1",
                 "--timeout", "2"]
    except FileNotFoundError:
        safim_ok = False
    assert ev.main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["kinds"]) == {"completion", "noop"}
    for entry in report["kinds"].values():
        d, ar = entry["diffusion"], entry["ar"]
        assert d["n"] == 1 and ar["n"] == 1
        for m in (d, ar):
            assert 0.0 <= m["exact_match"] <= 1.0 and 0.0 <= m["edit_similarity"] <= 1.0
            assert m["forward_passes_mean"] >= 1
        # the autoregressive baseline commits at most one slot per forward pass
        assert ar["tokens_per_pass"] <= 1.0 + 1e-9
        # the oracle-length row: same cases, every output of the target's token count
        o = entry["oracle"]
        assert o["n"] == 1 and o["length_exact"] == 1.0 and 0.0 <= o["edit_similarity"] <= 1.0
        assert entry["examples"] and "prediction" in entry["examples"][0]
    if safim_ok:
        s = report["safim"]["block"]
        assert s["diffusion"]["n"] == 1 and 0.0 <= s["diffusion"]["pass@1"] <= 1.0


def test_real_edit_cases_come_from_the_test_split():
    from dlm.drivers.training import commit_edits as ce

    try:
        cases = ev.real_edit_cases(3)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert len(cases) == 3 and all(c.kind == "real_edit" for c in cases)
    test_commits = {r["commit"][:12] for r in ce.iter_edit_records("test", allow_test=True,
                                                                    repos=["Textualize/rich"])}
    for c in cases:
        assert c.source.split("@")[1].split(":")[0] in test_commits
        assert c.target != c.prompt.region and c.prompt.history
    assert [c.source for c in ev.real_edit_cases(3)] == [c.source for c in cases]  # deterministic


def test_evaluate_rejects_unknown_kinds(capsys):
    assert ev.main(["--kinds", "completion,bogus"]) == 2
    assert "unknown bogus" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# oracle length


@pytest.mark.parametrize("target", [
    "x = 1\n",  # shorter than one block
    "total = sum(value * 2 for value in range(40)) + len(str(total_count))\n",  # needs a second block
    "",  # empty: <eom> in slot 0, nothing to decode
])
def test_oracle_decode_fixes_the_length_to_the_target(tiny_model, target):
    from dlm.coder_model.types import LayoutBudget, Prompt, SamplerParams
    from dlm.drivers.evaluation.oracle import oracle_decode

    model, tok = tiny_model
    prompt = Prompt(prefix="def f(a):\n", region="    return a\n", cursor=4, suffix="\n", language="python",
                    path="m.py")
    params = SamplerParams(block_len=16, max_blocks=1)
    r = oracle_decode(model, tok, LayoutBudget.for_window(256), prompt, target, params)
    # a random model would stop anywhere; the oracle gives exactly the target's token count,
    # and none of the content slots is <eom> or <pad>
    assert r.target_tokens == len(tok.encode(target))
    assert len(r.tokens) == r.target_tokens
    assert tok.eom_id not in r.tokens and tok.pad_id not in r.tokens
    assert r.steps >= (1 if target else 0)


def test_oracle_row_is_skipped_with_no_oracle(tiny_checkpoint, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with gzip.open(corpus / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"path": "/src/m.py", "language": "python", "text": PROGRAM}) + "\n")
    out = tmp_path / "report.json"
    assert ev.main(["--model", tiny_checkpoint, "--device", "cpu", "--limit", "1", "--corpus", str(corpus),
                    "--kinds", "completion", "--no-ar", "--no-oracle", "--dtype", "fp32", "--json", str(out)]) == 0
    entry = json.loads(out.read_text())["kinds"]["completion"]
    assert "oracle" not in entry and "ar" not in entry and entry["diffusion"]["n"] == 1


def test_every_corpus_kind_of_training_has_evaluation_cases(tmp_path):
    """The evaluation cuts a case of every kind the trainer's mix knows (real_edit comes from the edit
    histories, not the corpus): the default --kinds never meets a kind it cannot build."""
    from dlm.drivers.training.examples import KINDS

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with gzip.open(corpus / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(4):
            f.write(json.dumps({"path": f"/src/m{i}.py", "language": "python", "text": PROGRAM * (i + 2)}) + "\n")
    for kind in KINDS:
        if kind == "real_edit":
            continue
        cases = ev.corpus_cases(corpus, kind, limit=2)
        assert cases and all(c.kind == kind for c in cases), kind
