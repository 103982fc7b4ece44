"""An inline suggestion that would break the code's syntax is held back (lsp.syntax_check).

The unit tests give the check a document with the cursor marked `|` and the model's insertion;
the end-to-end test runs the real server with a test double for the engine (this module is
also the server subprocess's engine factory, DLM_ENGINE_FACTORY=test_no_broken_code_is_shown:engine):
it makes no claim about the model, it inserts a `:` at the cursor, so the server's path from
answer to editor is what is tested.
"""

from __future__ import annotations

import asyncio

import pytest
from dlm.coder_model.types import Prompt
from dlm.lsp.stats import Stats
from dlm.lsp.syntax_check import check_text
from fake_engine import InsertingEngine

HEADERS = """\
class Headers:
    def __init__(self):
        self._headers = {}

"""


def breaks(language: str, doc: str, insertion: str, replace_rest: bool = False) -> str | None:
    """The check's verdict for `insertion` at the `|` of `doc`."""
    before, after = doc.split("|")
    return check_text(language, before, after, insertion, replace_rest)


# -- the five suggestions a user saw in a Python file ------------------------------------------------


def test_a_colon_after_a_return_statement_is_held_back():
    doc = (
        HEADERS
        + "    def has(self, name):\n        return name in self._head|\n\n    def get(self):\n        pass\n"
    )
    assert breaks("python", doc, "ers:")
    assert breaks("python", doc, "ers") is None  # the same completion without the colon is shown


def test_a_colon_after_a_complete_call_is_held_back():
    doc = (
        HEADERS
        + "    def add(self, name, value):\n        self.set_header(name, value)|\n        return self\n"
    )
    assert breaks("python", doc, ":")


def test_an_else_with_no_if_before_it_is_held_back():
    doc = HEADERS + "    def add(self, name, value):\n        self._headers[name] = value\n        |\n"
    assert breaks("python", doc, "else:")


def test_an_else_that_follows_an_if_block_is_shown():
    doc = (
        HEADERS
        + "    def add(self, name, value):\n        if name:\n            self._headers[name] = value\n        |\n"
    )
    assert breaks("python", doc, "else:") is None


def test_sel_completed_to_self_value_is_valid_python_and_shown():
    # `self.value` alone on a line is a valid expression statement (useless, not broken): the
    # syntax rule does not hold it back; judging that it means nothing is not a syntax question.
    doc = HEADERS + "    def get(self):\n        sel|\n"
    assert breaks("python", doc, "f.value") is None


def test_sel_completed_to_self_value_in_a_parameter_list_is_held_back():
    # where the same completion does make an invalid statement: a dotted name as a parameter
    doc = HEADERS + "    def set(sel|):\n        pass\n"
    assert breaks("python", doc, "f.value")


def test_a_del_under_if_not_in_is_wrong_but_valid_syntax_and_not_held_back():
    # Deleting the key the `if` just found missing is a logic error: the syntax is valid, so the
    # syntax check cannot see it (a known limit, not a rule this check claims).
    doc = HEADERS + "    def remove(self, name):\n        if name not in self._headers:\n            |\n"
    assert breaks("python", doc, "del self._headers[name]") is None


# -- half-typed lines: a suggestion that completes them is shown --------------------------------------


def test_closing_a_half_typed_call_is_shown_and_a_colon_after_it_is_not():
    doc = "def f(a, b):\n    x = foo(|\n    return x\n"
    assert breaks("python", doc, "a, b)") is None
    # accepted, it would end the line with `foo(` open above a line that does not continue it
    assert breaks("python", doc, "a, ")
    assert breaks("python", doc, "a, b):")
    assert breaks("python", doc, "a, b))")


def test_a_colon_inside_the_open_bracket_of_a_header_is_held_back():
    doc = "def f(x):\n    if g(x|\n        return 1\n"
    assert breaks("python", doc, ":") == "ends a block header inside an open bracket"
    assert breaks("python", doc, "):") is None
    from dlm.lsp.syntax_check import _colon_inside_bracket

    assert not _colon_inside_bracket("d = {k:")  # a dict's colon is not a header's


def test_the_colon_of_a_half_typed_if_is_shown():
    assert breaks("python", "def f(x):\n    if x|\n        return 1\n", ":") is None
    assert breaks("python", "def f(x):\n    if x|\n", ":") is None  # its body is yet to be typed


