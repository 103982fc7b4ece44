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

`Rules` is one file's patterns; `IgnoreStack` holds the files that apply to a
path (the root's, `.git/info/exclude`, and each nested directory's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    source: str  # the line as written, for debug logs


def _class(pattern: str, i: int) -> tuple[str, int]:
    """Translate a `[...]` class starting at pattern[i] == '['; (regex, index after it)."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):  # no closing bracket: a literal '['
        return re.escape("["), i + 1
    body = pattern[i + 1 : j]
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    body = body.replace("\\", "\\\\").replace("[", "\\[")
    return ("[^/" if negate else "[") + body + "]", j + 1


def _glob_to_regex(pattern: str) -> str:
    """The regex body of one gitignore glob (without anchoring)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                end = i + 2
                if at_start and end == n:  # trailing "**": everything below
                    out.append(".*")
                    i = end
                elif at_start and pattern.startswith("/", end):  # "**/": zero or more directories
                    out.append("(?:.*/)?")
                    i = end + 1
                else:  # "a**b" is two plain stars
                    out.append("[^/]*")
                    i = end
            else:
                out.append("[^/]*")
                i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            part, i = _class(pattern, i)
            out.append(part)
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_line(line: str) -> Rule | None:
    """One line of a .gitignore as a Rule, or None (blank, comment)."""
    source = line
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
    body = _glob_to_regex(line)
    # Matching a directory also matches everything below it (used when a path is
    # tested without its parents having been tested, e.g. a watched-file event).
    prefix = "" if anchored else "(?:.*/)?"
    regex = re.compile(f"^{prefix}{body}$", re.DOTALL)
    return Rule(regex, negated, dir_only, source.strip())


class Rules:
    """The rules of one ignore file, relative to `base` (a directory under the root, '' for
    the root). `outer` is for a file above the root (the root is a subdirectory of a git
    repository): the root's path from that file's directory, prepended to every path."""

    def __init__(self, base: str, lines: list[str], outer: str = "") -> None:
        self.base = base.strip("/")
        self.outer = outer.strip("/")
        self.rules = [r for r in (parse_line(x) for x in lines) if r is not None]

    @classmethod
    def from_text(cls, base: str, text: str, outer: str = "") -> Rules:
        return cls(base, text.splitlines(), outer)

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
        verdict: bool | None = None
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(rel):
                verdict = not rule.negated
        return verdict

    def __bool__(self) -> bool:
        return bool(self.rules)


class IgnoreStack:
    """The ignore files that apply under one root: by their directory, plus those above
    the root and `.git/info/exclude`. A path consults only the files of its ancestors."""

    def __init__(self) -> None:
        self._outer: list[Rules] = []  # above the root, shallowest first; then info/exclude
        self._by_base: dict[str, list[Rules]] = {}
        self._seen: set[str] = set()  # directories whose .gitignore was read (even if empty)
        self.final: Rules | None = None  # the user's own patterns (an option): they have the last word

    def add(self, rules: Rules) -> None:
        """Add one file's rules. Adding rules for a directory twice (a walk after a single
        path looked there) replaces them, so the stack never holds a file twice."""
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
        verdict = False
        for rules in self._applicable(rel):
            v = rules.match(rel, is_dir)
            if v is not None:
                verdict = v
        if self.final is not None:
            v = self.final.match(rel, is_dir)
            if v is not None:
                verdict = v
        return verdict

    def _applicable(self, rel: str) -> list[Rules]:
        out = list(self._outer)
        out += self._by_base.get("", [])
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            out += self._by_base.get("/".join(parts[:k]), [])
        return out
