"""Would accepting an inline suggestion break the code's syntax? (the server holds it back)

The model's insertion at the cursor is judged by tree-sitter (the grammars of
coder_model.regions.GRAMMARS), on a window of the document around the cursor, before
and after the insertion:

- after: the window with the insertion applied. No syntax problem on the edited lines
  (the cursor line through the line where the insertion ends): it is shown;
- before: the same window as the user has it. The edited line had no problem: the
  insertion introduced one, and it is held back (`return x in self._h` + `ers:`);
- the line was already broken (a half-typed line: `x = foo(`): both lines are closed the
  way a user would go on typing (the brackets left open on the line are closed at its
  end); held back when the closed line before is clean and the closed line after is not
  (`x = foo(` + `a, b):`), shown otherwise (`x = foo(` + `a, b)` completes it).

A syntax problem is an ERROR node on the edited lines, or a MISSING node the parser put
before the end of the insertion (a token the insertion skipped). A MISSING node at or
after the insertion's end is a token the user has yet to type (`if (x) {` wants its `}`,
`let x = f(a)` its `;`): an unfinished line, not a broken one. Hence an insertion that
opens a bracket passes and one that closes a bracket nothing opened does not.

Below the edited lines: an insertion after which the window has more ERROR nodes below
them than both the document as it is and the document with the cursor line blank is held
back (a docstring closed early makes its prose code; a block no longer opened).
Text typed in a comment or in a string begun on a line above is prose and not judged,
unless the insertion holds a triple quote (it may end that string).

An indentation-sensitive language (Python) adds one rule tree-sitter's error recovery misses:
an insertion that leaves a bracket open at the end of the line makes the next lines part of
that bracket, so the next line of code must be indented deeper than the edited line or close
it (`"OPTIONS": {` above a `"DIRS": [],` at the same indentation is held back; the parser
reports that error, if at all, far below the edited lines). An insertion that ends the line
counts every bracket the line leaves open, not only those it opens: accepted, `f(g(1` + `)`
leaves `f(` open.

More Python rules read the lines below the cursor as the compiler would:
- a line of code indented deeper than the edited line continues it, so the edited line must
  open a bracket (or end in `:` or `\\`): `x = ` + `(a, b)` above `    a,` / `)` is held back,
  `x = ` + `(` passes. Inside a bracket indentation is free, but formatted code indents a line
  deeper than the one before it only under an opener, so the rule holds there too (an item
  written whole above its own lines is held back);
- a statement typed where a docstring begun above swallows code below it (its closing quotes
  are missing, so the code that follows reads as its prose) belongs after those quotes:
  `try:` typed at the docstring's indentation is held back; prose there is not judged; and on a
  new line under a header, above prose closed by triple quotes, the docstring opens;
- the brackets open at the line's end are counted from the first line of its statement, on the
  tree's tokens above the cursor (a bracket inside a multi-line string counts for nothing): a
  half-typed line is closed with all of them, and a line that leaves one open above the next
  statement (a line of code at the statement's indentation or less that is a statement alone:
  `for k in d:`, `L, U = m.lu()`) is held back (a generator's `for` given a `:`, a matrix's last
  row given a comma);
- triple quotes opened on a blank line outside any string, and left open, where no docstring or
  value goes (under `return x`, or under a header whose body below is code) swallow the code
  below up to the next string's quotes: held back;
- on a docstring's line, closing quotes above more of its prose and its own closing quotes are
  held back (that prose would be code, and those quotes would open a string);
- a closer that starts a line below at the edited line's indentation (`):` under the arguments
  of a `for ... in zip(`) closes a bracket the edited line must open;
- in a call whose arguments above include a keyword one, a new argument line that begins a
  positional argument is Python's "positional argument follows keyword argument".

What it cannot see: a valid statement in the wrong place (`del d[k]` under
`if k not in d:`), or a valid one that means nothing (`self.value` alone on a line).

The window (MAX_BEFORE lines back to the nearest line at indentation 0, else to the least
indented line; MAX_AFTER lines on, up to a line less indented than the window's first that is
not inside one of its brackets)
keeps a check under a millisecond or so on real files: parsing the window costs about
as much as a few hundred lines, never the whole file. No torch here; tree-sitter is
imported when a grammar is first asked for.
"""

from __future__ import annotations

import ast
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlm.coder_model import regions
from dlm.coder_model.line_scan import code_chars, open_string, without_comment
from dlm.coder_model.regions import content, split_lines, utf8_length

log = logging.getLogger(__name__)

MAX_BEFORE = 60  # lines looked back for the start of the enclosing top-level statement
MAX_AFTER = 30  # lines after the cursor (a closing brace, the body of a header)
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}
_QUOTES = "\"'`"


@dataclass(frozen=True)
class Window:
    """Lines of the document around the cursor: `lines[row]` is the cursor line."""

    lines: list[str]  # with their terminators
    row: int


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _starts_token(root, lines: list[str], r: int) -> bool:
    """Does a token of the tree start at line r's first character? (not inside a string or
    comment that began above: a window starting there would read prose as code)"""
    if root is None:
        return True
    text = content(lines[r])
    point = (r, utf8_length(text[: _indent(text)]))
    node = root.descendant_for_point_range(point, point)
    return node is not None and (node.start_point[0], node.start_point[1]) == (point[0], point[1])


