"""Rest-of-line cases from a real repository, and the repository memory measured alone on them.

A repository's files are split by a hash of their path: about HOLDOUT of
them are held out, the rest is the workspace (the held-out files never
enter the index). A case is one non-blank line of a held-out file, typed
up to a word boundary or not at all (NOT_TYPED of the cases: the cursor
stands after the line's indentation, where an editor puts it after
Enter), with the whole file above and below in view; the answer is the
rest of the line. `make_cases` is the one case builder: `dlm-lsp eval
--repo` replays the same cases through the server. Only files ending in
one of the suffixes asked for are read (`--extensions` of both commands,
default SOURCE_EXTENSIONS); the split depends on the path alone, so the
held-out files of one suffix stay the same whatever else is read.

    python -m dlm.drivers.evaluation.repo_cases --repo DIR --cases 400
    python -m dlm.drivers.evaluation.repo_cases --repo DIR --extensions .js,.ts,.mjs,.tsx
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dlm.coder_model.regions import typed_cut

HOLDOUT = 0.10
SOURCE_EXTENSIONS = (".py",)  # the files cases are drawn from unless --extensions says otherwise
EXTENSIONS_EXAMPLE = ".js,.ts,.mjs,.tsx"  # a JavaScript/TypeScript project
EXTENSIONS_HELP = ("comma-separated file suffixes: only files ending in one of them are held out and "
                   f"indexed (default {','.join(SOURCE_EXTENSIONS)}; e.g. {EXTENSIONS_EXAMPLE} for a "
                   "JavaScript/TypeScript project)")
_SUFFIX = re.compile(r"(\.[A-Za-z0-9_+-]+)+")
MAX_FILE_BYTES = 1_000_000
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".tox", ".venv", "venv", "build", "dist"}
LENGTH_BINS = ((1, 2), (3, 10), (11, 30), (31, None))
CUTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class Case:
    path: str  # relative to the repository root, "/"-separated
    line: int  # 0-based line number in the file
    before: str  # the file up to the cursor
    after: str  # the file from the end of the line (its line break) on
    answer: str  # the rest of the line after the cursor, trailing blanks dropped
    typed: bool  # False: nothing of the line typed (the cursor after its indentation)


def source_files(repo_dir: str, extensions: Sequence[str] = SOURCE_EXTENSIONS) -> dict[str, str]:
    """Relative path -> text of the repository's source files (UTF-8, regular, under the size cap)."""
    out: dict[str, str] = {}
    for root, dirs, names in os.walk(repo_dir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(names):
            if not name.endswith(tuple(extensions)):
                continue
            full = os.path.join(root, name)
            if os.path.islink(full) or not os.path.isfile(full) or os.path.getsize(full) > MAX_FILE_BYTES:
                continue
            try:
                with open(full, encoding="utf-8", newline="") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            out[os.path.relpath(full, repo_dir).replace(os.sep, "/")] = text
    return out


def parse_extensions(text: str) -> tuple[str, ...]:
    """The suffixes of a comma-separated --extensions value, in order, once each; an
    argparse.ArgumentTypeError that says what is wrong and what to pass otherwise."""
    example = f"pass suffixes with their dot, comma-separated, e.g. --extensions {EXTENSIONS_EXAMPLE}"
    wanted: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if not item.startswith("."):
            raise argparse.ArgumentTypeError(f"{item!r} does not start with '.': {example}")
        if not _SUFFIX.fullmatch(item):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a plain file suffix (after each '.' only letters, digits, '_', '+' or '-': "
                f"no paths, spaces or wildcards): {example}")
        if item not in wanted:
            wanted.append(item)
    if not wanted:
        raise argparse.ArgumentTypeError(f"no file suffix in {text!r}: {example}")
    return tuple(wanted)


def held_out(path: str, share: float = HOLDOUT) -> bool:
    """Whether `path` is held out: a hash of the path, so the split never depends on the seed."""
    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _cases_of_line(path: str, text: str, starts: Sequence[int], i: int, rng: random.Random) -> Case | None:
    start = starts[i]
    end = starts[i + 1] - 1 if i + 1 < len(starts) else len(text)  # the "\n" ending the line, or EOF
    line = text[start:end]
    content = line.rstrip()
    if not content.strip():
        return None
    cut = typed_cut(content, rng)
    typed = cut > len(content) - len(content.lstrip())
    return Case(path, i, text[: start + cut], text[end:], content[cut:], typed)


def make_cases(
    repo_dir: str, n: int, seed: int = 0, *, holdout: float = HOLDOUT, extensions: Sequence[str] = SOURCE_EXTENSIONS
) -> tuple[dict[str, str], list[Case]]:
    """(workspace files: path -> text, n cases from held-out files), the same for the same arguments."""
    files = source_files(repo_dir, extensions)
    workspace = {p: t for p, t in files.items() if not held_out(p, holdout)}
    lines: list[tuple[str, int]] = []
    line_starts: dict[str, list[int]] = {}
    for path in sorted(p for p in files if held_out(p, holdout)):
        text = files[path]
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        if starts[-1] == len(text) and len(starts) > 1:
            starts.pop()  # no empty last line after a final line break
        line_starts[path] = starts
        lines.extend((path, i) for i in range(len(starts)) if text[starts[i] : starts[i] + 200].split("\n", 1)[0].strip())
    rng = random.Random(seed)
    rng.shuffle(lines)
    cases = []
    for path, i in lines:
        case = _cases_of_line(path, files[path], line_starts[path], i, rng)
        if case is not None:
            cases.append(case)
        if len(cases) == n:
            break
    return workspace, cases


# --- statistics ---------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _bin_name(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi}" if hi is not None else f">{lo - 1}"


def _rate(k: int, n: int) -> dict:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else 0.0, "ci95": [lo, hi]}


