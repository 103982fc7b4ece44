""".gitignore and `index.exclude` patterns are matched in linear time (lsp.gitignore), and an
oversized ignore file is honoured up to the size cap instead of being dropped (lsp.discovery).

A pattern like `a*a*a*a*a*a*a*a*a*a*b` made a backtracking regex take seconds per file name;
the matcher must decide it in well under a millisecond, with the same answers as before.
"""

from __future__ import annotations

import fnmatch
import logging
import random
import re
import time
from pathlib import Path

import pytest
from dlm.lsp import discovery
from dlm.lsp.gitignore import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    IgnoreStack,
    IgnoreText,
    Rules,
    class_end,
    compile_glob,
    parse_line,
    split_line,
)
from workspace_fakes import stack, write

LIMITS = discovery.Limits(max_files=1000, max_file_bytes=1_000_000, max_entries=100_000)
HOSTILE = "a*a*a*a*a*a*a*a*a*a*b"  # ten stars: exponential for a backtracking matcher
# Generous: the matcher needs well under a millisecond per name; a backtracking one needs seconds.
MAX_SECONDS_PER_CALL = 0.05


def walked(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    return [
        c.rel for c in discovery.walk(str(root), LIMITS, discovery.ignore_stack(str(root), exclude)).files
    ]


def seconds_per_call(fn, calls: int = 100) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


# ---- the reference: the regex translation the matcher replaces --------------------------------


class _OracleSkip(Exception):
    """A pattern where the regex translation was wrong by accident (see `_old_class`)."""


def _old_class(pattern: str, i: int) -> tuple[str, int]:
    j = class_end(pattern, i)  # where the class ends is as the matcher finds it
    if j is None:
        return re.escape("["), i + 1
    body = pattern[i + 1 : j]
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
        # `[^/` + body: a body starting with `]` closed the class early (`[!]a]` was "one
        # character, then `a]`") and one starting with `-` made a range from `/` (`[!-a]`
        # left out `/`..`a`). The matcher gives these gitignore's meaning (a member `]` or
        # `-`), as fnmatch does; they are compared with fnmatch below instead.
        if body[:1] in ("]", "-"):
            raise _OracleSkip
    body = body.replace("\\", "\\\\").replace("[", "\\[")
    return ("[^/" if negate else "[") + body + "]", j + 1


def _old_glob_to_regex(pattern: str) -> str:
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
                if at_start and end == n:
                    out.append(".*")
                    i = end
                elif at_start and pattern.startswith("/", end):
                    out.append("(?:.*/)?")
                    i = end + 1
                else:
                    out.append("[^/]*")
                    i = end
            else:
                out.append("[^/]*")
                i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            part, i = _old_class(pattern, i)
            out.append(part)
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _old_rule(line: str) -> tuple[re.Pattern[str], bool, bool] | None:
    """(regex, negated, dir_only) as the regex translation parsed a line (the line split as the
    glob's parser splits it)."""
    parts = split_line(line)
    if parts is None:
        return None
    line, anchored, negated, dir_only = parts
    prefix = "" if anchored else "(?:.*/)?"
    return re.compile(f"^{prefix}{_old_glob_to_regex(line)}$", re.DOTALL), negated, dir_only


# ---- hostile patterns: linear time, right answers ------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        (HOSTILE, "a" * 80, False),  # the name of the report: no `b` at the end
        (HOSTILE, "a" * 79 + "b", True),
        (HOSTILE, "a" * 9 + "b" * 71, False),  # ends in `b` but has too few `a`s
        ("a*a*a*a*a*a*a*a*a*a*[b]", "a" * 80, False),  # no literal tail to reject it early
        ("*a*a*a*a*a*a*a*a*a*a*", "a" * 9 + "c" * 71, False),  # no literal head or tail
        ("*a*a*a*a*a*a*a*a*a*a*", "c" * 70 + "a" * 10, True),
        ("**/" + HOSTILE, "x/" * 20 + "a" * 80, False),  # `**/` and stars together
        ("?*?*?*?*?*?*?*?*?*?*?*c", "a" * 80, False),
    ],
)
def test_hostile_pattern_is_decided_correctly_in_linear_time(pattern: str, name: str, expected: bool):
    ignores = stack(pattern)
    assert ignores.ignored(name, False) is expected
    assert seconds_per_call(lambda: ignores.ignored(name, False)) < MAX_SECONDS_PER_CALL


