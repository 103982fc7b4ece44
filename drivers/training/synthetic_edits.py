"""Synthetic consistent edits made from real code, and no-op examples.

Kinds:
- `synthetic_edit`: rename an identifier and all its uses, add or remove a
  parameter and update the call sites, change a literal that is used at least
  twice, add a field to a class (`__init__` parameter, `self.x = x`,
  constructor calls). Each edit is a list of character sites, grouped into
  line hunks (`sites_to_hunks`) and built into a next-edit example by
  `training.hunks.build_next_edit`.
- `noop`: the region needs no change (target == region): plain code, or the
  code right after a finished synthetic edit (history = all hunks).

Pure Python (no torch), deterministic given the `random.Random` passed in.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import itertools
import keyword
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dlm.coder_model.types import Prompt
from dlm.drivers.training.examples import Example, window
from dlm.drivers.training.hunks import (
    DEFAULT_OPTIONS,
    EditOptions,
    Hunk,
    build_finished_noop,
    build_next_edit,
    shrink_to,
    split_lines,
)

# ---------------------------------------------------------------------------
# synthetic edits: sites -> hunks


@dataclass(frozen=True)
class Site:
    """Replace text[start:end] with `text` (character offsets in the whole file)."""

    start: int
    end: int
    text: str


def _line_starts(text: str) -> list[int]:
    """Offsets of the starts of split_lines(text) (no empty line after a final newline)."""
    starts = [0]
    starts.extend(itertools.accumulate(len(line) for line in split_lines(text)))
    starts.pop()
    return starts or [0]


def _line_of(starts: list[int], pos: int) -> int:
    return bisect.bisect_right(starts, pos) - 1


def sites_to_hunks(text: str, sites: list[Site], anchor: int = 0) -> tuple[list[Hunk], list[int]] | None:
    """Group character sites into line hunks; the order starts at the hunk of
    site `anchor`, then follows the file downwards, then wraps to the top."""
    if not sites:
        return None
    anchor_site = sites[min(anchor, len(sites) - 1)]
    sites = sorted(sites, key=lambda s: (s.start, s.end))
    for x, y in itertools.pairwise(sites):
        if y.start < x.end:
            return None  # overlapping sites
    starts = _line_starts(text)
    lines = split_lines(text)
    groups: list[list] = []  # [first line, last line (first - 1 for a whole-line insertion), sites]
    for s in sites:
        first = _line_of(starts, s.start)
        if s.start == s.end and s.start == starts[first] and s.text.endswith("\n"):
            last = first - 1  # whole-line insertion before line `first`
        else:
            last = _line_of(starts, max(s.start, s.end - 1))
        if groups:
            gf, gl, gs = groups[-1]
            # same line, or a site on the line an insertion group goes before
            if first <= gl or (gl < gf and first == gf):
                groups[-1][1] = max(gl, last)
                gs.append(s)
                continue
        groups.append([first, last, [s]])
    hunks: list[Hunk] = []
    site_group: dict[int, int] = {}
    for gi, (first, last, gsites) in enumerate(groups):
        span_a = starts[first] if first < len(starts) else len(text)
        span_b = starts[last + 1] if last + 1 < len(starts) else len(text)
        if last < first:
            span_b = span_a
        piece = text[span_a:span_b]
        for s in sorted(gsites, key=lambda s: s.start, reverse=True):
            piece = piece[: s.start - span_a] + s.text + piece[s.end - span_a :]
        old_count = last - first + 1
        if lines[first : first + old_count] == split_lines(piece):
            return None  # a no-op site: not an edit
        hunks.append(Hunk(first, old_count, tuple(split_lines(piece))))
        for s in gsites:
            site_group[id(s)] = gi
    a = site_group[id(anchor_site)]
    order = list(range(a, len(hunks))) + list(range(a))
    return hunks, order


# ---------------------------------------------------------------------------
# a cheap Python scanner: strings, comments, names, numbers

_TOKEN_RE = re.compile(
    r"""
    (?P<str>(?:[rRbBuUfF]{1,2})?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
    |(?P<com>\#[^\n]*)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<num>0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d+)?|\.\d[\d_]*(?:[eE][+-]?\d+)?)[jJ]?)
    """,
    re.VERBOSE | re.DOTALL,
)
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = frozenset(keyword.kwlist) | frozenset(getattr(keyword, "softkwlist", [])) | frozenset(dir(builtins))
_RESERVED |= {"self", "cls", "args", "kwargs", "super", "main"}


@dataclass
class _Scan:
    names: dict[str, list[int]]  # code identifier -> start offsets
    attr_names: set[str]  # identifiers seen right after "."
    text_words: set[str]  # words inside strings and comments
    literals: dict[str, list[int]]  # literal text -> start offsets (code only)
    import_names: set[str]


def _scan(text: str) -> _Scan:
    names: dict[str, list[int]] = {}
    attr: set[str] = set()
    words: set[str] = set()
    lits: dict[str, list[int]] = {}
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        tok = m.group()
        if kind == "name":
            names.setdefault(tok, []).append(m.start())
            j = m.start() - 1
            while j >= 0 and text[j] in " \t":
                j -= 1
            if j >= 0 and text[j] == ".":
                attr.add(tok)
        elif kind == "num":
            lits.setdefault(tok, []).append(m.start())
        else:
            words.update(_WORD_RE.findall(tok))
            if kind == "str" and "\n" not in tok and len(tok) <= 40 and tok[0] in "\"'":
                lits.setdefault(tok, []).append(m.start())
    imports: set[str] = set()
    for m in re.finditer(r"^[ \t]*(?:from[ \t]+\S+[ \t]+)?import[ \t]+([^\n]*)", text, re.MULTILINE):
        imports.update(_WORD_RE.findall(m.group(1)))
        imports.update(_WORD_RE.findall(m.group()))
    return _Scan(names, attr, words, lits, imports)


_VOCAB = (
    "value", "count", "items", "result", "data", "info", "name", "index", "total", "current",
    "raw", "parsed", "local", "cached", "new", "old", "tmp", "size", "key", "entry", "path",
    "config", "options", "state", "buffer", "limit", "offset", "prefix", "target", "source",
)
_SYNONYMS = {
    "get": "fetch", "fetch": "get", "set": "update", "update": "set", "value": "val", "val": "value",
    "index": "idx", "idx": "index", "num": "count", "count": "num", "data": "payload", "result": "res",
    "res": "result", "item": "entry", "items": "entries", "entry": "item", "name": "label",
    "key": "k", "make": "build", "build": "make", "create": "make", "remove": "delete",
    "delete": "remove", "add": "append", "find": "lookup", "list": "seq", "dict": "mapping",
    "obj": "instance", "msg": "message", "message": "msg", "err": "error", "error": "err",
    "config": "cfg", "cfg": "config", "path": "filepath", "file": "fh", "text": "content",
    "content": "text", "start": "begin", "end": "stop", "size": "length", "length": "size",
    "args": "params", "func": "fn", "fn": "func", "resp": "response", "response": "resp",
    "req": "request", "request": "req", "tmp": "temp", "buf": "buffer", "buffer": "buf",
}


def _split_ident(name: str) -> tuple[str, list[str], str]:
    lead = name[: len(name) - len(name.lstrip("_"))]
    core = name[len(lead) :]
    if "_" in core or core.islower() or core.isupper():
        return lead, [p for p in core.split("_") if p], "snake" if not core.isupper() else "upper"
    parts = re.findall(r"[A-Z]+(?=[A-Z][a-z]|\d|\b)|[A-Z]?[a-z0-9]+|[A-Z]+", core)
    return lead, [p.lower() for p in parts], "camel" if core[0].islower() else "pascal"


def _join_ident(lead: str, parts: list[str], style: str) -> str:
    if style == "snake":
        return lead + "_".join(parts)
    if style == "upper":
        return lead + "_".join(p.upper() for p in parts)
    caps = "".join(p[:1].upper() + p[1:] for p in parts)
    return lead + (caps[:1].lower() + caps[1:] if style == "camel" else caps)


def new_identifier(name: str, rng: random.Random, taken: set[str]) -> str | None:
    """A plausible new name for `name` that is not a keyword/builtin or in `taken`."""
    lead, parts, style = _split_ident(name)
    if not parts:
        return None
    for _ in range(6):
        p = list(parts)
        r = rng.random()
        swaps = [i for i, w in enumerate(p) if w.lower() in _SYNONYMS]
        if r < 0.4 and swaps:
            i = rng.choice(swaps)
            p[i] = _SYNONYMS[p[i].lower()]
        elif r < 0.6 and len(p) > 1:
            del p[rng.randrange(len(p))]
        elif r < 0.75:
            p[-1] = p[-1][:-1] if p[-1].endswith("s") and len(p[-1]) > 2 else p[-1] + "s"
        else:
            w = rng.choice(_VOCAB)
            if rng.random() < 0.5:
                p.insert(0, w)
            else:
                p.append(w)
        cand = _join_ident(lead, p, style)
        if cand != name and cand.isidentifier() and cand not in _RESERVED and cand not in taken:
            return cand
    return None


# ---------------------------------------------------------------------------
# the code chunk a synthetic edit works on


_TOP_RE = re.compile(r"^[^ \t\n#)\]}\r]", re.MULTILINE)


def _chunk(text: str, rng: random.Random, max_chars: int) -> tuple[int, int] | None:
    """A span [a, b) of whole top-level statements (column-0 lines) up to max_chars."""
    if not text:
        return None
    # the first top-level line after a random offset (searching is C-speed;
    # listing every top-level line of a long file is not)
    m = _TOP_RE.search(text, rng.randrange(len(text))) or _TOP_RE.search(text)
    if m is None:
        return None
    a = b = m.start()
    while True:
        m = _TOP_RE.search(text, b + 1)
        nxt = m.start() if m else len(text)
        if nxt - a > max_chars and b > a:
            break
        b = nxt
        if m is None:
            break
    if b - a > 2 * max_chars:
        return None
    return a, b


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


class _Pos:
    """ast (line, utf-8 col) -> character offset in the chunk's text."""

    def __init__(self, code: str, base: int) -> None:
        self.code = code
        self.base = base
        self.starts = [0] + [m.end() for m in re.finditer("\n", code)]
        self.ascii = code.isascii()

    def __call__(self, lineno: int, col: int) -> int:
        ls = self.starts[lineno - 1]
        if not self.ascii:
            line_end = self.code.find("\n", ls)
            line = self.code[ls : line_end if line_end >= 0 else len(self.code)]
            col = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
        return self.base + ls + col

    def start(self, node: ast.AST) -> int:
        return self(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self(node.end_lineno, node.end_col_offset)


def _word_outside(text: str, a: int, b: int, word: str) -> bool:
    """Whether identifier `word` occurs (as a whole word) in text outside [a, b)."""
    n = len(word)
    for lo, hi in ((0, a), (b, len(text))):
        i = text.find(word, lo, hi)
        while i >= 0:
            before = text[i - 1] if i > 0 else " "
            after = text[i + n] if i + n < len(text) else " "
            if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
                return True
            i = text.find(word, i + 1, hi)
    return False


def _rename_sites(text: str, a: int, b: int, rng: random.Random) -> tuple[list[Site], int] | None:
    chunk = text[a:b]
    sc = _scan(chunk)
    cands = [
        n for n, occ in sc.names.items()
        if 2 <= len(occ) <= 12 and n not in _RESERVED and not n.startswith("__") and len(n) > 1
        and n not in sc.text_words and n not in sc.import_names
        and (n not in sc.attr_names or re.search(r"\bself\." + re.escape(n) + r"\s*=", chunk))
    ]
    rng.shuffle(cands)
    taken = set(sc.names) | sc.text_words
    for n in cands[:4]:
        if _word_outside(text, a, b, n):
            continue
        new = new_identifier(n, rng, taken)
        if new is None or _word_outside(text, a, b, new):
            continue
        occ = sc.names[n]
        sites = [Site(a + o, a + o + len(n), new) for o in occ]
        anchor = 0 if rng.random() < 0.75 else rng.randrange(len(sites))
        return sites, anchor
    return None


_NUM_RE = re.compile(r"\d+")


def _literal_outside(text: str, a: int, b: int, lit: str) -> bool:
    if lit[0] in "\"'":
        return text.find(lit, 0, a) >= 0 or text.find(lit, b) >= 0
    pat = re.compile(r"(?<![\w.])" + re.escape(lit) + r"(?![\w.])")
    return bool(pat.search(text, 0, a) or pat.search(text, b))


def _new_literal(lit: str, rng: random.Random) -> str | None:
    if lit[0] in "\"'":
        q = lit[0]
        body = lit[1:-1]
        if not body or "\\" in body:
            return None
        r = rng.random()
        if r < 0.3 and re.search(r"[a-z]", body):
            new = body.replace("_", "-") if "_" in body else body.upper() if r < 0.1 else body + "_v2"
        elif r < 0.6 and _NUM_RE.search(body):
            new = _NUM_RE.sub(lambda m: str(int(m.group()) + rng.randint(1, 9)), body, count=1)
        else:
            new = body + rng.choice(["_new", "s", "-2", ".bak", "_id"])
        if q in new or new == body:
            return None
        return q + new + q
    clean = lit.replace("_", "")
    try:
        if re.fullmatch(r"\d+", clean):
            v = int(clean)
            if v in (0, 1):
                return None
            return str(rng.choice([v * 2, v + 1, max(2, v - 1), v * 10, v + rng.randint(2, 50)]))
        if clean.lower().endswith("j"):
            return None
        v = float(clean)
        if v in (0.0, 1.0):
            return None
        return repr(round(v * rng.choice([0.5, 2.0, 10.0, 0.1]), 6))
    except ValueError:
        return None


def _literal_sites(text: str, a: int, b: int, rng: random.Random) -> tuple[list[Site], int] | None:
    sc = _scan(text[a:b])
    cands = [lit for lit, occ in sc.literals.items() if 2 <= len(occ) <= 8]
    rng.shuffle(cands)
    for lit in cands[:4]:
        new = _new_literal(lit, rng)
        if new is None or new == lit:
            continue
        if _literal_outside(text, a, b, lit):
            continue
        occ = sc.literals[lit]
        return [Site(a + o, a + o + len(lit), new) for o in occ], 0
    return None


_VALUES = ("None", "True", "False", "0", "1", "2", "10", "''", '"utf-8"', "[]", "{}", "0.5")


def _simple_def(fn: ast.AST) -> bool:
    a = fn.args
    return not (a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs)


class _Uses:
    """One walk over a tree: calls by callee name, and how often each name is used."""

    @classmethod
    def of(cls, tree: ast.AST) -> _Uses:
        """Built once per tree, on first need (the walk costs more than parsing)."""
        got = getattr(tree, "_dlm_uses", None)
        if got is None:
            got = cls(tree)
            tree._dlm_uses = got
        return got

    def __init__(self, tree: ast.AST) -> None:
        self.calls: dict[str, list[ast.Call]] = {}
        self.uses: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                key = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if key is not None:
                    self.calls.setdefault(key, []).append(node)
            elif isinstance(node, ast.Name):
                self.uses[node.id] = self.uses.get(node.id, 0) + 1
            elif isinstance(node, ast.Attribute):
                self.uses[node.attr] = self.uses.get(node.attr, 0) + 1


def _calls_to(uses: _Uses, name: str, method: bool) -> list[ast.Call] | None:
    """Call sites of `name` (`name(...)` or, for methods, `self.name(...)`/`cls.name(...)`).

    None when the name is used any other way (passed around, called on
    another object, or with *args/**kwargs), since those uses could not be
    updated consistently."""
    calls: list[ast.Call] = []
    for node in uses.calls.get(name, []):
        f = node.func
        hit = (not method and isinstance(f, ast.Name)) or (
            method and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            and f.value.id in ("self", "cls")
        )
        if hit:
            if any(isinstance(x, ast.Starred) for x in node.args) or any(k.arg is None for k in node.keywords):
                return None
            calls.append(node)
    if uses.uses.get(name, 0) != len(calls):
        return None
    return calls


def _functions(tree: ast.AST) -> list[tuple[ast.AST, bool]]:
    out: list[tuple[ast.AST, bool]] = []
    for node in tree.body if isinstance(tree, ast.Module) else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node, False))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((sub, True))
    return out


def _param_insert_site(text: str, pos: _Pos, fn: ast.AST, piece: str) -> Site | None:
    a = fn.args
    ends = [pos.end(x) for x in a.args] + [pos.end(d) for d in a.defaults]
    if ends:
        at = max(ends)
        return Site(at, at, ", " + piece)
    m = re.compile(r"(?:async\s+)?def\s+\w+\s*(?:\[[^\]]*\])?\s*\(").match(text, pos.start(fn))
    if not m:
        return None
    return Site(m.end(), m.end(), piece)


def _call_insert_site(text: str, pos: _Pos, call: ast.Call, piece: str) -> Site | None:
    ends = [pos.end(x) for x in call.args] + [pos.end(k) for k in call.keywords]
    if ends:
        at = max(ends)
        return Site(at, at, ", " + piece)
    close = pos.end(call) - 1
    if text[close] != ")" or text[pos.end(call.func) : close].strip() != "(":
        return None
    return Site(close, close, piece)


def _add_param_sites(text: str, a: int, b: int, tree: ast.Module, rng: random.Random, field: bool = False):
    chunk = text[a:b]
    pos = _Pos(chunk, a)
    sc_words = set(_WORD_RE.findall(chunk))
    fns = _functions(tree)
    rng.shuffle(fns)
    for fn, method in fns[:6]:
        if not _simple_def(fn) or fn.name.startswith("__") != field:
            continue
        if field and fn.name != "__init__":
            continue
        if not field and _word_outside(text, a, b, fn.name):
            continue
        new = next((w for w in rng.sample(_VOCAB, 6) if w not in sc_words and w not in _RESERVED), None)
        if new is None:
            continue
        value = rng.choice(_VALUES)
        has_defaults = bool(fn.args.defaults)
        def_site = _param_insert_site(text, pos, fn, f"{new}={value}" if has_defaults or field and rng.random() < 0.5 else new)
        if def_site is None:
            continue
        sites = [def_site]
        if field:
            cls = next((c for c in tree.body if isinstance(c, ast.ClassDef) and fn in c.body), None)
            if cls is None:
                continue
            assigns = [
                s for s in fn.body
                if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute)
                and isinstance(s.targets[0].value, ast.Name) and s.targets[0].value.id == "self"
            ]
            if not assigns:
                continue
            last = assigns[-1]
            line_start = pos(last.lineno, 0)
            indent = text[line_start : pos.start(last)]
            if indent.strip():
                continue
            nl = text.find("\n", pos.end(last))
            if nl < 0:
                continue
            sites.append(Site(nl + 1, nl + 1, f"{indent}self.{new} = {new}\n"))
            if _word_outside(text, a, b, cls.name):
                continue
            calls = _calls_to(_Uses.of(tree), cls.name, False)
        else:
            calls = _calls_to(_Uses.of(tree), fn.name, method)
        if calls is None or (not calls and not field):
            continue
        ok = True
        for c in calls:
            s = _call_insert_site(text, pos, c, f"{new}={value}")
            if s is None:
                ok = False
                break
            sites.append(s)
        if ok:
            return sites, 0
    return None


