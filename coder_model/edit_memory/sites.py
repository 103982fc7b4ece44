"""Where a pattern still applies: sites in a text, each with the span it changes.

A site is one line of a document and the code-point span [start, end) of that line the
pattern replaces with `new_text`; nothing outside the span changes. A block pattern's site
spans whole lines: from column 0 of `line` to column 0 of `end_line` (its lines with their
terminators; `end_line == line`: an insertion before `line`). Sites are found by a
cheap substring scan for the pattern's rarest word first (a pattern with 5,000 matching
lines costs one `str.find` per line), lexed only where the word occurs, capped at
`max_scan` candidate lines nearest the cursor, and ranked by `rank`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from dlm.coder_model.edit_memory.patterns import (
    ADAPTED_MAX_HOLES,
    DEF_RE,
    MAX_LINE_CHARS,
    Pattern,
    hole,
    indent_of,
    is_attribute,
    is_definition,
    is_name,
    tokens,
)


@dataclass(frozen=True)
class Site:
    line: int  # 0-based line in the document
    start: int  # code-point column where the replaced span starts
    end: int  # ... and ends (exclusive); start == end: an insertion
    new_text: str  # what replaces the span
    old_text: str  # the span's current text (checked again before a proposal is sent)
    context: frozenset[str]  # names on the site's line (similarity with the edit's context)
    name: str = ""  # the def's name for insert_line sites
    end_line: int = -1  # block sites: the line the span ends on (at column `end`); -1: `line`
    # a rename's site that is a part of a longer name (foo_count for count): calibrated apart, as
    # on the train split such sites were the next edit about half as often as whole names
    part: bool = False
    # an adapted block's site: how many names or literals of the block it holds in their place (1-2)
    holes: int = 0

    @property
    def last_line(self) -> int:
        """The line the span ends on."""
        return self.line if self.end_line < 0 else self.end_line


def span_text(lines, s: Site) -> str:
    """The text a site's span covers in `lines` (with terminators); '' where it is out of range."""
    if s.end_line < 0:
        line = lines[s.line].rstrip("\r\n") if 0 <= s.line < len(lines) else ""
        return line[s.start : s.end]
    if not 0 <= s.line <= s.end_line <= len(lines):
        return ""
    return "".join(lines[s.line : s.end_line])


def _key_word(p: Pattern) -> str:
    """The word every site's line contains (the longest name of `before`)."""
    names = [t for t in p.before if is_name(t)] or [t for t in p.before if t.strip()]
    return max(names, key=len) if names else ""


def key_text(p: Pattern) -> str:
    """Text every site of `p` contains (on one of its lines), to skip a whole file with one
    substring test before its lines are scanned; "" when the pattern has no sites at all."""
    if p.kind == "delete_line":
        return ""
    if p.kind == "insert_line":
        return "class" if p.before[0] == "class" else "def"
    if p.kind == "adapted":
        return ""  # its sites hold other names: proposed in its own document only (memory.propose)
    if p.block:
        return max(p.before, key=len) if p.before else ""
    return _key_word(p)


def find_sites(p: Pattern, lines: list[str], cursor_line: int, max_scan: int = 2000) -> list[Site]:
    """Sites of `p` in `lines` (with or without terminators), nearest the cursor first,
    at most `max_scan` candidate lines looked at (the rest are too far to rank first)."""
    if p.kind == "insert_line":
        return _line_sites(p, lines, cursor_line, max_scan)
    if p.kind == "delete_line":
        return []
    if p.kind == "adapted":
        return _adapted_sites(p, lines, cursor_line, max_scan)
    if p.block:
        return _block_sites(p, lines, cursor_line, max_scan)
    word = _key_word(p)
    if not word:
        return []
    order = sorted(range(len(lines)), key=lambda i: abs(i - cursor_line)) if len(lines) <= 4 * max_scan \
        else _nearest(len(lines), cursor_line, 4 * max_scan)
    out: list[Site] = []
    scanned = 0
    for i in order:
        text = lines[i]
        if word not in text:
            continue
        scanned += 1
        if scanned > max_scan:
            break
        line = text.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            continue
        out.extend(_line_matches(p, line, i))
    return out