def test_a_header_whose_body_is_yet_to_be_typed_is_shown():
    assert breaks("python", HEADERS + "    |\n", "def remove(self, name):") is None


# -- a bracket left open above lines that do not continue it (Python: indentation is syntax) ------------

SETTINGS = """\
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        |
        "APP_DIRS": True,
    },
]
"""


def test_a_bracket_opened_above_a_line_at_the_same_indentation_is_held_back():
    # django's settings: the memory proposed `"OPTIONS": {` where the file goes on with `"DIRS": [],`
    assert breaks("python", SETTINGS, '"OPTIONS": {') == "leaves a bracket open that the next lines do not continue"
    assert breaks("python", SETTINGS, '"DIRS": [],') is None
    assert breaks("python", SETTINGS, '"DIRS": [') is not None  # `[` then a line at its indentation
    # the string's quote typed already: what follows it is code being typed, and judged
    quoted = SETTINGS.replace("|", '"|')
    assert breaks("python", quoted, 'OPTIONS": {') == "leaves a bracket open that the next lines do not continue"
    assert breaks("python", quoted, 'DIRS": [],') is None


def test_a_bracket_opened_above_deeper_lines_or_its_closer_is_shown():
    deeper = 'CONFIG = {\n    |\n        "debug": True,\n    },\n}\n'
    assert breaks("python", deeper, '"options": {') is None
    closer = "def f():\n    x = call|\n    )\n"
    assert breaks("python", closer, "(") is None  # the next line closes it
    assert breaks("python", "def f():\n    x = call|\n    return x\n", "(") is not None
    # a language whose indentation is not syntax: the rule does not apply
    assert breaks("typescript", "const x = {\n  a: 1,\n  |\n  c: 3,\n};\n", "b: {") is None


def test_an_insertion_that_makes_errors_below_the_line_is_held_back():
    # the lines below parse with the line as it is, and with it blank; after the insertion they do not
    doc = "def f(x):\n    y = {|\n    }\n    return y\n"
    assert breaks("python", doc, '"a": (1,') is not None  # (the bracket rule also sees this one)
    assert breaks("python", doc, '"a": 1') is None
    # a half-typed line that closes a bracket opened above: its own error swallowed the lines below,
    # and blanked they err; the completion that closes it is shown
    call = 'def f():\n    raise ValueError(\n        "no such|\n    return 1\n'
    assert breaks("python", call, ' key")') is None


def test_the_rest_of_a_line_replaced_is_judged_as_the_new_line():
    doc = "def f(a, b):\n    x = foo(a|)\n"
    assert breaks("python", doc, ", b)", replace_rest=True) is None
    assert breaks("python", doc, ", b))", replace_rest=True)


def test_prose_in_a_docstring_is_not_judged():
    doc = 'def f():\n    """Return the\n    values: all| of them.\n    """\n'
    assert breaks("python", doc, "):") is None


# -- other languages: one breaking and one completing case each --------------------------------------


def test_a_tuple_written_on_one_line_above_its_own_deeper_lines_is_held_back():
    """The lines below hold the tuple's items and its closer: the line must open the bracket."""
    before = "def pair():\n    x = "
    after = "\n        first,\n        second,\n    )\n    return x\n"
    assert check_text("python", before, after, "(first, second)", replace_rest=True) is not None
    assert check_text("python", before, after, "(", replace_rest=True) is None
    assert check_text("python", before, after, "dict(", replace_rest=True) is None


def test_deeper_lines_need_an_opener_inside_a_bracket_too():
    """In a list, the item written whole on one line leaves its own lines below as stray ones."""
    before = "fields = [\n    ("
    after = '\n        "tag_ptr",\n        models.OneToOneField("Tag"),\n    ),\n]\n'
    assert check_text("python", before, after, '"id", models.AutoField(primary_key=True)),') is not None
    assert check_text("python", before, after, "") is None
    before = "def f():\n    call(\n        a,\n        "
    assert check_text("python", before, "\n        c,\n    )\n", "b,") is None  # the same indentation
    assert check_text("python", "def f():\n    if ready", "\n        go()\n", ":") is None
    assert check_text("python", "def f():\n    # a note", "\n        go()\n", " on it") is None