def _remove_param_sites(text: str, a: int, b: int, tree: ast.Module, rng: random.Random):
    chunk = text[a:b]
    pos = _Pos(chunk, a)
    fns = _functions(tree)
    rng.shuffle(fns)
    for fn, method in fns[:6]:
        if not _simple_def(fn) or fn.name.startswith("__") or _word_outside(text, a, b, fn.name):
            continue
        params = fn.args.args
        first = 1 if method else 0
        n_req = len(params) - len(fn.args.defaults)
        idxs = [i for i in range(first, n_req)]
        if not idxs:
            continue
        i = rng.choice(idxs)
        pname = params[i].arg
        if any(isinstance(n, ast.Name) and n.id == pname for st in fn.body for n in ast.walk(st)):
            continue  # the parameter is used: removing it would not be a consistent edit
        calls = _calls_to(_Uses.of(tree), fn.name, method)
        if not calls:
            continue
        ci = i - first
        # every call passes the parameter positionally (later positional
        # arguments then still line up with the later parameters)
        if any(len(c.args) <= ci or any(kw.arg == pname for kw in c.keywords) for c in calls):
            continue
        sites = [_remove_item(text, pos, params, i, fn)]
        for c in calls:
            sites.append(_remove_item(text, pos, list(c.args) + list(c.keywords), ci, c))
        if any(s is None for s in sites):
            continue
        return sites, 0
    return None


