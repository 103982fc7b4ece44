"""Masking a long text piece by piece (so that the indexer can pause between pieces) masks
exactly what masking it whole does, private key blocks across a piece's end included."""

from __future__ import annotations

import random

import pytest
from dlm.coder_model import secrets
from dlm.coder_model.secrets import mask_in_pieces, mask_secrets

KEY = ["-----BEGIN RSA PRIVATE KEY-----"] + ["MIIEowIBAAKCAQEA" + "x" * 48] * 5 + ["-----END RSA PRIVATE KEY-----"]
UNENDED_KEY = ["-----BEGIN OPENSSH PRIVATE KEY-----"] + ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB"] * 4
TOKEN = 'GITHUB = "ghp_' + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"[:36] + '"'


def _text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < lines:
        r = rng.random()
        if r < 0.002:
            out.extend(KEY)
        elif r < 0.003:
            out.extend(UNENDED_KEY)
        elif r < 0.03:
            out.append(TOKEN)
        else:
            out.append(f"    value_{rng.randrange(1000)} = compute(x, {rng.randrange(99)})")
    brk = ["\n", "\r\n"][seed % 2]
    return brk.join(out) + brk


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("piece", [200, 1000, 4096])
def test_pieces_mask_what_the_whole_text_masks(monkeypatch: pytest.MonkeyPatch, seed: int, piece: int) -> None:
    monkeypatch.setattr(secrets, "MASK_PIECE_CHARS", piece)
    text = _text(seed, 3000)
    calls = []
    got = mask_in_pieces(text, lambda: calls.append(1))
    assert got == mask_secrets(text)
    assert got[1] > 0 and calls


def test_a_key_block_straddling_a_piece_end_is_masked_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "MASK_PIECE_CHARS", 100)
    text = "x = 1\n" * 15 + "\n".join(KEY) + "\n" + "y = 2\n" * 400
    masked, count = mask_in_pieces(text, lambda: None)
    assert (masked, count) == mask_secrets(text)
    assert "MIIEowIBAAKCAQEA" not in masked and count == len(KEY)
