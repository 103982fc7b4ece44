"""Token n-gram counts: hashed contexts, compact sorted tables, smoothing, beam search.

A context of order k is the k-1 tokens before a position, hashed into 40
bits by a chain that starts at the nearest token and walks back, so the
keys of all orders of one position come out of one pass. Counts live in
two kinds of table with the same `lookup`:

- `SortedTable`: arrays sorted by context, successors of a context sorted
  by count, built by sorting hashed keys (no per-n-gram Python object
  survives the build). A context seen with one successor costs 8 bytes, one
  with several 12 bytes plus 8 per successor. Counts are signed: a table built from a file's
  removal subtracts.
- `DictTable`: dicts, for small, changing token streams (the current file,
  an open buffer, the changes since the last sealed table).

Probabilities: counts of all levels (current file, open buffers, retrieved
windows, workspace) are merged per order with a weight per level, then
smoothed by interpolated Witten-Bell from order 1 up to the longest context
seen. Tables of one query may differ in order (the local levels count longer
contexts than the workspace): a table is asked only up to its own.

Building (`SortedTable.build` from token streams, `SortedTable.merge` of
tables, whose counts add up) runs in numpy: the chain hash is CPython's
hash((h, t)) computed bit for bit on uint64 arrays (checked against the
interpreter once; otherwise the interpreter's own hash is used), keys are
sorted with numpy's in-place sort, and counting, grouping and ordering run
over SLICE_ENTRIES entries at a time. The numpy calls run in C without the
GIL and each is short, so the event loop is never held up for long, and a
build holds 16 bytes a token (chain, sorted keys) plus one slice beyond the
table it makes; no per-position Python object exists. A merge still holds
the old tables and the new one at once.
"""

from __future__ import annotations

import heapq
import itertools
import math
import typing
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

CTX_BITS = 40  # context keys: 40 bits of the chain hash
CTX_MASK = (1 << CTX_BITS) - 1
SEED = 0x2545F4914F6CDD1D
LOW_MASK = (1 << 32) - 1  # the low half of a context key, stored; its high bits pick a bucket
BUCKETS = 1 << (CTX_BITS - 32)
SINGLE_MAX_COUNT = 0xFF  # a one-successor context's count shares a 32-bit word with its token
TOKEN_BITS = 24  # token ids in a combined (context, token) sort key
MAX_TOKEN_ID = (1 << TOKEN_BITS) - 1
BOS = 0  # token id 0: the empty string, pads contexts before a file's first token
# Every table state gets a fresh serial (a DictTable on each change): cached answers are keyed by them.
_serials = itertools.count(1)
# The chain uses CPython's hash of a pair of ints: deterministic (no per-process salt, unlike
# str), C-fast, and well mixed. A saved index records this fingerprint and is rebuilt if an
# interpreter hashes differently.
HASH_FINGERPRINT = hash((SEED, 1)) & CTX_MASK


def order_keys(ctx: Sequence[int], order: int) -> list[int]:
    """Context keys of orders 1..order for the position after `ctx` (keys[k-1] is order k)."""
    h = SEED
    keys = [h & CTX_MASK]
    n = len(ctx)
    for j in range(1, order):
        h = hash((h, ctx[n - j] if j <= n else BOS))
        keys.append(h & CTX_MASK)
    return keys


def file_key_columns(tokens: Sequence[int], order: int) -> Iterable[list[int]]:
    """For k = 1..order, the order-k context key of every position of `tokens` (a file from its start)."""
    n = len(tokens)
    h: list[int] = [SEED] * n
    yield [SEED & CTX_MASK] * n
    padded = [BOS] * (order - 1) + list(tokens)
    for j in range(1, order):
        # the token j places back from each position
        col = padded[order - 1 - j : order - 1 - j + n]
        h = [hash(pair) for pair in zip(h, col)]
        yield [a & CTX_MASK for a in h]


@dataclass(frozen=True, slots=True)
class Stats:
    """What one table knows after one context: total count, distinct successors, top successors."""

    total: int
    types: int
    top: Sequence[tuple[int, int]]  # (token, count), most frequent first