def measure(memory, cases: Sequence[Case], beam: int = 8) -> dict:
    """Top-1 exact, top-`beam` coverage, by length of the answer, and precision/shown per score cut."""
    rows = []
    latencies = []  # a new line of a document: the file level is built for it
    keystrokes = []  # the next keystroke on that line: the file level and answers are cached
    retrievals = []  # similar snippets for the lines above (no figure of their use yet: that needs the model)
    cpu_first, cpu_next = [], []  # CPU time of this thread: the part a shared machine does not inflate
    for case in cases:
        t0, c0 = time.perf_counter(), time.thread_time()
        cands = memory.complete(case.before, case.after, path=case.path, beam=beam)
        latencies.append((time.perf_counter() - t0) * 1000)
        cpu_first.append((time.thread_time() - c0) * 1000)
        t0, c0 = time.perf_counter(), time.thread_time()
        memory.complete(case.before + case.answer[0], case.after, path=case.path, beam=beam)
        keystrokes.append((time.perf_counter() - t0) * 1000)
        cpu_next.append((time.thread_time() - c0) * 1000)
        t0 = time.perf_counter()
        memory.retrieve(case.before.split("\n")[:-1], 4, exclude_path=case.path)
        retrievals.append((time.perf_counter() - t0) * 1000)
        texts = [c.text for c in cands]
        rows.append(
            {
                "len": len(case.answer),
                "typed": case.typed,
                "top1": bool(texts) and texts[0] == case.answer,
                "topk": case.answer in texts[:8],
                "score": cands[0].score if cands else 0.0,
            }
        )
    out = summarize(rows, latencies, keystrokes)
    out["latency_cpu_ms"] = _percentiles(cpu_first)
    out["keystroke_cpu_ms"] = _percentiles(cpu_next)
    if retrievals:
        out["retrieve_ms"] = _percentiles(retrievals)
    return out


