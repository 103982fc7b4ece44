"""Completion / FIM examples: regions cut the way the server cuts them (whole lines, the
cursor line plus the rest of its statement while typing), and <eom> right after them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from dlm.coder_model import regions
from dlm.coder_model.budget import CHARS_PER_TOKEN
from dlm.coder_model.layout import answer_text, encode_target, target_block
from dlm.coder_model.regions import RegionBudget, region_rows, split_lines, statement_spans
from dlm.coder_model.tokenizer import SPECIAL_TOKENS
from dlm.drivers.training.examples import completion_example, fim_example, server_region, typing_example
from dlm.drivers.training.project_snippets import project_path

REPO = Path(__file__).resolve().parents[3]
# layout.py names the special tokens in its docstrings; the corpus drops such files (a literal
# "<eom>" in a file would be encoded as the special token), so the test text renames them
PYTHON_FILE = (REPO / "coder_model" / "layout.py").read_text()
for _name in SPECIAL_TOKENS:
    PYTHON_FILE = PYTHON_FILE.replace(_name, _name.strip("<>").upper())
JS = """function add(a, b) {
  const total = a +
    b;
  if (total > 10) {
    return total;
  }
  return 0;
}

const items = [1, 2, 3].map((x) =>
  add(x, 1));
"""


def _check_boundaries(text: str, ex) -> None:
    p = ex.prompt
    # the region is whole lines without the last line's break; the break starts the suffix
    assert p.prefix == "" or p.prefix.endswith("\n")
    assert p.suffix == "" or p.suffix.startswith("\n")
    assert p.prefix + ex.target + p.suffix in text
    start = text.index(p.prefix + ex.target + p.suffix) + len(p.prefix)
    assert start == 0 or text[start - 1] == "\n"
    end = start + len(ex.target)
    assert end == len(text) or text[end] == "\n"  # (a region may end in a blank line, as the server's may)


@pytest.mark.parametrize("builder", [typing_example, completion_example, fim_example])
@pytest.mark.parametrize(("text", "language"), [(PYTHON_FILE, "python"), (JS, "javascript"), (PYTHON_FILE, "lua")])
def test_regions_start_and_end_at_line_boundaries(builder, text, language):
    made = 0
    for seed in range(200):
        ex = builder(text, random.Random(seed), path="f", language=language)
        if ex is None:
            continue
        made += 1
        _check_boundaries(text, ex)
        p = ex.prompt
        assert ex.target[: p.cursor] == p.region[: p.cursor]  # text before the cursor is kept
        assert ex.target != p.region  # something to restore
    assert made > 100


def test_typing_examples_stand_where_the_evaluation_types_and_miss_the_rest_of_the_line():
    # the cursor of the rest-of-line evaluation (repo_cases, regions.typed_cut): after the
    # indentation or at a word boundary; the missing text is the rest of the cursor line (or of the
    # statement), never only the rest of a token
    from dlm.drivers.evaluation.repo_cases import _cases_of_line

    at_indent = rest_of_line = 0
    made = []
    for seed in range(300):
        ex = typing_example(PYTHON_FILE, random.Random(seed), language="python")
        if ex is None:
            continue
        p = ex.prompt
        assert p.insert
        line = ex.target.split("\n")[0]
        typed = p.region[: p.cursor]
        indent = len(line) - len(line.lstrip())
        assert p.cursor == indent or (p.cursor > indent and (typed[-1].isalnum() or typed[-1] == "_")
                                      != (line[p.cursor].isalnum() or line[p.cursor] == "_"))
        at_indent += p.cursor == indent
        answer = answer_text(p, ex.target)
        rest_of_line = rest_of_line + (answer == line[p.cursor :])
        assert answer.startswith(line[p.cursor :])  # the whole rest of the line at least
        made.append(ex)
    n = len(made)
    assert n > 200
    assert 0.15 * n < at_indent < 0.45 * n  # NOT_TYPED = 0.3 of the lines
    assert rest_of_line > 0.7 * n
    # the evaluation's case of the same line and generator state stands at the same column
    text = "def f(alpha, beta):\n    return alpha.total + beta\n"
    for seed in range(20):
        case = _cases_of_line("f.py", text, [0, 20], 1, random.Random(seed))
        line = text.split("\n")[1]
        assert case.before.endswith(line[: len(line) - len(case.answer)])


def test_typing_examples_of_a_crlf_file_never_answer_the_line_break():
    text = PYTHON_FILE.replace("\n", "\r\n")
    made = 0
    for seed in range(200):
        ex = typing_example(text, random.Random(seed), language="python")
        if ex is None:
            continue
        made += 1
        answer = answer_text(ex.prompt, ex.target)
        # (a multi-line rest of a region may end in a blank line, as the server's regions may)
        assert not answer.endswith("\r"), answer
        assert "\n" in answer or not answer.endswith("\n")
        assert ex.target.replace(ex.prompt.region[: ex.prompt.cursor], "", 1).startswith(answer)
    assert made > 100


def test_typing_regions_are_the_short_ones_the_server_sends():
    budget = RegionBudget()
    sizes = []
    for seed in range(300):
        cut = server_region(PYTHON_FILE, random.Random(seed), "python", "typing")
        if cut is None:
            continue
        region = PYTHON_FILE[cut.a : cut.b]
        lines = region.split("\n")
        assert len(lines) <= budget.typing_region_lines
        # several lines only while they fit the typing budget (one long line is kept whole)
        assert len(lines) == 1 or len(region) + 1 <= budget.typing_region_tokens * CHARS_PER_TOKEN
        assert "\n" not in region[: cut.cursor]  # the cursor is on the region's first line
        sizes.append(len(lines))
    assert sizes.count(1) > len(sizes) // 2 and max(sizes) > 1  # mostly one line; statements span more


def test_eom_follows_the_regions_tokens():
    from dlm.coder_model.tokenizer import Tokenizer

    tok = Tokenizer.from_file(REPO / "coder_model" / "checkpoints" / "default" / "tokenizer.json")
    for seed in range(40):
        ex = completion_example(PYTHON_FILE, random.Random(seed), language="python")
        if ex is None:
            continue
        # the block's answer: the insertion at the cursor while typing (Prompt.insert, layout 2),
        # never the typed text again; the whole new region in the wide (edit) mode
        answer = answer_text(ex.prompt, ex.target)
        if ex.prompt.insert:
            assert ex.target == ex.prompt.region[: ex.prompt.cursor] + answer + ex.prompt.region[ex.prompt.cursor :]
        else:
            assert answer == ex.target
        region_ids = tok.encode(answer)
        block = target_block(tok, encode_target(tok, answer), 0, 64)
        if len(region_ids) >= 64:
            continue
        assert block.index(tok.eom_id) == len(region_ids)
        assert tok.decode(block[: len(region_ids)]) == answer
        assert set(block[len(region_ids) + 1 :]) <= {tok.pad_id}
        # the line break after the region is not part of the answer: it is in the suffix
        assert ex.prompt.suffix == "" or ex.prompt.suffix.startswith("\n")


@pytest.mark.skipif(regions.grammar("python") is None, reason="tree-sitter-python not installed")
def test_typing_region_is_the_cursor_line_plus_the_rest_of_its_statement():
    text = "x = 1\nresult = compute(\n    alpha,\n    beta,\n)\nif result:\n    print(result)\n"
    lines = split_lines(text)
    spans = statement_spans(text, "python")
    budget = RegionBudget()
    assert region_rows(lines, 1, 4, "typing", budget, spans) == (1, 4)  # the whole call
    assert region_rows(lines, 0, 2, "typing", budget, spans) == (0, 0)  # a one-line statement
    assert region_rows(lines, 5, 3, "typing", budget, spans) == (5, 5)  # a compound statement's header
    assert region_rows(lines, 1, 4, "typing", budget, None) == (1, 1)  # no tree: the line


def test_the_server_cuts_with_the_same_sizes_and_statements():
    """The server (dlm.lsp.context) cuts by these same rules; what could still differ is the
    sizes (its ContextOptions) and the tree (its incrementally kept one, lsp.syntax)."""
    from dlm.lsp.documents import Document
    from dlm.lsp.options import ContextOptions

    assert issubclass(ContextOptions, RegionBudget)  # one set of region sizes, training's
    for text, language, uri in ((PYTHON_FILE, "python", "file:///a.py"), (JS, "javascript", "file:///a.js")):
        doc = Document(uri, text, language_id=language)
        rng = random.Random(0)
        for edit in range(3):  # as opened, then after edits the tree followed incrementally
            spans = statement_spans(doc.text, language)
            for _ in range(300):
                row = rng.randrange(len(doc.lines))
                col = rng.randint(-1, len(doc.line(row)))
                assert doc.syntax.statement_span(row, col) == spans(row, col), (edit, row, col)
            row = rng.randrange(len(doc.lines))
            doc.apply((row, 0), (row + 1, 0), "total = 1\n", doc.version + 1)


def test_typing_examples_get_snippets_of_their_own_project_only(tmp_path):
    """The example stream sees each corpus project as a workspace: a typing example's snippets
    come from the other files of its project, never from the file itself or another project,
    and they reach the model's context in the snippet sections."""
    from types import SimpleNamespace

    from dlm.coder_model.layout import LayoutBudget, decode_context, encode_prompt
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.drivers.training.batches import ExampleStream, make_sequence

    files = _project_corpus(tmp_path, modules=4, functions=8, lines=6)
    cfg = SimpleNamespace(corpus=str(tmp_path), mix="completion=1", context=384, block=32, max_blocks=2,
                          snippet_share=1.0, edit_histories="")
    stream = ExampleStream(cfg, "train", random.Random(0))
    tok = Tokenizer.from_file(REPO / "coder_model" / "checkpoints" / "default" / "tokenizer.json")
    with_snippets = 0
    for _ in range(40):
        ex = next(stream)
        if not ex.prompt.insert:
            assert not ex.prompt.snippets  # the edit mode has none, as in the server
            continue
        project = next(r["source"] for r in files if r["path"].endswith("/" + ex.prompt.path))
        own = [r["path"] for r in files if r["source"] == project]
        for sn in ex.prompt.snippets:
            assert f"{project}/{sn.path}" in own and not f"{project}/{sn.path}".endswith("/" + ex.prompt.path)
        if ex.prompt.snippets:
            with_snippets += 1
            seg = decode_context(tok, encode_prompt(tok, ex.prompt, LayoutBudget.for_window(384)))
            assert seg["snippets"].startswith(ex.prompt.snippets[0].path + "\n")
            assert make_sequence(tok, ex, cfg, random.Random(1)) is not None
    assert with_snippets >= 10


