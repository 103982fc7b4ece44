"""RepoMemory's file format: a magic line, a version, a JSON header, typed little-endian arrays, a CRC.

No pickle: a cache file is data, never code. The file holds what the index
was built from (the vocabulary, each file's token ids, the snippet windows),
not its n-gram tables: they are counted again on load (`SortedTable.build`,
about 0.55 s a million tokens on one core), which keeps the file near twice
the indexed source's size where the tables would triple it, and a table read
back can never disagree with the tokens it counts. Layout after the magic:
u32 version, u32 CRC-32 of the payload, u64 payload length, payload. The
payload is a sequence of sections, each a u8 type code ('J' JSON, 'S'
strings, or an array typecode), u64 item count, then the items. Any
mismatch (magic, version, length, CRC, a section's type or size) is a
ValueError that says what is wrong: the caller rebuilds the index.
"""

from __future__ import annotations

import json
import struct
import sys
import typing
import zlib
from array import array

MAGIC = b"DLM-REPO-MEMORY\n"
# A file of another version is rebuilt, never read (older versions may also hold lines holding
# a secret in clear text: this version's RepoMemory empties them before indexing, dlm.coder_model.secrets).
VERSION = 3
_HEAD = struct.Struct("<IIQ")
_SECTION = struct.Struct("<cQ")
_LITTLE = sys.byteorder == "little"

# RepoMemory (memory.index) is named in annotations only: index imports this module to save and load
RepoMemory = typing.Any


class _Writer:
    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []

    def array(self, a: array) -> None:
        if not _LITTLE:
            a = array(a.typecode, a)
            a.byteswap()
        self.chunks.append(_SECTION.pack(a.typecode.encode(), len(a)))
        self.chunks.append(memoryview(a).cast("B"))

    def json(self, obj: object) -> None:
        data = json.dumps(obj, sort_keys=True).encode()
        self.chunks.append(_SECTION.pack(b"J", len(data)))
        self.chunks.append(data)

    def strings(self, items: typing.Sequence[str]) -> None:
        encoded = [s.encode("utf-8", "surrogatepass") for s in items]
        self.chunks.append(_SECTION.pack(b"S", len(encoded)))
        self.array_raw(array("I", map(len, encoded)))
        self.chunks.append(b"".join(encoded))

    def array_raw(self, a: array) -> None:
        if not _LITTLE:
            a = array(a.typecode, a)
            a.byteswap()
        self.chunks.append(a.tobytes())


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"repository memory file is truncated (in {what}): rebuild the index")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _section(self, what: str) -> tuple[str, int]:
        code, count = _SECTION.unpack(self._take(_SECTION.size, what))
        return code.decode("latin-1"), count

    def array(self, typecode: str, what: str) -> array:
        code, count = self._section(what)
        if code != typecode:
            raise ValueError(f"repository memory file is corrupt: {what} has type {code!r}, expected {typecode!r}")
        return self._raw(typecode, count, what)

    def _raw(self, typecode: str, count: int, what: str) -> array:
        a = array(typecode)
        a.frombytes(self._take(count * a.itemsize, what))
        if not _LITTLE:
            a.byteswap()
        return a

    def json(self, what: str) -> typing.Any:
        code, count = self._section(what)
        if code != "J":
            raise ValueError(f"repository memory file is corrupt: {what} is not JSON")
        try:
            return json.loads(bytes(self._take(count, what)))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"repository memory file is corrupt: {what}: {exc}") from None

    def strings(self, what: str) -> list[str]:
        code, count = self._section(what)
        if code != "S":
            raise ValueError(f"repository memory file is corrupt: {what} is not a string table")
        lengths = self._raw("I", count, what)
        blob = bytes(self._take(sum(lengths), what))
        out = []
        pos = 0
        try:
            for n in lengths:
                out.append(blob[pos : pos + n].decode("utf-8", "surrogatepass"))
                pos += n
        except UnicodeDecodeError as exc:
            raise ValueError(f"repository memory file is corrupt: {what}: {exc}") from None
        return out


def save(memory: RepoMemory, fh: typing.BinaryIO, vocabulary: int | None = None) -> None:
    """Write `memory` (under its writers' lock, taken by the caller), with the first `vocabulary`
    token strings (default: all): the ones any file can refer to."""
    w = _Writer()
    paths = list(memory._files)
    from dlm.coder_model.memory import ngram

    w.json(
        {
            "hash_fingerprint": ngram.HASH_FINGERPRINT,
            "order": memory.order,
            "max_tokens": memory.max_tokens,
            "tokens": memory._tokens,
            "files": len(paths),
        }
    )
    w.strings(memory._strings[:vocabulary] if vocabulary is not None else memory._strings)
    w.strings(paths)
    w.array(array("I", (len(memory._files[p]) for p in paths)))
    for p in paths:
        w.array(memory._files[p])
    snip = memory._snippets
    if snip.dead:
        raise RuntimeError("RepoMemory.save compacts the snippet windows before it calls persist.save")
    path_index = {p: i for i, p in enumerate(paths)}
    w.strings(list(snip.ident_ids))
    w.array(array("i", (path_index.get(p, -1) if p is not None else -1 for p in snip.win_path)))
    w.array(snip.win_start)
    w.array(array("I", (len(ids) for ids in snip.win_idents)))
    flat = array("I")
    for ids in snip.win_idents:
        flat.extend(ids)
    w.array(flat)
    # written chunk by chunk (no joined copy of the payload): the CRC and length come first
    crc = 0
    length = 0
    for chunk in w.chunks:
        crc = zlib.crc32(chunk, crc)
        length += len(chunk)
    fh.write(MAGIC)
    fh.write(_HEAD.pack(VERSION, crc, length))
    for chunk in w.chunks:
        fh.write(chunk)