class DictTable:
    """Counts in dicts, for small token streams that change; signed counts allowed."""

    __slots__ = ("_sorted", "order", "serial", "succ", "tokens")

    def __init__(self, order: int) -> None:
        self.order = order
        self.serial = next(_serials)
        # context key -> {successor: count}, or the successor's id alone for a context seen once
        self.succ: list[dict[int, dict[int, int] | int]] = [{} for _ in range(order)]
        self._sorted: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}
        self.tokens = 0

    def add(self, tokens: Sequence[int], sign: int = 1, history: Sequence[int] = ()) -> None:
        """Count `tokens` (with `history`, the tokens before them, as context); sign -1 subtracts."""
        self._sorted.clear()
        self.serial = next(_serials)
        self.tokens += sign * len(tokens)
        if not tokens:
            return
        # `history` is every token before `tokens` (from the stream's start): pad it as a file start
        ctx = list(history[-(self.order - 1) :]) if self.order > 1 else []
        ctx = [BOS] * ((self.order - 1) - len(ctx)) + ctx
        stream = ctx + list(tokens)
        offset = len(ctx)
        toks = stream[offset:]
        for k, col in enumerate(file_key_columns(stream, self.order)):
            succ = self.succ[k]
            ctxs = col[offset:]
            if not succ and sign > 0:
                self._fill_fresh(succ, ctxs, toks)
                continue
            # count in C (Counter over pairs), then one Python step per distinct n-gram
            for (key, t), c in Counter(zip(ctxs, toks)).items():
                c *= sign
                d = succ.get(key)
                if d is None:
                    succ[key] = {t: c}
                    continue
                if type(d) is int:  # a context seen once, stored as its one successor
                    d = succ[key] = {d: 1}
                c += d.get(t, 0)
                if c:
                    d[t] = c
                else:
                    del d[t]
                    if not d:
                        del succ[key]

    @staticmethod
    def _fill_fresh(succ: dict, ctxs: list[int], toks: list[int]) -> None:
        """Counts of an empty order: a context seen once (most of them at the longer orders) is
        stored as its successor's id, in C (dict over pairs); only repeated ones get a dict."""
        seen = Counter(ctxs)
        succ.update(zip(ctxs, toks))  # the last successor of each context
        if len(seen) == len(ctxs):
            return
        repeated = {key for key, c in seen.items() if c > 1}
        for key in repeated:
            succ[key] = {}
        for key, t in zip(ctxs, toks):
            if key in repeated:
                d = succ[key]
                d[t] = d.get(t, 0) + 1

    def lookup(self, k: int, key: int, limit: int) -> Stats | None:
        d = self.succ[k - 1].get(key)
        if d is None or d == {}:
            return None
        if type(d) is int:
            return Stats(1, 1, [(d, 1)])
        got = self._sorted.get((k, key))
        if got is None:
            # totals and order are computed for the contexts asked only, once per table state
            if len(d) == 1:
                top = list(d.items())
            else:
                top = heapq.nlargest(1024, d.items(), key=lambda kv: kv[1])
            got = self._sorted[(k, key)] = (sum(d.values()), top)
        return Stats(got[0], len(d), got[1][:limit])

    def entries(self) -> int:
        return sum(1 if type(d) is int else len(d) for s in self.succ for d in s.values())