def _inside_prose(root, lines: list[str], row: int, col: int) -> bool:
    """Is (row, col) strictly inside a comment, or a string begun on a line above, of the
    document's tree? Anything typed there is text, not code: the check has nothing to judge (a
    doctest line in a docstring). A string opened on the cursor's line is code being typed: what
    follows its quote is judged (`"` + `OPTIONS": {` opens a bracket past the line)."""
    if root is None:
        return False
    point = (row, utf8_length(content(lines[row])[:col]))
    node = root.descendant_for_point_range(point, point)
    for _ in range(4):  # the string's content node, the string, a concatenation
        if node is None:
            return False
        if ("string" in node.type or "comment" in node.type) and node.start_point < point < node.end_point:
            return "comment" in node.type or node.start_point[0] < row
        node = node.parent
    return False


def _inside_bracket(root, lines: list[str], r: int, start: int) -> bool:
    """Does line r begin inside a bracket (or a half-typed line's ERROR) opened on a line from
    `start` on? Inside one, indentation is free (the rows of a matrix at column 0)."""
    if root is None:
        return False
    text = content(lines[r])
    point = (r, utf8_length(text[: _indent(text)]))
    node = root.descendant_for_point_range(point, point)
    while node is not None:
        if (node.type in _BRACKET_NODES or node.type == "ERROR") and start <= node.start_point[0] < r:
            return True
        node = node.parent
    return False


def window(lines: list[str], row: int, root=None) -> Window:
    """The lines around `row` the check parses: from the nearest line at indentation 0 within
    MAX_BEFORE lines (else the least indented one there, the nearest of those), to MAX_AFTER lines
    after, stopping before a line less indented than the first. With the document's tree (`root`),
    a window starts and ends only where a token starts (never inside a docstring), and a cut
    after MAX_AFTER lines falls between two statements of the cursor's block where it can: a
    window cut inside a statement makes an ERROR of its last lines that may reach back to the
    cursor line."""
    start, least = row, None
    for r in range(row - 1, max(-1, row - 1 - MAX_BEFORE), -1):
        text = content(lines[r])
        if not text.strip():
            continue
        ind = _indent(text)
        if (least is None or ind < least) and _starts_token(root, lines, r):
            least, start = ind, r
            if ind == 0:
                break
    start = _statement_start(root, lines, start, row)
    base = _indent(content(lines[start])) if least is not None else _indent(content(lines[row]))
    end, limit = row, min(len(lines), row + 1 + MAX_AFTER)
    body = None  # the indentation of the first line after the cursor: its block's statements
    cut = None  # the last row before a statement of that block starts
    decorated = False  # the last line of code was a decorator: no cut between it and its def
    for r in range(row + 1, len(lines)):
        text = content(lines[r])
        if text.strip() and _starts_token(root, lines, r):  # (a string's lines may start anywhere)
            ind = _indent(text)
            if ind < base and not _inside_bracket(root, lines, r, start):
                return Window(lines[start : end + 1], row - start)
            body = ind if body is None else body
            closer = text.lstrip().startswith(tuple(_CLOSE))  # it ends the statement above it
            if ind <= body and not decorated and not closer:
                cut = end
            if ind <= body and not closer:  # a decorator's own lines keep it open until its def
                decorated = text.lstrip().startswith("@")
        if r >= limit:
            break
        end = r
    if end == len(lines) - 1:
        return Window(lines[start:], row - start)
    last = cut if cut is not None and cut > row else end
    return Window(lines[start : _bracket_end(root, lines, last, row) + 1], row - start)


def _bracket_end(root, lines: list[str], last: int, row: int) -> int:
    """`last`, or the row where a bracket open across it closes (within MAX_STATEMENT_LINES of
    `row`): a window cut inside a long bracket (a list of 80 cases) reads as unclosed."""
    if root is None or last + 1 >= len(lines):
        return last
    text = content(lines[last + 1])
    point = (last + 1, utf8_length(text[: _indent(text)]))
    node = root.descendant_for_point_range(point, point)
    far = last
    while node is not None:
        if node.type in _BRACKET_NODES and node.start_point[0] <= last < node.end_point[0]:
            far = max(far, node.end_point[0])
        node = node.parent
    return far if far - row <= MAX_STATEMENT_LINES else last


MAX_STRING_LINES = 200  # lines a window is extended by to take in the end of a triple-quoted string


def _past_open_strings(win: Window, lines: list[str], row: int, text: str) -> Window:
    """`win` extended past the end of a triple-quoted string that the insertion leaves open in it:
    a window cut inside a docstring the insertion opens or closes (triple quotes typed on a docstring's
    first or last line) reads that docstring as unterminated, an error of the insertion's line
    that the document does not have. Quotes are counted roughly (escapes and quotes inside
    one-line strings aside), the document's and the insertion's together."""
    start = row - win.row
    end = start + len(win.lines)
    window_text = "".join(win.lines) + text
    for quote in ('"""', "'''"):
        if window_text.count(quote) % 2 == 0:
            continue
        for r in range(end, min(len(lines), end + MAX_STRING_LINES)):
            if quote in lines[r]:
                end = r + 1
                break
        window_text = "".join(lines[start:end]) + text
    return win if end == start + len(win.lines) else Window(lines[start:end], win.row)


