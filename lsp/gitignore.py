"""`.gitignore` rules in pure Python (no git needed, no subprocess).

The subset of gitignore(5) that decides what a project's source is:

- one pattern per line; blank lines and `#` comments skipped (`\\#` is a literal
  `#`); trailing spaces dropped unless escaped with a backslash;
- `!pattern` re-includes what an earlier pattern excluded (`\\!` is a literal `!`);
- `dir/` matches directories only;
- a pattern with a `/` at its start or in its middle is anchored to the directory
  of its `.gitignore`; one without matches at any depth below it;
- `*` and `?` never match `/`; `[a-z]`, `[!a-z]` classes; `**/` (any leading
  directories), `/**` (everything inside), `/**/` (zero or more directories);
- the last matching rule wins, and rules of deeper `.gitignore` files come after
  those of their parents;
- a file whose directory is excluded stays excluded whatever a later `!` says
  (git does not descend into an excluded directory; the walker prunes it).

Patterns come from files a repository commits and from the user's `index.exclude`
option, so matching them must cost little whatever they say. A pattern is compiled to
a list of tokens (`Glob`) and matched by simulating its automaton over the path, all
states at once (one bit per pattern character), never by backtracking: one match costs
at worst one step per character of the path, each a few operations on a bit set the
size of the pattern, so O(len(pattern) * len(path)); `a*a*a*a*a*a*a*a*b` against a
long name of `a`s costs what any pattern of its length does. The common shapes (a
literal name, `*.ext`, `prefix*`, `dir/**`) are decided by string comparisons alone.
Matching runs as Python code, which gives up the interpreter lock between steps, so a
slow walk cannot freeze the server's other threads (a backtracking regex call holds the
lock for its whole run).

The work is bounded as well (`MAX_PATTERNS`, `MAX_PATTERN_CHARS`): what is left out
is logged and kept in `Rules.warnings` / `IgnoreStack.warnings`, so that the index
status can say it.

`Rules` is one file's patterns; `IgnoreStack` holds the files that apply to a
path (the root's, `.git/info/exclude`, and each nested directory's).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Self

log = logging.getLogger(__name__)

# At most this many patterns of one ignore file (or of the `index.exclude` option, whose
# own cap is the same) are used, the first ones. Every path the index looks at is tested
# against each of them, so the count bounds the cost of one path; a hand-kept .gitignore
# has tens to a few hundred, a generated one a few thousand.
MAX_PATTERNS = 10_000
# A longer pattern is left out. A path is at most PATH_MAX (4096) bytes on Linux, so no
# hand-written rule is longer; the cap bounds one match at 4096 states times the path.
MAX_PATTERN_CHARS = 4096

# Token kinds of a compiled glob.
_LIT = 0  # given characters (a run of them)
_ANY = 1  # `?`: one character but `/`
_CLASS = 2  # `[...]`: one character of a set (a negated set never matches `/`)
_STAR = 3  # `*`: any characters but `/`
_DSTAR = 4  # trailing `/**`, or `**` alone: any characters
_DIRS = 5  # `**/`: nothing, or any characters ending with `/` (zero or more directories)

_SKIPPABLE = (_STAR, _DSTAR, _DIRS)  # may match nothing
_MAX_CACHED_CHARS = 512  # per glob: the transition masks of this many distinct characters
# The characters that are not literal in a glob; finding the next one is a plain linear scan.
_SPECIAL = re.compile(r"[*?\[\\]")


@dataclass(frozen=True)
class CharClass:
    """A `[...]` set: `chars` and inclusive `ranges`. A negated one matches any
    character but `/` that is not in the set."""

    negated: bool
    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]

    def matches(self, c: str) -> bool:
        inside = c in self.chars or any(lo <= c <= hi for lo, hi in self.ranges)
        return (not inside and c != "/") if self.negated else inside


def class_end(pattern: str, i: int) -> int | None:
    """The index of the `]` that closes the `[...]` class starting at pattern[i] == '[', or None
    when there is none. A `]` right after the `[` (or after `[!`, `[^`) is a member, not the end."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    return j if j < len(pattern) else None