def _project_corpus(tmp_path, projects=("alpha==1", "beta==2"), modules: int = 3, functions: int = 6,
                    lines: int = 5):
    """A corpus split (train.jsonl.gz in `tmp_path`) of small projects: each function calls its
    project's own helpers (the identifiers retrieval and the memory match on), and every file has
    functions of its own too. Returns its records."""
    import gzip
    import json

    files = []
    for project in projects:
        name = project[:4]
        for k in range(modules):
            body = "".join(
                f"def {name}_task_{j}_{k}(ctx):\n"
                + "".join(f"    {name}_value_{j}_{i} = {name}_helper_{j}(ctx, {i})\n" for i in range(lines))
                + f"    return {name}_finish_{j}(ctx)\n\n\n" for j in range(functions))
            files.append({"path": f"{project}/{name}/{name}_mod{k}.py", "language": "python", "text": body,
                          "source": project})
    with gzip.open(tmp_path / "train.jsonl.gz", "wt") as fh:
        for rec in files:
            fh.write(json.dumps(rec) + "\n")
    return files


def test_typing_examples_get_the_drafts_the_memory_of_their_project_proposes(tmp_path):
    """With --draft-share, a typing example carries the memory's proposals at its cursor (from its
    own project's other files and its file's other lines); they reach the drafts section, and the
    answer is often the first of them."""
    from types import SimpleNamespace

    from dlm.coder_model.layout import answer_text, decode_context, encode_prompt
    from dlm.coder_model.refine import draft_block
    from dlm.coder_model.tokenizer import Tokenizer
    from dlm.drivers.training.batches import ExampleStream, make_sequence, train_budget

    files = _project_corpus(tmp_path)
    cfg = SimpleNamespace(corpus=str(tmp_path), mix="typing=1", context=384, block=32, max_blocks=2,
                          snippet_share=0.0, draft_share=1.0, edit_histories="")
    assert train_budget(cfg).max_drafts == 48
    stream = ExampleStream(cfg, "train", random.Random(0))
    tok = Tokenizer.from_file(REPO / "coder_model" / "checkpoints" / "default" / "tokenizer.json")
    given = first = 0
    for _ in range(30):
        ex = next(stream)
        assert ex.prompt.insert
        project = next(r["source"] for r in files if r["path"].endswith("/" + ex.prompt.path))
        if ex.prompt.proposals:
            given += 1
            answer = answer_text(ex.prompt, ex.target)
            first += ex.prompt.proposals[0].text == answer.split("\n")[0]
            seg = decode_context(tok, encode_prompt(tok, ex.prompt, train_budget(cfg)))
            assert seg["drafts"].split("\x00")[0] == ex.prompt.proposals[0].text
            assert make_sequence(tok, ex, cfg, random.Random(1))[2] is None  # from masks
            # --draft-start: the block starts from the first draft
            started = make_sequence(tok, ex, SimpleNamespace(**vars(cfg), draft_start=1.0), random.Random(1))
            assert started[2] == draft_block(tok, ex.prompt.proposals[0].text, cfg.block)
            # never another project's names
            other = "beta" if project.startswith("alpha") else "alph"
            assert not any(other in p.text for p in ex.prompt.proposals)
    assert given >= 20 and first >= 5