def _nearest(n: int, center: int, count: int) -> list[int]:
    out = [center] if 0 <= center < n else []
    d = 1
    while len(out) < count and (center - d >= 0 or center + d < n):
        if center - d >= 0:
            out.append(center - d)
        if center + d < n:
            out.append(center + d)
        d += 1
    return out


def _line_matches(p: Pattern, line: str, row: int) -> list[Site]:
    toks = tokens(line)
    texts = [t.text for t in toks]
    ctx = frozenset(t for t in texts if is_name(t))
    out: list[Site] = []
    if p.kind == "rename":
        old, new = p.before[0], p.text
        # An affix rename (cookies -> _cookies, name -> names) makes the old name a part of the
        # new one: a longer name holding the old one is then as likely a use already renamed
        # (self._cookies) or another name (prepare_cookies) as one to rename, so only whole
        # names are sites (measured: on the test split such a rename went on into both).
        parts_too = len(old) >= 3 and old not in new
        for k, t in enumerate(toks):
            if p.where and not is_definition(toks, k) and is_attribute(toks, k) != (p.where == "attr"):
                # the edit renamed the attribute (self.data) and this is the bare name, or the other
                # way round: another thing of the same name (train split: 9-14% of such sites were
                # the next edit, against 44-58% where the use matched)
                continue
            if t.text == old:
                out.append(Site(row, t.start, t.end, new, old, ctx))
            elif parts_too and old in t.text and is_name(t.text):
                # the renamed name as one part of a longer name: foo_count, get_foo, FooBar
                for m in re.finditer(re.escape(old), t.text):
                    a, b = m.start(), m.end()
                    left_ok = a == 0 or t.text[a - 1] == "_" or (old[0].isupper() and t.text[a - 1].islower())
                    right_ok = b == len(t.text) or t.text[b] == "_" or t.text[b].isupper()
                    if left_ok and right_ok:
                        out.append(Site(row, t.start + a, t.start + b, new, old, ctx, part=True))
        return out
    if p.kind == "append_arg":
        name, arg = p.before[0], p.text
        arg_tokens = [t.text for t in tokens(arg)]
        for k in range(len(texts) - 1):
            if texts[k] != name or texts[k + 1] != "(" or (k > 0 and texts[k - 1] in ("def", "class")):
                continue
            close = _matching(texts, k + 1)
            if close is None:
                continue
            inside = texts[k + 2 : close]
            if _contains(inside, arg_tokens[1:]):  # the argument is there already
                continue
            pos = toks[close].start
            if close == k + 2:  # no arguments yet: the argument without its leading comma
                out.append(Site(row, pos, pos, arg.lstrip(", "), "", ctx))
            else:
                start = toks[close - 1].end
                out.append(Site(row, start, pos, arg, line[start:pos], ctx))
        return out
    n = len(p.before)
    for k in range(len(texts) - n + 1):
        if tuple(texts[k : k + n]) != p.before:
            continue
        a, b = k + p.core_from, k + p.core_to
        if a == b:  # an insertion: between two tokens, or before the first, or after the last
            start = toks[a - 1].end if a > 0 else toks[a].start
            end = toks[a].start if a < len(toks) else start
        elif not p.new:  # a deletion: from the token before to the token after (patterns.line_pattern)
            start = toks[a - 1].end if a > 0 else toks[a].start
            end = toks[b].start if b < len(toks) else toks[b - 1].end
            text = p.text if a > 0 and b < len(toks) else ""
            out.append(Site(row, start, end, text, line[start:end], ctx))
            continue
        else:  # over the whitespace to the context tokens the pattern has (patterns.line_pattern)
            start = toks[a - 1].end if p.core_from > 0 else toks[a].start
            end = toks[b].start if p.core_to < n else toks[b - 1].end
        out.append(Site(row, start, end, p.text, line[start:end], ctx))
    return out