def measure_follow(memory, cases: Sequence[Case], beam: int = 8) -> dict:
    """Multi-line drafts (RepoMemory.follow_lines) on the cases whose true line opens a block:
    the block's true lines are taken out of the text below (as while typing it), and the draft
    that follows the line is compared with them, line by line. `given`: the true line as the
    first line (the draft alone); `top1`: the memory's first proposal as the first line, as the
    server shows it (a wrong first line gives no credit)."""
    from dlm.coder_model.memory.follow import block_after, opens_block

    out = {"cases": 0, "given": _follow_counts(), "top1": _follow_counts()}
    for case in cases:
        line = case.before[case.before.rfind("\n") + 1 :] + case.answer
        below = case.after.split("\n")
        if not opens_block(line):
            continue
        truth = block_after([line, *below[1:]], 0)
        if not truth:
            continue
        out["cases"] += 1
        after = "\n".join([below[0], *below[1 + len(truth) :]])
        given = memory.follow_lines(case.before, case.answer, after, exclude_path=case.path)
        _follow_add(out["given"], given, truth)
        cands = memory.complete(case.before, after, path=case.path, beam=beam)
        first = cands[0].text if cands else ""
        drafted = memory.follow_lines(case.before, first, after, exclude_path=case.path) if first else []
        _follow_add(out["top1"], drafted if first == case.answer else [], truth, shown=bool(drafted))
    return out


def _follow_counts() -> dict:
    return {"shown": 0, "exact": 0, "first_line": 0, "lines": 0, "true_lines": 0}


def _follow_add(counts: dict, draft: list[str], truth: list[str], shown: bool | None = None) -> None:
    counts["shown"] += int(bool(draft) if shown is None else shown)
    counts["exact"] += int(draft == truth)
    counts["first_line"] += int(bool(draft) and draft[0] == truth[0])
    same = 0
    for a, b in zip(draft, truth):
        if a != b:
            break
        same += 1
    counts["lines"] += same  # the leading lines a user keeps
    counts["true_lines"] += len(truth)


def typing_latency(memory, cases: Sequence[Case], lines: int, beam: int = 8) -> dict:
    """complete() at every keystroke while `lines` held-out lines are typed out one character at a time."""
    per_key = []
    for case in cases[:lines]:
        for i in range(len(case.answer) + 1):
            c0 = time.thread_time()
            memory.complete(case.before + case.answer[:i], case.after, path=case.path, beam=beam)
            per_key.append((time.thread_time() - c0) * 1000)
    return {**_percentiles(per_key), "keystrokes": len(per_key), "lines": min(lines, len(cases))} if per_key else {}


def _percentiles(values: Sequence[float]) -> dict:
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(len(v) * q))]
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": v[-1]}


def summarize(rows: Sequence[dict], latencies: Sequence[float] = (), keystrokes: Sequence[float] = ()) -> dict:
    n = len(rows)
    out: dict = {
        "cases": n,
        "top1": _rate(sum(r["top1"] for r in rows), n),
        "top8": _rate(sum(r["topk"] for r in rows), n),
        "by_length": {},
        "by_typing": {},
        "cuts": [],
    }
    for lo, hi in LENGTH_BINS:
        sub = [r for r in rows if r["len"] >= lo and (hi is None or r["len"] <= hi)]
        out["by_length"][_bin_name(lo, hi)] = {
            "top1": _rate(sum(r["top1"] for r in sub), len(sub)),
            "top8": _rate(sum(r["topk"] for r in sub), len(sub)),
        }
    for typed in (False, True):
        sub = [r for r in rows if r["typed"] == typed]
        out["by_typing"]["typed" if typed else "not typed"] = _rate(sum(r["top1"] for r in sub), len(sub))
    for cut in CUTS:
        shown = [r for r in rows if r["score"] >= cut and (cut > 0 or r["score"] > 0)]
        right = sum(r["top1"] for r in shown)
        out["cuts"].append(
            {"cut": cut, "shown": _rate(len(shown), n), "precision": _rate(right, len(shown)), "right_of_all": right / n if n else 0.0}
        )
    if latencies:
        out["latency_ms"] = _percentiles(latencies)
    if keystrokes:
        out["keystroke_ms"] = _percentiles(keystrokes)
    return out


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def build_memory(workspace: dict[str, str], **kwargs) -> tuple[object, dict]:
    """Index the workspace; the memory and what it cost (seconds, RSS added, save/load)."""
    import io

    from dlm.coder_model.memory import RepoMemory

    rss0 = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    memory = RepoMemory(**kwargs)
    for path in sorted(workspace):
        memory.update_file(path, workspace[path])
    build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    rss1 = _rss_mb()
    t0 = time.perf_counter()
    memory.compact()
    compact_s = time.perf_counter() - t0
    buf = io.BytesIO()
    t0 = time.perf_counter()
    memory.save(buf)
    save_s = time.perf_counter() - t0
    data = buf.getvalue()
    t0 = time.perf_counter()
    RepoMemory.load(io.BytesIO(data))
    load_s = time.perf_counter() - t0
    lines = sum(t.count("\n") for t in workspace.values())
    cost = {
        "files": memory.files,
        "lines": lines,
        "tokens": memory.tokens,
        "build_s": build_s,
        "build_cpu_s": build_cpu_s,
        "compact_s": compact_s,
        "rss_added_mb": rss1 - rss0,
        "saved_mb": len(data) / 2**20,
        "save_s": save_s,
        "load_s": load_s,
    }
    return memory, cost


