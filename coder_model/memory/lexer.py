"""A code lexer for the repository memory: text -> lexical tokens, reversible.

Tokenizer-independent on purpose: the memory works the same in local and
remote mode, whatever model sits behind it. One language-agnostic rule set
(identifiers, numbers, operators, single characters), no string or comment
state: a window that starts mid-file lexes the same as the whole file from
its first line start on, so the memory can lex only the tail of `before`.

Whitespace is attached to the token that follows it (" foo", "    return"),
the way byte-level BPE does: the n-gram predicts spacing together with the
word and a context slot is never spent on a blank. A line break is its own
token and carries the line's trailing whitespace ("  \\n"); whitespace at
the very end of a text is a token of its own. "".join(lex(text)) == text.
"""

from __future__ import annotations

import re

# Whitespace that is not a line break: attached to the next token.
_WS = r"[^\S\r\n]"
# Longest operators first; anything else is one character.
_OPERATORS = (
    r"\*\*=|//=|>>=|<<=|\.\.\.|===|!==|->|:=|==|!=|<=|>=|\*\*|//|<<|>>|\+=|-=|\*=|/=|%=|&=|\|=|\^=|@="
    r"|&&|\|\||\+\+|--|=>|::|\?\?|\?\."
)
MAX_WORD = 64  # longer identifiers (minified code, base64) split into pieces: bounds the vocabulary
_CORE = (
    rf"[^\W\d]\w{{0,{MAX_WORD - 1}}}"  # identifier (Unicode letters)
    r"|0[xXoObB][0-9a-fA-F_]{1,32}"
    r"|\d[\d_]{0,31}(?:\.[\d_]{0,32})?(?:[eE][+-]?\d{1,4})?[jJlLuUfFnN]?"
    r"|\.\d[\d_]{0,31}(?:[eE][+-]?\d{1,4})?[jJ]?"
    r"|\r\n|\n|\r"
    rf"|{_OPERATORS}"
    r"|\S"
)
# Every character is whitespace, a line break or \S, so the two alternatives
# cover any text and findall returns contiguous tokens.
TOKEN_RE = re.compile(rf"{_WS}*(?:{_CORE})|{_WS}+")


def lex(text: str) -> list[str]:
    """The tokens of `text`; they join back to exactly `text`."""
    return TOKEN_RE.findall(text)


def is_line_break(token: str) -> bool:
    """True for a token that ends a line (it may carry the line's trailing whitespace)."""
    return token.endswith(("\n", "\r"))


def is_identifier(token: str) -> bool:
    word = token.lstrip()
    return bool(word) and (word[0].isalpha() or word[0] == "_")


def line_start(text: str, pos: int | None = None) -> int:
    """Offset of the start of the line containing `pos` (default: the end of `text`)."""
    if pos is None:
        pos = len(text)
    return max(text.rfind("\n", 0, pos), text.rfind("\r", 0, pos)) + 1