def test_hostile_pattern_cost_grows_linearly_with_the_name():
    glob = compile_glob("*a*a*a*a*a*a*a*a*a*a*[b]")
    # The best of a few runs, so that a busy machine does not skew the ratio.
    short = min(seconds_per_call(lambda: glob.match("a" * 200), calls=20) for _ in range(3))
    long = min(seconds_per_call(lambda: glob.match("a" * 2000), calls=20) for _ in range(3))
    # Ten times the name: about ten times the work (a backtracking matcher: astronomically more).
    assert long < 40 * short + 0.001
    assert long < MAX_SECONDS_PER_CALL


def test_hostile_gitignore_still_excludes_what_it_names(tmp_path: Path):
    write(tmp_path, ".gitignore", "a*a*a*a*a*a*a*a*a*a*b.py\n")
    named, kept = "a" * 78 + "b.py", "a" * 80 + ".py"
    for rel in (named, kept, "sub/" + named, "sub/" + kept):
        write(tmp_path, rel)
    start = time.perf_counter()
    assert walked(tmp_path) == [kept, "sub/" + kept]
    assert time.perf_counter() - start < 2.0
    ignore = discovery.ignore_stack(str(tmp_path))
    assert discovery.path_allowed(str(tmp_path), "sub/" + named, ignore) == "ignored"
    assert discovery.path_allowed(str(tmp_path), "sub/" + kept, ignore) == ""


def test_exclude_option_is_matched_in_linear_time_and_still_excludes(tmp_path: Path):
    named, kept = "a" * 78 + "b.py", "a" * 80 + ".py"
    for rel in (named, kept, "ok.py"):
        write(tmp_path, rel)
    exclude = ("a*a*a*a*a*a*a*a*a*a*b.py", "*a*a*a*a*a*a*a*a*a*a*[x].py")
    assert walked(tmp_path, exclude) == [kept, "ok.py"]
    stack = discovery.ignore_stack(str(tmp_path), exclude)
    assert stack.ignored(named, False)
    assert not stack.ignored(kept, False)
    assert seconds_per_call(lambda: stack.ignored(kept, False)) < MAX_SECONDS_PER_CALL


# ---- an oversized ignore file fails closed --------------------------------------------------------


def test_oversized_gitignore_still_excludes_its_first_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    filler = "".join(f"# padding line {i:07d} of a very large generated ignore file\n" for i in range(20_000))
    text = "local_settings.py\n" + filler
    assert len(text.encode()) > discovery.MAX_IGNORE_FILE_BYTES
    gitignore = write(tmp_path, ".gitignore", text)
    write(tmp_path, "local_settings.py")
    write(tmp_path, "main.py")
    with caplog.at_level(logging.WARNING):
        assert walked(tmp_path) == ["main.py"]
    assert any(str(gitignore) in r.getMessage() and "honoured" in r.getMessage() for r in caplog.records)


