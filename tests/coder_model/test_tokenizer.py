"""The tokenizer treats text as content: marker names inside code stay text."""

from __future__ import annotations

from dlm.coder_model.checkpoint import embedded_checkpoint_dir
from dlm.coder_model.tokenizer import SPECIAL_TOKENS, Tokenizer


def test_special_token_text_in_code_is_content():
    tok = Tokenizer.from_file(embedded_checkpoint_dir() / "tokenizer.json")
    for name in SPECIAL_TOKENS:
        text = f'marker = "{name}"\n'
        ids = tok.encode(text)
        assert not set(ids) & set(tok.special.values()), (name, ids)
        assert tok.decode(ids) == text