DOCSTRING_THEN_CODE = (
    'def load(path):\n    """Read the file.\n\n    Raises OSError.\n    ',
    ('\n    try:\n        return open(path).read()\n    except OSError:\n        raise\n\n\n'
     'def save(path):\n    """Write the file."""\n    return path\n'),
)


def test_code_where_a_docstring_must_close_is_held_back():
    """The docstring's closing quotes are what the user types here: the code below reads as its
    prose until they come, and a statement typed in their place breaks the file."""
    before, after = DOCSTRING_THEN_CODE
    assert check_text("python", before, after, "try:") is not None
    assert check_text("python", before, after, "return open(path).read()") is not None


def test_where_a_docstring_must_close_only_its_closing_quotes_are_shown():
    """With its closing quotes missing, the docstring runs on over the code below: prose there
    leaves that code inside it, and the file broken, whoever types it."""
    before, after = DOCSTRING_THEN_CODE
    assert check_text("python", before, after, '"""') is None
    assert check_text("python", before, after, "Returns the text.") is not None
    assert check_text("python", before, after, "Parameters") is not None
    # a string value whose lines read like code is closed below: its lines are shown
    header = 'HEADER = """\nSIMPLE  = T\n'
    assert check_text("python", header, '\nNAXIS   = 2\n"""\nx = 1\n', "BITPIX  = 8") is None


# The true rest of a line is never held back: windows cut inside a statement, a docstring or a
# long bracket read the document as broken where it is not.

def test_closing_a_call_above_statements_that_end_in_closers_is_shown():
    calls = "".join(f"        value_{i} = make(\n            {i},\n        )\n" for i in range(12))
    before = "class T:\n    def test(self):\n        expected = make(\n            [1, 2],\n        "
    assert check_text("python", before, "\n\n" + calls, ")") is None


def test_closing_a_bracket_above_a_decorator_of_many_lines_is_shown():
    before = "x = call(\n    1,\n"
    after = ("\n@pytest.mark.parametrize(\n    'freq', ['A', 'B']\n)\ndef test_freq(freq):\n    assert freq\n"
             + "".join(f"\n\n@mark(\n    {i}\n)\ndef test_{i}():\n    pass\n" for i in range(6)))
    assert check_text("python", before, after, ")") is None


def test_closing_a_list_of_many_cases_opened_far_above_is_shown():
    cases = "".join(f"        ({i}, {i + 1}),\n" for i in range(90))
    before = f"@pytest.mark.parametrize(\n    ('a', 'b'),\n    [\n{cases}    ],\n"
    after = "\ndef test_pairs(a, b):\n    assert a < b\n"
    assert check_text("python", before, after, ")") is None


def test_opening_and_closing_quotes_of_a_long_docstring_are_shown():
    prose = "".join(f"    Line {i} of what the function does.\n" for i in range(40))
    before = "def combine(a, b):\n    "
    after = f"\n{prose}    \"\"\"\n    return a + b\n"
    assert check_text("python", before, after, '"""') is None
    before = f'def combine(a, b):\n    """\n{prose}    '
    assert check_text("python", before, "\n    return a + b\n", '"""') is None


def test_assignments_typed_inside_a_string_value_are_shown():
    before = 'HEADER = """\nSIMPLE = T\nSPECSYS = \''
    after = "\nRESTFRQ = 1.42E+09\nRADESYS = 'FK5'\n\"\"\"\n"
    assert check_text("python", before, after, "TOPOCENT'") is None


def test_code_where_a_docstring_must_open_is_held_back():
    """A new line under a header, above prose closed by triple quotes: the docstring opens here."""
    before = "class Store:\n    def expiry(self, data):\n        "
    after = ('\n        Return the expiry time of the stored session.\n        """\n'
             "        return data.get('expiry')\n")
    assert check_text("python", before, after, "try:") is not None
    assert check_text("python", before, after, "return data") is not None
    assert check_text("python", before, after, '"""') is None
    assert check_text("python", before, after, '"""Return') is None


def test_typescript():
    doc = "function f(a: number) {\n  const x = foo(a, b)|;\n}\n"
    assert breaks("typescript", doc, ")")  # a closer with no opener
    assert breaks("typescript", "function f(|\n}\n", "a: number) {") is None  # the `}` follows
    assert breaks("typescript", "function f(a: number) {\n  const x = foo(|\n}\n", "a, b);") is None
    assert breaks("typescript", "function f(a: number) {\n  if (a) |\n}\n", "{") is None  # opens a block