def test_oversized_gitignore_is_cut_at_a_line_end_and_says_so(tmp_path: Path):
    # Long lines, so that the part read holds fewer than MAX_PATTERNS patterns.
    lines = [f"gen_{i}_{'x' * (100 + i % 37)}.py\n" for i in range(10_500)]
    data = "".join(lines).encode()
    assert len(data) > discovery.MAX_IGNORE_FILE_BYTES
    path = write(tmp_path, ".gitignore", "".join(lines))
    got = discovery.read_ignore_file(str(path))
    assert isinstance(got, IgnoreText) and got.truncated
    assert got.size == len(data) and 0 < got.read <= discovery.MAX_IGNORE_FILE_BYTES
    assert got.read > discovery.MAX_IGNORE_FILE_BYTES - 160  # only the line that crossed the cap is left
    assert got == data[: got.read].decode() and got.endswith("\n")  # whole lines only
    assert got.message.startswith(f"only the first {got.read // 1024} KB of {path} was read")
    # The stack the index keeps carries the message, for the index status to show.
    stack = discovery.ignore_stack(str(tmp_path))
    assert stack.warnings == [got.message]
    assert stack.ignored(lines[0].strip(), False)
    last_whole = got.splitlines()[-1]
    assert stack.ignored(last_whole, False)
    assert not stack.ignored(lines[-1].strip(), False)  # past the cap: not honoured


@pytest.mark.parametrize(
    ("cap", "honoured"),
    [
        (9, "a.py\nb.py"),  # the byte after the cap ends the line: the line is whole
        (8, "a.py\n"),  # `b.py` crosses the cap: left out
        (3, ""),  # the first line alone is longer than the cap
    ],
)
def test_oversized_ignore_file_keeps_whole_lines_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int, honoured: str
):
    monkeypatch.setattr(discovery, "MAX_IGNORE_FILE_BYTES", cap)
    path = write(tmp_path, ".gitignore", "a.py\nb.py\nc.py\n")
    got = discovery.read_ignore_file(str(path))
    assert got == honoured
    assert isinstance(got, IgnoreText) and got.truncated and got.size == 15
    stack = discovery.ignore_stack(str(tmp_path))
    assert stack.warnings == [got.message]  # kept even when no pattern could be used
    assert stack.ignored("a.py", False) is (cap >= 8)


def test_ignore_file_within_the_cap_is_read_whole_without_warnings(tmp_path: Path):
    path = write(tmp_path, ".gitignore", "a.py\n")
    got = discovery.read_ignore_file(str(path))
    assert got == "a.py\n" and isinstance(got, IgnoreText) and not got.truncated and got.message == ""
    assert discovery.ignore_stack(str(tmp_path)).warnings == []


# ---- the caps on patterns ---------------------------------------------------------------------


def test_only_the_first_max_patterns_are_used_and_the_rest_is_reported():
    lines = [f"f{i}.py" for i in range(MAX_PATTERNS + 5)]
    rules = Rules("", lines, origin="the index.exclude option")
    assert len(rules.rules) == MAX_PATTERNS
    assert rules.match(f"f{MAX_PATTERNS - 1}.py", False) is True
    assert rules.match(f"f{MAX_PATTERNS}.py", False) is None
    stack = IgnoreStack()
    stack.final = rules
    assert any(
        f"only the first {MAX_PATTERNS} patterns of the index.exclude option" in w for w in stack.warnings
    )


def test_pattern_longer_than_the_cap_is_left_out_and_reported():
    rules = Rules(
        "", ["x" * (MAX_PATTERN_CHARS + 1), "*" * MAX_PATTERN_CHARS, "ok.py"], origin="p/.gitignore"
    )
    assert len(rules.rules) == 2
    assert rules.match("x" * (MAX_PATTERN_CHARS + 1), False) is True  # the other rule (`***...`) still holds
    assert rules.warnings == [
        f"1 line(s) of p/.gitignore longer than {MAX_PATTERN_CHARS} characters are not used"
    ]


