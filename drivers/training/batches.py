"""Training batches: mixed examples -> token sequences -> padded tensors, in worker processes.

Each example (training.examples / synthetic_edits / commit_edits) becomes one
sequence: left padding, the context tokens of the native layout, then one block
of L slots holding the answer (the new region, or the insertion of a typing
prompt: layout.answer_text), <eom> and <pad>. Typing examples get retrieved
snippets of their project's other files (`--snippet-share`; training.project_snippets). `batches()` yields
collated batches from the main process (`workers=0`, deterministic given the
trainer's rng: what resume relies on) or from N worker processes through a torch
DataLoader over `BatchDataset` (each worker with its own seed), so example
building keeps up with a GPU.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from dlm.coder_model.budget import drafts_window, plan
from dlm.coder_model.layout import LayoutBudget, answer_text, encode_prompt, encode_target, target_block
from dlm.coder_model.refine import draft_block
from dlm.coder_model.tokenizer import Tokenizer
from dlm.drivers.training import examples as ex_mod
from dlm.drivers.training.corpus import read_split
from dlm.drivers.training.project_drafts import FileDraw, ProjectDrafts
from dlm.drivers.training.project_snippets import ProjectSnippets


class ExampleStream:
    """Endless mixed examples from the corpus files (and the edit histories), seeded."""

    def __init__(self, cfg, split: str, rng: random.Random) -> None:
        self.cfg, self.split, self.rng = cfg, split, rng
        records = list(read_split(Path(cfg.corpus), split))
        self.files = [(r["path"], r["language"], r["text"], r.get("source", "")) for r in records]
        # Typing examples get snippets retrieved from the other files of their project (a share
        # of them: the server has none before its index is ready, or with the index off).
        self.snippet_share = float(getattr(cfg, "snippet_share", 0.0))
        self.project_snippets = ProjectSnippets((p, t, s) for p, _, t, s in self.files) \
            if self.snippet_share > 0 else None
        # ... and the repository memory's drafts at their cursor (a share of them: the server has
        # none before its index is ready), for a model with a drafts section (training.project_drafts)
        self.draft_share = float(getattr(cfg, "draft_share", 0.0))
        self.project_drafts = ProjectDrafts((p, t, s) for p, _, t, s in self.files) \
            if self.draft_share > 0 else None
        # with drafts, files come in runs per workspace so that its memory is built once per run
        self.file_draw = FileDraw(self.project_drafts, self.files, self.rng) if self.project_drafts else None
        if not self.files:
            raise SystemExit(f"corpus split {split!r} in {cfg.corpus} is empty; build it with "
                             "python -m dlm.drivers.training.corpus")
        weights = dict(kv.split("=") for kv in cfg.mix.split(","))
        from dlm.drivers.training.hunks import EditOptions
        from dlm.drivers.training.synthetic_edits import noop_example, synthetic_edit_example

        # The text windows of the model's budget (coder_model.budget), as the server sizes them,
        # so that the layout fills the context in training as it does in serving.
        cuts = plan(train_budget(cfg))
        win = {"prefix_chars": cuts.prefix_chars, "suffix_chars": cuts.suffix_chars}
        self.edit_options = EditOptions(**win, max_history_chars=cuts.history_chars)
        self.builders = {"typing": partial(ex_mod.typing_example, **win),
                         "completion": partial(ex_mod.completion_example, **win),
                         "fim": partial(ex_mod.fim_example, **win),
                         "synthetic_edit": partial(synthetic_edit_example, opts=self.edit_options),
                         "noop": partial(noop_example, opts=self.edit_options)}
        self.real_edits = self._real_edits() if "real_edit" in weights else None
        unknown = sorted(k for k in weights if k not in self.builders and k != "real_edit")
        if unknown:
            raise SystemExit(f"--mix names unknown example kind(s) {unknown}; use "
                             f"{', '.join([*self.builders, 'real_edit'])}")
        self.kinds = [k for k in weights if k in self.builders or (k == "real_edit" and self.real_edits)]
        self.weights = [float(weights[k]) for k in self.kinds]

    def _real_edits(self):
        from dlm.drivers.training.commit_edits import edit_histories_dir, real_edit_examples

        try:
            data_dir = edit_histories_dir(self.cfg.edit_histories or None)
        except FileNotFoundError as exc:
            print(f"[train] {exc}: training without real_edit", file=sys.stderr)
            return None
        return real_edit_examples(self.split, self.rng, data_dir=data_dir, opts=self.edit_options)

    def reseed(self, seed: int) -> None:
        """A fresh random stream (one per worker process)."""
        self.rng.seed(seed)
        if self.real_edits is not None:
            self.real_edits = self._real_edits()

    def __iter__(self):
        return self

    def __next__(self) -> ex_mod.Example:
        while True:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            if kind == "real_edit":
                try:
                    ex = next(self.real_edits)
                except StopIteration:
                    i = self.kinds.index("real_edit")
                    del self.kinds[i], self.weights[i]
                    continue
            else:
                path, lang, text, source = self.file_draw() if self.file_draw \
                    else self.files[self.rng.randrange(len(self.files))]
                ex = self.builders[kind](text, self.rng, path=Path(path).name, language=lang)
                if ex is not None and ex.prompt.insert and self.project_snippets is not None \
                        and self.rng.random() < self.snippet_share:
                    found = self.project_snippets.snippets(source, path, ex.prompt.prefix)
                    ex = replace(ex, prompt=replace(ex.prompt, snippets=found))
                if ex is not None and ex.prompt.insert and self.project_drafts is not None \
                        and self.rng.random() < self.draft_share:
                    drafts = self.project_drafts.drafts(source, path, text, ex.prompt, ex.target)
                    ex = replace(ex, prompt=replace(ex.prompt, proposals=drafts))
            if ex is not None:
                return ex


def train_budget(cfg) -> LayoutBudget:
    """The layout budget of a run: its context, and a drafts section when its examples get drafts
    (the model then records the section as its ModelConfig.drafts_window)."""
    drafts = drafts_window(cfg.context) if getattr(cfg, "draft_share", 0.0) > 0 else 0
    return LayoutBudget.for_window(cfg.context, drafts)


def make_sequence(tok: Tokenizer, ex: ex_mod.Example, cfg, rng: random.Random):
    """(context ids, block target ids, the block's start or None) or None when the target needs
    more blocks than allowed. The start: for a share (`cfg.draft_start`) of the examples with
    drafts, the block the run starts from, the first draft's (coder_model.refine.draft_block)."""
    ctx = encode_prompt(tok, ex.prompt, train_budget(cfg))
    tgt = encode_target(tok, answer_text(ex.prompt, ex.target))
    n_blocks = math.ceil(len(tgt) / cfg.block)
    if n_blocks > cfg.max_blocks:
        return None
    b = rng.randrange(n_blocks)
    ctx = ctx + tgt[: b * cfg.block]  # earlier blocks are context (block diffusion)
    start = None
    if b == 0 and ex.prompt.proposals and rng.random() < getattr(cfg, "draft_start", 0.0):
        start = draft_block(tok, ex.prompt.proposals[0].text, cfg.block)
    return ctx, target_block(tok, tgt, b, cfg.block), start


def collate(tok: Tokenizer, seqs, cfg):
    """Left-pad contexts to one length so every block starts at the same position.

    Returns ids (B, T), targets (B, L), key_valid (B, T), context length Tc, and starts (B, L):
    each row's block start (make_sequence), -1 in a row that starts from masks.
    """
    tc = max(len(s[0]) for s in seqs)
    B, L = len(seqs), cfg.block
    ids = torch.full((B, tc + L), tok.pad_id, dtype=torch.long)
    valid = torch.zeros((B, tc + L), dtype=torch.bool)
    targets = torch.empty((B, L), dtype=torch.long)
    starts = torch.full((B, L), -1, dtype=torch.long)
    for i, (c, t, *rest) in enumerate(seqs):
        ids[i, tc - len(c) : tc] = torch.tensor(c)
        valid[i, tc - len(c) :] = True
        targets[i] = torch.tensor(t)
        if rest and rest[0] is not None:
            starts[i] = torch.tensor(rest[0])
    return ids, targets, valid, tc, starts


def build_batch(tok: Tokenizer, stream: ExampleStream, cfg, rng: random.Random):
    """One collated batch of cfg.batch rows.

    With `cfg.complementary` the batch holds cfg.batch / 2 sequences, each twice
    (row i and row i + B/2): the objective gives the copies complementary masks.
    """
    distinct = cfg.batch // 2 if cfg.complementary else cfg.batch
    seqs = []
    while len(seqs) < distinct:
        s = make_sequence(tok, next(stream), cfg, rng)
        if s:
            seqs.append(s)
    return collate(tok, seqs + seqs if cfg.complementary else seqs, cfg)


class BatchDataset(torch.utils.data.IterableDataset):
    """Endless collated batches; each DataLoader worker reseeds its own stream."""

    def __init__(self, tok: Tokenizer, stream: ExampleStream, cfg, seed: int) -> None:
        self.tok, self.stream, self.cfg, self.seed = tok, stream, cfg, seed

    def __iter__(self) -> Iterator:
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else 0
        seed = self.seed * 1009 + wid + 1
        self.stream.reseed(seed)
        rng = random.Random(seed + 7)
        while True:
            yield build_batch(self.tok, self.stream, self.cfg, rng)


def batches(tok: Tokenizer, stream: ExampleStream, cfg, rng: random.Random, workers: int, seed: int,
            pin_memory: bool = False) -> Iterator:
    """Endless batches: built here with `rng` (workers=0) or by `workers` processes."""
    if workers <= 0:
        while True:
            yield build_batch(tok, stream, cfg, rng)
    loader = torch.utils.data.DataLoader(
        BatchDataset(tok, stream, cfg, seed), batch_size=None, num_workers=workers,
        prefetch_factor=4, persistent_workers=True, pin_memory=pin_memory,
    )
    yield from loader