MAX_STATEMENT_LINES = 400  # lines a window reaches back for the start of a statement it began inside


def _statement_start(root, lines: list[str], start: int, row: int) -> int:
    """The row where the statement (or decorator) begins whose bracket line `start` is inside, when
    it lies within MAX_STATEMENT_LINES of `row`; else `start`. A window begun inside a long
    bracket (a parametrize list of 80 cases) reads its closer as one that nothing opened."""
    if root is None or start >= len(lines):
        return start
    text = content(lines[start])
    point = (start, utf8_length(text[: _indent(text)]))
    node = root.descendant_for_point_range(point, point)
    outer = None
    while node is not None:
        if (node.type in _BRACKET_NODES or node.type == "ERROR") and node.start_point[0] < start:
            outer = node  # (a bracket the half-typed line leaves unclosed is an ERROR of the tree)
        node = node.parent
    if outer is None:
        return start
    node = outer
    while node.parent is not None and node.parent.type not in ("module", "block", "decorated_definition"):
        node = node.parent
    first = node.start_point[0]
    return first if 0 <= row - first <= MAX_STATEMENT_LINES else start


def _problems(root, lo: int, hi: int, typed_to: int) -> list:
    """The syntax problems of a tree on the bytes lo..hi: ERROR nodes that touch them, MISSING
    nodes placed before `typed_to` (the insertion's end; later ones are yet to be typed)."""
    out = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if node.is_missing:
            if node.start_byte < typed_to:
                out.append(node)
            continue
        if node.type == "ERROR":
            out.append(node)
            continue
        if node.has_error:
            stack.extend(node.children)
    return out


def _open_brackets(text: str) -> list[str]:
    """The brackets a line leaves open, innermost last (string literals skipped roughly:
    coder_model.line_scan; a closer with no opener clears nothing)."""
    stack: list[str] = []
    _push(stack, text)
    return stack


def _push(stack: list[str], text: str) -> None:
    """Push `text`'s openers on `stack` and pop the ones its closers match (strings skipped roughly)."""
    for _, ch in code_chars(text, _QUOTES):
        if ch in _OPEN:
            stack.append(ch)
        elif ch in _CLOSE and stack and stack[-1] == _CLOSE[ch]:
            stack.pop()


def _pushed(stack: list[str], text: str) -> list[str]:
    """`stack` (open brackets, innermost last) after the brackets of `text` (strings and comments
    skipped roughly: coder_model.line_scan; a closer that matches nothing clears nothing)."""
    out = list(stack)
    for line in text.split("\n"):
        _push(out, without_comment(line))
    return out


def _open_at_line(root, start: int, row: int) -> tuple[list[str], int]:
    """(the brackets open where line `row` begins, innermost last; the row where the statement
    that holds them begins), counted on the document tree's tokens from line `start` (a line
    between two statements). Strings and comments are tokens whole, so a bracket inside a
    multi-line string counts for nothing, as it does for the compiler. Without a tree: ([], row)."""
    if root is None or start >= row:
        return [], row
    lo, hi = (start, 0), (row, 0)
    stack: list[str] = []
    first = row  # the first row of the statement under way: the row of a token met with nothing open
    last_row = -1
    todo = [root]
    while todo:
        node = todo.pop()
        if node.end_point <= lo or node.start_point >= hi:
            continue
        if node.child_count:
            todo.extend(reversed(node.children))
            continue
        kind = node.type
        if node.start_point[0] != last_row:
            last_row = node.start_point[0]
            if not stack:
                first = last_row
        if kind in _OPEN:
            stack.append(kind)
        elif kind in _CLOSE and stack and stack[-1] == _CLOSE[kind]:
            stack.pop()
    return stack, (first if stack else row)


def _leaves_string_open(line: str) -> bool:
    return line.count('"""') % 2 == 1 or line.count("'''") % 2 == 1


def _closed(line: str, stack: list[str] | None = None) -> str:
    """A line with the brackets it leaves open closed at its end (its terminator kept); a
    trailing comma goes first (`f(a, ` is closed as `f(a)`: C takes no `f(a, )`). `stack`:
    the brackets open at the line's end counted from its statement's start (the lines above
    included); without it, those the line itself opens."""
    text = content(line)
    eol = line[len(text) :]
    body = text.rstrip()
    body = body.removesuffix(",")
    opened = _open_brackets(body) if stack is None else stack
    closers = "".join(_OPEN[c] for c in reversed(opened))
    return body + closers + eol


class _Parsed:
    """A window's text parsed, with the byte span of its edited lines."""

    def __init__(self, parser, lines: list[str], first: int, last: int, typed_to_char: int, col: int) -> None:
        # typed_to_char: the insertion's end, col: the cursor, in code points from the start of line `first`
        head = "".join(lines[:first])
        edited = "".join(lines[first : last + 1])
        text = head + edited + "".join(lines[last + 1 :])
        self.lo = utf8_length(head)
        self.hi = self.lo + utf8_length(content(edited))
        self.typed_to = self.lo + utf8_length(edited[:typed_to_char])
        self.cursor = self.lo + utf8_length(edited[:col])
        self.root = parser.parse(text.encode("utf-8", "surrogatepass")).root_node

    def problems(self) -> list:
        return _problems(self.root, self.lo, self.hi, self.typed_to)

    def problems_below(self) -> int:
        """ERROR nodes that start after the edited lines (the window's own, or ones the insertion
        caused below: a docstring closed early, a block no longer opened). A MISSING node there
        is a closer yet to be typed (`if (a) {` wants its `}`), not an error."""
        return sum(1 for n in _problems(self.root, self.hi + 1, 1 << 62, 0)
                   if n.start_byte > self.hi and n.type == "ERROR")  # fmt: skip

    def typed_errors(self) -> list:
        """ERROR nodes that start in the insertion (or, before it, at or after the cursor)."""
        return [
            n
            for n in self.problems()
            if n.type == "ERROR" and self.cursor <= n.start_byte <= max(self.typed_to - 1, self.cursor)
        ]


