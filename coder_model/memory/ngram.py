"""Token n-gram counts: hashed contexts, compact sorted tables, smoothing, beam search.

A context of order k is the k-1 tokens before a position, hashed into 40
bits by a chain that starts at the nearest token and walks back, so the
keys of all orders of one position come out of one pass. Counts live in
two kinds of table with the same `lookup`:

- `SortedTable`: arrays sorted by context (8 bytes per context key plus 8
  per successor entry), successors of a context sorted by count, built by
  sorting hashed keys (no per-n-gram Python object survives the build).
  Counts are signed: a table built from a file's removal subtracts.
- `DictTable`: dicts, for small, changing token streams (the current file,
  an open buffer, the changes since the last sealed table).

Probabilities: counts of all levels (current file, open buffers,
workspace) are merged per order with a weight per level, then smoothed by
interpolated Witten-Bell from order 1 up to the longest context seen.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

MASK64 = (1 << 64) - 1
MULT = 0x9E3779B97F4A7C15
SEED = 0x2545F4914F6CDD1D
TOKEN_BITS = 24  # token ids in a combined (context, token) sort key
MAX_TOKEN_ID = (1 << TOKEN_BITS) - 1
BOS = 0  # token id 0: the empty string, pads contexts before a file's first token


def order_keys(ctx: Sequence[int], order: int) -> list[int]:
    """Context keys of orders 1..order for the position after `ctx` (keys[k-1] is order k)."""
    h = SEED
    keys = [h >> TOKEN_BITS]
    n = len(ctx)
    for j in range(1, order):
        t = ctx[n - j] if j <= n else BOS
        h = ((h ^ (h >> 29) ^ (t + 1)) * MULT) & MASK64
        keys.append(h >> TOKEN_BITS)
    return keys


def file_key_columns(tokens: Sequence[int], order: int) -> Iterable[list[int]]:
    """For k = 1..order, the order-k context key of every position of `tokens` (a file from its start)."""
    n = len(tokens)
    h = [SEED] * n
    yield [SEED >> TOKEN_BITS] * n
    padded = [BOS] * (order - 1) + list(tokens)
    for j in range(1, order):
        # the token j places back from each position
        col = padded[order - 1 - j : order - 1 - j + n]
        h = [((a ^ (a >> 29) ^ (b + 1)) * MULT) & MASK64 for a, b in zip(h, col)]
        yield [a >> TOKEN_BITS for a in h]


@dataclass(frozen=True, slots=True)
class Stats:
    """What one table knows after one context: total count, distinct successors, top successors."""

    total: int
    types: int
    top: Sequence[tuple[int, int]]  # (token, count), most frequent first


class DictTable:
    """Counts in dicts, for small token streams that change; signed counts allowed."""

    __slots__ = ("order", "succ", "totals", "_sorted", "tokens")

    def __init__(self, order: int) -> None:
        self.order = order
        self.succ: list[dict[int, dict[int, int]]] = [{} for _ in range(order)]
        self.totals: list[dict[int, int]] = [{} for _ in range(order)]
        self._sorted: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.tokens = 0

    def add(self, tokens: Sequence[int], sign: int = 1, history: Sequence[int] = ()) -> None:
        """Count `tokens` (with `history`, the tokens before them, as context); sign -1 subtracts."""
        self._sorted.clear()
        self.tokens += sign * len(tokens)
        if not tokens:
            return
        # `history` is every token before `tokens` (from the stream's start): pad it as a file start
        ctx = list(history[-(self.order - 1) :]) if self.order > 1 else []
        ctx = [BOS] * ((self.order - 1) - len(ctx)) + ctx
        stream = ctx + list(tokens)
        offset = len(ctx)
        for k, col in enumerate(file_key_columns(stream, self.order)):
            succ = self.succ[k]
            totals = self.totals[k]
            for i in range(offset, len(stream)):
                key = col[i]
                t = stream[i]
                d = succ.get(key)
                if d is None:
                    succ[key] = {t: sign}
                else:
                    c = d.get(t, 0) + sign
                    if c:
                        d[t] = c
                    else:
                        del d[t]
                        if not d:
                            del succ[key]
                c = totals.get(key, 0) + sign
                if c:
                    totals[key] = c
                else:
                    totals.pop(key, None)

    def lookup(self, k: int, key: int, limit: int) -> Stats | None:
        d = self.succ[k - 1].get(key)
        if not d:
            return None
        top = self._sorted.get((k, key))
        if top is None:
            if len(d) == 1:
                top = list(d.items())
            else:
                top = heapq.nlargest(256, d.items(), key=lambda kv: kv[1])
            self._sorted[(k, key)] = top
        return Stats(self.totals[k - 1].get(key, 0), len(d), top[:limit])

    def entries(self) -> int:
        return sum(len(d) for s in self.succ for d in s.values())


class SortedTable:
    """Counts in arrays sorted by context key; successors by count. Immutable once built."""

    __slots__ = ("order", "keys", "offsets", "totals", "succ_tok", "succ_cnt", "tokens")

    def __init__(self, order: int) -> None:
        self.order = order
        self.keys = [array("Q") for _ in range(order)]
        self.offsets = [array("I", [0]) for _ in range(order)]
        self.totals = [array("q") for _ in range(order)]
        self.succ_tok = [array("I") for _ in range(order)]
        self.succ_cnt = [array("i") for _ in range(order)]
        self.tokens = 0  # signed: tokens added minus tokens removed

    @classmethod
    def build(cls, order: int, parts: Sequence[tuple[Sequence[int], int]]) -> SortedTable:
        """Count every (token stream, sign) part; each stream is a whole file from its start."""
        table = cls(order)
        table.tokens = sum(sign * len(toks) for toks, sign in parts)
        for k in range(order):
            pos: list[int] = []
            neg: list[int] = []
            for toks, sign in parts:
                if not toks:
                    continue
                col = _nth(file_key_columns(toks, order), k)
                (pos if sign > 0 else neg).extend([(c << TOKEN_BITS) | t for c, t in zip(col, toks)])
            table._fill(k, _signed_runs(pos, neg))
        return table

    def _fill(self, k: int, runs: Iterable[tuple[int, int]]) -> None:
        keys, offsets, totals = self.keys[k], self.offsets[k], self.totals[k]
        succ_tok, succ_cnt = self.succ_tok[k], self.succ_cnt[k]
        cur = -1
        group: list[tuple[int, int]] = []

        def flush() -> None:
            if len(group) > 1:
                group.sort(key=lambda tc: -tc[1])
            keys.append(cur)
            total = 0
            for t, c in group:
                succ_tok.append(t)
                succ_cnt.append(c)
                total += c
            totals.append(total)
            offsets.append(len(succ_tok))

        for combined, count in runs:
            if not count:
                continue
            ctx = combined >> TOKEN_BITS
            if ctx != cur:
                if group:
                    flush()
                cur = ctx
                group = []
            group.append((combined & MAX_TOKEN_ID, count))
        if group:
            flush()

    def lookup(self, k: int, key: int, limit: int) -> Stats | None:
        keys = self.keys[k - 1]
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            return None
        lo, hi = self.offsets[k - 1][i], self.offsets[k - 1][i + 1]
        end = min(hi, lo + limit)
        top = list(zip(self.succ_tok[k - 1][lo:end], self.succ_cnt[k - 1][lo:end]))
        return Stats(self.totals[k - 1][i], hi - lo, top)

    def entries(self) -> int:
        return sum(len(s) for s in self.succ_tok)

    def nbytes(self) -> int:
        return sum(
            a.itemsize * len(a)
            for group in (self.keys, self.offsets, self.totals, self.succ_tok, self.succ_cnt)
            for a in group
        )

    ARRAYS = ("keys", "offsets", "totals", "succ_tok", "succ_cnt")


def _nth(it: Iterable[list[int]], k: int) -> list[int]:
    for i, col in enumerate(it):
        if i == k:
            return col
    raise IndexError(k)


def _runs(sorted_keys: Iterable[int]) -> Iterable[tuple[int, int]]:
    prev = -1
    count = 0
    for key in sorted_keys:
        if key == prev:
            count += 1
        else:
            if count:
                yield prev, count
            prev = key
            count = 1
    if count:
        yield prev, count


def _signed_runs(pos: list[int], neg: list[int]) -> Iterable[tuple[int, int]]:
    pos.sort()
    if not neg:
        yield from _runs(pos)
        return
    neg.sort()
    merged = heapq.merge(_runs(pos), ((k, -c) for k, c in _runs(neg)))
    prev, total = -1, 0
    for key, c in merged:
        if key == prev:
            total += c
        else:
            if total:
                yield prev, total
            prev, total = key, c
    if total:
        yield prev, total


# --- probabilities ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Smoothing:
    """Tunable knobs of the memory's distribution (chosen on the development repositories)."""

    wb: float = 1.0  # Witten-Bell weight of the lower order: larger trusts long contexts less
    top: int = 12  # successors read per context per table
    first_scan: int = 4000  # successors scanned for the first token when a word is half typed