def load_or_build(index_file: str, workspace: dict[str, str], **kwargs) -> tuple[object, dict]:
    """The index saved in `index_file` when it holds exactly `workspace`'s files (and the order
    asked), else a fresh build saved there; the cost says which."""
    from dlm.coder_model.memory import RepoMemory

    if os.path.exists(index_file):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            with open(index_file, "rb") as fh:
                memory = RepoMemory.load(fh)
        except (OSError, ValueError) as exc:
            print(f"repo_cases: {index_file}: {exc}; building the index again", file=sys.stderr)
        else:
            if sorted(memory.paths()) == sorted(workspace) and memory.order == kwargs.get("order", memory.order):
                lines = sum(t.count("\n") for t in workspace.values())
                load_s, load_cpu_s = time.perf_counter() - t0, time.process_time() - c0
                return memory, {"files": memory.files, "lines": lines, "tokens": memory.tokens,
                                "loaded_from": index_file, "load_s": load_s, "load_cpu_s": load_cpu_s}
            print(f"repo_cases: {index_file} holds another workspace or order; building the index again",
                  file=sys.stderr)
    memory, cost = build_memory(workspace, **kwargs)
    tmp = index_file + ".tmp"
    with open(tmp, "wb") as fh:
        memory.save(fh)
    os.replace(tmp, index_file)
    return memory, cost


def _fmt_rate(r: dict) -> str:
    lo, hi = r["ci95"]
    return f"{100 * r['rate']:5.1f}% [{100 * lo:4.1f}, {100 * hi:4.1f}] (n={r['n']})"