def test_go():
    doc = "package main\n\nfunc f() {\n\tx := foo(a, b)|\n}\n"
    assert breaks("go", doc, ")")
    assert breaks("go", "package main\n\nfunc f() {\n\tx := foo(|\n}\n", "a, b)") is None


def test_rust():
    assert breaks("rust", "fn f() {\n    let x = foo(a, b)|\n}\n", "))")
    assert breaks("rust", "fn f() {\n    let x = foo(|\n}\n", "a, b);") is None
    assert breaks("rust", "fn f() {\n    let x = |\n}\n", "foo(a, b)") is None  # its `;` is yet to be typed


def test_c_takes_an_unfinished_argument_list():
    assert breaks("c", "int f() {\n  foo(|\n}\n", "a, ") is None
    assert breaks("c", "int f() {\n  foo(|\n}\n", "a));")


def test_a_language_without_a_grammar_is_never_held_back():
    assert breaks("cobol", "MOVE A TO B|\n", ")))") is None


def test_held_back_by_reports_syntax():
    stats = Stats()
    stats.add("held_back_syntax")
    assert stats.held_back()["held_back_by"]["syntax"] == 1
    assert stats.snapshot()["held_back_syntax"] == 1


# -- end to end: the real server does not show a breaking suggestion ---------------------------------


class ColonEngine(InsertingEngine):
    """Inserts `:` at the cursor with full confidence."""

    model_name = "colon (syntax hold-back test only)"

    def insertion(self, prompt: Prompt) -> str:
        return ":"


def engine(model=None, device=None) -> ColonEngine:
    return ColonEngine()


@pytest.mark.parametrize(
    ("text", "line", "character", "shown"),
    [
        ("def add(self, name, value):\n    self.set_header(name, value)\n", 1, 32, False),
        ("def add(self, name, value):\n    if name\n        return 1\n", 1, 11, True),
    ],
    ids=["colon-after-a-call-held-back", "colon-of-an-if-shown"],
)
def test_the_server_holds_back_a_suggestion_that_breaks_the_syntax(text, line, character, shown):
    from lsp_helpers import inline_params, inline_session, open_document, server_env

    async def scenario():
        statuses: list = []
        env = server_env(DLM_ENGINE_FACTORY="test_no_broken_code_is_shown:engine")
        init = {"minConfidence": 0, "statusIntervalS": 0}
        async with inline_session(env, init, "syntax-test", on_status=statuses.append) as client:
            uri = "file:///w/headers.py"
            open_document(client, uri, text)
            res = await client.text_document_inline_completion_async(inline_params(uri, line, character))
            items = res.items if res is not None else []
            stats = await client.protocol.send_request_async("dlm/stats", {})
            assert stats.completed == 1
            if shown:
                assert [i.insert_text for i in items] == [":"] and stats.held_back_syntax == 0
            else:
                assert not items and stats.held_back_syntax == 1 and stats.offered == 0
                last = statuses[-1]
                held_back_by = last["held_back_by"] if isinstance(last, dict) else last.held_back_by
                syntax = held_back_by["syntax"] if isinstance(held_back_by, dict) else held_back_by.syntax
                assert syntax == 1

    asyncio.run(scenario())