def test_drafts_are_none_where_the_server_would_have_none(tmp_path, monkeypatch):
    from dlm.coder_model.types import Prompt
    from dlm.drivers.training import project_drafts
    from dlm.drivers.training.project_drafts import ProjectDrafts, document_around

    files = _project_corpus(tmp_path, ("alpha==1",))
    drafts = ProjectDrafts((r["path"], r["text"], r["source"]) for r in files)
    text = files[0]["text"]
    line = "    alph_value_0_1 = alph_helper_0(ctx, 1)"
    at = text.index(line)
    typed = Prompt(prefix=text[:at], region="    alph_value_0_1 = ", cursor=21, suffix=text[at + len(line):],
                   insert=True, path="alph/alph_mod0.py")
    assert document_around(text, typed, line) == (text[:at] + "    alph_value_0_1 = ", text[at + len(line):])
    got = drafts.drafts("alpha==1", files[0]["path"], text, typed, line)
    assert got and got[0].text == "alph_helper_0(ctx, 1)"
    # edit mode, a region the file does not hold, an unknown project, a project too big to index
    assert drafts.drafts("alpha==1", files[0]["path"], text, Prompt(prefix=typed.prefix, region=typed.region,
                         cursor=21, suffix=typed.suffix), line) == ()
    assert drafts.drafts("alpha==1", files[0]["path"], text, typed, "    not in the file") == ()
    assert drafts.drafts("gamma==3", "gamma==3/x.py", text, typed, line) == ()
    monkeypatch.setattr(project_drafts, "MAX_PROJECT_CHARS", 100)
    assert drafts.drafts("alpha==1", files[0]["path"], text, typed, line) == ()