# The parses of the document as it is (the window, the window with the cursor line blank, the
# half-typed line closed), and whether a string must close at the cursor, are the same for every
# draft a request checks: the line ranker checks the memory's 8, then the server its answer. They
# are kept, newest last, a few requests' worth.
_KEPT_PARSES = 16
_kept: OrderedDict[tuple, Any] = OrderedDict()
_kept_lock = threading.Lock()


def _kept_or_made(key: tuple, make: Callable[[], Any]) -> Any:
    """The value kept under `key`, else `make()` kept there (the newest _KEPT_PARSES values)."""
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    got = make()
    with _kept_lock:
        _kept[key] = got
        while len(_kept) > _KEPT_PARSES:
            _kept.popitem(last=False)
    return got


def _parsed_document(parser, lines: list[str], first: int, last: int, typed_to_char: int, col: int) -> _Parsed:
    """`_Parsed` of a window with no insertion in it, parsed once for all the drafts of a request."""
    return _kept_or_made(("parsed", id(parser), tuple(lines), first, last, typed_to_char, col),
                         lambda: _Parsed(parser, lines, first, last, typed_to_char, col))


# languages where a line's indentation is syntax: the open-bracket rule applies (module docstring)
INDENTED_LANGUAGES = frozenset({"python"})


def _next_code_line(lines: list[str], after: int) -> str | None:
    """The first line after index `after` that holds code (not blank, not only a comment)."""
    for line in lines[after + 1 :]:
        stripped = content(line).strip()
        if stripped and not stripped.startswith("#"):
            return content(line)
    return None


def _open_until_next_statement(lines: list[str], last: int, stack: list[str], base: int) -> bool:
    """Do the brackets `stack` (open at the end of line `last`) stay open up to the next statement
    at indentation `base` or less? The deeper lines between continue the bracket, so their own
    brackets count; one that closes all of them ends the statement. Triple quotes among them end
    the count unjudged (a string's lines hold no brackets)."""
    for line in lines[last + 1 : last + 1 + MAX_AFTER]:
        code = content(line)
        stripped = code.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if '"""' in code or "'''" in code:
            return False
        if _indent(code) <= base:
            return not stripped.startswith(tuple(_CLOSE)) and _is_statement(code)
        stack = _pushed(stack, code)
        if not stack:
            return False
    return False


def _ends_inside_quote(line: str) -> bool:
    """Does the line end inside a one-line string literal: a quote opened and never closed, with no
    backslash to carry it on? (A one-line string cannot go on past its line.) Lines with triple
    quotes are not judged: theirs can."""
    code = line.rstrip()
    if '"""' in code or "'''" in code or code.endswith("\\"):
        return False
    return bool(open_string(without_comment(code)))


def _opens_past_the_line(before_line: str, after_line: str, next_line: str | None, ends_line: bool = False) -> bool:
    """Does the edited line leave more brackets open than the line had (or, for an insertion that
    ends the line, any bracket open: `f(g(1` + `)` leaves `f(` open), with the next line of code
    neither indented deeper nor closing the innermost of them?"""
    if next_line is None:
        return False
    opened = _open_brackets(after_line)
    if not opened or (len(opened) <= len(_open_brackets(before_line)) and not ends_line):
        return False
    if _indent(next_line) > _indent(after_line):
        return False
    return not next_line.lstrip().startswith(_OPEN[opened[-1]])


_BLOCK_KEYWORDS = ("if", "elif", "else", "for", "while", "def", "class", "with", "try", "except", "finally",
                   "async", "match", "case")


def _colon_inside_bracket(after_line: str) -> bool:
    """A block header whose `:` comes while a bracket it opened is still open (`if g(x` + `:`)."""
    words = after_line.split(None, 1)
    code = after_line.rstrip()
    return bool(words) and words[0].rstrip(":") in _BLOCK_KEYWORDS and code.endswith(":") \
        and bool(_open_brackets(code))  # fmt: skip


_BRACKET_NODES = frozenset({
    "argument_list", "parameters", "parenthesized_expression", "tuple", "list", "dictionary", "set",
    "subscript", "generator_expression", "list_comprehension", "dictionary_comprehension",
    "set_comprehension", "lambda_parameters", "import_from_statement",
})  # fmt: skip