def _class(pattern: str, i: int) -> tuple[CharClass | None, int]:
    """The `[...]` class starting at pattern[i] == '[': (class, index after it), or
    (None, i + 1) when there is no closing bracket (the `[` is then a literal).

    Inside a class a backslash and `[` are plain characters; a `]` right after the `[`
    (or after `[!`) is a member; `a-z` is a range (a reversed one matches nothing, as
    in git); a `-` first or last is a member."""
    j = class_end(pattern, i)
    if j is None:
        return None, i + 1
    body = pattern[i + 1 : j]
    negated = body[:1] in ("!", "^")
    if negated:
        body = body[1:]
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            ranges.append((body[k], body[k + 2]))
            k += 3
        else:
            chars.add(body[k])
            k += 1
    return CharClass(negated, frozenset(chars), tuple(ranges)), j + 1


def _tokens(pattern: str) -> list[tuple[int, object]]:
    """The tokens of one gitignore glob (without the anchoring, which the rule adds). A run
    of plain characters is one `_LIT` token holding the run."""
    out: list[tuple[int, object]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append((_LIT, pattern[i + 1]))
            i += 2
        elif c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                end = i + 2
                if at_start and end == n:  # trailing "**": everything below
                    out.append((_DSTAR, None))
                    i = end
                elif at_start and pattern.startswith("/", end):  # "**/": zero or more directories
                    out.append((_DIRS, None))
                    i = end + 1
                else:  # "a**b" is two plain stars
                    out.append((_STAR, None))
                    i = end
            else:
                out.append((_STAR, None))
                i += 1
        elif c == "?":
            out.append((_ANY, None))
            i += 1
        elif c == "[":
            cls, i = _class(pattern, i)
            out.append((_LIT, "[") if cls is None else (_CLASS, cls))
        else:
            special = _SPECIAL.search(pattern, i + 1)  # one character class: a plain scan
            j = n if special is None else special.start()
            out.append((_LIT, pattern[i:j]))
            i = j
    merged: list[tuple[int, object]] = []
    for kind, value in out:
        if merged and kind == merged[-1][0] == _LIT:  # one run of literal characters
            merged[-1] = (_LIT, str(merged[-1][1]) + str(value))
        elif not (merged and kind == merged[-1][0] == _STAR):  # a run of `*` is one `*`
            merged.append((kind, value))
    return merged


class Glob:
    """One compiled glob, matched against a whole string (`match`) without backtracking.

    A leading and a trailing run of literal characters are checked by comparison; a glob
    that is nothing more (`name`, `*.ext`, `prefix*`, `dir/**`) needs nothing else. Any
    other is matched by its automaton, built when first needed."""

    __slots__ = ("_accept", "_any", "_classes", "_eps", "_lit", "_loop", "_skip3", "_star", "_start",
                 "_steps", "head", "min_len", "shape", "tail", "tokens")  # fmt: skip

    def __init__(self, tokens: list[tuple[int, object]]) -> None:
        self.tokens = tokens
        n = len(tokens)
        h = 1 if n and tokens[0][0] == _LIT else 0
        t = n - 1 if n > h and tokens[-1][0] == _LIT else n
        self.head = str(tokens[0][1]) if h else ""
        self.tail = str(tokens[-1][1]) if t < n else ""
        self.min_len = sum(len(str(v)) if k == _LIT else 1 for k, v in tokens if k not in _SKIPPABLE)
        if h == n:
            self.shape = "exact"
        elif t == h + 1 and tokens[h][0] == _STAR:
            self.shape = "star"  # head, one `*`, tail: string comparisons decide
        elif t == h + 1 and tokens[h][0] == _DSTAR:
            self.shape = "any"  # head, `**`, tail
        else:
            self.shape = "nfa"
        self._steps: dict[str, tuple[int, int]] | None = None  # the automaton, once built

    def _build(self) -> None:
        """The automaton: state k is "token k comes next" (one state per literal character);
        the state after the last token accepts. Bit k of a mask is state k. A `**/` (nothing,
        or `.*/`) is three states: an entry that consumes nothing and leads to the next state
        or past all three (`_skip3`), a `**`, then a literal `/`.
        `_lit[c]`: states that consume the character c and move on; `_any`: `?` states;
        `_classes`: `[...]` states by class; `_star`: `*` states (they stay on anything but
        `/`); `_loop`: `**` states (they stay on anything); `_eps`: states that may match
        nothing (they lead on to the next state)."""
        self._lit: dict[str, int] = {}
        self._any = self._star = self._loop = self._eps = self._skip3 = 0
        classes: dict[CharClass, int] = {}
        k = 0
        for kind, value in self.tokens:
            bit = 1 << k
            if kind == _LIT:
                for ch in str(value):
                    self._lit[ch] = self._lit.get(ch, 0) | (1 << k)
                    k += 1
                continue
            if kind == _ANY:
                self._any |= bit
            elif kind == _CLASS:
                assert isinstance(value, CharClass)
                classes[value] = classes.get(value, 0) | bit
            elif kind == _STAR:
                self._star |= bit
                self._eps |= bit
            elif kind == _DSTAR:
                self._loop |= bit
                self._eps |= bit
            else:  # _DIRS: the entry at k, `**` at k + 1, `/` at k + 2
                self._eps |= bit | (bit << 1)
                self._skip3 |= bit
                self._loop |= bit << 1
                k += 2
                self._lit["/"] = self._lit.get("/", 0) | (1 << k)
            k += 1
        self._classes = tuple(classes.items())
        self._start = self._closure(1 << len(self.head))  # the head is checked by comparison
        self._accept = 1 << k
        self._steps = {}

    def _closure(self, states: int) -> int:
        """`states` plus those reached by skipping tokens that may match nothing."""
        eps, skip3 = self._eps, self._skip3
        while True:
            more = states | ((states & eps) << 1) | ((states & skip3) << 3)
            if more == states:
                return states
            states = more

    def _step(self, steps: dict[str, tuple[int, int]], c: str) -> tuple[int, int]:
        """(states that consume `c` and move on, states that consume `c` and stay)."""
        move = self._lit.get(c, 0)
        stay = self._loop
        if c != "/":
            move |= self._any
            stay |= self._star
        for cls, bits in self._classes:
            if cls.matches(c):
                move |= bits
        if len(steps) < _MAX_CACHED_CHARS:
            steps[c] = (move, stay)
        return move, stay

    def match(self, s: str) -> bool:
        """Does the whole of `s` match? O(len(pattern) * len(s)) at worst."""
        head, tail = self.head, self.tail
        if len(s) < self.min_len or not s.startswith(head) or not s.endswith(tail):
            return False
        shape = self.shape
        if shape == "exact":
            return len(s) == len(head)
        if shape == "star":
            return len(s) >= len(head) + len(tail) and "/" not in s[len(head) : len(s) - len(tail)]
        if shape == "any":
            return len(s) >= len(head) + len(tail)
        steps = self._steps
        if steps is None:
            self._build()
            steps = self._steps
            assert steps is not None
        states = self._start
        eps, skip3 = self._eps, self._skip3
        for i in range(len(head), len(s)):
            c = s[i]
            move, stay = steps.get(c) or self._step(steps, c)
            states = ((states & move) << 1) | (states & stay)
            if not states:
                return False
            while True:  # the closure, inline: this loop is the hot path
                more = states | ((states & eps) << 1) | ((states & skip3) << 3)
                if more == states:
                    break
                states = more
        return bool(states & self._accept)


def compile_glob(pattern: str) -> Glob:
    """A gitignore glob (no anchoring, no `!`, no trailing `/`) compiled for `Glob.match`."""
    if _SPECIAL.search(pattern) is None:
        return Glob([(_LIT, pattern)] if pattern else [])
    return Glob(_tokens(pattern))


@dataclass(frozen=True)
class Rule:
    glob: Glob
    anchored: bool  # matched against the whole path; otherwise against its last name
    negated: bool
    dir_only: bool
    source: str  # the line as written, for debug logs

    def matches(self, rel: str) -> bool:
        """Does the pattern match `rel` (relative to its file's directory)? A pattern that
        is not anchored holds no `/`, and none of its parts matches a `/` (only `**` alone
        matches anything), so it matches a path at any depth exactly when it matches the
        path's last name."""
        if self.anchored:
            return self.glob.match(rel)
        return self.glob.match(rel[rel.rfind("/") + 1 :])


def split_line(line: str) -> tuple[str, bool, bool, bool] | None:
    """One line of a .gitignore as (pattern, anchored, negated, dir_only), or None (blank,
    comment): the pattern without its `!`, trailing `/` and leading `/`."""
    line = line.rstrip("\n").rstrip("\r")
    if not line or line.startswith("#"):
        return None
    # Trailing spaces are dropped unless the last one is escaped.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    negated = line.startswith("!")
    if negated or line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    if dir_only:
        line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    if not line:
        return None
    return line, anchored, negated, dir_only


def parse_line(line: str) -> Rule | None:
    """One line of a .gitignore as a Rule, or None (blank, comment)."""
    parts = split_line(line)
    if parts is None:
        return None
    pattern, anchored, negated, dir_only = parts
    return Rule(compile_glob(pattern), anchored, negated, dir_only, line.strip())


class IgnoreText(str):
    """The text of an ignore file as read, which knows where it came from and whether it
    was cut: `size` bytes on disk, of which the first `read` (whole lines) are the text."""

    path: str
    size: int
    read: int

    def __new__(cls, text: str, path: str, size: int, read: int) -> Self:
        self = super().__new__(cls, text)
        self.path, self.size, self.read = path, size, read
        return self

    @property
    def truncated(self) -> bool:
        return self.read < self.size

    @property
    def message(self) -> str:
        """'' when the whole file was read; otherwise what the index status can show."""
        if not self.truncated:
            return ""
        return (f"only the first {self.read // 1024} KB of {self.path} was read "
                f"(it has {self.size // 1024} KB); the patterns after that are not used")  # fmt: skip


class Rules:
    """The rules of one ignore file, relative to `base` (a directory under the root, '' for
    the root). `outer` is for a file above the root (the root is a subdirectory of a git
    repository): the root's path from that file's directory, prepended to every path.
    `origin` names the file (or option) in warnings: what was left out of it and why."""

    def __init__(self, base: str, lines: list[str], outer: str = "", origin: str = "") -> None:
        self.base = base.strip("/")
        self.outer = outer.strip("/")
        self.origin = origin
        self.warnings: list[str] = []
        self.rules: list[Rule] = []
        too_long = 0
        for k, line in enumerate(lines):
            if len(line) > MAX_PATTERN_CHARS:
                too_long += 1
                continue
            rule = parse_line(line)
            if rule is None:
                continue
            if len(self.rules) == MAX_PATTERNS:
                self.warnings.append(f"only the first {MAX_PATTERNS} patterns of {origin or 'an ignore file'} "
                                     f"are used; its last {len(lines) - k} lines are not")  # fmt: skip
                break
            self.rules.append(rule)
        # What `match` needs of each rule, last rule first.
        self._last_first = [(r.glob.match, r.anchored, r.dir_only, r.negated) for r in reversed(self.rules)]
        if too_long:
            self.warnings.append(f"{too_long} line(s) of {origin or 'an ignore file'} longer than "
                                 f"{MAX_PATTERN_CHARS} characters are not used")  # fmt: skip
        for w in self.warnings:
            log.warning("index: %s", w)

    @classmethod
    def from_text(cls, base: str, text: str, outer: str = "", origin: str = "") -> Rules:
        """The rules of `text`; an `IgnoreText` names its file, and one that was cut adds
        its warning to the rules' (the first part is honoured)."""
        if isinstance(text, IgnoreText):
            rules = cls(base, text.splitlines(), outer, origin or text.path)
            if text.truncated:
                rules.warnings.insert(0, text.message)
            return rules
        return cls(base, text.splitlines(), outer, origin)

    @property
    def depth(self) -> int:
        """Shallower files come first, so that deeper ones override them."""
        if self.outer:
            return -1 - self.outer.count("/")
        return self.base.count("/") + 1 if self.base else 0

    def match(self, rel: str, is_dir: bool) -> bool | None:
        """True (ignored), False (re-included) or None (no rule says) for `rel`, a path
        relative to the same root as `base`."""
        if self.outer:
            rel = f"{self.outer}/{rel}"
        elif self.base:
            if not rel.startswith(self.base + "/"):
                return None
            rel = rel[len(self.base) + 1 :]
        name = rel[rel.rfind("/") + 1 :]  # what a pattern without a `/` is matched against
        for match, anchored, dir_only, negated in self._last_first:  # the last matching rule wins
            if dir_only and not is_dir:
                continue
            if match(rel if anchored else name):
                return not negated
        return None

    def __bool__(self) -> bool:
        return bool(self.rules)


class IgnoreStack:
    """The ignore files that apply under one root: by their directory, plus those above
    the root and `.git/info/exclude`. A path consults only the files of its ancestors."""

    def __init__(self) -> None:
        self._outer: list[Rules] = []  # above the root, shallowest first; then info/exclude
        self._by_base: dict[str, list[Rules]] = {}
        self._seen: set[str] = set()  # directories whose .gitignore was read (even if empty)
        # What was left out of the files added (a file cut at the size cap, patterns over the
        # caps), by file; kept even for a file none of whose patterns could be used.
        self._warnings: dict[tuple[str, str, str], list[str]] = {}
        self.final: Rules | None = None  # the user's own patterns (an option): they have the last word

    def add(self, rules: Rules) -> None:
        """Add one file's rules. Adding rules for a directory twice (a walk after a single
        path looked there) replaces them, so the stack never holds a file twice."""
        key = (rules.outer, rules.base, rules.origin)
        if rules.warnings:
            self._warnings[key] = list(rules.warnings)
        else:
            self._warnings.pop(key, None)
        if rules.outer:
            if rules:
                self._outer.append(rules)
                self._outer.sort(key=lambda r: r.depth)  # stable: equal depths keep their order
            return
        self._seen.add(rules.base)
        if rules.base and rules.base in self._by_base:
            del self._by_base[rules.base]
        if rules:
            self._by_base.setdefault(rules.base, []).append(rules)

    @property
    def warnings(self) -> list[str]:
        """What the rules leave out, one line each (e.g. 'only the first 976 KB of
        /p/.gitignore was read ...'), for the index status."""
        out = [w for ws in self._warnings.values() for w in ws]
        if self.final is not None:
            out += self.final.warnings
        return out

    def has_base(self, base: str) -> bool:
        return base in self._seen

    def __len__(self) -> int:
        return len(self._outer) + sum(len(v) for v in self._by_base.values())

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Is `rel` (relative to the root, '/'-separated) excluded by the rules? Checks its
        parent directories too, so a path inside an excluded directory is excluded whatever
        a later `!` says (git never looks inside it)."""
        parts = rel.split("/")
        for k in range(1, len(parts)):
            if self.ignored_here("/".join(parts[:k]), True):
                return True
        return self.ignored_here(rel, is_dir)

    def ignored_here(self, rel: str, is_dir: bool) -> bool:
        """The rules' verdict on `rel` alone (for a walker that has already checked its
        parents): the last matching rule wins, deeper files after shallower ones."""
        if self.final is not None:
            v = self.final.match(rel, is_dir)
            if v is not None:
                return v
        for rules in reversed(self._applicable(rel)):
            v = rules.match(rel, is_dir)
            if v is not None:
                return v
        return False

    def _applicable(self, rel: str) -> list[Rules]:
        out = list(self._outer)
        out += self._by_base.get("", [])
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            out += self._by_base.get("/".join(parts[:k]), [])
        return out