class SortedTable:
    """Counts in arrays sorted by context key; successors by count. Immutable once built.

    Per order, a context key's top CTX_BITS - 32 bits pick a bucket (`*_bucket`:
    where each bucket starts) and its low 32 bits are stored. A context seen with
    one successor, 1 to SINGLE_MAX_COUNT times (most contexts at the longer
    orders), keeps only its key and (token << 8 | count): 8 bytes. Any other
    context costs 12 bytes plus 8 per successor (`offsets` into
    `succ_tok`/`succ_cnt`, `totals`).
    """

    __slots__ = (
        "bucket",
        "keys",
        "offsets",
        "order",
        "serial",
        "single_bucket",
        "single_keys",
        "single_succ",
        "succ_cnt",
        "succ_tok",
        "tokens",
        "totals",
    )

    def __init__(self, order: int) -> None:
        self.order = order
        self.serial = next(_serials)
        self.single_keys = [array("I") for _ in range(order)]
        self.single_succ = [array("I") for _ in range(order)]  # token << 8 | count
        self.single_bucket = [array("I", [0] * (BUCKETS + 1)) for _ in range(order)]
        self.keys = [array("I") for _ in range(order)]
        self.bucket = [array("I", [0] * (BUCKETS + 1)) for _ in range(order)]
        self.offsets = [array("I", [0]) for _ in range(order)]
        self.totals = [array("i") for _ in range(order)]
        self.succ_tok = [array("I") for _ in range(order)]
        self.succ_cnt = [array("i") for _ in range(order)]
        self.tokens = 0  # signed: tokens added minus tokens removed

    @classmethod
    def build(cls, order: int, parts: Sequence[tuple[Sequence[int], int]],
              pause: Callable[[], None] | None = None) -> SortedTable:
        """Count every (token stream, sign) part; each stream is a whole file from its start.

        Per order: the hash chain of every position (8 bytes a token), the
        (context, token) keys of the positive and the negative parts sorted in
        one uint64 array each (8 bytes a token), then counted slice by slice
        (`_fill_order`). Nothing per position is a Python object. `pause` is
        called between slices (the caller may wait there for readers).
        """
        np = _numpy()
        table = cls(order)
        table.tokens = sum(sign * len(toks) for toks, sign in parts)
        parts = [(_as_u32(np, toks), sign) for toks, sign in parts if len(toks)]
        if not parts:
            return table
        chains = [np.full(len(toks), SEED, dtype=np.uint64) for toks, _ in parts]
        runs: list[tuple[typing.Any, int]] = []
        for sign in (1, -1):
            n = sum(len(toks) for toks, s in parts if s == sign)
            if n:
                runs.append((np.empty(n, dtype=np.uint64), sign))
        for k in range(order):
            at = {1: 0, -1: 0}
            for f, (toks, sign) in enumerate(parts):
                if pause is not None and len(toks) >= PAUSE_TOKENS:
                    pause()
                if k:
                    _chain_back(np, chains[f], toks, k)
                run = next(r for r, s in runs if s == sign)
                _combined_into(np, run[at[sign] : at[sign] + len(toks)], chains[f], toks)
                at[sign] += len(toks)
            for run, _ in runs:
                if pause is not None:
                    pause()
                run.sort()  # numpy's sort: in place, in C, without the GIL (but on a core)
            table._fill_order(k, runs, (), pause)
        return table

    @classmethod
    def merge(cls, order: int, tables: Sequence[SortedTable], pause: Callable[[], None] | None = None) -> SortedTable:
        """The table of all `tables`' parts together: counts of equal (context, token) keys add up
        (zeros dropped), as `build` over their parts would count them."""
        table = cls(order)
        table.tokens = sum(t.tokens for t in tables)
        for k in range(order):
            table._fill_order(k, (), [t for t in tables if t.entries_of(k)], pause)
        return table

    def _fill_order(self, k: int, runs: Sequence[tuple[typing.Any, int]], tables: Sequence[SortedTable],
                    pause: Callable[[], None] | None = None) -> None:
        """Arrays of order k from sorted (context << TOKEN_BITS | token) key runs (each occurrence
        counts its run's sign) and from tables' order-k entries, SLICE_ENTRIES at a time: the
        context key space is cut into equal ranges (keys are hashes, spread evenly), and each
        range is counted, sorted and appended on its own, so the memory beyond the output is
        bounded by a slice and no numpy call runs long on the GIL."""
        np = _numpy()
        total = sum(len(r) for r, _ in runs) + sum(t.entries_of(k) for t in tables)
        if not total:
            return
        slices = max(1, -(-total // SLICE_ENTRIES))
        bounds = [(i * (1 << CTX_BITS)) // slices for i in range(slices + 1)]
        rcuts = [np.searchsorted(r, np.array(bounds[:-1] + [0], dtype=np.uint64) << np.uint64(TOKEN_BITS)) for r, _ in runs]
        for rc, (r, _) in zip(rcuts, runs):
            rc[-1] = len(r)
        single_per_bucket = np.zeros(BUCKETS, dtype=np.int64)
        multi_per_bucket = np.zeros(BUCKETS, dtype=np.int64)
        for i in range(slices):
            if pause is not None:
                pause()
            combs = []
            cnts = []
            for rc, (r, sign) in zip(rcuts, runs):
                seg = r[rc[i] : rc[i + 1]]
                if not len(seg):
                    continue
                starts = np.flatnonzero(seg[1:] != seg[:-1]) + 1
                starts = np.concatenate((np.zeros(1, dtype=starts.dtype), starts))
                combs.append(seg[starts])
                cnts.append(np.diff(np.append(starts, len(seg))) * sign)
            for t in tables:
                t._entries_between(np, k, bounds[i], bounds[i + 1], combs, cnts)
            if not combs:
                continue
            if len(combs) == 1 and not tables:
                comb, cnt = combs[0], cnts[0]
            else:
                comb = np.concatenate(combs)
                cnt = np.concatenate(cnts)
                by = np.argsort(comb, kind="stable")
                comb = comb[by]
                cnt = cnt[by]
                starts = np.flatnonzero(comb[1:] != comb[:-1]) + 1
                starts = np.concatenate((np.zeros(1, dtype=starts.dtype), starts))
                comb = comb[starts]
                cnt = np.add.reduceat(cnt, starts)
                keep = cnt != 0
                comb = comb[keep]
                cnt = cnt[keep]
            del combs, cnts
            m = len(comb)
            if not m:
                continue
            ctxs = comb >> np.uint64(TOKEN_BITS)
            toks = (comb & np.uint64(MAX_TOKEN_ID)).astype(np.uint32)
            del comb
            starts = np.flatnonzero(ctxs[1:] != ctxs[:-1]) + 1
            starts = np.concatenate((np.zeros(1, dtype=starts.dtype), starts))
            sizes = np.diff(np.append(starts, m))
            # successors of a context by count, most first; equal counts keep the token order
            group = np.zeros(m, dtype=np.int64)
            group[starts[1:]] = 1
            np.cumsum(group, out=group)
            by = np.argsort((group << 32) | ((1 << 31) - 1 - cnt), kind="stable")
            del group
            cnt = cnt[by]
            toks = toks[by]
            first = cnt[starts]
            one = (sizes == 1) & (first >= 1) & (first <= SINGLE_MAX_COUNT)
            at = starts[one]
            keys = ctxs[at]
            single_per_bucket += np.bincount((keys >> np.uint64(32)).astype(np.int64), minlength=BUCKETS)
            _extend(self.single_keys[k], (keys & np.uint64(LOW_MASK)).astype(np.uint32))
            _extend(self.single_succ[k], (toks[at] << np.uint32(8)) | cnt[at].astype(np.uint32))
            many = ~one
            if not many.any():
                continue
            totals = np.add.reduceat(cnt, starts)[many]
            keys = ctxs[starts[many]]
            entry = np.repeat(many, sizes)
            base = len(self.succ_tok[k])
            multi_per_bucket += np.bincount((keys >> np.uint64(32)).astype(np.int64), minlength=BUCKETS)
            _extend(self.keys[k], (keys & np.uint64(LOW_MASK)).astype(np.uint32))
            _extend(self.offsets[k], (np.cumsum(sizes[many]) + base).astype(np.uint32))
            _extend(self.totals[k], totals.astype(np.int32))
            _extend(self.succ_tok[k], toks[entry])
            _extend(self.succ_cnt[k], cnt[entry].astype(np.int32))
        for out, per in ((self.single_bucket, single_per_bucket), (self.bucket, multi_per_bucket)):
            out[k] = array("I", [0])
            _extend(out[k], np.cumsum(per).astype(np.uint32))

    def _entries_between(self, np: typing.Any, k: int, lo: int, hi: int, combs: list, cnts: list) -> None:
        """Append this table's order-k (context << TOKEN_BITS | token) keys and counts whose
        context lies in [lo, hi) to `combs` and `cnts` (in key order within each kind)."""
        a, b = _position(self.single_bucket[k], self.single_keys[k], lo), _position(self.single_bucket[k], self.single_keys[k], hi)
        if a < b:
            ctx = _full_keys(np, self.single_bucket[k], self.single_keys[k], a, b)
            succ = np.frombuffer(self.single_succ[k], dtype=np.uint32)[a:b]
            combs.append((ctx << np.uint64(TOKEN_BITS)) | (succ >> np.uint32(8)).astype(np.uint64))
            cnts.append((succ & np.uint32(0xFF)).astype(np.int64))
        a, b = _position(self.bucket[k], self.keys[k], lo), _position(self.bucket[k], self.keys[k], hi)
        if a < b:
            off = np.frombuffer(self.offsets[k], dtype=np.uint32)
            ctx = np.repeat(_full_keys(np, self.bucket[k], self.keys[k], a, b), np.diff(off[a : b + 1]).astype(np.int64))
            e, f = int(off[a]), int(off[b])
            combs.append((ctx << np.uint64(TOKEN_BITS)) | np.frombuffer(self.succ_tok[k], dtype=np.uint32)[e:f].astype(np.uint64))
            cnts.append(np.frombuffer(self.succ_cnt[k], dtype=np.int32)[e:f].astype(np.int64))

    def lookup(self, k: int, key: int, limit: int) -> Stats | None:
        k -= 1
        b = key >> 32
        low = key & LOW_MASK
        bucket = self.single_bucket[k]
        lo, hi = bucket[b], bucket[b + 1]
        if lo < hi:
            keys = self.single_keys[k]
            i = bisect_left(keys, low, lo, hi)
            if i < hi and keys[i] == low:
                v = self.single_succ[k][i]
                c = v & 0xFF
                return Stats(c, 1, [(v >> 8, c)] if limit > 0 else [])
        bucket = self.bucket[k]
        lo, hi = bucket[b], bucket[b + 1]
        if lo == hi:
            return None
        keys = self.keys[k]
        i = bisect_left(keys, low, lo, hi)
        if i == hi or keys[i] != low:
            return None
        lo, hi = self.offsets[k][i], self.offsets[k][i + 1]
        end = min(hi, lo + limit)
        top = list(zip(self.succ_tok[k][lo:end], self.succ_cnt[k][lo:end]))
        return Stats(self.totals[k][i], hi - lo, top)

    def contexts(self, k: int) -> Iterable[tuple[int, int, list[tuple[int, int]]]]:
        """(context key, total, successors by count) of every order-k context (0-based k), by key."""
        rows = []
        for b in range(BUCKETS):
            for i in range(self.single_bucket[k][b], self.single_bucket[k][b + 1]):
                v = self.single_succ[k][i]
                rows.append(((b << 32) | self.single_keys[k][i], v & 0xFF, [(v >> 8, v & 0xFF)]))
            for i in range(self.bucket[k][b], self.bucket[k][b + 1]):
                lo, hi = self.offsets[k][i], self.offsets[k][i + 1]
                succ = list(zip(self.succ_tok[k][lo:hi], self.succ_cnt[k][lo:hi]))
                rows.append(((b << 32) | self.keys[k][i], self.totals[k][i], succ))
        rows.sort(key=lambda r: r[0])
        return rows

    def entries_of(self, k: int) -> int:
        return len(self.single_succ[k]) + len(self.succ_tok[k])

    def entries(self) -> int:
        return sum(self.entries_of(k) for k in range(self.order))

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for name in self.ARRAYS for a in getattr(self, name))

    ARRAYS = ("single_bucket", "single_keys", "single_succ", "bucket", "keys", "offsets", "totals", "succ_tok", "succ_cnt")


def _position(bucket: array, keys: array, key: int) -> int:
    """Index of the first stored context key >= `key` (a CTX_BITS key, or 1 << CTX_BITS for the end)."""
    b = key >> 32
    if b >= BUCKETS:
        return bucket[BUCKETS]
    return bisect_left(keys, key & LOW_MASK, bucket[b], bucket[b + 1])


def _full_keys(np: typing.Any, bucket: array, keys: array, a: int, b: int) -> typing.Any:
    """The CTX_BITS context keys stored at [a, b): each low half with its bucket's high bits."""
    starts = np.frombuffer(bucket, dtype=np.uint32)
    high = np.searchsorted(starts, np.arange(a, b), side="right") - 1
    return (high.astype(np.uint64) << np.uint64(32)) | np.frombuffer(keys, dtype=np.uint32)[a:b].astype(np.uint64)


def _by_value_desc(kv: tuple[int, float]) -> float:
    return -kv[1]

# --- the sorted tables' build, in numpy ---------------------------------------------------------

SLICE_ENTRIES = 1 << 17  # entries counted and sorted at once by `_fill_order`
PAUSE_TOKENS = 1 << 14  # a build pauses before hashing a part of at least this many tokens
CHAIN_CHUNK = 1 << 18  # positions hashed at once: bounds the temporaries and each call's GIL hold
_U64 = (1 << 64) - 1
_P61 = (1 << 61) - 1  # CPython's int hash modulus
_XXPRIME_1 = 11400714785074694791
_XXPRIME_2 = 14029467366897019727
_XXPRIME_5 = 2870177450012600261
_exact: bool | None = None  # whether `_pair_hash` equals this interpreter's hash((h, t))


def _numpy() -> typing.Any:
    import numpy

    return numpy


def _as_u32(np: typing.Any, toks: Sequence[int]) -> typing.Any:
    if isinstance(toks, array) and toks.typecode == "I":
        return np.frombuffer(toks, dtype=np.uint32) if len(toks) else np.zeros(0, dtype=np.uint32)
    return np.asarray(toks, dtype=np.uint32)


def _extend(out: array, values: typing.Any) -> None:
    out.frombytes(values.tobytes())


def _pair_hash(np: typing.Any, h: typing.Any, t: typing.Any) -> typing.Any:
    """CPython's hash((h, t)) (64-bit: the tuple's xxHash over int hashes mod 2**61-1) of every
    int64 `h` (given as its uint64 bits) and token id `t`, as uint64 bits."""
    u = np.uint64
    neg = (h >> u(63)).astype(bool)
    a = np.where(neg, u(0) - h, h)
    r = (a & u(_P61)) + (a >> u(61))
    r -= np.where(r >= u(_P61), u(_P61), u(0))
    lane = np.where(neg, u(0) - r, r)
    lane[lane == u(_U64)] = u(_U64 - 1)  # hash(-1) is -2
    acc = lane * u(_XXPRIME_2) + u(_XXPRIME_5)
    acc = (acc << u(31)) | (acc >> u(33))
    acc *= u(_XXPRIME_1)
    acc += t.astype(np.uint64) * u(_XXPRIME_2)
    acc = (acc << u(31)) | (acc >> u(33))
    acc *= u(_XXPRIME_1)
    acc += u(2 ^ (_XXPRIME_5 ^ 3527539))
    acc[acc == u(_U64)] = u(1546275796)  # a tuple never hashes to -1
    return acc


def _hash_is_exact(np: typing.Any) -> bool:
    global _exact
    if _exact is None:
        hs = [SEED, -1, -2, 0, 1, _P61, -_P61, _P61 + 1, -(1 << 63), (1 << 63) - 1, 0x7FFF_0123_4567_89AB]
        ts = [BOS, 1, 7, MAX_TOKEN_ID, 3, 0, 99, 12345, 5, 8, 1 << 20]
        want = np.array([hash((h, t)) for h, t in zip(hs, ts)], dtype=np.int64).view(np.uint64)
        got = _pair_hash(np, np.array(hs, dtype=np.int64).view(np.uint64), np.array(ts, dtype=np.uint64))
        _exact = bool((want == got).all())
    return _exact


def _chain_back(np: typing.Any, chain: typing.Any, toks: typing.Any, k: int) -> None:
    """One step of the chain, in place: chain[i] = hash((chain[i], the token k places before i, or BOS))."""
    n = len(chain)
    exact = _hash_is_exact(np)
    for lo in range(0, n, CHAIN_CHUNK):
        hi = min(n, lo + CHAIN_CHUNK)
        col = np.zeros(hi - lo, dtype=np.uint64)
        src_lo = lo - k
        if hi - k > 0:
            first = max(src_lo, 0)
            col[first - src_lo :] = toks[first : hi - k]
        if exact:
            chain[lo:hi] = _pair_hash(np, chain[lo:hi], col)
        else:  # an interpreter that hashes otherwise: its own hash, one pair at a time
            hs = chain[lo:hi].view(np.int64).tolist()
            chain[lo:hi] = np.array([hash(p) for p in zip(hs, col.tolist())], dtype=np.int64).view(np.uint64)


def _combined_into(np: typing.Any, out: typing.Any, chain: typing.Any, toks: typing.Any) -> None:
    """out[i] = (context key of chain[i]) << TOKEN_BITS | toks[i], CHAIN_CHUNK at a time."""
    for lo in range(0, len(chain), CHAIN_CHUNK):
        hi = min(len(chain), lo + CHAIN_CHUNK)
        np.bitwise_and(chain[lo:hi], np.uint64(CTX_MASK), out=out[lo:hi])
        out[lo:hi] <<= np.uint64(TOKEN_BITS)
        out[lo:hi] |= toks[lo:hi]


# --- probabilities ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Smoothing:
    """Tunable knobs of the memory's distribution (chosen on the development repositories)."""

    wb: float = 1.0  # Witten-Bell weight of the lower order: larger trusts long contexts less
    top: int = 12  # successors read per context per table
    first_scan: int = 600  # successors scanned for the first token when a word is half typed


class Level:
    """One level of the nested cache: tables whose counts add up, with one weight."""

    __slots__ = ("tables", "weight")

    def __init__(self, weight: float, tables: Sequence[tuple[int, DictTable | SortedTable]]) -> None:
        self.weight = weight
        self.tables = tables  # (sign, table): sign -1 subtracts (an excluded file)


# The floor under order 1: a fixed vocabulary size, not the index's (which only grows), so that
# removing a file restores exactly the probabilities from before it was added.
UNIFORM_VOCAB = 1 << 16


def next_tokens(
    levels: Sequence[Level],
    keys: Sequence[int],
    smoothing: Smoothing,
    accept: Callable[[int], bool] | None = None,
    want: int = 16,
    typed: int | None = None,
) -> list[tuple[int, float, int]]:
    """Interpolated next-token probabilities after one context: [(token, p, support)], best first.

    `keys` are the context keys of orders 1..N; `accept` restricts the
    candidates (the first token must extend what is typed of a word) and
    the result is then renormalised over the accepted ones. `typed`, the
    word as typed so far, is always a candidate then: the word may be
    complete, and new to this context.
    """
    limit = smoothing.first_scan if accept is not None else smoothing.top
    per_order: list[tuple[float, float, dict[int, float], dict[int, int]]] = []
    # a table without the order-k context has none of the longer ones: it is not asked again
    missing: set[int] = set()
    for k in range(1, len(keys) + 1):
        total = 0.0
        types = 0.0
        counts: dict[int, float] = {}
        raw: dict[int, int] = {}
        found = False
        for level in levels:
            w = level.weight
            got: list[tuple[int, Stats]] = []
            for sign, table in level.tables:
                if id(table) in missing or k > table.order:  # the local levels count longer contexts
                    continue
                st = table.lookup(k, keys[k - 1], limit)
                if st is None:
                    missing.add(id(table))
                    continue
                found = True
                total += sign * w * st.total
                got.append((sign, st))
            if not got:
                continue
            if len(got) == 1 and got[0][0] > 0:
                # one table answered (the common case): its successors as they are
                st = got[0][1]
                positive = 0
                for t, c in st.top:
                    if c > 0:
                        positive += 1
                        if accept is None or accept(t):
                            counts[t] = counts.get(t, 0.0) + w * c
                            raw[t] = raw.get(t, 0) + c
                types += w * max(0, positive + st.types - len(st.top))
                continue
            merged: dict[int, int] = {}
            unseen = 0  # successors past the lists read: they count as distinct types
            for sign, st in got:
                unseen += sign * (st.types - len(st.top))
                for t, c in st.top:
                    merged[t] = merged.get(t, 0) + sign * c
            if not merged:
                continue
            # distinct successors of the level's tables together: a file counted in one table
            # and out in another cancels (the state after a removal equals the state before)
            types += w * max(0, sum(1 for c in merged.values() if c > 0) + unseen)
            for t, c in merged.items():
                if c > 0 and (accept is None or accept(t)):
                    counts[t] = counts.get(t, 0.0) + w * c
                    raw[t] = raw.get(t, 0) + c
        if not found or total <= 0:
            break
        per_order.append((total, max(types, 1e-9), counts, raw))
    if not per_order:
        return [(typed, 1.0, 0)] if typed is not None else []
    # candidates from the longest context down, until there are `want` of them: a token that
    # only a short context proposes rarely beats one the longer contexts saw
    candidates: list[int] = []
    seen = {BOS}
    for _, _, counts, _ in reversed(per_order):
        for t, c in sorted(counts.items(), key=_by_value_desc):
            if c > 0 and t not in seen:
                seen.add(t)
                candidates.append(t)
                if len(candidates) >= want:
                    break
        if len(candidates) >= want:
            break
    if typed is not None and typed not in seen:
        candidates.append(typed)
    base = 1.0 / UNIFORM_VOCAB
    beta = smoothing.wb
    # p_k = (c_k + beta T_k p_{k-1}) / (C_k + beta T_k), as (c_k * inv + back * p_{k-1}) per order
    steps = []
    for total, types, counts, _ in per_order:
        inv = 1.0 / (total + beta * types)
        steps.append((counts.get, inv, beta * types * inv))
    raws = [raw.get for _, _, _, raw in reversed(per_order)]
    out = []
    for t in candidates:
        p = base
        for get, inv, back in steps:
            p = get(t, 0.0) * inv + back * p
        support = 0
        for get in raws:  # the count at the longest context that saw it
            r = get(t)
            if r:
                support = r
                break
        out.append((t, p, support))
    if accept is not None and out:
        z = sum(p for _, p, _ in out)
        out = [(t, p / z, s) for t, p, s in out]
    out.sort(key=lambda x: -x[1])
    return out


PRUNE = math.log(1000.0)  # a hypothesis 1000 times less likely than the best one is dropped


@dataclass(frozen=True, slots=True)
class Hypothesis:
    logp: float
    tokens: tuple[int, ...]
    text: str
    support: int


def add_mass(texts: dict[str, list[float]], text: str, prob: float, support: float) -> None:
    """Counts `text` once more in `texts` (text -> [probability, support]): the probabilities of
    the ways to it add up, its support is the largest of theirs."""
    slot = texts.get(text)
    if slot is None:
        texts[text] = [prob, support]
    else:
        slot[0] += prob
        slot[1] = max(slot[1], support)


def beam_search(
    step: Callable[[tuple[int, ...], bool], list[tuple[int, float, int]]],
    text_of: Callable[[int], str],
    partial: str,
    beam: int,
    max_tokens: int,
    is_end: Callable[[str], bool],
) -> list[tuple[str, float, int]]:
    """Whole-line continuations: [(text, probability, support)], most probable first.

    `step(generated, first)` gives the next tokens after the context plus
    `generated`; `partial` is what is typed of the first token (its
    candidates all start with it, and the text drops it). A hypothesis
    ends at a line-break token, which the text leaves out.
    """
    live = [Hypothesis(0.0, (), "", 1 << 30)]
    done: dict[str, list[float]] = {}  # text -> [probability, support]
    for depth in range(max_tokens):
        expanded: list[Hypothesis] = []
        for hyp in live:
            for t, p, support in step(hyp.tokens, depth == 0)[:beam]:
                if p <= 0:
                    continue
                s = text_of(t)
                if depth == 0:
                    s = s[len(partial) :]
                logp = hyp.logp + math.log(p)
                sup = min(hyp.support, support)
                if is_end(s):
                    # a line-break token carries only the line's trailing blanks: the text ends here
                    text = hyp.text
                    if not text.strip():
                        continue
                    add_mass(done, text, math.exp(logp), sup)
                else:
                    expanded.append(Hypothesis(logp, hyp.tokens + (t,), hyp.text + s, sup))
        if not expanded:
            break
        expanded.sort(key=lambda h: -h.logp)
        floor = expanded[0].logp - PRUNE
        live = [h for h in expanded[:beam] if h.logp >= floor]
        if len(done) >= beam:
            kth = sorted((v[0] for v in done.values()), reverse=True)[beam - 1]
            if math.exp(live[0].logp) < kth:
                break
    ranked = sorted(done.items(), key=lambda kv: -kv[1][0])[:beam]
    return [(text, prob, sup) for text, (prob, sup) in ranked]


@dataclass
class Segment:
    """A sealed table of the repository memory and the token streams it counts."""

    table: SortedTable
    parts: list[tuple[str, array, int]]  # (path, tokens, sign)

    @property
    def size(self) -> int:
        return sum(len(toks) for _, toks, _ in self.parts)
