"""Token-level before->after transformations ("patterns") from one edit of a few lines.

An edit (the old lines of a burst and their new text) is lexed into code tokens and
diffed at the token level (difflib on token strings, whitespace ignored). The changed
tokens, with as little context as identifies them, become a `Pattern`:

- `rename`: one identifier became another (`foo` -> `bar`); it matches the identifier
  as a whole token, and as one `_`-separated part of a longer name (`foo_count`);
- `append_arg`: text added before the closing parenthesis of a call (`f(a)` ->
  `f(a, b)`); it matches every one-line call of `f` that lacks the argument,
  whatever its other arguments are;
- `insert_line`: a line added directly above a `def`/`class` line (a decorator);
- `replace`: anything else on one line (a changed literal, a wrapped call, an added
  keyword, a deleted argument), anchored by context tokens until it holds an
  identifier: the token sequence `before` becomes `after` wherever it occurs;
- whole-line blocks (`block_pattern`, from the edit's lines and the document around them):
  `lines` (a block of lines became another block: a changed signature line with its
  docstring line, a guard of two lines), `delete_lines` (a block deleted: a decorator, a
  debug print) and `insert_lines` (a block inserted between two given lines: a guard, an
  import, a keyword-argument line, a docstring `:param` line); `same_lines` is the block of
  an edit the token-level patterns name too (memory.py: calibrated apart); `adapted`
  (`adapted_pattern`) is a changed block carried to lines of the same shape that differ from
  its old lines in one or two names or literals that the edit kept (not the value it changed),
  the new lines taking the site's names
  (`def test_a(self):` -> `def test_a(self) -> None:` gives `def test_b(self) -> None:`). A site holds the same lines,
  compared without their indentation (for an insertion: the two lines the block went
  between, next to each other); the new lines keep their indentation relative to the
  block's first line (the line above, for an insertion). On the edit-histories train split,
  4.9% of next hunks repeat an earlier hunk of the same commit and file line for line
  (whitespace aside), and the one-line patterns proposed none of them exactly: most are
  insertions, deletions and blocks of several lines.

A pattern covers only its changed span at a site (`Site.start`..`Site.end` of the
line): the text around it is never touched. Nothing here imports torch or lsp.
"""

from __future__ import annotations

import difflib
import keyword
import re
from dataclasses import dataclass, field

# One code token: an identifier, a number, a one-line string literal, a two-character
# operator or any other single non-space character. Whitespace is not a token.
TOKEN_RE = re.compile(
    r"""[^\W\d]\w*|\d[\w.]*|[rbfuRBFU]{0,2}(?:"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
    r"""|->|==|!=|<=|>=|\*\*|//|:=|[^\s\w]"""
)
MAX_CONTEXT = 3  # context tokens on each side of the change, at most
# A replace pattern of fewer tokens matches too much: on the edit-histories valid split those of
# one token were never right, those of two right 25% of the time, three or more 56-70%.
MIN_REPLACE_TOKENS = 3
MAX_LINE_CHARS = 400  # longer lines are neither edits nor sites (minified code, data)
BLOCK_KINDS = frozenset({"lines", "delete_lines", "insert_lines", "same_lines", "adapted"})
# An adapted block's site differs from the block's old lines in at most this many names or
# literals (each always the same way); the old lines need ADAPTED_MIN_SAME other tokens (keywords,
# operators, brackets) that every site holds as they are: with one (`x,` -> `abs(x),`) every line
# of a list would be a site.
ADAPTED_MAX_HOLES = 2
ADAPTED_MIN_SAME = 3
MAX_BLOCK_LINES = 12  # lines of a block pattern on either side, at most
DEF_RE = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+(\w+)")
KEYWORDS = frozenset(keyword.kwlist) | {"self", "cls", "True", "False", "None"}


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int


def tokens(line: str) -> list[Token]:
    return [Token(m.group(), m.start(), m.end()) for m in TOKEN_RE.finditer(line)]