def _remove_item(text: str, pos: _Pos, items: list, i: int, owner) -> Site | None:
    """Delete items[i] and one adjacent comma from a parameter or argument list."""
    s, e = pos.start(items[i]), pos.end(items[i])
    if i + 1 < len(items):
        e2 = pos.start(items[i + 1])
        if "," not in text[e:e2] or "#" in text[e:e2]:
            return None
        if "\n" in text[e:e2]:
            e2 = e + text[e:e2].index(",") + 1
        return Site(s, e2, "")
    if i > 0:
        s2 = pos.end(items[i - 1])
        if "#" in text[s2:s] or "\n" in text[s2:s]:
            return None
        return Site(s2, e, "")
    # the only item: also drop a trailing comma
    m = re.compile(r"\s*,").match(text, e)
    return Site(s, m.end() if m else e, "")


SYNTHETIC_EDITS = ("rename", "literal", "add_param", "remove_param", "add_field")


def synthetic_edit_plan(
    text: str, rng: random.Random, opts: EditOptions = DEFAULT_OPTIONS, edit: str | None = None
) -> tuple[str, list[Hunk], list[int]] | None:
    """(edit name, hunks in file order, order of making them) for one consistent edit, or None."""
    span = _chunk(text, rng, opts.chunk_chars)
    if span is None:
        return None
    a, b = span
    # parse even for the regex-based edits: a chunk that does not parse was cut
    # inside a string or bracket, and its tokens cannot be trusted
    tree = _parse(text[a:b])
    if tree is None:
        return None
    names = [edit] if edit else rng.sample(SYNTHETIC_EDITS, len(SYNTHETIC_EDITS))
    for name in names[:3]:
        if name == "rename":
            got = _rename_sites(text, a, b, rng)
        elif name == "literal":
            got = _literal_sites(text, a, b, rng)
        elif name == "add_param":
            got = _add_param_sites(text, a, b, tree, rng)
        elif name == "add_field":
            got = _add_param_sites(text, a, b, tree, rng, field=True)
        else:
            got = _remove_param_sites(text, a, b, tree, rng)
        if got is None:
            continue
        sites, anchor = got
        hk = sites_to_hunks(text, sites, anchor)
        if hk is None or len(hk[0]) < 2:
            continue
        return name, hk[0], hk[1]
    return None


