"""LSP positions <-> Python string offsets, per line.

LSP `Position.character` counts UTF-16 code units by default; a client may
offer `utf-8` (bytes) or `utf-32` (code points) in
`general.positionEncodings`, and we take utf-8 / utf-32 when offered because
they are cheaper to convert than utf-16 for us (Python strings index code
points). Everything here works on one line of text (without its newline).

Bad positions never raise: a character past the end of the line clamps to
the end of the line (LSP spec), and a UTF-16 offset that points between the
two halves of a surrogate pair (an invalid position) snaps to the start of
that code point; a UTF-8 offset inside a multi-byte character likewise.
"""

from __future__ import annotations

UTF16 = "utf-16"
UTF8 = "utf-8"
UTF32 = "utf-32"
ENCODINGS = (UTF16, UTF8, UTF32)


def choose_encoding(offered: list[str] | None) -> str:
    """The position encoding to announce, from the client's offered list."""
    offered = [str(getattr(e, "value", e)) for e in (offered or [])]
    for enc in (UTF32, UTF8):
        if enc in offered:
            return enc
    return UTF16


def _units(ch: str, encoding: str) -> int:
    o = ord(ch)
    if encoding == UTF16:
        return 2 if o > 0xFFFF else 1
    if encoding == UTF8:
        return 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
    return 1


def to_index(line: str, character: int, encoding: str = UTF16) -> int:
    """Code-point index in `line` for an LSP character offset (clamped, snapped)."""
    if character <= 0:
        return 0
    if encoding == UTF32 or line.isascii():
        return min(character, len(line))
    units = 0
    for i, ch in enumerate(line):
        nxt = units + _units(ch, encoding)
        if nxt > character:  # inside this code point: snap to its start
            return i
        units = nxt
        if units == character:
            return i + 1
    return len(line)


def to_character(line: str, index: int, encoding: str = UTF16) -> int:
    """LSP character offset for a code-point index in `line`."""
    index = max(0, min(index, len(line)))
    if encoding == UTF32 or line.isascii():
        return index
    if encoding == UTF8:
        return len(line[:index].encode("utf-8", "surrogatepass"))
    return index + sum(1 for ch in line[:index] if ord(ch) > 0xFFFF)