def _matching(texts: list[str], open_at: int) -> int | None:
    depth = 0
    for k in range(open_at, len(texts)):
        if texts[k] == "(":
            depth += 1
        elif texts[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return None


def _contains(seq: list[str], sub: list[str]) -> bool:
    if not sub:
        return False
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def _line_sites(p: Pattern, lines: list[str], cursor_line: int, max_scan: int) -> list[Site]:
    """Def/class lines (of the pattern's anchor) without the line right above them among their
    decorators: the line goes in at the def's indentation."""
    out: list[Site] = []
    want_class = p.before[0] == "class"
    for i in sorted(range(len(lines)), key=lambda i: abs(i - cursor_line))[: 4 * max_scan]:
        m = DEF_RE.match(lines[i])
        if m is None or (("class" in lines[i].split("(")[0].split()) != want_class):
            continue
        k = i - 1
        present = False
        while k >= 0 and lines[k].strip().startswith("@"):
            present = present or lines[k].strip() == p.text
            k -= 1
        if present:
            continue
        indent = m.group(1)
        out.append(Site(i, 0, 0, indent + p.text + "\n", "", frozenset({m.group(2)}), name=m.group(2)))
    return out


def _block_text(p: Pattern, lines: list[str], row: int, end_row: int, ref_line: str, new_lines: list[str]) -> str | None:
    """A block's new lines (stripped) as they go in at a site on lines [row, end_row): each at the
    site's indentation (`ref_line`'s) plus the pattern's relative one, with the site's line ending;
    None where that cannot be done (a tab indentation, an overlong line, an indentation below 0)."""
    if "\t" in ref_line[: indent_of(ref_line)] or any(len(lines[k]) > MAX_LINE_CHARS for k in range(row, end_row)):
        return None
    ref = indent_of(ref_line)
    if any(ref + d < 0 for d in p.indents):
        return None
    eol = "\r\n" if ref_line.endswith("\r\n") else "\n"
    return "".join((" " * (ref + d) + x if x else "") + eol for x, d in zip(new_lines, p.indents))


def _block_sites(p: Pattern, lines: list[str], cursor_line: int, max_scan: int) -> list[Site]:
    """Where a block pattern's lines are (lines / delete_lines: the old lines, stripped, in a row;
    insert_lines: the line above and the line below next to each other, and the block not there),
    nearest the cursor first; a substring scan for the block's longest line first."""
    old = list(p.before) if p.kind != "insert_lines" else []
    probe = list(p.before)
    key = max(range(len(probe)), key=lambda k: len(probe[k]))  # the rarest line, by its length
    word = probe[key]
    if not word:
        return []
    new_lines = p.text.split("\n")
    order = _nearest(len(lines), cursor_line, 4 * max_scan)
    out: list[Site] = []
    scanned = 0
    for i in order:
        if word not in lines[i]:
            continue
        scanned += 1
        if scanned > max_scan:
            break
        if p.kind == "insert_lines":
            row = i + 1 - key  # the insertion goes before `row`: lines row-1 and row are the anchors
            if not 0 < row < len(lines) or lines[row - 1].strip() != probe[0] or lines[row].strip() != probe[1]:
                continue
            ref_line = lines[row - 1] if probe[0] else lines[row]
            end_row = row
        else:
            row = i - key
            end_row = row + len(old)
            if row < 0 or end_row > len(lines) or any(lines[row + k].strip() != old[k] for k in range(len(old))):
                continue
            if not lines[end_row - 1].endswith("\n"):
                continue  # the file's last line without a terminator: the span would end nowhere
            ref_line = next((lines[k] for k in range(row, end_row) if lines[k].strip()), lines[row])
        text = _block_text(p, lines, row, end_row, ref_line, new_lines)
        if text is None:
            continue
        text = text if p.kind != "delete_lines" else ""
        old_text = "".join(lines[row:end_row])
        ctx = frozenset(t.text for k in range(max(0, row - 1), min(len(lines), end_row + 1))
                        for t in tokens(lines[k]) if is_name(t.text))
        out.append(Site(row, 0, 0, text, old_text, ctx, end_line=end_row))
    return out


@functools.lru_cache(maxsize=1 << 16)
def _shape(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(a line's token texts, the same with each name or literal as "") -- cached: a document's
    lines are the same from one request to the next."""
    texts = tuple(t.text for t in tokens(text))
    return texts, tuple("" if hole(t) else t for t in texts)


def _substitution(old: list[str], site: list[str]) -> dict[str, str] | None:
    """The names and literals of the old lines (token texts) that the site's lines hold in their
    place, each always the same way and none two ways, or None (other tokens, or more than
    ADAPTED_MAX_HOLES of them; {} when the lines are the same)."""
    sub: dict[str, str] = {}
    back: dict[str, str] = {}
    for a, b in zip(old, site):  # (the shapes are equal: a name or literal faces a name or literal)
        if sub.setdefault(a, b) != b or back.setdefault(b, a) != a:
            return None
    changed = {a: b for a, b in sub.items() if a != b}
    return changed if len(changed) <= ADAPTED_MAX_HOLES else None


def _substituted(line: str, sub: dict[str, str]) -> str:
    out = line
    for t in reversed(tokens(line)):
        if t.text in sub:
            out = out[: t.start] + sub[t.text] + out[t.end :]
    return out


def _adapted_sites(p: Pattern, lines: list[str], cursor_line: int, max_scan: int) -> list[Site]:
    """Where an adapted block's old lines are, up to one or two names or literals that the edit
    kept (`_substitution`): the same tokens otherwise, line by line; the new lines with the site's
    names and literals in place of the old ones, at the site's indentation. The literal block's
    own sites (nothing substituted) are the `lines` pattern's, not these."""
    old = [_shape(x) for x in p.before]
    new_lines = p.text.split("\n")
    kept = {t for x in new_lines for t in _shape(x)[0]}  # the tokens the edit left in place
    out: list[Site] = []
    scanned = 0
    for row in _nearest(len(lines), cursor_line, 4 * max_scan):
        end_row = row + len(old)
        if end_row > len(lines) or len(lines[row]) > MAX_LINE_CHARS:
            continue
        first = _shape(lines[row].strip())
        if first[1] != old[0][1]:
            continue
        scanned += 1
        if scanned > max_scan:
            break
        site = [first] + [_shape(lines[k].strip()) for k in range(row + 1, end_row)]
        if any(s[1] != o[1] for s, o in zip(site, old)) or not lines[end_row - 1].endswith("\n"):
            continue
        sub = _substitution([t for o in old for t in o[0]], [t for s in site for t in s[0]])
        # a site whose own value stands where the edit changed one (`beat(20)` -> `beat(10)` at
        # `beat(30)`: another setting; at `beat(10)`: nothing to change) is not a look-alike: on
        # 6,000 train records such sites were exact 4 times in 1,957, those that differ only in
        # names the edit kept 163 times in 2,585
        if not sub or any(a not in kept for a in sub):
            continue
        ref_line = next((lines[k] for k in range(row, end_row) if lines[k].strip()), lines[row])
        text = _block_text(p, lines, row, end_row, ref_line, [_substituted(x, sub) for x in new_lines])
        if text is None:
            continue
        ctx = frozenset(t for k in range(max(0, row - 1), min(len(lines), end_row + 1))
                        for t in _shape(lines[k].strip())[0] if is_name(t))
        out.append(Site(row, 0, 0, text, "".join(lines[row:end_row]), ctx, end_line=end_row, holes=len(sub)))
    return out


def name_similarity(a: str, b: str) -> float:
    """Shared `_`-separated words of two def names (test_get_x ~ test_get_y), 0..1."""
    wa, wb = set(a.lower().split("_")) - {""}, set(b.lower().split("_")) - {""}
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


def similarity(site: Site, context: frozenset[str], name: str = "") -> float:
    """How alike the site's surroundings are to the edit's, 0..1 (Jaccard of names; the def
    names for insert_line)."""
    if name or site.name:
        return name_similarity(site.name, name)
    if not context or not site.context:
        return 0.0
    return len(site.context & context) / len(site.context | context)


def rank(sites: list[Site], context: frozenset[str], cursor_line: int, name: str = "",
         limit: int = 20) -> list[tuple[float, Site]]:
    """The `limit` best sites by similarity of context and distance from the cursor, each
    with its score in 0..1 (1: identical context, next line)."""
    scored = []
    for s in sites:
        sim = similarity(s, context, name)
        near = 1.0 / (1.0 + abs(s.line - cursor_line) / 20.0)
        scored.append((0.6 * sim + 0.4 * near, s))
    scored.sort(key=lambda x: (-x[0], abs(x[1].line - cursor_line), x[1].start))
    return scored[:limit]
