"""The memory's lexer: tokens join back to the exact text, for real files and random junk."""

from __future__ import annotations

import pathlib
import random

from dlm.coder_model.memory.lexer import is_identifier, is_line_break, lex, line_start

ROOT = pathlib.Path(__file__).resolve().parents[3]
ALPHABET = "ab_Z09 \t\n\r\x0b\x0c\xa0\u2028\u3000é字'\"#\\(){}[].,:;=+-*/%<>!&|^~@?$`" + "\U0001f600"


def test_round_trip_on_the_projects_own_sources():
    files = sorted(ROOT.glob("coder_model/**/*.py")) + sorted(ROOT.glob("lsp/**/*.py"))
    assert len(files) > 20
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert "".join(lex(text)) == text, path


def test_round_trip_on_random_text():
    rng = random.Random(1234)
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 60)))
        tokens = lex(text)
        assert "".join(tokens) == text, repr(text)
        assert all(tokens), repr(text)  # no empty token


def test_whitespace_attaches_to_the_next_token_and_line_breaks_stand_alone():
    assert lex("x = foo(a, b)  \n    return 1\n") == [
        "x", " =", " foo", "(", "a", ",", " b", ")", "  \n", "    return", " 1", "\n",
    ]
    assert lex("a  ") == ["a", "  "]
    assert lex("a**=b->c") == ["a", "**=", "b", "->", "c"]
    assert lex("x\r\ny") == ["x", "\r\n", "y"]


def test_long_words_are_split_but_kept_whole_in_text():
    word = "a" * 200
    tokens = lex(word)
    assert len(tokens) > 1 and "".join(tokens) == word


def test_helpers():
    assert is_line_break("  \n") and is_line_break("\r\n") and not is_line_break(" x")
    assert is_identifier("  foo") and not is_identifier("(") and not is_identifier(" 12")
    assert line_start("ab\ncd") == 3 and line_start("ab\ncd", 2) == 0 and line_start("") == 0
