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

Probabilities: counts of all levels (current file, open buffers, retrieved
windows, workspace) are merged per order with a weight per level, then
smoothed by interpolated Witten-Bell from order 1 up to the longest context
seen. Tables of one query may differ in order (the local levels count longer
contexts than the workspace): a table is asked only up to its own.
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

CTX_BITS = 40  # context keys: 40 bits of the chain hash
CTX_MASK = (1 << CTX_BITS) - 1
SEED = 0x2545F4914F6CDD1D
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
    """Counts in arrays sorted by context key; successors by count. Immutable once built."""

    __slots__ = ("keys", "offsets", "order", "serial", "succ_cnt", "succ_tok", "tokens", "totals")

    def __init__(self, order: int) -> None:
        self.order = order
        self.serial = next(_serials)
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
        parts = [(toks, sign) for toks, sign in parts if len(toks)]
        # the hash chain of every position, one order further per pass (8 bytes a token)
        chains = [array("q", [SEED]) * len(toks) for toks, _ in parts]
        for k in range(order):
            pos: list[int] = []
            neg: list[int] = []
            for f, (toks, sign) in enumerate(parts):
                if k:
                    back = list(toks[: max(len(toks) - k, 0)])
                    col = [BOS] * min(k, len(toks)) + back
                    chains[f] = array("q", [hash(pair) for pair in zip(chains[f], col)])
                (pos if sign > 0 else neg).extend(
                    [((h & CTX_MASK) << TOKEN_BITS) | t for h, t in zip(chains[f], toks)]
                )
            table._fill(k, *_signed_counts(pos, neg))
            del pos, neg
        return table

    def _fill(self, k: int, combined: list[int], counts: list[int]) -> None:
        """Arrays of order k from distinct (context << TOKEN_BITS | token) keys, sorted, and their counts."""
        m = len(combined)
        if not m:
            return
        shift = TOKEN_BITS
        ctxs = [c >> shift for c in combined]
        toks = [c & MAX_TOKEN_ID for c in combined]
        starts = [0]
        starts += [i for i in range(1, m) if ctxs[i] != ctxs[i - 1]]
        ends = starts[1:] + [m]
        totals = []
        for lo, hi in zip(starts, ends):
            if hi - lo == 1:
                totals.append(counts[lo])
                continue
            group = sorted(zip(counts[lo:hi], toks[lo:hi]), key=_by_count)
            counts[lo:hi] = [c for c, _ in group]
            toks[lo:hi] = [t for _, t in group]
            totals.append(sum(counts[lo:hi]))
        self.keys[k] = array("Q", [ctxs[i] for i in starts])
        self.offsets[k] = array("I", starts + [m])
        self.totals[k] = array("q", totals)
        self.succ_tok[k] = array("I", toks)
        self.succ_cnt[k] = array("i", counts)

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


def _by_count(ct: tuple[int, int]) -> int:
    return -ct[0]


def _by_value_desc(kv: tuple[int, float]) -> float:
    return -kv[1]


def _distinct(keys: list[int]) -> tuple[list[int], list[int]]:
    """Sort `keys` in place; (distinct keys, how many of each)."""
    keys.sort()
    n = len(keys)
    if not n:
        return [], []
    starts = [0]
    starts += [i for i in range(1, n) if keys[i] != keys[i - 1]]
    counts = [b - a for a, b in zip(starts, starts[1:] + [n])]
    return [keys[i] for i in starts], counts


def _signed_counts(pos: list[int], neg: list[int]) -> tuple[list[int], list[int]]:
    """Distinct keys and their counts: occurrences in `pos` minus occurrences in `neg`, zeros dropped."""
    keys, counts = _distinct(pos)
    if not neg:
        return keys, counts
    nkeys, ncounts = _distinct(neg)
    taken = dict(zip(nkeys, ncounts))
    for i, key in enumerate(keys):
        c = taken.pop(key, None)
        if c is not None:
            counts[i] -= c
    pairs = [(key, c) for key, c in zip(keys, counts) if c]
    if taken:
        pairs.extend((key, -c) for key, c in taken.items())
        pairs.sort()
    return [key for key, _ in pairs], [c for _, c in pairs]


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
        floor = expanded[0].logp - PRUNE
        live = [h for h in expanded[:beam] if h.logp >= floor]
        if len(done) >= beam:
            kth = sorted((v[0] for v in done.values()), reverse=True)[beam - 1]
            if math.exp(live[0].logp) < kth:
                break
    ranked = sorted(done.items(), key=lambda kv: -kv[1][0])[:beam]
    return [(text, prob, sup) for text, (prob, sup) in ranked]