class Level:
    """One level of the nested cache: tables whose counts add up, with one weight."""

    __slots__ = ("weight", "tables")

    def __init__(self, weight: float, tables: Sequence[tuple[int, DictTable | SortedTable]]) -> None:
        self.weight = weight
        self.tables = tables  # (sign, table): sign -1 subtracts (an excluded file)


def next_tokens(
    levels: Sequence[Level],
    keys: Sequence[int],
    vocab_size: int,
    smoothing: Smoothing,
    accept: Callable[[int], bool] | None = None,
) -> list[tuple[int, float, int]]:
    """Interpolated next-token probabilities after one context: [(token, p, support)], best first.

    `keys` are the context keys of orders 1..N; `accept` restricts the
    candidates (the first token must extend what is typed of a word) and
    the result is then renormalised over the accepted ones.
    """
    limit = smoothing.first_scan if accept is not None else smoothing.top
    per_order: list[tuple[float, float, dict[int, float], dict[int, int]]] = []
    for k in range(1, len(keys) + 1):
        total = 0.0
        types = 0.0
        counts: dict[int, float] = {}
        raw: dict[int, int] = {}
        found = False
        for level in levels:
            w = level.weight
            for sign, table in level.tables:
                st = table.lookup(k, keys[k - 1], limit)
                if st is None:
                    continue
                found = True
                total += sign * w * st.total
                types += sign * w * st.types
                for t, c in st.top:
                    if accept is not None and not accept(t):
                        continue
                    counts[t] = counts.get(t, 0.0) + sign * w * c
                    raw[t] = raw.get(t, 0) + sign * c
        if not found or total <= 0:
            break
        per_order.append((total, max(types, 1e-9), counts, raw))
    if not per_order:
        return []
    candidates: set[int] = set()
    for _, _, counts, _ in per_order:
        candidates.update(t for t, c in counts.items() if c > 0)
    candidates.discard(BOS)
    base = 1.0 / max(vocab_size, 1)
    beta = smoothing.wb
    out = []
    for t in candidates:
        p = base
        support = 0
        for total, types, counts, raw in per_order:
            c = counts.get(t, 0.0)
            if c < 0:
                c = 0.0
            p = (c + beta * types * p) / (total + beta * types)
            r = raw.get(t, 0)
            if r > 0:
                support = r
        out.append((t, p, support))
    if accept is not None and out:
        z = sum(p for _, p, _ in out)
        out = [(t, p / z, s) for t, p, s in out]
    out.sort(key=lambda x: -x[1])
    return out


