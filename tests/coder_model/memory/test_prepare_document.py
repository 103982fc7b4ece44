"""A document counted ahead (RepoMemory.prepare_document) answers the first query on a line as the
count around the cursor would, and only while nothing but the cursor's line changed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from dlm.coder_model.memory import index as memory_index
from dlm.coder_model.memory.index import RepoMemory

ROOT = Path(__file__).resolve().parents[3]
WORKSPACE = ("lsp/server.py", "lsp/context.py", "coder_model/engine.py")
DOC = "lsp/inline.py"


@pytest.fixture(scope="module")
def texts():
    return {rel: (ROOT / rel).read_text() for rel in (*WORKSPACE, DOC)}


def _memory(texts) -> RepoMemory:
    m = RepoMemory()
    for rel in WORKSPACE:
        m.update_file(rel, texts[rel])
    m.compact()
    return m


def _cases(text: str, n: int, seed: int = 1):
    """(kind, the document as it was opened, before, after): a line typed on (its last characters
    typed since the document opened), or a new line (Enter and the indentation)."""
    lines = text.splitlines(keepends=True)
    rng = random.Random(seed)
    for row in rng.sample([r for r in range(5, len(lines) - 5) if len(lines[r].strip()) > 4], n):
        line = lines[row].rstrip("\n")
        indent = len(line) - len(line.lstrip())
        above, below = "".join(lines[:row]), "".join(lines[row + 1 :])
        k = rng.randint(indent + 1, len(line))
        yield "typed", above + line[: max(indent, k - 3)] + "\n" + below, above + line[:k], "\n" + below
        yield "enter", above + below, above + line[:indent], "\n" + below


def test_the_first_query_from_the_count_ahead_proposes_what_the_count_around_the_cursor_does(texts):
    plain, ahead = _memory(texts), _memory(texts)
    same = total = 0
    for _kind, opened, before, after in _cases(texts[DOC], 30):
        assert ahead.prepare_document(DOC, opened)
        assert ahead._base_tables(DOC, before, after) is not None  # the count ahead is what answers
        a = plain.complete(before, after, path=DOC)
        b = ahead.complete(before, after, path=DOC)
        total += 1
        same += [c.text for c in a[:1]] == [c.text for c in b[:1]]
        # the same counts: probabilities agree but for the smoothing's estimate of distinct successors
        for x, y in zip(a[:3], b[:3]):
            if x.text == y.text:
                assert abs(x.score - y.score) < 0.02
    assert same >= total - 3


def test_a_document_changed_elsewhere_or_too_long_is_counted_around_the_cursor(texts, monkeypatch):
    m = _memory(texts)
    text = texts[DOC]
    assert m.prepare_document(DOC, text)
    lines = text.splitlines(keepends=True)
    before, after = "".join(lines[:40]) + "    x", "\n" + "".join(lines[41:])
    assert m._base_tables(DOC, before, after) is not None
    # a line above changed too: the count ahead no longer holds
    edited = "".join(lines[:10]) + "# edited\n" + "".join(lines[11:40]) + "    x"
    assert m._base_tables(DOC, edited, after) is None
    assert m.complete(edited, after, path=DOC) is not None
    # two lines where the count had one
    assert m._base_tables(DOC, before + "\n    y", after) is None
    # another path has no count ahead
    assert m._base_tables("other.py", before, after) is None
    monkeypatch.setattr(memory_index, "BASE_MAX_CHARS", 100)
    assert not m.prepare_document(DOC, text) and m._base_tables(DOC, before, after) is None


def test_a_secret_in_the_document_counted_ahead_is_never_proposed(texts):
    m = _memory(texts)
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    text = f"def setup():\n    token = '{secret}'\n    return token\n\n\ndef again():\n    tok"
    assert m.prepare_document("s.py", text)
    before = text
    got = m.complete(before, "", path="s.py")
    assert all(secret[4:12] not in c.text for c in got)
    assert all(secret[4:12] not in s for s in m._strings)


def test_counting_ahead_keeps_the_last_documents_only(texts):
    m = _memory(texts)
    for i in range(memory_index.BASE_DOCUMENTS + 2):
        m.prepare_document(f"d{i}.py", f"x_{i} = {i}\n")
    assert len(m._bases) == memory_index.BASE_DOCUMENTS and "d0.py" not in m._bases
