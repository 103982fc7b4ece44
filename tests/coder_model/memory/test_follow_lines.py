"""Multi-line drafts (coder_model.memory.follow, RepoMemory.follow_lines): the lines that follow a
proposed line in a source that holds it, up to the end of its block or bracket, re-indented;
nothing where the body is already below, and no secret from any source."""

from __future__ import annotations

from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory.follow import block_after, body_present, bracket_depth, opens_block, reindent


def test_what_opens_a_block():
    assert opens_block("    def f(x):")
    assert opens_block("    cfg = dict(  # the options")
    assert opens_block("    x = [")
    assert not opens_block("    x = f(a)")
    assert not opens_block('    s = "a(b"')  # a bracket inside a string opens nothing
    assert not opens_block("    # if x:")
    assert bracket_depth("    )") == -1


def test_the_block_is_the_body_or_the_bracket_and_at_most_max_lines():
    lines = ["def f(x):", "    a = 1", "", "    return a", "", "def g():", "    pass"]
    assert block_after(lines, 0) == ["    a = 1", "", "    return a"]
    call = ["x = dict(", "    a=1,", "    b=2,", ")", "y = 2"]
    assert block_after(call, 0) == ["    a=1,", "    b=2,", ")"]
    assert block_after(call, 0, max_lines=2) == []  # cut inside the bracket: no draft
    assert block_after(lines, 0, max_lines=1) == ["    a = 1"]
    assert block_after(["x = 1", "y = 2"], 0) == []


def test_reindent_and_body_present():
    assert reindent(["        a", "", "        b"], 4, 8) == ["            a", "", "            b"]
    assert reindent(["        a"], 8, 4) == ["    a"]
    assert body_present("    def f():", "\n        return 1\n")
    assert not body_present("    def f():", "\n\n    def g():\n")
    assert body_present("    x = f(", "\n    )\n")


def test_follow_lines_from_the_document_above_then_the_index():
    mem = RepoMemory()
    mem.update_file("util.py", "def read(path):\n    with open(path) as fh:\n        return fh.read()\n")
    mem.compact()
    # another file's block, re-indented to the cursor's line
    before = "import os\n\n\ndef read(path):\n    with open(path) as fh:\n        data = fh.read()\n\n\nclass A:\n    def load(self, path):\n        "
    assert mem.follow_lines(before, "with open(path) as fh:", "\n") == ["            data = fh.read()"]
    # the document's own earlier block is nearer than the index's
    before2 = "def load(path):\n    "
    assert mem.follow_lines(before2, "with open(path) as fh:", "\n") == ["        return fh.read()"]
    # the body already below the cursor: nothing
    assert mem.follow_lines(before2, "with open(path) as fh:", "\n        pass\n") == []
    # a line that opens nothing, or a proposal that is not one line
    assert mem.follow_lines(before2, "x = 1", "\n") == []
    assert mem.follow_lines(before2, "with open(path) as fh:\n", "\n") == []
    # the file the cursor is in is never its own source through the index
    assert mem.follow_lines(before2, "with open(path) as fh:", "\n", exclude_path="util.py") == []


def test_no_secret_comes_back_in_a_block():
    key = "AKIA" + "IOSFODNN7EXAMPLE"
    mem = RepoMemory()
    before = f'def creds():\n    return dict(\n        key="{key}",\n        region="eu",\n    )\n\n\ndef other():\n    '
    assert mem.follow_lines(before, "return dict(", "\n") == []  # the only source's block holds a key
    clean = before.replace(f'key="{key}"', 'key=os.environ["KEY"]')
    assert mem.follow_lines(clean, "return dict(", "\n") == ['        key=os.environ["KEY"],', '        region="eu",', "    )"]
