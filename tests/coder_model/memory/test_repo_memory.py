"""RepoMemory: completions from a tiny in-test repository, nesting, updates, caps, persistence."""

from __future__ import annotations

import io

import pytest
from dlm.coder_model.memory import Candidate, RepoMemory, Snippet
from dlm.coder_model.memory import index as memory_index

REPO = {
    "pkg/a.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "pkg/b.py": "from pkg.a import add\n\nprint(add(1, 2))\nprint(add(1, 2))\n",
    "pkg/c.py": "import os\n\nROOT = os.path.dirname(os.path.abspath(__file__))\n",
}
QUERIES = [
    ("x = 1\nprint(", "\n"),
    ("x = 1\nprint(ad", "\n"),
    ("def mul(a, b):\n    ", "\n"),
    ("import os\n\nROOT = ", "\n"),
    ("", ""),
]


def build(files: dict[str, str], **kwargs) -> RepoMemory:
    memory = RepoMemory(**kwargs)
    for path, text in files.items():
        assert memory.update_file(path, text) > 0
    return memory


def answers(memory: RepoMemory) -> list[list[tuple[str, int]]]:
    return [[(c.text, c.support) for c in memory.complete(b, a, path="new.py")] for b, a in QUERIES]


def test_complete_gives_the_continuation_seen_in_the_repository():
    memory = build(REPO)
    assert memory.files == 3 and memory.tokens > 0
    got = memory.complete("x = 1\nprint(", "\n", path="new.py")
    assert got and got[0] == Candidate("add(1, 2))", got[0].score, 2)
    assert all(0.0 <= c.score <= 1.0 for c in got)
    assert [c.score for c in got] == sorted((c.score for c in got), reverse=True)
    # half a word typed: the insertion finishes it
    assert memory.complete("x = 1\nprint(ad", "\n", path="new.py")[0].text == "d(1, 2))"
    # nothing typed on an indented line
    assert memory.complete("def mul(a, b):\n    ", "\n", path="new.py")[0].text in {"return a + b", "return a - b"}
    assert len(memory.complete("x = 1\nprint(", "\n", path="new.py", beam=1)) == 1


def test_the_rest_of_the_line_after_the_cursor_is_respected():
    memory = build(REPO)
    got = memory.complete("x = 1\nprint(", ")\n", path="new.py")
    assert got and got[0].text == "add(1, 2)"  # the editor's closing bracket is already there
    assert len({c.text for c in got}) == len(got)


def test_nested_cache_current_file_then_open_buffers_then_workspace():
    workspace = {f"w{i}.py": "value = compute_global(x)\n" for i in range(3)}
    # the three levels alone (the retrieved windows, a fourth level, are tested below)
    memory = build(workspace, weights=memory_index.Weights(retrieved=0))
    assert memory.complete("value = ", "\n", path="cur.py")[0].text == "compute_global(x)"
    opened = {"open.py": "value = compute_open(x)\n"}
    assert memory.complete("value = ", "\n", path="cur.py", open_files=opened)[0].text == "compute_open(x)"
    before = "value = compute_local(x)\nvalue = "
    assert memory.complete(before, "\n", path="cur.py", open_files=opened)[0].text == "compute_local(x)"
    # the current file's own lines below the cursor count too
    after = "\nvalue = compute_below(x)\n"
    assert memory.complete("value = ", after, path="cur2.py")[0].text == "compute_below(x)"
    # and the buffer of the current document is not an "open buffer" of itself
    got = memory.complete("value = ", "\n", path="open.py", open_files=opened)
    assert got[0].text == "compute_global(x)"


def test_exclude_path_takes_a_workspace_file_out():
    memory = build({"a.py": "flag = special_value\n", "b.py": "x = 1\n"})
    assert memory.complete("flag = ", "\n", path="z.py")[0].text == "special_value"
    assert all(c.text != "special_value" for c in memory.complete("flag = ", "\n", path="z.py", exclude_path="a.py"))


def top1(memory: RepoMemory) -> list[str | None]:
    return [got[0][0] if got else None for got in answers(memory)]