def test_longest_allowed_pattern_is_still_fast():
    glob = compile_glob("*a" * (MAX_PATTERN_CHARS // 2))
    name = "a" * 255  # NAME_MAX
    assert not glob.match(name)
    assert seconds_per_call(lambda: glob.match(name), calls=20) < MAX_SECONDS_PER_CALL


# ---- semantics are unchanged -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "path", "is_dir", "ignored"),
    [
        ("\\*.py", "*.py", False, True),  # an escaped star is a literal
        ("\\*.py", "a.py", False, False),
        ("\\?", "?", False, True),
        ("\\[a]", "[a]", False, True),
        ("\\[a]", "a", False, False),
        ("[a-c]x", "bx", False, True),
        ("[a-c]x", "dx", False, False),
        ("[^a-c]x", "dx", False, True),
        ("[!a-c]x", "bx", False, False),
        ("a[!b]c", "a/c", False, False),  # a negated class never matches `/`
        ("[]a]", "]", False, True),  # `]` first is a member
        ("[!]a]", "b", False, True),
        ("[!]a]", "]", False, False),
        ("[a-]", "-", False, True),
        ("[z-a].py", "m.py", False, False),  # a reversed range matches nothing
        ("[z-a]b.py\nok.py", "ok.py", False, True),  # ... and does not break the other rules
        ("[abc", "[abc", False, True),  # no closing bracket: a literal `[`
        ("**/gen", "gen", True, True),  # leading `**/`: at any depth, the top too
        ("**/gen", "a/b/gen", True, True),
        ("src/**/gen", "src/gen", True, True),  # middle `/**/`: zero or more folders
        ("src/**/gen", "src/a/b/gen", True, True),
        ("src/**/gen", "srcx/gen", True, False),
        ("out/**", "out/a/b.py", False, True),  # trailing `/**`: everything inside
        ("out/**", "out", True, False),
        ("**", "any/thing.py", False, True),
        ("a**b", "axxb", False, True),  # `**` not next to a `/` is a plain star
        ("a**b", "ax/xb", False, False),
        ("/a*", "a/b", False, True),  # the folder `a` matches, so its contents do
        ("/a*", "x/ab", False, False),
        ("tail\\ ", "tail ", False, True),  # an escaped trailing space is kept
        ("end\\", "end\\", False, True),  # a backslash at the end is a literal backslash
    ],
)
def test_glob_semantics(line: str, path: str, is_dir: bool, ignored: bool):
    assert stack(line).ignored(path, is_dir) is ignored


def _random_pattern(rng: random.Random) -> str:
    atoms = ["a", "b", "/", "*", "*", "?", "**", "**/", "/**", "[ab]", "[!a]", "[a-b]", "[^/]", "[/b]",
             "\\*", "\\", ".", "[", "]", "!", "-", " "]  # fmt: skip
    line = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 7)))
    # Few enough stars that the backtracking reference stays fast.
    while line.count("*") > 4:
        line = line.replace("*", "a", 1)
    return rng.choice(["", "", "!", "/"]) + line


def _random_path(rng: random.Random) -> str:
    parts = [
        "".join(rng.choice("ab.-]*[") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))
    ]
    return "/".join(parts)


def test_matcher_agrees_with_the_regex_translation_on_random_patterns():
    rng = random.Random(20240611)
    compared = 0
    for _ in range(3000):
        line = _random_pattern(rng)
        try:
            old = _old_rule(line)
        except (_OracleSkip, re.error):
            continue
        new = parse_line(line)
        assert (old is None) == (new is None), line
        if old is None or new is None:
            continue
        regex, negated, dir_only = old
        assert (new.negated, new.dir_only) == (negated, dir_only), line
        for _ in range(20):
            path = _random_path(rng)
            assert new.matches(path) == (regex.match(path) is not None), (line, path)
            compared += 1
    assert compared > 20_000


def test_matcher_agrees_with_fnmatch_on_names():
    rng = random.Random(7)
    atoms = ["a", "b", "c", "*", "?", "[ab]", "[!a]", "[]a]", "[!]a]", "[-a]", "[!-a]", "[a-c]", "[c-a]",
             "[!b-c]", "[a-]", "[", "]", "!", "-", "."]  # fmt: skip
    for _ in range(3000):
        pattern = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 6)))
        while pattern.count("*") > 4:
            pattern = pattern.replace("*", "a", 1)
        glob = compile_glob(pattern)
        for _ in range(20):
            name = "".join(rng.choice("abc-].!") for _ in range(rng.randint(0, 6)))
            assert glob.match(name) == fnmatch.fnmatchcase(name, pattern), (pattern, name)