def synthetic_edit_example(
    text: str, rng: random.Random, path: str = "", opts: EditOptions = DEFAULT_OPTIONS,
    language: str = "python", edit: str | None = None,
) -> Example | None:
    """One `synthetic_edit` example from a Python source text, or None if no edit fits.

    The history holds 1..n-1 of the edit's hunks; the target applies the next one.
    Only Python is edited (the edits rely on Python's grammar): other languages give None.
    """
    if language != "python":
        return None
    plan = synthetic_edit_plan(text, rng, opts, edit)
    if plan is None:
        return None
    name, hunks, order = plan
    k = rng.randint(1, len(hunks) - 1)
    got = build_next_edit(text, hunks, order, k, rng, path, "synthetic_edit", opts, language, f"{path}#{name}")
    return got.example if got else None


def noop_example(
    text: str, rng: random.Random, path: str = "", opts: EditOptions = DEFAULT_OPTIONS,
    language: str = "python", after_edit: float = 0.5,
) -> Example | None:
    """A region that needs no change (target == region).

    With probability `after_edit` the text first gets a finished synthetic edit
    (all its hunks in the history), so the model also learns to stop once an
    edit is complete; otherwise the region is plain code with no history.
    """
    if language == "python" and rng.random() < after_edit:
        plan = synthetic_edit_plan(text, rng, opts)
        if plan is not None:
            _, hunks, order = plan
            ex = build_finished_noop(text, hunks, order, rng, path, opts, language, path)
            if ex is not None:
                return ex
    if not text.strip():
        return None
    lines = split_lines(text)
    i = rng.randrange(len(lines))
    j = min(len(lines), i + 1 + rng.randint(0, 3))
    region = shrink_to(lines, i, j, opts.max_region_chars)
    if region is None:
        return None
    a = len("".join(lines[:i]))
    b = a + len(region)
    prompt = Prompt(
        prefix=window(text, 0, a, opts.prefix_chars, "before"),
        region=region,
        cursor=rng.randint(0, len(region.rstrip("\n"))),
        suffix=window(text, b, len(text), opts.suffix_chars, "after"),
        language=language,
        path=path,
    )
    return Example("noop", prompt, region, path)


def edit_examples(
    texts: Iterable[tuple[str, str]], rng: random.Random, *, opts: EditOptions = DEFAULT_OPTIONS,
    noop_rate: float = 0.25,
) -> Iterator[Example]:
    """Synthetic edit and no-op examples from (path, text) pairs of the corpus."""
    for path, text in texts:
        ex = noop_example(text, rng, path, opts) if rng.random() < noop_rate else synthetic_edit_example(
            text, rng, path, opts)
        if ex is not None:
            yield ex