def test_a_big_project_is_seen_as_the_largest_folder_of_the_file_that_fits(monkeypatch):
    from dlm.drivers.training import project_drafts
    from dlm.drivers.training.project_drafts import ProjectDrafts

    files = [("big==1/pkg/core/a.py", "x" * 400, "big==1"), ("big==1/pkg/core/b.py", "y" * 400, "big==1"),
             ("big==1/pkg/io/c.py", "z" * 900, "big==1"), ("big==1/setup.py", "s" * 50, "big==1")]
    monkeypatch.setattr(project_drafts, "MAX_PROJECT_CHARS", 1000)
    drafts = ProjectDrafts(files)
    assert drafts.workspace("big==1", "pkg/core/a.py") == "pkg/core"  # pkg (1,700) is too big
    assert drafts.workspace("big==1", "pkg/io/c.py") == "pkg/io"
    assert drafts.workspace("big==1", "setup.py") is None  # only the whole project holds it
    monkeypatch.setattr(project_drafts, "MAX_PROJECT_CHARS", 5000)
    assert ProjectDrafts(files).workspace("big==1", "pkg/core/a.py") == ""


def test_files_are_drawn_in_runs_per_workspace_so_each_memory_serves_many_examples(monkeypatch):
    import random

    from dlm.drivers.training import project_drafts
    from dlm.drivers.training.project_drafts import FileDraw, ProjectDrafts

    files = [("big==1/pkg/core/a.py", "x" * 400, "big==1"), ("big==1/pkg/core/b.py", "y" * 400, "big==1"),
             ("big==1/pkg/io/c.py", "z" * 900, "big==1"), ("big==1/setup.py", "s" * 50, "big==1")]
    files += [(f"p{k}==1/m{k}/f{j}.py", "q" * 30, f"p{k}==1") for k in range(40) for j in range(3)]
    monkeypatch.setattr(project_drafts, "MAX_PROJECT_CHARS", 1000)
    drafts = ProjectDrafts(files)
    assert drafts.companions("big==1", "big==1/pkg/core/b.py") == [0, 1]
    assert drafts.companions("big==1", "big==1/setup.py") == []  # no workspace: drawn alone
    assert drafts.companions("p3==1", "p3==1/m3/f0.py") == [13, 14, 15]
    monkeypatch.setattr(project_drafts, "MEMORIES", 4)
    monkeypatch.setattr(project_drafts, "RUN", 8)
    rows = [(p, "python", t, s) for p, t, s in files]
    draw = FileDraw(drafts, rows, random.Random(0))
    got = [draw() for _ in range(400)]
    workspaces = [(src, drafts.workspace(src, project_path(p, src))) for p, _, _, src in got]
    # an LRU of MEMORIES memories builds one per workspace run: ~400 / RUN builds, where a
    # uniform draw over the 41 workspaces would build one for nearly every draw
    lru: list = []
    builds = 0
    for w in workspaces:
        if w[1] is None:
            continue
        if w in lru:
            lru.remove(w)
        else:
            builds += 1
        lru = [*lru, w][-4:]
    assert builds <= 70
    # and a stretch of 40 draws still mixes several projects
    assert all(len(set(workspaces[i:i + 40])) >= 4 for i in range(0, 360, 40))
    assert all(g in rows for g in got)


def test_the_draft_share_report_counts_examples_given_drafts_and_right_ones(tmp_path, capsys):
    import json

    from dlm.drivers.training import project_drafts

    _project_corpus(tmp_path)
    assert project_drafts.main(["--corpus", str(tmp_path), "--split", "train", "--examples", "20"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["examples"] == 20 and got["given"] >= 0.5 and 0 < got["first"] <= got["any"] <= got["given"]