def report(name: str, cost: dict, result: dict) -> str:
    if "loaded_from" in cost:
        index_line = f"index: loaded from {cost['loaded_from']} in {cost['load_s']:.2f} s ({cost['load_cpu_s']:.2f} s CPU)"
    else:
        index_line = (f"index: build {cost['build_s']:.1f} s ({cost['build_cpu_s']:.1f} s CPU), +{cost['rss_added_mb']:.0f} MB RSS, "
                      f"then compact {cost['compact_s']:.1f} s, file {cost['saved_mb']:.1f} MB, save {cost['save_s']:.2f} s, "
                      f"load {cost['load_s']:.2f} s")
    lines = [
        f"== {name}: {cost['files']} workspace files, {cost['lines']} lines, {cost['tokens']} tokens",
        index_line,
        f"top-1 exact  {_fmt_rate(result['top1'])}",
        f"top-8 cover  {_fmt_rate(result['top8'])}",
    ]
    for name_, r in result["by_length"].items():
        lines.append(f"  rest {name_:>5} chars: top-1 {_fmt_rate(r['top1'])}  top-8 {_fmt_rate(r['top8'])}")
    for name_, r in result["by_typing"].items():
        lines.append(f"  {name_:>9}: top-1 {_fmt_rate(r)}")
    lines.append("  score cut  shown            precision")
    for c in result["cuts"]:
        lines.append(f"  {c['cut']:9.2f}  {_fmt_rate(c['shown'])}  {_fmt_rate(c['precision'])}")
    for key, what in (
        ("latency_ms", "complete(), first query on a line"),
        ("latency_cpu_ms", "  the same, CPU time of the thread"),
        ("keystroke_ms", "complete(), next keystroke"),
        ("keystroke_cpu_ms", "  the same, CPU time of the thread"),
        ("retrieve_ms", "retrieve(), 4 snippets"),
        ("typing_ms", "complete(), every keystroke of typed-out lines, CPU time"),
    ):
        if key in result:
            lat = result[key]
            lines.append(
                f"{what}: p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, "
                f"p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms"
            )
    if "follow" in result:
        f = result["follow"]
        lines.append(f"multi-line drafts: {f['cases']} cases whose line opens a block")
        for key, what in (("given", "after the true line"), ("top1", "after the memory's first line")):
            c, n = f[key], max(f["cases"], 1)
            lines.append(f"  {what}: shown {c['shown']} ({100 * c['shown'] / n:.1f}%), block exact {c['exact']} "
                         f"({100 * c['exact'] / n:.1f}%), next line exact {c['first_line']} "
                         f"({100 * c['first_line'] / n:.1f}%), leading lines kept {c['lines']} of {c['true_lines']}")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Repository memory alone on held-out lines of a repository.")
    ap.add_argument("--repo", required=True, action="append", help="repository directory (repeat for several)")
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--holdout", type=float, default=HOLDOUT)
    ap.add_argument("--extensions", type=parse_extensions, default=",".join(SOURCE_EXTENSIONS),
                    metavar="SUFFIXES", help=EXTENSIONS_HELP)
    ap.add_argument("--order", type=int, default=None, help="n-gram order (default: the memory's)")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--follow", action="store_true", help="also measure multi-line drafts (measure_follow)")
    ap.add_argument("--typing-lines", type=int, default=0, help="also time complete() at every keystroke of this many lines")
    ap.add_argument("--index-file", default=None,
                    help="load the workspace index from this file if it holds this workspace, else build it and "
                         "save it there (query-side changes are then measured without a rebuild; the cost line "
                         "shows the load); with several --repo, a {repo} in the name is the repository's name")
    args = ap.parse_args(list(argv) if argv is not None else None)
    results = {}
    for repo in args.repo:
        if not os.path.isdir(repo):
            print(f"repo_cases: {repo} is not a directory: pass a repository checkout or an unpacked sdist", file=sys.stderr)
            return 2
        workspace, cases = make_cases(repo, args.cases, args.seed, holdout=args.holdout,
                                      extensions=args.extensions)
        if not cases:
            print(f"repo_cases: no held-out lines in {repo} in files ending in {', '.join(args.extensions)} "
                  f"(another language: --extensions, e.g. {EXTENSIONS_EXAMPLE})", file=sys.stderr)
            return 2
        kwargs = {"order": args.order} if args.order else {}
        name = os.path.basename(os.path.normpath(repo))
        index_file = args.index_file.replace("{repo}", name) if args.index_file else None
        memory, cost = (load_or_build(index_file, workspace, **kwargs) if index_file
                        else build_memory(workspace, **kwargs))
        result = measure(memory, cases, beam=args.beam)
        if args.typing_lines:
            result["typing_ms"] = typing_latency(memory, cases, args.typing_lines, beam=args.beam)
        if args.follow:
            result["follow"] = measure_follow(memory, cases, beam=args.beam)
        print(report(name, cost, result), flush=True)
        results[name] = {"cost": cost, "result": result, "cases": len(cases), "seed": args.seed,
                         "extensions": list(args.extensions)}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
