"""Which sorted tables the memory merges next (index._merge_group): TIER tables of one size tier
unless together they pass MERGE_MAX_TOKENS (a merge holds inputs and output at once); past
MAX_SEGMENTS tables, the two adjacent ones smallest together; everything on a full compact.

`_merge_group` reads only each segment's `.size`, so fake segments carry just that (checked
against real Segment objects in the last test)."""

from __future__ import annotations

import random
from array import array
from types import SimpleNamespace

import pytest
from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory import index as index_mod
from dlm.coder_model.memory.index import MAX_SEGMENTS, MERGE_MAX_TOKENS, TIER, _merge_group, _tier


def segs(*sizes: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(size=n) for n in sizes]


def test_constants_are_what_the_tests_assume():
    assert TIER == 4 and MAX_SEGMENTS == 8 and MERGE_MAX_TOKENS == 4_000_000


def test_one_tier_merges_when_small_enough():
    n = 900_000
    assert _tier(n) == _tier(n * 1.2)
    assert _merge_group(segs(n, n, n, n), full=False) == (0, 4)
    assert sum([n] * 4) <= MERGE_MAX_TOKENS


def test_one_tier_over_merge_max_tokens_does_not_merge():
    n = 1_200_000  # four of them: 4.8M tokens, over MERGE_MAX_TOKENS, all one tier
    assert len({_tier(n), _tier(n + 1), _tier(n + 2), _tier(n + 3)}) == 1
    assert 4 * n > MERGE_MAX_TOKENS
    assert _merge_group(segs(n, n + 1, n + 2, n + 3), full=False) is None
    # up to MAX_SEGMENTS of them stay apart
    assert _merge_group(segs(*[n] * MAX_SEGMENTS), full=False) is None
    # an earlier small group of one tier still merges (the later large one is skipped)
    assert _merge_group(segs(50_000, 50_000, 50_000, 50_000, n, n, n, n), full=False) == (0, 4)


def test_past_max_segments_the_two_adjacent_smallest_together_merge():
    # tiers interleaved (tier 1, tier 0, ...): never TIER tables of one tier in a row
    sizes = [300_000, 50_000] * 4 + [300_000]
    assert len(sizes) == MAX_SEGMENTS + 1
    tiers = [_tier(n) for n in sizes]
    assert all(len(set(tiers[i : i + TIER])) > 1 for i in range(len(sizes) - TIER + 1))
    sizes[5] = 40_000  # (300k, 40k) pairs are smallest at 4 and 5 (tie: the first)
    assert _merge_group(segs(*sizes), full=False) == (4, 6)
    sizes[4] = 200_000  # now the pair (40k, 300k) at 5 and 6 is not smaller; (200k, 40k) is at 4
    assert _merge_group(segs(*sizes), full=False) == (4, 6)
    sizes[6] = 100_000  # (40k, 100k) at 5 and 6
    assert _merge_group(segs(*sizes), full=False) == (5, 7)
    # at MAX_SEGMENTS tables, nothing merges
    assert _merge_group(segs(*sizes[:MAX_SEGMENTS]), full=False) is None


def test_past_max_segments_no_pair_over_merge_max_tokens_merges():
    n = 2_100_000  # any two together pass MERGE_MAX_TOKENS
    assert _merge_group(segs(*[n] * (MAX_SEGMENTS + 3)), full=False) is None
    sizes = [n] * (MAX_SEGMENTS + 1)
    sizes[-1] = 1_000_000  # the last pair fits: 3.1M
    assert _merge_group(segs(*sizes), full=False) == (MAX_SEGMENTS - 1, MAX_SEGMENTS + 1)


def test_a_full_compact_merges_everything_whatever_the_size():
    big = [5_000_000, 9_000_000, 3_000_000]
    assert sum(big) > MERGE_MAX_TOKENS
    assert _merge_group(segs(*big), full=True) == (0, 3)
    assert _merge_group(segs(*[1_200_000] * 4), full=True) == (0, 4)
    assert _merge_group(segs(10), full=True) is None
    assert _merge_group(segs(), full=True) is None


@pytest.mark.parametrize("seed", range(5))
def test_merging_as_the_memory_does_never_makes_a_table_over_the_limit(seed):
    """Seal after seal (query-time and bulk seal sizes, now and then a huge file), merged as
    _compact_locked merges: no merge output passes MERGE_MAX_TOKENS, and past MAX_SEGMENTS
    tables a pair that fits always merges."""
    rng = random.Random(seed)
    tables: list[int] = []
    for _ in range(300):
        tables.append(rng.choice([40_000, 45_000, 250_000, 260_000, 900_000, 5_000_000]))
        while True:
            group = _merge_group(segs(*tables), full=False)
            if group is None:
                break
            lo, hi = group
            assert hi - lo >= 2
            merged = sum(tables[lo:hi])
            assert merged <= MERGE_MAX_TOKENS, f"a merge made a table of {merged} tokens"
            tables[lo:hi] = [merged]
        if len(tables) > MAX_SEGMENTS:
            pairs = [tables[i] + tables[i + 1] for i in range(len(tables) - 1)]
            assert min(pairs) > MERGE_MAX_TOKENS, "a fitting pair was left unmerged past MAX_SEGMENTS"


def test_real_segments_merge_under_a_small_limit(monkeypatch):
    """The memory itself, with MERGE_MAX_TOKENS made small: no merged table passes it, and a
    full compact still makes one table."""
    limit = 3_000
    monkeypatch.setattr(index_mod, "MERGE_MAX_TOKENS", limit)
    mem = RepoMemory()
    rng = random.Random(0)
    seal_max = 0
    for i in range(60):
        words = " ".join(f"name_{rng.randrange(300)}" for _ in range(rng.randrange(100, 700)))
        mem.update_file(f"f{i}.py", f"x_{i} = [{words}]\n")
        seal_max = max(seal_max, len(mem._files[f"f{i}.py"]))
        mem.compact(full=False)
        sizes = [s.size for s in mem._segments]
        assert [s.size for s in mem._segments] == [sum(len(t) for _, t, _ in s.parts) for s in mem._segments]
        over = [n for n in sizes if n > max(limit, seal_max)]
        assert not over, f"tables over the limit: {over} (all: {sizes})"
        assert _merge_group(mem._segments, full=False) is None
    assert len(mem._segments) > 1
    tokens = mem.tokens
    mem.compact(full=True)
    assert len(mem._segments) == 1
    assert mem._segments[0].size == tokens
    assert isinstance(mem._segments[0].parts[0][1], array)
