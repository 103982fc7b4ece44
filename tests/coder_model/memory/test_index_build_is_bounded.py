"""The sorted tables' build (numpy, slice by slice) counts exactly what the per-position
Python build counted, in bounded memory, without long GIL holds.

`_reference_build` is the straightforward build: every position's hashed keys as Python
ints, sorted and counted in lists. The tables the memory builds (from token streams, by
merging tables, with removals) must hold the same arrays, so every lookup answers alike."""

from __future__ import annotations

import glob
import io
import os
import random
import threading
import time
import tracemalloc
from array import array
from collections import Counter

import pytest
from dlm.coder_model.memory import RepoMemory, ngram
from dlm.coder_model.memory import index as index_mod
from dlm.coder_model.memory.lexer import lex
from dlm.coder_model.memory.ngram import BOS, CTX_MASK, MAX_TOKEN_ID, SEED, TOKEN_BITS, SortedTable


def _reference_build(order: int, parts: list[tuple[list[int], int]]) -> dict:
    """Per order: {context key: [(token, count)] by count (most first, then token), total}."""
    out = []
    for k in range(order):
        counts: Counter[int] = Counter()
        for toks, sign in parts:
            for i, t in enumerate(toks):
                h = SEED
                for j in range(1, k + 1):
                    h = hash((h, toks[i - j] if i - j >= 0 else BOS))
                counts[((h & CTX_MASK) << TOKEN_BITS) | t] += sign
        by_ctx: dict[int, list[tuple[int, int]]] = {}
        for comb in sorted(counts):
            if counts[comb]:
                by_ctx.setdefault(comb >> TOKEN_BITS, []).append((comb & MAX_TOKEN_ID, counts[comb]))
        out.append({ctx: sorted(succ, key=lambda tc: -tc[1]) for ctx, succ in by_ctx.items()})
    return out


def _table_as_dicts(table: SortedTable) -> list[dict]:
    out = []
    for k in range(table.order):
        d = {}
        rows = table.contexts(k)
        for key, total, succ in rows:
            assert total == sum(c for _, c in succ)
            d[key] = succ
        assert [key for key, _, _ in rows] == sorted(d)
        out.append(d)
    return out


def _streams(seed: int, files: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    # a small vocabulary and repeated phrases: many contexts with several successors, ties in count
    phrases = [[rng.randrange(1, vocab) for _ in range(rng.randrange(2, 8))] for _ in range(30)]
    out = []
    for _ in range(files):
        toks: list[int] = []
        while len(toks) < length:
            toks.extend(rng.choice(phrases) if rng.random() < 0.7 else [rng.randrange(1, vocab)])
        out.append(toks[: rng.randrange(1, length + 1)])
    return out


@pytest.mark.parametrize("order", [1, 2, 6])
def test_build_from_streams_equals_the_reference_build(order: int) -> None:
    streams = _streams(order, files=7, length=900, vocab=40)
    parts = [(array("I", s), 1) for s in streams] + [(array("I", streams[2]), -1), (array("I", [5, 6]), -1)]
    parts.append((array("I"), 1))  # an empty file counts nothing
    want = _reference_build(order, [(list(t), s) for t, s in parts])
    table = SortedTable.build(order, parts)
    assert _table_as_dicts(table) == want
    assert table.tokens == sum(s * len(t) for t, s in parts)


def test_build_in_many_slices_equals_the_build_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    streams = _streams(11, files=5, length=3000, vocab=300)
    parts = [(array("I", s), 1) for s in streams] + [(array("I", streams[0]), -1)]
    whole = _table_as_dicts(SortedTable.build(6, parts))
    monkeypatch.setattr(ngram, "SLICE_ENTRIES", 97)
    monkeypatch.setattr(ngram, "CHAIN_CHUNK", 53)
    assert _table_as_dicts(SortedTable.build(6, parts)) == whole
    assert whole == _reference_build(6, [(list(t), s) for t, s in parts])


def test_merging_tables_equals_building_their_parts_together(monkeypatch: pytest.MonkeyPatch) -> None:
    streams = _streams(5, files=9, length=1500, vocab=60)
    monkeypatch.setattr(ngram, "SLICE_ENTRIES", 211)
    groups = [[(array("I", s), 1) for s in streams[i : i + 3]] for i in range(0, 9, 3)]
    groups.append([(groups[0][1][0], -1)])  # a removal sealed later cancels the file's counts
    tables = [SortedTable.build(6, g) for g in groups]
    merged = SortedTable.merge(6, tables)
    together = [p for g in groups for p in g]
    assert _table_as_dicts(merged) == _reference_build(6, [(list(t), s) for t, s in together])
    assert merged.tokens == sum(s * len(t) for t, s in together)


def _python_sources(limit_chars: int) -> list[tuple[str, str]]:
    site = os.path.join(os.path.dirname(os.__file__), "json")
    out, total = [], 0
    for path in sorted(glob.glob(os.path.join(site, "**", "*.py"), recursive=True)) + sorted(
        glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))
    ):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        out.append((os.path.relpath(path, os.path.dirname(os.__file__)), text))
        total += len(text)
        if total >= limit_chars:
            break
    return out


def _arrays(table: SortedTable) -> list:
    return [list(getattr(table, name)[k]) for name in SortedTable.ARRAYS for k in range(table.order)]