# What the lines around the cursor ask of a Python insertion: the document with the cursor at `|`,
# insertions held back, insertions shown.
PYTHON_LINES = {
    # `):` below at the line's indentation closes a bracket the line must open
    "a line closed whole above the closer of its own bracket": (
        ("def persist(self):\n    if self.lazy:\n        |\n            self.lazy, self.done, strict=False\n"
        "        ):\n            pass\n"),
        ["for key, data in zip(self.lazy, self.done):"], ["for key, data in zip("]),
    "rows that close on a line of their own items are not closers": (
        "M = Matrix([[1, 2],\n           |\n           [5, 6]])\nx = 1\n", [], ["[3, 4],"]),
    "a positional argument after keyword arguments": (
        "view = make(\n    variables=variables,\n    attrs=attrs,\n    |\n    close=None,\n)\n",
        ["None if enc is None else dict(enc),"], ["encoding=enc,", "**extra,"]),
    "an item of a list argument after keyword arguments": (
        "fields = make(\n    name='x',\n    fields=[\n        |\n    ],\n)\n", [], ["('id', 1),"]),
    "an insertion that ends the line with a bracket still open": (
        "def f(R):\n    raises(ValueError, lambda: R.from_expr(1|\n    raises(ValueError, lambda: R.from_expr(2))\n",
        [")"], ["/x))"]),
    # brackets are counted from the statement's first line: a generator's `for` given a `:` leaves
    # `extend([` open although the cursor line opens nothing
    "a bracket opened lines above and left open before the next statement": (
        ("def f(self):\n    pairs = []\n    pairs.extend([(tz, '%Z') for values in self.zones\n"
        "                  for tz in values|\n\n    for offset, directive in pairs:\n        pass\n"),
        [":"], ["])"]),
    "a row that leaves the matrix open above the next statement": (
        "def test_lu():\n    m = Matrix([[ 6, -2],\n                [ 0,  3],\n                |\n    L, U = m.lu()\n",
        ["[ 1, -2],"], ["[ 1, -2]])"]),
    "a middle row with more rows below it": (
        ("def test_lu():\n    m = Matrix([[ 6, -2],\n                |\n                [ 1, -2]])\n"
        "    L, U = m.lu()\n"), [], ["[ 0,  3],"]),
    # inside a bracket indentation is free: the rows at column 0 still belong to the statement
    "a row that closes the matrix above rows at column zero": (
        "def test_glsl():\n    mat = Matrix([\n[0, 1],\n[2, 3],\n[|\n[6, 7]])\n    assert glsl_code(mat) == gl\n",
        ["4, 5]])"], ["4, 5],"]),
    "brackets inside a multi-line string above count for nothing": (
        ('def f():\n    doc = """\n    a list: [1, 2,\n    (and a note\n    """\n'
        "    values = compute(doc,\n                     |\n    return values\n"),
        ["strict=True"], ["strict=True)"]),
    # a string opened after `return x` is a statement of its own that swallows the code below
    "triple quotes opened between two statements": (
        "def f(x):\n    y = g(x)\n    |\n    return y\n\n\ndef h():\n    \"\"\"Doc.\"\"\"\n", ['"""'], ["z = y"]),
    # under a header whose body is code: a docstring opened there swallows it
    "triple quotes opened above the code of a body": (
        "def f(x):\n    |\n\n    y = g(x)\n    return y\n\n\ndef h():\n    \"\"\"Doc.\"\"\"\n", ['"""'], ["y = 0"]),
    "triple quotes that open a docstring": (
        'def f(x):\n    |\n    Return x.\n    """\n    return x\n', [], ['"""']),
    "triple quotes that open a value": (
        'def f(x):\n    y = (\n        |\n        Text.\n        """\n    )\n    return y\n', [], ['"""']),
    "triple quotes that close a docstring": (
        'def f(x):\n    """Return x.\n\n    More.\n    |\n    return x\n\n\ndef h():\n    """Doc."""\n', [], ['"""']),
    # a one-line string cannot go on past its line
    "a string left open at the end of the line": (
        "__all__ = [\n    'Curve',\n    'Tendon|\n\n    'Base',\n]\n", [",", "Force,"], ["Force',", "'"]),
    "a string closed on a line that goes on with a backslash": (
        "x = 'a' \\\n    |\ny = 1\n", [], ["'b'"]),
    # the deeper lines below continue the open bracket; it is still open where `def` begins
    "a bracket left open over the lines that continue it": (
        ("def test_one():\n    assert integrate(x * sin(x) * Rational(-1, 2|\n\n        2*cos(pi*n)/(pi*n)\n\n\n"
        "def test_two():\n    pass\n"), [")"], ["), [x, -2, 0]) == \\"]),
    "a bracket closed by the lines that continue it": (
        "def f(a):\n    x = g(a,|\n          h(a))\n    return x\n", [], [" b,"]),
}


@pytest.mark.parametrize(("doc", "held", "shown"), PYTHON_LINES.values(), ids=list(PYTHON_LINES))
def test_python_insertions_the_lines_around_them_hold_back_or_let_through(doc, held, shown):
    for text in held:
        assert breaks("python", doc, text) is not None, text
    for text in shown:
        assert breaks("python", doc, text) is None, text