def _closed_below(lines: list[str], row: int) -> bool:
    """Do the lines below `row` close a bracket that none of them opened, with a closer that starts
    a line at `row`'s indentation, before any line less indented? (the statement the cursor line begins goes on over
    them: `for k, v in zip(` above `        pairs, strict=True` and `    ):`)"""
    ind = _indent(content(lines[row]))
    depth = 0
    for r in range(row + 1, min(len(lines), row + 1 + MAX_AFTER)):
        text = content(lines[r])
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if _indent(text) < ind:
            return False
        for _, ch in code_chars(without_comment(text), _QUOTES):
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
                if depth < 0:  # a closer that starts its line at the cursor line's indentation
                    return _indent(text) == ind and text.lstrip()[:1] in _CLOSE
    return False


_NAMED_ARGUMENT = re.compile(r"\s*(\*\*|\*|[A-Za-z_]\w*\s*=(?!=)|[)\]}#]|$)")


def _positional_after_keyword(root, lines: list[str], row: int, col: int, line_after: str) -> bool:
    """Does the edited line begin a positional argument in a call whose arguments on the lines
    above include a keyword one (`f(a=1,` over `    x,`: Python's "positional argument follows
    keyword argument")? Only a line that starts at the cursor's argument is judged."""
    if root is None or content(lines[row])[:col].strip() or _NAMED_ARGUMENT.match(line_after):
        return False
    point = (row, utf8_length(content(lines[row])[:col]))
    node = root.descendant_for_point_range(point, point)
    while node is not None and node.type != "argument_list":
        if node.type in _BRACKET_NODES or node.type in ("block", "module", "ERROR"):
            return False  # (an argument's own bracket: a list of items, where any item may come)
        node = node.parent
    if node is None or node.start_point[0] >= row:
        return False
    return any(ch.type == "keyword_argument" and ch.end_point[0] < row for ch in node.children)


def _continues_without_opening(after_line: str, next_line: str | None) -> bool:
    """Is the next line of code indented deeper than the edited line, which opens no bracket, ends
    in no `:` or `\\` and leaves no string open? (Python: only a bracket, a block header or a
    backslash lets the next line be indented deeper.)"""
    if next_line is None or _indent(next_line) <= _indent(after_line):
        return False
    code = without_comment(after_line)
    if not code.strip() or code.endswith((":", "\\")) or _open_brackets(code):
        return False
    return not _leaves_string_open(code)


_STATEMENTS = (ast.Assign, ast.AugAssign, ast.Return, ast.Import, ast.ImportFrom, ast.FunctionDef,
               ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try,
               ast.With, ast.AsyncWith, ast.Raise, ast.Delete, ast.Global, ast.Nonlocal, ast.Assert)
MAX_STATEMENT_CHARS = 400  # longer lines are not parsed by `_is_statement` (prose, or minified)


def _is_statement(line: str) -> bool:
    """Is `line` (one line) a Python statement that prose would not be: an assignment, a return, an
    import, a call, a block header...? `Parameters`, `x : int` and `See foo(bar).` are not."""
    code = line.strip()
    if not code or len(code) > MAX_STATEMENT_CHARS:
        return False
    if code.endswith(":"):  # a block header: valid with a body, in the place its keyword wants
        tries = (code + "\n pass", "if 1:\n pass\n" + code + "\n pass",
                 "try:\n pass\n" + code + "\n pass", code + "\n pass\nexcept Exception:\n pass")
        return any(_parses(src) is not None for src in tries)
    tree = _parses(code)
    if tree is None or len(tree.body) != 1:
        return False
    node = tree.body[0]
    return isinstance(node, _STATEMENTS) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))


def _parses(src: str) -> ast.Module | None:
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _docstring_swallowing_code(root, lines: list[str], row: int, col: int) -> int | None:
    """When (row, col) is inside a triple-quoted string begun on a line above whose text below the
    cursor holds statements at the indentation of the string's first line (the code after a
    docstring whose closing quotes are missing), that indentation; else None."""
    if root is None:
        return None
    point = (row, utf8_length(content(lines[row])[:col]))
    node = root.descendant_for_point_range(point, point)
    for _ in range(4):
        if node is None:
            return None
        if node.type == "string" and node.start_point[0] < row < node.end_point[0]:
            if node.parent is None or node.parent.type not in ("expression_statement", "ERROR", "block"):
                return None  # a string that is a value (`HEADER = """...`): its lines may be anything
            break
        node = node.parent
    else:
        return None
    opener = content(lines[node.start_point[0]])
    if '"""' not in opener and "'''" not in opener:
        return None
    base = _indent(opener)
    seen = 0
    for r in range(row + 1, min(node.end_point[0], row + 1 + MAX_AFTER)):
        text = content(lines[r])
        if not text.strip():
            continue
        seen += 1
        if _indent(text) <= base and _is_statement(text):
            return base
        if seen >= 8:
            break
    return None


_CODE_STARTS = ("#", "@", "def ", "class ", "return", "if ", "elif ", "else", "for ", "while ", "with ", "try",
                "except", "finally", "async ", "await ", "from ", "import ", "raise", "yield", "assert ")


def _reads_as_code(text: str) -> bool:
    """Is this line of the lines below code (or a piece of a statement), not a docstring's prose?"""
    stripped = text.strip()
    return (_is_statement(text) or stripped.startswith(_CODE_STARTS)
            or stripped.endswith(("(", "[", "{", ",", ":", ")", "]", "}", "\\")))