def is_identifier(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and text.replace("_", "a").isalnum()


def is_name(text: str) -> bool:
    """An identifier that says something (not a keyword, not self/None)."""
    return is_identifier(text) and text not in KEYWORDS


@dataclass(frozen=True)
class Pattern:
    """A before->after transformation. `before` is the token sequence a site must hold
    (context included); the site's text from its `core_from`-th to its `core_to`-th token
    (exclusive; equal: an insertion point after token `core_from - 1`) is replaced by
    `text`. For `append_arg` `before` is the call's name and `text` the argument text
    (", b"); for `insert_line`, `before` is the anchor keyword and `text` the line."""

    kind: str  # rename | append_arg | insert_line | replace | lines | same_lines | delete_lines | insert_lines | adapted
    before: tuple[str, ...]
    core_from: int
    core_to: int
    text: str
    old: str  # the changed text before (for labels, undo and the history event)
    new: str  # ... and after
    # block kinds: each new line's indentation in columns relative to the block's first old line
    # (for insert_lines: to the line above); `text` holds the new lines stripped, joined by "\n"
    indents: tuple[int, ...] = ()
    # rename: how the edit used the name. "attr": every use followed a `.` (`self.data`); "name":
    # none did, and none defined it (a local, a parameter, an import); "": both, or a definition
    # (a def or class name, an assignment at the start of a line: used both ways). A site used the
    # other way is another thing with the same name (sites.py). Not part of the key: the same
    # rename made both ways is one pattern, and then "" (EditMemory.observe).
    where: str = field(default="", compare=False)

    @property
    def key(self) -> tuple:
        return (self.kind, self.before, self.core_from, self.core_to, self.text, self.indents)

    @property
    def block(self) -> bool:
        """A whole-line block pattern (its sites span lines: Site.end_line)."""
        return self.kind in BLOCK_KINDS

    def undoes(self, other: Pattern) -> bool:
        """True when this edit reverts `other` (its new text back to its old)."""
        return (self.old, self.new) == (other.new, other.old) and (self.old or self.new) != ""

    def label(self) -> str:
        if self.kind == "rename":
            return f"rename {self.old} → {self.new}"
        if self.kind == "append_arg":
            return f"add argument {self.text.lstrip(', ')} to {self.before[0]}()"
        if self.kind == "insert_line":
            return f"add {self.text.strip()}"
        if self.kind in BLOCK_KINDS:
            new, old = self.new.split("\n"), self.old.split("\n")
            first = _short(new[0] if self.kind != "delete_lines" else old[0])
            more = len(new if self.kind != "delete_lines" else old) - 1
            lines = f" (+{more} line{'s' * (more > 1)})" if more else ""
            verb = {"insert_lines": "add", "delete_lines": "delete", "lines": "change to", "same_lines": "change to",
                    "adapted": "change like"}[self.kind]
            return f"{verb} {first}{lines}"
        return f"{self.old.strip() or '∅'} → {self.new.strip() or '∅'}"


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass(frozen=True)
class Extracted:
    pattern: Pattern
    line: int  # 0-based line of the edit in the new text (relative to the edit's first line)
    context: frozenset[str]  # identifiers around the edit (context similarity of sites)
    name: str = ""  # the enclosing def's name for insert_line


def _diff_ops(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [op for op in sm.get_opcodes() if op[0] != "equal"]


def extract(old_lines: list[str], new_lines: list[str], max_lines: int = 20) -> list[Extracted]:
    """The patterns of one edit: `old_lines` became `new_lines` (terminators optional).
    Empty for an edit of more than `max_lines` lines on either side (a paste, a reformat:
    not a pattern), for whitespace-only edits and for edits too scattered to name."""
    old = [line.rstrip("\r\n") for line in old_lines]
    new = [line.rstrip("\r\n") for line in new_lines]
    while old and new and old[0] == new[0]:
        old, new = old[1:], new[1:]
    while old and new and old[-1] == new[-1]:
        old, new = old[:-1], new[:-1]
    if not (old or new) or len(old) > max_lines or len(new) > max_lines:
        return []
    if any(len(x) > MAX_LINE_CHARS for x in old + new):
        return []
    if not old and len(new) == 1:  # one line added
        return _inserted_line(new[0], new_lines, old_lines)
    if not new and len(old) == 1:  # one line deleted: only an undo of an insert_line
        m = old[0].strip()
        return [Extracted(Pattern("delete_line", ("def",), 0, 0, "", m, ""), 0, frozenset())] if m else []
    if len(old) != len(new):
        return []
    out: list[Extracted] = []
    for i, (o, n) in enumerate(zip(old, new)):
        if [t.text for t in tokens(o)] == [t.text for t in tokens(n)]:
            continue  # unchanged, or whitespace only
        p = line_pattern(o, n)
        if p is None:
            return []  # one line of the edit cannot be named: the edit is not a pattern
        ctx = frozenset(t.text for t in tokens(o) + tokens(n) if is_name(t.text))
        if all(x.pattern.key != p.key for x in out):
            out.append(Extracted(p, i, ctx))
    return out


def _inserted_line(line: str, new_lines: list[str], old_lines: list[str]) -> list[Extracted]:
    """A decorator-like line added above a def/class line."""
    stripped = line.strip()
    if not stripped.startswith("@") or len(tokens(stripped)) > 24:
        return []
    # the line after the inserted one, in the edit's text: the first new line that is not it
    after = [x for x in new_lines if x.rstrip("\r\n") != line]
    follow = after[0] if after else (old_lines[0] if old_lines else "")
    m = DEF_RE.match(follow)
    if m is None:
        return []
    anchor = "class" if "class" in follow.split("(")[0].split() else "def"
    p = Pattern("insert_line", (anchor,), 0, 0, stripped, "", stripped)
    return [Extracted(p, 0, frozenset({m.group(2)}), name=m.group(2))]


def line_pattern(old: str, new: str) -> Pattern | None:
    a, b = tokens(old), tokens(new)
    at, bt = [t.text for t in a], [t.text for t in b]
    if at == bt:
        return None  # whitespace only
    ops = _diff_ops(at, bt)
    i1, i2 = ops[0][1], ops[-1][2]
    j1, j2 = ops[0][3], ops[-1][4]
    old_core = at[i1:i2]
    new_core = bt[j1:j2]
    if len(old_core) > 12 or len(new_core) > 16:
        return None
    old_text = old[a[i1].start : a[i2 - 1].end] if i2 > i1 else ""
    new_text = new[b[j1].start : b[j2 - 1].end] if j2 > j1 else ""
    # rename: every op is the same identifier swap (foo -> bar, perhaps several times)
    swaps = {(tuple(at[o[1]:o[2]]), tuple(bt[o[3]:o[4]])) for o in ops}
    if len(swaps) == 1:
        (olds, news), = swaps
        if len(olds) == len(news) == 1 and is_name(olds[0]) and is_identifier(news[0]):
            return Pattern("rename", (olds[0],), 0, 1, news[0], olds[0], news[0],
                           where=name_use(b, [j for o in ops for j in range(o[3], o[4])]))
    # append_arg: text inserted right before a call's closing parenthesis, starting with ","
    if i1 == i2 and j2 > j1 and bt[j1] == "," and i1 < len(at) and at[i1] == ")":
        name = _call_name(at, i1)
        if name is not None:
            text = new[b[j1].start : b[j2 - 1].end]
            return Pattern("append_arg", (name,), 0, 0, text, "", text)
    # replace: the core with context until the sequence holds a name outside the core
    # (a changed literal alone would match every equal literal), at most MAX_CONTEXT a side
    left, right = 0, 0
    while True:
        seq = at[i1 - left : i2 + right]
        named = any(is_name(t) for t in at[i1 - left : i1] + at[i2 : i2 + right])
        core_named = i2 - i1 >= 2 and any(is_name(t) for t in old_core)
        # an insertion needs context on both sides, or one side and the line's end
        anchored = (left > 0 or i1 == 0) and (right > 0 or i2 == len(at)) if i1 == i2 else True
        if seq and (named or core_named) and anchored:
            break
        grow_left = i1 - left > 0 and (left <= right or i2 + right >= len(at))
        if grow_left and left < MAX_CONTEXT:
            left += 1
        elif i2 + right < len(at) and right < MAX_CONTEXT:
            right += 1
        elif i1 - left > 0 and left < MAX_CONTEXT:
            left += 1
        else:
            return None
    while i2 + right - (i1 - left) < MIN_REPLACE_TOKENS:  # more context, where there is some
        if i2 + right < len(at):
            right += 1
        elif i1 - left > 0:
            left += 1
        else:
            return None
    before = tuple(at[i1 - left : i2 + right])
    if i1 == i2:  # an insertion: the exact text between the two context tokens in the new line
        new_text = new[b[j1 - 1].end if j1 > 0 else b[j1].start : b[j2].start if j2 < len(b) else b[j2 - 1].end]
        return Pattern("replace", before, left, left, new_text, old_text, new_text)
    # The span reaches over the whitespace to the context tokens on each side that has one, and the
    # new text is the new line's text between them: deleting `as live` from `f() as live:` leaves
    # `f():`, not `f() :` (on the valid split, deletions were never exact without it).
    if j1 == j2:  # a deletion: the span reaches from the token before to the token after, whatever
        # they are (sites.py), and the text is the gap the new line has there (or "" at an end of the line)
        text = new[b[j1 - 1].end : b[j1].start] if 0 < i1 and i2 < len(at) and 0 < j1 < len(b) else ""
        return Pattern("replace", before, left, left + (i2 - i1), text, old_text, "")
    text_from = b[j1 - 1].end if left else b[j1].start
    text_to = b[j2].start if right else b[j2 - 1].end
    text = new[text_from:text_to]
    return Pattern("replace", before, left, left + (i2 - i1), text, old_text, new_text)


def is_attribute(toks: list[Token], k: int) -> bool:
    """Token k follows a `.`: an attribute (`self.data`), not the bare name."""
    return k > 0 and toks[k - 1].text == "."


def is_definition(toks: list[Token], k: int) -> bool:
    """Token k is what its line defines: a def or class name, or the target of an assignment or
    annotation that starts the line (`data = ...`, `data: int`): such a name is used both bare and
    as an attribute (a class attribute, a method)."""
    if k > 0 and toks[k - 1].text in ("def", "class"):
        return True
    return k == 0 and len(toks) > 1 and toks[1].text in ("=", ":")


def name_use(toks: list[Token], at: list[int]) -> str:
    """Pattern.where of a rename whose new name is tokens `at` of the new line `toks`."""
    if any(is_definition(toks, k) for k in at):
        return ""
    dots = {is_attribute(toks, k) for k in at}
    return "" if len(dots) != 1 else "attr" if dots == {True} else "name"


def _call_name(at: list[str], close: int) -> str | None:
    """The name of the call whose `)` is token `close`, when it opens on this line."""
    depth = 0
    for k in range(close, -1, -1):
        if at[k] == ")":
            depth += 1
        elif at[k] == "(":
            depth -= 1
            if depth == 0:
                return at[k - 1] if k > 0 and is_name(at[k - 1]) else None
    return None


# ---- whole-line blocks ------------------------------------------------------------------------


def indent_of(line: str) -> int:
    """Columns of leading whitespace (a tab counts one: the block's lines are compared to each other)."""
    return len(line) - len(line.lstrip(" \t"))


def _has_name(lines) -> bool:
    return any(is_name(t.text) for x in lines for t in tokens(x))


def common_ends(old: list[str], new: list[str]) -> tuple[int, int]:
    """(head, tail): how many lines the two sides share at their start and, after those, at their end."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return head, tail


def block_pattern(old_lines: list[str], new_lines: list[str], above: str | None,
                  below: str | None) -> tuple[Pattern, int, int] | None:
    """The whole-line block pattern of an edit (module doc), with the offsets of its first and
    last-but-one line in the edit (the lines both sides share are left out): `old_lines` became
    `new_lines`; `above`/`below` are the document's lines right outside the edit (None at an end).
    None for an edit that changes whitespace only, blocks of more than MAX_BLOCK_LINES, a deleted
    block without a name (every `pass`), a changed block of blank lines, an inserted block without
    a name (every blank line), or an insertion below a line without a name."""
    old = [x.rstrip("\r\n") for x in old_lines]
    new = [x.rstrip("\r\n") for x in new_lines]
    head, tail = common_ends(old, new)
    if head:
        above = old[head - 1]
    if tail:
        below = old[len(old) - tail]
    old, new = old[head : len(old) - tail], new[head : len(new) - tail]
    if len(old) > MAX_BLOCK_LINES or len(new) > MAX_BLOCK_LINES or not (old or new):
        return None
    if any(len(x) > MAX_LINE_CHARS for x in old + new):
        return None
    if [t.text for x in old for t in tokens(x)] == [t.text for x in new for t in tokens(x)]:
        return None  # whitespace and line breaks only: a reformat
    stripped_new = tuple(x.strip() for x in new)
    if old:
        # A changed block without a name (`):` -> `) -> None:`) is a pattern, its many sites for
        # the trees to judge (on the train split's held-out folds it added right proposals at the
        # same precision); a deleted one (every `pass`) or one of blank lines only is not.
        if not _has_name(old) and not (new and any(tokens(x) for x in old)):
            return None
        first = next((x for x in old if x.strip()), old[0])
        ref = indent_of(first)
        before = tuple(x.strip() for x in old)
        kind = "lines" if new else "delete_lines"
        pattern = Pattern(kind, before, 0, len(before), "\n".join(stripped_new),
                          "\n".join(before), "\n".join(stripped_new),
                          tuple(indent_of(x) - ref if x.strip() else 0 for x in new))
        return pattern, head, len(new)
    # an insertion: the lines it went between (stripped) are where it goes again
    # The line above must say something: on the train split, a block inserted below a blank line
    # or a bracket was the next edit at 0.2-0.7% of the places with the same two lines (below a
    # line with a name: 9-17% the first time, 21-50% once the user repeated it).
    if above is None or below is None or not _has_name(new) or not _has_name([above]):
        return None
    a, b = above.strip(), below.strip()
    ref = indent_of(above)
    pattern = Pattern("insert_lines", (a, b), 1, 1, "\n".join(stripped_new), "", "\n".join(stripped_new),
                      tuple(indent_of(x) - ref if x.strip() else 0 for x in new))
    return pattern, head, len(new)


def is_literal(text: str) -> bool:
    """A number or a one-line string literal (TOKEN_RE's; a prefix like `r` lexes as its own token)."""
    return bool(text) and (text[0].isdigit() or text[0] in "'\"")


def hole(text: str) -> bool:
    """A token an adapted block's site may hold in its place: a name or a literal."""
    return is_name(text) or is_literal(text)


def adapted_pattern(block: Pattern) -> Pattern | None:
    """The `adapted` pattern of a changed block (`lines` or `same_lines`): the same old and new
    lines, matched at sites up to a substitution of names and literals (sites.py). None for a
    deleted or inserted block (a wrong deletion at a look-alike line, an `import` the user keeps, is
    the worst guess to show), or one whose old lines hold too few other tokens to say where."""
    if block.kind not in ("lines", "same_lines") or not block.before or not block.text:
        return None
    toks = [t.text for x in block.before for t in tokens(x)]
    if not any(hole(t) for t in toks) or sum(not hole(t) for t in toks) < ADAPTED_MIN_SAME:
        return None
    return Pattern("adapted", block.before, block.core_from, block.core_to, block.text, block.old, block.new,
                   block.indents)