def load(cls: type[RepoMemory], fh: typing.BinaryIO) -> RepoMemory:
    from dlm.coder_model.memory.ngram import DictTable, Segment, SortedTable
    from dlm.coder_model.memory.retrieve import SnippetIndex

    magic = fh.read(len(MAGIC))
    if magic != MAGIC:
        raise ValueError("not a repository memory file (wrong magic bytes): rebuild the index")
    head = fh.read(_HEAD.size)
    if len(head) != _HEAD.size:
        raise ValueError("repository memory file is truncated (in the header): rebuild the index")
    version, crc, length = _HEAD.unpack(head)
    if version != VERSION:
        raise ValueError(f"repository memory file has format version {version}, this build reads {VERSION}: rebuild the index")
    payload = fh.read(length)
    if len(payload) != length:
        raise ValueError(f"repository memory file is truncated ({len(payload)} of {length} bytes): rebuild the index")
    if zlib.crc32(payload) != crc:
        raise ValueError("repository memory file is corrupt (checksum mismatch): rebuild the index")
    r = _Reader(memoryview(payload))
    meta = r.json("header")
    from dlm.coder_model.memory import ngram

    if not isinstance(meta, dict) or meta.get("hash_fingerprint") != ngram.HASH_FINGERPRINT:
        raise ValueError(
            "repository memory file was built by a Python that hashes contexts differently "
            "(or has no fingerprint): rebuild the index"
        )
    try:
        order = int(meta["order"])
        memory = cls(max_tokens=int(meta["max_tokens"]), order=order)
        nfiles = int(meta["files"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"repository memory file is corrupt: bad header ({exc}): rebuild the index") from None
    strings = r.strings("vocabulary")
    if not strings or strings[0] != "":
        raise ValueError("repository memory file is corrupt: vocabulary does not start with the empty token")
    paths = r.strings("paths")
    lengths = r.array("I", "file lengths")
    if len(paths) != nfiles or len(lengths) != nfiles:
        raise ValueError("repository memory file is corrupt: file count does not match the header")
    files = {}
    for p, n in zip(paths, lengths):
        toks = r.array("I", "file tokens")
        if len(toks) != n or (toks and max(toks) >= len(strings)):
            raise ValueError(f"repository memory file is corrupt: tokens of {p!r} do not match the vocabulary")
        files[p] = toks
    idents = r.strings("identifiers")
    win_path = r.array("i", "window paths")
    win_start = r.array("I", "window starts")
    win_len = r.array("I", "window sizes")
    flat = r.array("I", "window identifiers")
    if not (len(win_path) == len(win_start) == len(win_len)) or sum(win_len) != len(flat):
        raise ValueError("repository memory file is corrupt: snippet windows are inconsistent")
    if r.pos != len(payload):
        raise ValueError("repository memory file is corrupt: trailing bytes after the last section")
    if any(p >= len(paths) for p in win_path) or (flat and max(flat) >= len(idents)):
        raise ValueError("repository memory file is corrupt: snippet windows point outside the tables")

    memory._strings = strings
    memory._ids = {s: i for i, s in enumerate(strings)}
    if len(memory._ids) != len(strings):
        raise ValueError("repository memory file is corrupt: duplicate tokens in the vocabulary")
    from dlm.coder_model.memory.lexer import is_line_break

    memory._breaks = bytearray(1 if is_line_break(s) else 0 for s in strings)
    memory._files = files
    memory._line_starts = {p: memory._starts_of_lines(toks) for p, toks in files.items()}
    memory._tokens = sum(len(t) for t in files.values())
    if memory._tokens:
        parts = [(p, files[p], +1) for p in paths if len(files[p])]
        table = SortedTable.build(order, [(toks, sign) for _, toks, sign in parts])
        memory._segments = (Segment(table, parts),)
    memory._delta = DictTable(order)
    snip = SnippetIndex()
    snip.ident_ids = {s: i for i, s in enumerate(idents)}
    snip.postings = [array("I") for _ in idents]
    pos = 0
    by_path: dict[str, list[int]] = {}
    for wid, (pi, start, n) in enumerate(zip(win_path, win_start, win_len)):
        ids = flat[pos : pos + n]
        pos += n
        path = paths[pi] if pi >= 0 else None
        snip.win_path.append(path)
        snip.win_start.append(start)
        snip.win_idents.append(ids)
        if path is None:
            snip.dead += 1
            continue
        by_path.setdefault(path, []).append(wid)
        for i in ids:
            snip.postings[i].append(wid)
    snip.by_path = {p: range(ws[0], ws[-1] + 1) for p, ws in by_path.items()}
    memory._snippets = snip
    return memory