def _prose_then_quotes(lines: list[str], row: int) -> tuple[int, str] | None:
    """Below `row`: (how many lines of prose, then the first line with triple quotes), or None when
    a line of code comes first or no quotes come within MAX_AFTER lines."""
    prose = 0
    for r in range(row + 1, min(len(lines), row + 1 + MAX_AFTER)):
        text = content(lines[r])
        stripped = text.strip()
        if not stripped:
            continue
        if '"""' in stripped or "'''" in stripped:
            return prose, text
        if _reads_as_code(text):
            return None
        prose += 1
    return None


def _closes_docstring_early(lines: list[str], row: int, col: int, text: str) -> bool:
    """Does the insertion, on a line of a docstring (the lines above it hold an odd number of
    triple quotes), close it with more of its prose below and then a line of closing quotes alone
    at the cursor's indentation? That prose would become code, and those quotes open a string."""
    typed = content(lines[row])[:col]
    if typed.strip() or not _leaves_string_open(text) or not _inside_open_quotes(lines, row):
        return False
    below = _prose_then_quotes(lines, row)
    return below is not None and below[0] > 0 and below[1].strip() in ('"""', "'''") \
        and _indent(below[1]) == _indent(typed)


def _docstring_closed_below(lines: list[str], row: int, col: int) -> bool:
    """Is the cursor on a new line right under a block header (nothing typed on it yet), with lines
    of prose below it closed by triple quotes at its indentation? There the docstring must open:
    anything else makes its prose code."""
    typed = content(lines[row])[:col]
    if typed.strip():
        return False
    above = _previous_code_line(lines, row)
    if above is None or not without_comment(above).endswith(":"):
        return False
    below = _prose_then_quotes(lines, row)
    if below is None:
        return False
    prose, line = below
    stripped = line.strip()
    quote = '"""' if '"""' in stripped else "'''"
    closes = stripped.endswith(quote) and stripped.count(quote) == 1
    return closes and (prose > 0 or stripped != quote) and _indent(line) == _indent(typed)


def _inside_open_quotes(lines: list[str], row: int) -> bool:
    """Do the lines above `row`, up to the block header above it (the nearest less indented line,
    within MAX_STRING_LINES), hold an odd number of triple quotes? The cursor is then inside a
    docstring, however the tree reads a string it cannot close."""
    ind = _indent(content(lines[row]))
    quotes = 0
    for r in range(row - 1, max(-1, row - 1 - MAX_STRING_LINES), -1):
        text = content(lines[r])
        if text.strip() and _indent(text) < ind:
            break
        quotes += text.count('"""') + text.count("'''")
    return quotes % 2 == 1


_STRING_GOES_AFTER = (":", "(", "[", "{", ",", "=", "+", "\\")


def _opens_string_among_statements(root, lines: list[str], row: int, col: int, text: str) -> bool:
    """Does the insertion, typed on a blank line, open a triple-quoted string that it leaves open,
    outside any string, under a line of code that is no header, no opener and no operator, or
    above statements at its indentation that come before any closing quotes? There the string
    swallows the code below up to the next string's quotes (a docstring opened after `return x`,
    or under a header whose body is code)."""
    if content(lines[row])[:col].strip() or not text.lstrip().startswith(('"""', "'''")):
        return False
    if not _leaves_string_open(text) or _inside_prose(root, lines, row, col):
        return False
    r = row - 1
    while r >= 0 and (not content(lines[r]).strip() or content(lines[r]).lstrip().startswith("#")):
        r -= 1
    if r < 0 or not _starts_token(root, lines, r) or _inside_open_quotes(lines, row):
        return False  # the first line, or a line of a string (the insertion may close it)
    above = without_comment(content(lines[r]))
    if _leaves_string_open(above):
        return False
    return not above.endswith(_STRING_GOES_AFTER) or _code_before_quotes(lines, row)


def _code_before_quotes(lines: list[str], row: int) -> bool:
    """Is there a statement at `row`'s indentation below it before any line with triple quotes?
    A docstring opened at `row` would swallow it."""
    ind = _indent(content(lines[row]))
    for r in range(row + 1, min(len(lines), row + 1 + MAX_AFTER)):
        text = content(lines[r])
        if '"""' in text or "'''" in text:
            return False
        if text.strip() and _indent(text) == ind and _is_statement(text):
            return True
    return False


def _previous_code_line(lines: list[str], row: int) -> str | None:
    for r in range(row - 1, max(-1, row - 1 - MAX_BEFORE), -1):
        text = content(lines[r])
        if text.strip() and not text.strip().startswith("#"):
            return text
    return None


_parsers = threading.local()


def _parser(language: str):
    """This thread's parser of `language` (None: no grammar). One per thread and language, kept
    for the thread's life: a tree-sitter Parser is not shared between threads, and the kept parses
    (`_kept_or_made`) are keyed by the parser, so a request's drafts find the parses of the first."""
    kept = getattr(_parsers, "by_language", None)
    if kept is None:
        kept = _parsers.by_language = {}
    if language not in kept:
        lang = regions.grammar(language)
        if lang is None:
            kept[language] = None
        else:
            from tree_sitter import Parser

            kept[language] = Parser(lang)
    return kept[language]


