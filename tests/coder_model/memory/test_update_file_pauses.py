"""RepoMemory.update_file calls `pause` between slices of its work (lexed chunks, batches of
snippet windows, batches of new tokens, table build slices), and slicing changes nothing: the
tokens, vocabulary, line starts, snippet windows and tables are exactly those of a memory that
did each file in one piece. A reader is never locked out while the writer pauses (the server's
indexer waits in `pause` for a suggestion that reads the memory)."""

from __future__ import annotations

import threading
from array import array

import pytest
from dlm.coder_model.memory import RepoMemory
from dlm.coder_model.memory import index as index_mod
from dlm.coder_model.memory.ngram import SortedTable

WHOLE = 10**9  # a batch size that makes every file one slice


def _source(seed: int, functions: int) -> str:
    """Python source of many lines and thousands of distinct identifiers."""
    out = []
    for i in range(functions):
        out.append(f"def function_{seed}_{i}(argument_{i}, value):\n")
        out.append(f"    total_{i} = helper_{i % 37}(argument_{i}) + value * {i}\n")
        out.append(f"    return total_{i}  # note {seed} {i % 11}\n\n")
    return "".join(out)


SOURCES = {"a.py": _source(1, 1500), "b.py": _source(2, 700), "c.py": _source(1, 400)}


def _index(mem: RepoMemory) -> None:
    for path, text in SOURCES.items():
        mem.update_file(path, text)
    mem.update_file("a.py", SOURCES["a.py"].replace("value", "amount"))  # a re-index, new tokens
    mem.remove_file("c.py")


def _arrays(table: SortedTable) -> list:
    return [list(getattr(table, name)[k]) for name in SortedTable.ARRAYS for k in range(table.order)]


def _state(mem: RepoMemory) -> dict:
    snip = mem._snippets
    return {
        "files": {p: list(ids) for p, ids in mem._files.items()},
        "line_starts": {p: list(s) for p, s in mem._line_starts.items()},
        "strings": list(mem._strings),
        "tokens": mem.tokens,
        "win_path": list(snip.win_path),
        "win_start": list(snip.win_start),
        "win_idents": [list(w) for w in snip.win_idents],
        "by_path": dict(snip.by_path),
        "ident_ids": dict(snip.ident_ids),
    }


def _whole(monkeypatch) -> RepoMemory:
    with monkeypatch.context() as m:
        m.setattr(index_mod, "LEX_CHUNK_CHARS", WHOLE)
        m.setattr(index_mod, "WINDOW_BATCH_LINES", WHOLE)
        m.setattr(index_mod, "INTERN_BATCH", WHOLE)
        mem = RepoMemory()
        _index(mem)
        state = _state(mem)
        mem.compact(full=True)
    return mem, state


def test_a_long_file_pauses_more_than_once():
    text = SOURCES["a.py"]
    assert len(text) > index_mod.LEX_CHUNK_CHARS
    assert text.count("\n") > index_mod.WINDOW_BATCH_LINES
    mem = RepoMemory()
    assert mem.pause is index_mod._no_pause
    calls = []
    mem.pause = lambda: calls.append(1)
    assert mem.update_file("a.py", text) > 0
    assert len(calls) > 1
    # every chunk boundary of the lexer, every batch of windows past the first...
    assert len(calls) >= (len(text) // index_mod.LEX_CHUNK_CHARS) + (
        text.count("\n") // index_mod.WINDOW_BATCH_LINES
    )


@pytest.mark.parametrize("batches", ["real", "small"])
def test_slicing_and_pausing_change_nothing(monkeypatch, batches):
    want_mem, want = _whole(monkeypatch)
    if batches == "small":
        # odd sizes: chunk, window-batch (not a multiple of the windows' stride) and intern
        # boundaries everywhere
        monkeypatch.setattr(index_mod, "LEX_CHUNK_CHARS", 997)
        monkeypatch.setattr(index_mod, "WINDOW_BATCH_LINES", 7)
        monkeypatch.setattr(index_mod, "INTERN_BATCH", 101)
    mem = RepoMemory()
    calls = []
    mem.pause = lambda: calls.append(1)
    _index(mem)
    assert len(calls) > 1
    got = _state(mem)
    for key in want:
        assert got[key] == want[key], f"{key} differs when the work is sliced ({batches} batches)"
    mem.compact(full=True)
    assert len(mem._segments) == len(want_mem._segments) == 1
    assert _arrays(mem._segments[0].table) == _arrays(want_mem._segments[0].table)
    before = "def function_1_3(argument_3, value):\n    total_3 = "
    assert mem.complete(before, path="x.py") == want_mem.complete(before, path="x.py")


def test_a_reader_is_not_locked_out_while_the_writer_pauses():
    """The pause happens outside the readers' lock: a suggestion (complete) started while the
    writer waits in pause finishes, at every pause of a long file's update."""
    mem = RepoMemory()
    mem.update_file("seed.py", SOURCES["c.py"])
    answered: list[bool] = []

    def pause() -> None:
        done = threading.Event()

        def read() -> None:
            mem.complete("def function_1_3(argument_3, value):\n    ", path="seed.py")
            done.set()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        answered.append(done.wait(20))

    mem.pause = pause
    mem.update_file("a.py", SOURCES["a.py"])
    mem.compact(full=True)  # the tables' builds pause too
    assert len(answered) > 1
    assert all(answered), (
        f"a reader waited on the writer at pause(s) {[i for i, a in enumerate(answered) if not a]}"
    )
    assert "a.py" in mem.paths()


def test_pause_is_per_memory_and_defaults_to_nothing():
    a, b = RepoMemory(), RepoMemory()
    calls = []
    a.pause = lambda: calls.append(1)
    b.update_file("b.py", SOURCES["b.py"])
    assert calls == []
    assert b.pause is index_mod._no_pause
    assert isinstance(b._files["b.py"], array)