def test_remove_and_update_restore_the_earlier_state(monkeypatch):
    # tiny seal thresholds: changes go through sealed tables and merges, not only the dict delta
    monkeypatch.setattr(memory_index, "SEAL_TOKENS", 7)
    monkeypatch.setattr(memory_index, "SEAL_TOKENS_BULK", 11)
    memory = build(REPO)
    memory.compact()
    before = answers(memory)
    files, tokens = memory.files, memory.tokens
    snippets = memory.retrieve(["from pkg.a import add"], 2)
    memory.update_file("pkg/d.py", "print(add(3, 4))\nprint(sub(5, 6))\n")
    memory.update_file("pkg/b.py", "print(mul(1, 2))\n")
    assert answers(memory) != before
    memory.complete("x", "", path="q.py")  # a query between changes counts the pending ones
    memory.remove_file("pkg/d.py")
    memory.update_file("pkg/b.py", REPO["pkg/b.py"])
    memory.remove_file("never/indexed.py")  # no-op
    assert (memory.files, memory.tokens) == (files, tokens)
    assert memory.retrieve(["from pkg.a import add"], 2) == snippets
    # before compaction the counts are restored (tables counted in and out cancel) and so is what
    # the memory proposes first; low-ranked candidates may differ (each table is read to its top)
    assert len(memory._segments) > 1
    assert [a[0] if a else None for a in answers(memory)] == [b[0] if b else None for b in before]
    memory.compact()
    assert len(memory._segments) == 1
    assert answers(memory) == before


def test_max_tokens_is_respected():
    memory = RepoMemory(max_tokens=40)
    n = memory.update_file("a.py", "x = 1\n")
    assert n > 0
    assert memory.update_file("big.py", "y = 2\n" * 100) == 0
    assert (memory.files, memory.tokens) == (1, n)
    # a file that grows past the cap is dropped, not kept stale
    assert memory.update_file("a.py", "x = 1\n" * 100) == 0
    assert (memory.files, memory.tokens) == (0, 0)
    assert memory.complete("x = ", "\n") == []


def test_save_and_load_round_trip():
    memory = build(REPO)
    buf = io.BytesIO()
    memory.save(buf)
    loaded = RepoMemory.load(io.BytesIO(buf.getvalue()))
    assert (loaded.files, loaded.tokens, loaded.order) == (memory.files, memory.tokens, memory.order)
    assert answers(loaded) == answers(memory)
    assert loaded.retrieve(["from pkg.a import add"], 2) == memory.retrieve(["from pkg.a import add"], 2)
    # the loaded index keeps working: update and remove
    loaded.update_file("pkg/b.py", "print(sub(9, 9))\n")
    loaded.remove_file("pkg/c.py")
    assert loaded.files == 2
    assert loaded.complete("x = 1\nprint(", "\n", path="new.py")[0].text == "sub(9, 9))"
    empty = io.BytesIO()
    RepoMemory().save(empty)
    assert RepoMemory.load(io.BytesIO(empty.getvalue())).files == 0