def check(
    language: str, lines: list[str], row: int, col: int, text: str, replace_rest: bool = False, root=None
) -> str | None:
    """Why inserting `text` at (row, col) of the document `lines` (with terminators; col in code
    points) breaks its syntax, or None (it does not, or the language has no grammar here).
    `replace_rest`: the insertion replaces the rest of the cursor line. `root`: the root node of
    the document's tree, if one is kept (it picks the window: `window`)."""
    if not text or not 0 <= row < len(lines):
        return None
    parser = _parser(language)
    if parser is None:
        return None
    if language in INDENTED_LANGUAGES and '"""' not in text and "'''" not in text:
        base = _docstring_swallowing_code(root, lines, row, col)
        line_after = content(lines[row])[:col] + split_lines(text)[0]
        if base is not None and _indent(line_after) <= base and _is_statement(line_after):
            return "writes code inside a docstring whose closing quotes the code below needs"
    if language in INDENTED_LANGUAGES and '"""' not in text and "'''" not in text \
            and string_swallows_code(language, lines, row, col, root):
        return "leaves open the triple-quoted string whose closing quotes the code below needs"
    if not _starts_token(root, lines, row) and content(lines[row])[:col].strip():
        return None  # inside a string or comment begun on a line above (a docstring's prose)
    if _inside_prose(root, lines, row, col) and '"""' not in text and "'''" not in text:
        return None  # the cursor is inside a string or comment (a blank line of a docstring)
    if language in INDENTED_LANGUAGES and _opens_string_among_statements(root, lines, row, col, text):
        return "opens a string between two statements, where no docstring or value goes"
    if language in INDENTED_LANGUAGES and '"""' not in text and "'''" not in text \
            and not content(lines[row])[col:].strip() and _docstring_closed_below(lines, row, col):
        return "leaves unopened the docstring whose prose and closing quotes follow"
    win = window(lines, row, root)
    if language in INDENTED_LANGUAGES:
        win = _past_open_strings(win, lines, row, text)
    wl, wr = win.lines, win.row
    line = wl[wr]
    body = content(line)
    eol = line[len(body) :] or ("\n" if wr < len(wl) - 1 else "")
    col = min(col, len(body))
    rest = "" if replace_rest else body[col:]
    new = split_lines(body[:col] + text + rest + eol)
    if new[-1] == "" and len(new) > 1:
        new.pop()
    after = wl[:wr] + new + wl[wr + 1 :]
    last = wr + len(new) - 1
    typed_to = len("".join(new[:-1])) + len(split_lines(body[:col] + text)[-1])
    open_before = open_after = None  # the brackets open at the line's end, from its statement's start
    if language in INDENTED_LANGUAGES:
        above, first = _open_at_line(root, row - wr, row)
        open_before = _pushed(above, body)
        open_after = _pushed(above, body[:col] + text + rest)
        if _leaves_string_open(content(after[last])):
            open_before = open_after = None  # closers would be the string's text: each line closes its own
        if open_after and _open_until_next_statement(after, last, open_after, _indent(content(lines[first]))):
            return "leaves a bracket open where the next statement begins"
        if not rest.strip() and '"""' not in text and "'''" not in text \
                and any(_ends_inside_quote(content(line)) for line in new):
            return "leaves a string open at the end of the line"
    if language in INDENTED_LANGUAGES and _opens_past_the_line(
        body, content(after[last]), _next_code_line(after, last), ends_line=not rest.strip()
    ):
        return "leaves a bracket open that the next lines do not continue"
    if language in INDENTED_LANGUAGES and text.rstrip().endswith(":") and _colon_inside_bracket(content(after[last])):
        return "ends a block header inside an open bracket"
    if language in INDENTED_LANGUAGES and _continues_without_opening(
        content(after[last]), _next_code_line(after, last)
    ):
        return "leaves no bracket open for the deeper lines below it"
    if language in INDENTED_LANGUAGES and _positional_after_keyword(root, lines, row, col, content(after[wr])):
        return "writes a positional argument after keyword arguments"
    if language in INDENTED_LANGUAGES and not _open_brackets(without_comment(content(after[last]))) \
            and _closed_below(wl, wr):
        return "leaves no bracket open for the closer below it"
    parsed_after = _Parsed(parser, after, wr, last, typed_to, col)
    before = _parsed_document(parser, wl, wr, wr, col, col)
    # Errors below the edited lines that neither the document as it is nor the document without
    # the half-typed line has: the insertion made them (a half-typed line's own ERROR can swallow
    # the lines below it, and a line that closes a bracket opened above leaves errors once blanked).
    below = parsed_after.problems_below()
    if below > before.problems_below():
        blank = wl[:wr] + [eol] + wl[wr + 1 :]
        if below > _parsed_document(parser, blank, wr, wr, 0, 0).problems_below():
            return "breaks the lines below it"
    if language in INDENTED_LANGUAGES and _closes_docstring_early(lines, row, col, text):
        return "closes a docstring above its own prose and closing quotes"  # (beyond the window's errors)
    if not parsed_after.problems():
        return None
    if not before.problems():
        return "introduces a syntax error"
    # A half-typed line: compare both as the user would finish them (open brackets closed).
    closed_before = _parsed_document(parser, wl[:wr] + [_closed(line, open_before)] + wl[wr + 1 :], wr, wr, col, col)
    closed_after = _Parsed(
        parser, after[:last] + [_closed(after[last], open_after)] + after[last + 1 :], wr, last, typed_to, col
    )
    if not closed_before.problems():
        return "leaves the line broken past completing" if closed_after.problems() else None
    # Broken past what closing its brackets mends (C's `foo()` wants its `;`): held back only for
    # an error that starts inside the insertion where the line had none from the cursor on.
    if closed_after.typed_errors() and not closed_before.typed_errors():
        return "introduces a syntax error in a half-typed line"
    return None


