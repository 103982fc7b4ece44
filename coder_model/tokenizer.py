"""Tokenizer wrapper: a `tokenizers` byte-level BPE plus the native layout's special tokens."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

# Order fixes the ids (0..N-1): never reorder, only append.
SPECIAL_TOKENS = (
    "<pad>",
    "<eom>",  # end of the model's new region
    "<mask>",
    "<bos>",
    "<file>",
    "<history>",
    "<prefix>",
    "<suffix>",
    "<region>",
    "<cursor>",
    "<rewrite>",
    "<edit>",  # separates history events
)


# Texts this long are memoised: 8,000 characters of code take ~3.4 ms to encode (measured on this
# project's 2-vCPU Xeon, embedded tokenizer), 1,000 take ~0.25 ms; shorter ones are not worth a lookup.
MEMO_MIN_CHARS = 256
MEMO_ENTRIES = 64  # a few segments per open document


class Tokenizer:
    """Byte-level BPE: every string round-trips exactly (decode(encode(s)) == s)."""

    def __init__(self, tk) -> None:  # tk: tokenizers.Tokenizer
        self._tk = tk
        # Text is content only: "<eom>" typed in a user's file must stay 5 characters, never
        # become the layout marker (which would corrupt the prompt); markers are placed by id.
        tk.encode_special_tokens = True
        self.special: dict[str, int] = {}
        for name in SPECIAL_TOKENS:
            tid = tk.token_to_id(name)
            if tid is None:
                raise ValueError(
                    f"tokenizer.json lacks the special token {name}; it was not made for the native "
                    "dlm layout (train one with dlm.coder_model.tokenizer.train_tokenizer)"
                )
            self.special[name] = tid
        self.pad_id = self.special["<pad>"]
        self.eom_id = self.special["<eom>"]
        self.mask_id = self.special["<mask>"]
        self.vocab_size = tk.get_vocab_size()
        # The layout encodes each segment on its own (prefix, suffix, history events), and while
        # the user types only the region changes: the others are answered from this memo
        # (lru_cache locks, so the remote server's preparation threads may share it).
        self._memo = functools.lru_cache(maxsize=MEMO_ENTRIES)(self._encode_tuple)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return cls(HFTokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises its own Exception types
            if isinstance(exc, ValueError) and "special token" in str(exc):
                raise
            raise ValueError(f"cannot read tokenizer {path}: {exc}; is it a HF tokenizers JSON file?") from exc

    def save(self, path: str | Path) -> None:
        self._tk.save(str(path))

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if len(text) >= MEMO_MIN_CHARS:
            return list(self._memo(text))
        return self._tk.encode(text, add_special_tokens=False).ids

    def _encode_tuple(self, text: str) -> tuple[int, ...]:
        return tuple(self._tk.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of content tokens; special tokens are dropped."""
        ids = [i for i in ids if i >= len(SPECIAL_TOKENS)]
        return self._tk.decode(ids, skip_special_tokens=False) if ids else ""



def train_tokenizer(texts: Iterator[str], vocab_size: int = 8192) -> Tokenizer:
    """Train a byte-level BPE whose first ids are SPECIAL_TOKENS."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = HFTokenizer(models.BPE())
    # use_regex=True splits on GPT-2's pattern so merges stay inside words/whitespace runs
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(tk)