def test_corrupt_truncated_or_foreign_files_raise_value_error():
    buf = io.BytesIO()
    build(REPO).save(buf)
    data = buf.getvalue()
    bad = [b"", b"hello world", b"PK\x03\x04" + data[4:], data[:-1]]
    bad += [data[:cut] for cut in range(0, len(data), max(1, len(data) // 97))]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    bad.append(bytes(flipped))
    newer = bytearray(data)
    newer[16] = 99  # the format version
    bad.append(bytes(newer))
    for blob in bad:
        with pytest.raises(ValueError, match="repository memory|rebuild"):
            RepoMemory.load(io.BytesIO(blob))


def test_an_index_hashed_by_another_interpreter_is_refused(monkeypatch):
    from dlm.coder_model.memory import ngram

    buf = io.BytesIO()
    build(REPO).save(buf)
    monkeypatch.setattr(ngram, "HASH_FINGERPRINT", ngram.HASH_FINGERPRINT + 1)
    with pytest.raises(ValueError, match="hashes contexts differently"):
        RepoMemory.load(io.BytesIO(buf.getvalue()))


def test_retrieve_finds_the_similar_window_and_is_stable_on_one_line():
    files = {
        "geo.py": "def area(width, height):\n    return width * height\n",
        "net.py": "def fetch(url, timeout):\n    return request(url, timeout)\n",
    }
    memory = build(files)
    above = ["def perimeter(width, height):"]
    got = memory.retrieve(above, 2)
    assert got and isinstance(got[0], Snippet)
    assert got[0].path == "geo.py" and got[0].start_line == 0 and got[0].text == files["geo.py"]
    assert 0 < got[0].score <= 1
    assert memory.retrieve(above, 2) == got  # the query is the lines above: same answer every keystroke
    assert all(s.path != "geo.py" for s in memory.retrieve(above, 2, exclude_path="geo.py"))
    assert memory.retrieve([], 2) == [] and memory.retrieve(["nothing_in_common"], 2) == []


def test_odd_input_does_not_break_it():
    memory = build(REPO)
    assert memory.complete("", "") == [] or isinstance(memory.complete("", ""), list)
    assert memory.complete("x", "", beam=0) == []
    assert memory.complete("\ud800 weird \x00", "\r\n", path="w.py") is not None
    assert memory.update_file("empty.py", "") == 0 and memory.files == 4
    with pytest.raises(ValueError, match="order"):
        RepoMemory(order=0)


def test_queries_while_another_thread_indexes(monkeypatch):
    import threading

    monkeypatch.setattr(memory_index, "SEAL_TOKENS", 30)
    monkeypatch.setattr(memory_index, "SEAL_TOKENS_BULK", 60)
    memory = build(REPO)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(150):
                memory.update_file(f"gen/m{i % 7}.py", f"value_{i} = compute({i})\nprint(value_{i})\n")
                if i % 5 == 0:
                    memory.remove_file(f"gen/m{(i + 3) % 7}.py")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        memory.complete("x = 1\nprint(", "\n", path="new.py")
        memory.retrieve(["value_3 = compute(3)"], 2)
    thread.join()
    assert not errors
    memory.compact()
    fresh = RepoMemory()
    for path in memory.paths():
        fresh.update_file(path, memory._lines_text(path, 0, 10**9))
    fresh.compact()
    assert (fresh.files, fresh.tokens) == (memory.files, memory.tokens)
    assert answers(fresh) == answers(memory)


def test_pending_files_are_counted_a_few_per_query(monkeypatch):
    monkeypatch.setattr(memory_index, "QUERY_COUNT_TOKENS", 5)
    monkeypatch.setattr(memory_index, "SEAL_TOKENS", 10**9)
    monkeypatch.setattr(memory_index, "SEAL_TOKENS_BULK", 10**9)
    memory = RepoMemory()
    for name in "abc":
        memory.update_file(f"{name}.py", f"value_{name} = compute_{name}(x)\n")

    def first(name: str) -> str | None:
        got = memory.complete(f"value_{name} = ", "\n", path="z.py")
        return got[0].text if got else None

    # each query counts one more pending file (the budget is under one file)
    assert first("a") == "compute_a(x)"  # counts a.py
    assert first("c") != "compute_c(x)"  # counts b.py only
    assert first("c") == "compute_c(x)"  # counts c.py
    memory.update_file("d.py", "value_d = compute_d(x)\n")
    memory.compact()
    assert first("d") == "compute_d(x)" and first("a") == "compute_a(x)"


def test_a_huge_line_is_read_from_its_end_only():
    memory = build(REPO)
    before = "x = [" + "1, " * 100_000 + "\nprint("
    assert memory.complete(before, "\n", path="big.py")[0].text == "add(1, 2))"
    assert isinstance(memory.complete("y = " + "a" * 50_000, "\n", path="big2.py"), list)


def test_blanks_typed_at_the_cursor_are_not_extended():
    # indented and unindented lines after the same context: the cursor's indentation decides
    files = {f"m{i}.py": "if ready:\n        deep_call(x)\nif ready:\n    shallow_call(x)\n" for i in range(3)}
    files["n.py"] = "if ready:\n        deep_call(x)\n" * 5 + "if ready:\nflat_call(x)\n"
    memory = build(files)
    got = [c.text for c in memory.complete("if ready:\n    ", "\n", path="new.py")]
    assert got and got[0] == "shallow_call(x)" and all(not t[:1].isspace() for t in got)
    # at the start of a line (no indentation typed) no candidate starts with blanks
    got = [c.text for c in memory.complete("if ready:\n", "\n", path="new.py")]
    assert got and got[0] == "flat_call(x)" and all(not t[:1].isspace() for t in got)
    # after `x = ` the space is typed: the next word carries no second one
    memory = build({"a.py": "x =  spaced\nx = value\nx =  spaced\nx =  spaced\n"})
    assert [c.text for c in memory.complete("x = ", "\n", path="new.py")][:1] == ["value"]


def test_save_serialises_outside_the_readers_lock(monkeypatch):
    import threading

    from dlm.coder_model.memory import persist

    memory = build(REPO)
    memory.complete("brand_new_word = other_new_word(", "\n", path="new.py")  # a reader interned words
    vocabulary = memory.vocabulary
    real_save = persist.save
    seen = {}

    def save_checking_the_lock(mem, fh, vocab=None):
        # a reader on another thread gets the readers' lock while the file is written
        t = threading.Thread(target=lambda: seen.setdefault("free", mem._lock.acquire(timeout=5) and not mem._lock.release()))
        t.start()
        t.join()
        real_save(mem, fh, vocab)

    monkeypatch.setattr(persist, "save", save_checking_the_lock)
    buf = io.BytesIO()
    memory.save(buf)
    assert seen == {"free": True}
    loaded = RepoMemory.load(io.BytesIO(buf.getvalue()))
    assert loaded.vocabulary == vocabulary
    assert [c.text for c in loaded.complete("x = 1\nprint(", "\n", path="new.py")] == [
        c.text for c in memory.complete("x = 1\nprint(", "\n", path="new.py")
    ]


def test_lines_of_a_similar_file_are_copied_whole_by_the_retrieved_level():
    # a file like the one being edited: its line after the same lines above is the answer, while
    # the 5-token contexts of the workspace alone piece together a more common line
    common = "def check(frame):\n    result = frame.apply(handler, axis=0)\n"
    similar = (
        "def convert_table(table, units, strict):\n"
        "    validate_units(units)\n"
        "    result = frame.apply(handler, axis=1, raw=True, units=units, strict=strict)\n"
    )
    files = {f"common{i}.py": common for i in range(6)}
    files["similar.py"] = similar
    before = "def convert_table(table, units, strict):\n    validate_units(units)\n    result = frame.apply(handler, axis="
    plain = build(files, weights=memory_index.Weights(retrieved=0))
    # one window retrieved (by default 4: here the next best would be the common files themselves)
    with_retrieval = build(files, weights=memory_index.Weights(retrieved_windows=1))
    assert plain.complete(before, "\n", path="new.py")[0].text == "0)"
    assert with_retrieval.complete(before, "\n", path="new.py")[0].text == "1, raw=True, units=units, strict=strict)"
    # the current document is never its own retrieved window
    assert with_retrieval.complete(before, "\n", path="similar.py", exclude_path="similar.py")[0].text == "0)"


def test_the_local_levels_count_longer_contexts_than_the_workspace():
    memory = RepoMemory(order=3)
    assert memory.local_order == 3 + memory_index.LOCAL_EXTRA_ORDER
    with pytest.raises(ValueError, match="local_order"):
        RepoMemory(order=6, local_order=4)
    # two lines of this file agree on their last 2 tokens before the cursor and differ further
    # back: the order-3 workspace cannot tell them apart, the file level can
    text = "alpha beta gamma = first\nomega beta gamma = second\n"
    memory = build({"other.py": "x = 1\n"}, order=3)
    assert memory.complete(text + "alpha beta gamma =", "\n", path="cur.py")[0].text == " first"
    assert memory.complete(text + "omega beta gamma =", "\n", path="cur.py")[0].text == " second"


def test_a_table_counted_at_once_equals_one_counted_in_pieces_and_one_taken_back():
    from dlm.coder_model.memory.ngram import DictTable

    stream = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 6, 7, 1, 2, 3] * 3 + [0, 9, 0]  # 0: an id the vocabulary gave up on
    whole = DictTable(5)
    whole.add(stream)  # an empty table: contexts seen once are stored as their successor alone
    pieces = DictTable(5)
    for i in range(0, len(stream), 7):
        pieces.add(stream[i : i + 7], history=stream[:i])
    assert whole.entries() == pieces.entries()
    for k in range(1, 6):
        assert set(whole.succ[k - 1]) == set(pieces.succ[k - 1])
        for key in whole.succ[k - 1]:
            a, b = whole.lookup(k, key, 50), pieces.lookup(k, key, 50)
            assert (a.total, a.types, sorted(a.top)) == (b.total, b.types, sorted(b.top))
    # counting more into a table built at once, then taking it back, restores it
    extra = [7, 1, 2, 3, 8]
    whole.add(extra, history=stream)
    whole.add(extra, sign=-1, history=stream)
    for k in range(1, 6):
        for key in pieces.succ[k - 1]:
            a, b = whole.lookup(k, key, 50), pieces.lookup(k, key, 50)
            assert (a.total, a.types, sorted(a.top)) == (b.total, b.types, sorted(b.top))


def test_the_retrieved_level_follows_a_change_to_the_retrieved_file():
    head = "def convert_table(table, units, strict):\n    validate_units(units)\n"
    files = {"similar.py": head + "    result = frame.apply(handler, axis=1, raw=True)\n", "other.py": "x = 1\n"}
    memory = build(files, weights=memory_index.Weights(retrieved_windows=1))
    before = head + "    result = frame.apply(handler, axis="
    assert memory.complete(before, "\n", path="new.py")[0].text == "1, raw=True)"
    # the same lines above the cursor, but the similar file changed (same size: same window count)
    memory.update_file("similar.py", head + "    result = frame.apply(handler, axis=2, raw=None)\n")
    assert memory.complete(before, "\n", path="new.py")[0].text == "2, raw=None)"
