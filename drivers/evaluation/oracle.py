"""Oracle-length decoding: the true target length is given, the model fills only the content.

The block slots from the target's token count on are fixed before decoding
(<eom> at the first, <pad> after it), and content slots can only receive
content tokens (<eom>/<pad> are excluded from their choice). The output then
has exactly the target's token count, so the oracle row of the evaluation
measures content errors alone; the gap to the normal row is what length errors
(stopping early, running on) cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from dlm import kernels
from dlm.coder_model.cache import PrefixCache
from dlm.coder_model.layout import encode_prompt
from dlm.coder_model.sampler import UNSET, BlockDecoder, output_head
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from dlm.kernels import reference as reference_ops


class OracleLengthDecoder(BlockDecoder):
    """A BlockDecoder whose slots at and after `content_len` are fixed to <eom>, <pad>, ..."""

    def __init__(self, model, tok, context_ids: list[int], params: SamplerParams, content_len: int,
                 cache: PrefixCache | None = None, cancel: CancelToken | None = None) -> None:
        super().__init__(model, tok, context_ids, params, cache, cancel)
        self.content_len = content_len

    def _new_block(self) -> None:
        super()._new_block()
        first = (self.stats.blocks - 1) * self.params.block_len  # target position of slot 0
        for i in range(len(self.slots)):
            pos = first + i
            if pos == self.content_len:
                self.slots[i] = self.tok.eom_id
            elif pos > self.content_len:
                self.slots[i] = self.tok.pad_id

    def _score(self, hidden: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.params.temperature > 0:
            raise ValueError("oracle-length decoding is greedy (temperature 0): the evaluation's setting")
        w, token_of_row = output_head(self.model, self.tok)
        # rows 0 and 1 of the output head are <pad> and <eom>: a content slot never takes them
        if self.model.copy_head is not None:  # the copy mixture: plain torch
            rows, conf = reference_ops.confidence_from_logits(self._row_logits(hidden[pos])[:, 2:], self.params.rule)
        else:
            rows, conf = kernels.unmask_scores(hidden, w[2:], pos, self.params.rule, impl=self.model.impl)
        return token_of_row[2:][rows], conf


@dataclass
class OracleResult:
    text: str
    tokens: list[int]  # the content tokens decoded (always the target's count)
    target_tokens: int
    steps: int


def oracle_decode(model, tok, budget, prompt: Prompt, target: str, params: SamplerParams) -> OracleResult:
    """Greedy decode of `prompt` with the length of `target` given (block extension as needed)."""
    context = encode_prompt(tok, prompt, budget)
    n = len(tok.encode(target))
    need_blocks = n // params.block_len + 1  # the <eom> needs a slot too
    p = dataclasses.replace(params, max_blocks=max(params.max_blocks, need_blocks))
    dec = OracleLengthDecoder(model, tok, context, p, n)
    dev = model.tok_emb.weight.device
    dec.prefill()
    with torch.inference_mode():
        while not dec.done:
            if UNSET not in dec.slots:  # a block fixed entirely by the oracle (<eom> at slot 0)
                dec._finish_block()
                continue
            hidden = model.forward(dec.block_input().to(dev)[None], start_pos=len(dec.cache),
                                   context_len=len(dec.cache), cache=dec.cache)[0]  # (L, dim)
            dec.advance(hidden)
    return OracleResult(dec.text(), list(dec.output), n, dec.stats.steps)
