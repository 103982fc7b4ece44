"""LSP positions <-> Python string offsets, per line.

LSP `Position.character` counts UTF-16 code units by default; a client may
offer `utf-8` (bytes) or `utf-32` (code points) in
`general.positionEncodings`, in its order of preference, and we take its
first choice that is one of the three (utf-8 and utf-32 are cheaper for us to
convert than utf-16, Python strings index code points, but the client knows
what its own buffers hold: a conversion on its side costs it more). Everything here works on one line of text (without its newline).

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
    """The position encoding to announce: the client's first choice that we support (its
    list is in order of preference, LSP 3.17), else utf-16. pygls announces the same one
    (ServerCapabilitiesBuilder.choose_position_encoding); lsp.server checks they agree."""
    for enc in offered or []:
        name = str(getattr(enc, "value", enc))
        if name in ENCODINGS:
            return name
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

