"""The repository memory's drafts for training's typing examples, made by the code that serves.

A corpus project (as in training.project_snippets) is indexed into a RepoMemory, as the server
indexes a workspace. A typing example of one of its files gets the proposals the server's
`lsp.memory_proposals.memory_proposals` makes at its cursor: the document is the example's file
with the region as the user has it (its other lines are the memory's current-file level), the
file itself is excluded from the workspace level, and the shipped line ranker orders them. So
the model learns to read the drafts section (coder_model.layout.render_drafts) on what the
server will give it, including the cases where no draft is right.

A project's memory is built on its first example and kept (the last MEMORIES of them). Building
one takes seconds, so a stream draws its files through a FileDraw: MEMORIES / 2 workspaces open
at a time, each for RUN examples, drawn among at random, so that a memory serves many examples
and a batch still mixes many projects. A project over MAX_PROJECT_CHARS (building a memory of pandas' 18 MB takes minutes) is seen as the user who
opens one of its folders sees it: the memory of the largest folder holding the example's file
that is at most MAX_PROJECT_CHARS. A file with no such folder gets no drafts, as from a server
whose index is not ready: such examples train the model without drafts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from dlm.coder_model.types import MemoryProposal, Prompt
from dlm.drivers.training.project_snippets import project_path

MAX_PROJECT_CHARS = 4_000_000
MEMORIES = 16  # a memory of 4 MB of text adds about 20 MB to the process (sqlalchemy, measured)
RUN = 32  # examples drawn from a workspace's files while its memory is open


def document_around(text: str, prompt: Prompt, target: str) -> tuple[str, str] | None:
    """(before, after) the cursor in the document the example stands for: `text` with its region
    (`target`, the original) as the prompt has it. None when the region is not found in `text`."""
    at = text.find(prompt.prefix + target)
    if at < 0:
        return None
    a = at + len(prompt.prefix)
    before = text[:a] + prompt.region[: prompt.cursor]
    after = prompt.region[prompt.cursor :] + text[a + len(target) :]
    return before, after


class ProjectDrafts:
    """Repository memories of the corpus projects of one split, and the drafts they propose."""

    def __init__(self, files: Iterable[tuple[str, str, str]]) -> None:
        """`files`: (path, text, source) of every file of the split."""
        self._files: dict[str, list[tuple[str, str]]] = {}
        self._order: dict[str, list[int]] = {}  # source -> the positions of its files in `files`
        for i, (path, text, source) in enumerate(files):
            self._files.setdefault(source, []).append((project_path(path, source), text))
            self._order.setdefault(source, []).append(i)
        self._memories: OrderedDict[str, object] = OrderedDict()
        self._sizes: dict[str, dict[str, int]] = {}  # source -> folder ("" the project) -> characters

    def workspace(self, source: str, rel: str) -> str | None:
        """The folder of `source` (relative; "" the whole project) whose memory gives the drafts of
        its file `rel`: the largest holding it of at most MAX_PROJECT_CHARS; None when none is."""
        sizes = self._sizes.get(source)
        if sizes is None:
            sizes = self._sizes[source] = {}
            for path, text in self._files.get(source, ()):
                parts = path.split("/")[:-1]
                for depth in range(len(parts) + 1):
                    folder = "/".join(parts[:depth])
                    sizes[folder] = sizes.get(folder, 0) + len(text)
        parts = rel.split("/")[:-1]
        for depth in range(len(parts) + 1):
            folder = "/".join(parts[:depth])
            if 0 < sizes.get(folder, 0) <= MAX_PROJECT_CHARS:
                return folder
        return None

    def companions(self, source: str, path: str) -> list[int]:
        """The positions (in the files given) of the files whose drafts come from the memory that
        gives the drafts of `path` (corpus path) of `source`: its workspace's files; [] for none."""
        folder = self.workspace(source, project_path(path, source))
        if folder is None:
            return []
        return [i for i, (rel, _) in zip(self._order[source], self._files[source])
                if not folder or rel.startswith(folder + "/")]

    def _memory(self, source: str, folder: str):
        from dlm.coder_model.memory.index import RepoMemory

        key = f"{source}\x00{folder}"
        memory = self._memories.get(key)
        if memory is None:
            memory = RepoMemory()
            for rel, text in self._files[source]:
                if not folder or rel.startswith(folder + "/"):
                    memory.update_file(rel, text)
            memory.compact()
            self._memories[key] = memory
            while len(self._memories) > MEMORIES:
                self._memories.popitem(last=False)
        self._memories.move_to_end(key)
        return memory

    def drafts(self, source: str, path: str, text: str, prompt: Prompt, target: str) -> tuple[MemoryProposal, ...]:
        """The server's proposals for a typing example of `path` (corpus path) of `source` whose
        file's text is `text`; () for a project given none or a region not found in the file."""
        from dlm.lsp.memory_proposals import memory_proposals, shipped_ranker

        rel = project_path(path, source)
        folder = self.workspace(source, rel) if prompt.insert else None
        if folder is None:
            return ()
        around = document_around(text, prompt, target)
        if around is None:
            return ()
        before, after = around
        # the syntax facts of the drafts are read on the text, as the server's are on its document
        return memory_proposals(self._memory(source, folder), before, after, rel, {}, shipped_ranker())