@dataclass(frozen=True, slots=True)
class Hypothesis:
    logp: float
    tokens: tuple[int, ...]
    text: str
    support: int


def beam_search(
    step: Callable[[tuple[int, ...], bool], list[tuple[int, float, int]]],
    strings: Sequence[str],
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
            for t, p, support in step(hyp.tokens, depth == 0)[: beam * 2]:
                if p <= 0:
                    continue
                s = strings[t]
                if depth == 0:
                    s = s[len(partial) :]
                logp = hyp.logp + math.log(p)
                sup = min(hyp.support, support)
                if is_end(s):
                    # a line-break token carries only the line's trailing blanks: the text ends here
                    text = hyp.text
                    if not text.strip():
                        continue
                    prob = math.exp(logp)
                    slot = done.get(text)
                    if slot is None:
                        done[text] = [prob, sup]
                    else:
                        slot[0] += prob
                        slot[1] = max(slot[1], sup)
                else:
                    expanded.append(Hypothesis(logp, hyp.tokens + (t,), hyp.text + s, sup))
        if not expanded:
            break
        expanded.sort(key=lambda h: -h.logp)
        live = expanded[:beam]
        if len(done) >= beam:
            kth = sorted((v[0] for v in done.values()), reverse=True)[beam - 1]
            if math.exp(live[0].logp) < kth:
                break
    ranked = sorted(done.items(), key=lambda kv: -kv[1][0])[:beam]
    return [(text, prob, sup) for text, (prob, sup) in ranked]
