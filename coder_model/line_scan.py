"""One line of code read roughly: the characters outside its string literals, and the line without
its comment. A quote opens a string up to the same quote, and a backslash inside it escapes the
next character; triple quotes, string prefixes and strings that go on past the line are not told
apart. Enough to count a line's brackets, find its comment and tell whether it leaves a string
open, which is all its callers ask (coder_model.memory.follow, lsp.syntax_check)."""

from __future__ import annotations

from collections.abc import Iterator

QUOTES = "\"'"


def _scan(line: str, quotes: str) -> Iterator[tuple[int, str, str]]:
    """(position, character, the quote of the string literal open after it, or '') per character."""
    quote = ""
    escaped = False
    for i, ch in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in quotes:
            quote = ch
        yield i, ch, quote


def code_chars(line: str, quotes: str = QUOTES) -> Iterator[tuple[int, str]]:
    """(position, character) of each character of `line` outside its string literals (the quotes
    themselves are not yielded)."""
    for i, ch, quote in _scan(line, quotes):
        if not quote and ch not in quotes:
            yield i, ch


def open_string(line: str, quotes: str = QUOTES) -> str:
    """The quote of the string literal `line` leaves open at its end, or '' (none is open)."""
    quote = ""
    for _, _, quote in _scan(line, quotes):
        pass
    return quote


def without_comment(line: str, mark: str = "#") -> str:
    """`line` without its comment (from the first `mark` outside a string) and trailing blanks."""
    for i, ch in code_chars(line):
        if ch == mark:
            return line[:i].rstrip()
    return line.rstrip()