class FileDraw:
    """Draws the files of a split so that the memories of ProjectDrafts are reused: up to
    MEMORIES / 2 workspaces are open (half the memories kept, so an open one's memory is not the
    one dropped), each for RUN draws; a draw picks an open one at random and a file of it at
    random. A workspace is opened by a file drawn uniformly from the split (projects weigh by
    their files, as an undirected draw weighs them); a file with no workspace is drawn alone."""

    def __init__(self, drafts: ProjectDrafts, files, rng) -> None:
        self.drafts, self.files, self.rng = drafts, files, rng  # files: (path, language, text, source)
        self._open: list[list] = []  # [positions, draws left]

    def __call__(self):
        rng = self.rng
        if len(self._open) < max(1, MEMORIES // 2):
            i = rng.randrange(len(self.files))
            path, _, _, source = self.files[i]
            together = self.drafts.companions(source, path)
            if together:
                self._open.append([together, RUN - 1])
            return self.files[i]
        k = rng.randrange(len(self._open))
        together, left = self._open[k]
        if left <= 1:
            self._open.pop(k)
        else:
            self._open[k][1] = left - 1
        return self.files[together[rng.randrange(len(together))]]


def draft_shares(drafts: ProjectDrafts, files, rng, n: int) -> dict:
    """Of `n` typing examples (training.examples.typing_example) of `files` ((path, language, text,
    source) of a split): the share given drafts, whose answer is the first draft, and is any draft;
    and the milliseconds a lookup took (p50, a memory's build included)."""
    import time

    from dlm.coder_model.layout import answer_text
    from dlm.drivers.training import examples as ex_mod

    given = first = anywhere = seen = 0
    ms: list[float] = []
    draw = FileDraw(drafts, files, rng)
    while seen < n:
        path, lang, text, source = draw()
        ex = ex_mod.typing_example(text, rng, path=path, language=lang)
        if ex is None:
            continue
        seen += 1
        t0 = time.perf_counter()
        got = drafts.drafts(source, path, text, ex.prompt, ex.target)
        ms.append((time.perf_counter() - t0) * 1000)
        answer = answer_text(ex.prompt, ex.target).split("\n")[0]
        texts = [d.text.split("\n")[0] for d in got]
        given += bool(got)
        first += bool(texts) and texts[0] == answer
        anywhere += answer in texts
    ms.sort()
    return {"examples": n, "given": given / n, "first": first / n, "any": anywhere / n,
            "lookup_ms_p50": ms[len(ms) // 2]}


def add_arguments(ap) -> None:
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--split", default="valid", choices=("train", "valid", "test"))
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    import json
    import random
    from pathlib import Path

    from dlm.drivers.training.corpus import read_split

    files = [(r["path"], r["language"], r["text"], r.get("source", "")) for r in read_split(Path(args.corpus), args.split)]
    if not files:
        raise SystemExit(f"corpus split {args.split!r} in {args.corpus} is empty; build it with "
                         "python -m dlm.drivers.training.corpus")
    drafts = ProjectDrafts((p, t, s) for p, _, t, s in files)
    print(json.dumps(draft_shares(drafts, files, random.Random(args.seed), args.examples), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    from dlm.drivers.command import run_command

    return run_command("dlm.drivers.training.project_drafts", "How often a typing example's answer is among the "
                       "repository memory's drafts, on the corpus as training builds them", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