def test_merged_segments_hold_what_building_their_parts_holds() -> None:
    """The memory merges tables by their counts; each segment must hold what building its
    parts (the files it counts, in and out) holds, so every query answers as before."""
    sources = _python_sources(400_000)
    mem = RepoMemory()
    for i, (path, text) in enumerate(sources):
        mem.update_file(path, text)
        if i % 2 == 1:
            mem.compact(full=False)  # sealed apart, merged by tier
        if i % 5 == 4:
            mem.remove_file(sources[i - 2][0])
            mem.update_file(sources[i - 1][0], text[: len(text) // 2])
    segments = mem._segments
    assert any(len(s.parts) > 2 for s in segments)
    for seg in segments:
        built = SortedTable.build(mem.order, [(toks, sign) for _, toks, sign in seg.parts])
        assert _arrays(seg.table) == _arrays(built)
    queries = [text[: len(text) // 3] for _, text in sources[:40:4]]
    answers = [mem.complete(q) for q in queries]
    mem.compact(full=True)
    (whole,) = mem._segments
    built = SortedTable.build(mem.order, [(toks, sign) for _, toks, sign in whole.parts])
    assert _arrays(whole.table) == _arrays(built)
    buf = io.BytesIO()
    mem.save(buf)
    loaded = RepoMemory.load(io.BytesIO(buf.getvalue()))
    assert [loaded.complete(q) for q in queries] == [mem.complete(q) for q in queries]
    assert all(answers)


def test_big_file_lexed_in_chunks_gets_the_ids_of_lexing_it_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "".join(t for _, t in _python_sources(200_000)) + "  \r\n\r\nx = 1   "
    monkeypatch.setattr(index_mod, "LEX_CHUNK_CHARS", 777)
    mem = RepoMemory()
    mem.update_file("a.py", text)
    assert [mem._strings[i] for i in mem._files["a.py"]] == lex(text)
    # ids in first-seen order, as interning the whole token list at once gives them
    seen: dict[str, int] = {"": 0}
    for tok in lex(text):
        seen.setdefault(tok, len(seen))
    assert mem._strings == list(seen)


BUILD_TOKENS = 200_000
# tracemalloc peak of one seal of BUILD_TOKENS tokens beyond the table it builds, per token (random
# tokens: nearly every context is new, the worst case). The per-position Python build measured 208
# bytes a token here; the numpy build 84 (16 a token for the chain and the sorted keys, the rest
# one slice's temporaries, which SLICE_ENTRIES caps on larger builds).
BUILD_BYTES_PER_TOKEN = 130


def test_build_memory_per_token_is_bounded() -> None:
    rng = random.Random(3)
    toks = array("I", (rng.randrange(1, 5000) for _ in range(BUILD_TOKENS)))
    parts = [(toks[i : i + 20_000], 1) for i in range(0, BUILD_TOKENS, 20_000)]
    SortedTable.build(6, parts[:1])  # numpy imported and warm
    tracemalloc.start()
    try:
        table = SortedTable.build(6, parts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert table.tokens == BUILD_TOKENS
    extra = (peak - table.nbytes()) / BUILD_TOKENS
    assert extra < BUILD_BYTES_PER_TOKEN, f"{extra:.0f} bytes a token"


def test_build_never_holds_the_gil_long() -> None:
    rng = random.Random(4)
    parts = [(array("I", (rng.randrange(1, 20_000) for _ in range(100_000))), 1) for _ in range(4)]
    SortedTable.build(6, parts[:1])
    gaps: list[float] = []
    done = threading.Event()

    def build() -> None:
        try:
            t = SortedTable.build(6, parts)
            SortedTable.merge(6, [t, SortedTable.build(6, parts[:2])])
        finally:
            done.set()

    worker = threading.Thread(target=build)
    last = time.perf_counter()
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    # generous for a loaded machine: a build in one piece holds the GIL for seconds at this size
    assert max(gaps) < 0.25, f"longest wait {max(gaps) * 1e3:.0f} ms"


def test_saved_index_is_at_most_four_times_its_source_and_loads_the_same_tables() -> None:
    """The file holds tokens and snippets, not tables: it stays small, and the tables counted
    again on load are the ones the memory had."""
    sources = _python_sources(600_000)
    mem = RepoMemory()
    for path, text in sources:
        mem.update_file(path, text)
    buf = io.BytesIO()
    mem.save(buf)
    source_bytes = sum(len(text.encode("utf-8", "surrogatepass")) for _, text in sources)
    assert len(buf.getvalue()) <= 4 * source_bytes, (len(buf.getvalue()), source_bytes)
    loaded = RepoMemory.load(io.BytesIO(buf.getvalue()))
    (seg,) = loaded._segments
    mem.compact(full=True)
    (want,) = mem._segments
    assert _arrays(seg.table) == _arrays(want.table)
    assert loaded._line_starts == mem._line_starts


def test_a_context_seen_more_often_than_a_packed_count_holds_keeps_its_count() -> None:
    """One-successor contexts pack their count beside the token; one seen 300 times (and one
    counted negative, by a removal) must keep its exact count."""
    parts = [(array("I", [7, 8] * 300 + [9]), 1), (array("I", [3, 4, 5]), -1), (array("I", [1, 2] * 2), 1)]
    want = _reference_build(3, [(list(t), s) for t, s in parts])
    table = SortedTable.build(3, parts)
    assert _table_as_dicts(table) == want
    assert _table_as_dicts(SortedTable.merge(3, [table, SortedTable.build(3, parts[:1])])) == _reference_build(
        3, [(list(t), s) for t, s in parts + parts[:1]]
    )
    assert table.lookup(2, next(k for k, succ in want[1].items() if succ == [(8, 300)]), 4).total == 300