def rewrite_problem(language: str, lines: list[str], first: int, last: int, new_text: str) -> str | None:
    """Why replacing the document's lines `first`..`last` (inclusive; `lines` with terminators) by
    `new_text` breaks its syntax, or None: the rewrite (a next edit's region) is held back when
    the lines around it, parsed before and after, have more ERROR or MISSING nodes after. Both
    parses cut the document at the same lines, MAX_BEFORE above and MAX_AFTER below, so what
    differs is the rewrite's doing."""
    if not 0 <= first <= last < len(lines):
        return None
    parser = _parser(language)
    if parser is None:
        return None
    lo, hi = max(0, first - MAX_BEFORE), min(len(lines), last + 1 + MAX_AFTER)
    new = split_lines(new_text)
    if new and new[-1] == "":
        new.pop()
    if new and not new[-1].endswith(("\n", "\r")) and last + 1 < hi:
        new[-1] += "\n"  # the region's last line keeps its break when lines follow
    counts = []
    for window_lines in (lines[lo:hi], lines[lo:first] + new + lines[last + 1 : hi]):
        text = "".join(window_lines)
        root = parser.parse(text.encode("utf-8", "surrogatepass")).root_node
        counts.append(len(_problems(root, 0, 1 << 62, 1 << 62)))
    return "adds a syntax error" if counts[1] > counts[0] else None


def _closing_mends(parser, lines: list[str], row: int, col: int, root=None) -> bool:
    """Is the cursor inside a docstring (an odd number of triple quotes above it in its block)
    whose closing quotes, typed on the cursor's line, mend the document: with the line holding
    them there are fewer syntax errors than with the line blank? Then the string runs on over
    code below, which the quotes give back. The whole document is parsed (a window cut through
    the string reads its own cut as errors), so callers ask only of a document that has errors;
    the answer is kept for the line's other drafts and keystrokes: it does not depend on what is
    typed on the line, only on the lines around it and the line's indentation. On a line that
    holds only its indentation (after Enter), the document as it is, `root`, is the one with the
    line blank: of the two parses only the mended one is made, and a document whose string runs
    on is the slow one to parse."""
    typed = content(lines[row])[:col]
    if typed.strip() and not _is_prose(typed) or not _inside_open_quotes(lines, row):
        return False
    above = lines[max(0, row - MAX_STRING_LINES) : row]
    quotes = [q for q in ('"""', "'''") if any(q in line for line in above)]
    indent = typed[: _indent(typed)]
    eol = lines[row][len(content(lines[row])) :] or "\n"

    def errors(line: str) -> int:
        text = "".join(lines[:row]) + line + "".join(lines[row + 1 :])
        return len(_problems(parser.parse(text.encode("utf-8", "surrogatepass")).root_node, 0, 1 << 62, 1 << 62))

    def mends() -> bool:
        if not quotes:
            return False
        if root is not None and lines[row] == indent + eol:
            blank = len(_problems(root, 0, 1 << 62, 1 << 62))
        else:
            blank = errors(indent + eol)
        return any(errors(indent + quote + eol) < blank for quote in quotes)

    return _kept_or_made(("mends", id(parser), tuple(lines[:row]), tuple(lines[row + 1 :]), indent, eol), mends)


def _is_prose(typed: str) -> bool:
    """Is the typed start of a line words, not code (no bracket, operator or quote)?"""
    return not any(ch in typed for ch in "()[]{}=+*/<>'\"#@:;,%")


def string_swallows_code(language: str, lines: list[str], row: int, col: int, root=None) -> bool:
    """Is (row, col) inside a docstring whose closing quotes the code below needs (Python)? Only an
    insertion that closes it keeps that code code (`_closing_mends`). `root`: the document tree's
    root, if one is kept: a document with no syntax error has no string running over its code."""
    if language not in INDENTED_LANGUAGES or not 0 <= row < len(lines):
        return False
    if root is not None and not root.has_error:
        return False
    parser = _parser(language)
    return parser is not None and _closing_mends(parser, lines, row, col, root)


def string_swallows_code_text(language: str, before: str, after: str) -> bool:
    """`string_swallows_code` on a document given as its text before and after the cursor."""
    parser = _parser(language) if language in INDENTED_LANGUAGES else None
    if parser is None:
        return False
    head = split_lines(before)
    root = parser.parse((before + after).encode("utf-8", "surrogatepass")).root_node
    return string_swallows_code(language, split_lines(before + after), len(head) - 1, len(head[-1]), root)


def check_text(language: str, before: str, after: str, text: str, replace_rest: bool = False) -> str | None:
    """`check` on a document given as its text before and after the cursor."""
    lines = split_lines(before + after)
    row = len(split_lines(before)) - 1
    col = len(split_lines(before)[-1])
    parser = _parser(language)
    root = parser.parse((before + after).encode("utf-8", "surrogatepass")).root_node if parser else None
    return check(language, lines, row, col, text, replace_rest, root)
