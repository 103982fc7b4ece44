"""Tune the edit memory on the edit-histories `valid` split, fit its calibration on `train` (docs/next-edits.md).

    python -m dlm.drivers.evaluation.edit_memory_tuning --split valid [--limit N] [--model-check]
    python -m dlm.drivers.evaluation.edit_memory_tuning --split train --fit-calibration coder_model/edit_memory/calibration.json
    python -m dlm.drivers.evaluation.edit_memory_tuning --split train --cross-validate 5
    python -m dlm.drivers.evaluation.edit_memory_tuning --split valid --jumps

A library-level replay (the LSP-level one is `dlm-lsp eval`'s next-edit mode): each record's
hunks are applied one by one to its `before` text, each hunk observed as one closed edit; after
each hunk but the last, the memory proposes the best site in the file (cursor at the hunk).
A proposal is at the right location when its lines touch one of the hunks still to come (in
the current text's lines), and exact when its new line is that hunk's line after the commit (a
block pattern's lines: that hunk's lines); exact (next hunk) is the strict rule of `dlm-lsp eval
--next-edits`: the document after the proposal is the document after the next hunk.
For every threshold it prints: shown share (of opportunities: steps with a hunk to come), exact
and location precision of the shown, and "deletes kept lines" (a block pattern that removes a
non-blank line no hunk to come touches, with nothing like it written there; a one-line span
never removes a line).

Confidence: `memory` (the memory's confidence alone: the calibration model's P(exact next edit),
edit_memory/calibration.py, or with --no-calibration its older support), `checked` (the denoiser checks the literal
proposal, coder_model.verify's mix: it can veto), `written` (the denoiser writes the site's line
with the pattern's edit in its history; kept only when it equals the literal proposal's span edit
or is the answer the measure compares).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

from dlm.coder_model.edit_memory import Edit, EditMemory, extract
from dlm.coder_model.types import CancelToken, MemoryProposal, Prompt, SamplerParams

THRESHOLDS = (0.0, 0.1, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8)


def git_lines(s: str) -> list[str]:
    return [x for x in re.split(r"(?<=\n)", s) if x]


def records(root: Path, split: str, limit: int | None):
    n = 0
    for f in sorted(root.glob("*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                if rec["split"] != split:
                    continue
                yield rec
                n += 1
                if limit and n >= limit:
                    return


def hunk_spans(rec: dict) -> list[tuple[int, int, list[str]]]:
    """The record's hunks as (first line replaced, 0-based in `before`, or the line an insertion goes
    before; lines removed; lines added)."""
    return [((h["at"] - 1 if h["del"] else h["at"]), h["del"], git_lines(h["add"])) for h in rec["hunks"]]


def cases(rec: dict):
    """(lines after hunks 0..k, the edit of hunk k, the hunks to come as (start, old_n, new lines))
    for k = 0..n-2, in current-text coordinates."""
    lines = git_lines(rec["before"])
    offset = 0  # lines added minus removed by the hunks applied so far
    spans = hunk_spans(rec)
    for k, (start, deln, add) in enumerate(spans):
        s = start + offset
        old = lines[s : s + deln]
        lines = lines[:s] + add + lines[s + deln :]
        offset += len(add) - deln
        edit = Edit(s, tuple(old), tuple(add), float(k))
        rest = [(st + offset, d, a) for st, d, a in spans[k + 1 :]]
        yield list(lines), edit, rest


def applied(lines: list[str], p) -> dict[int, str]:
    """The lines a one-line proposal changes (all its sites), with their new text (insert_line: the
    inserted line keyed by the def's line)."""
    out: dict[int, str] = {}
    for s in sorted(p.sites, key=lambda s: (s.line, -s.start)):  # right to left on a line
        line = out.get(s.line, lines[s.line])
        out[s.line] = line[: s.start] + s.new_text + line[s.end :]
    return out


def after(lines: list[str], p) -> list[str]:
    """The document's lines after the proposal (every site applied)."""
    out = list(lines)
    for s in sorted(p.sites, key=lambda s: (s.line, s.start), reverse=True):
        if s.end_line >= 0 or p.pattern.kind == "insert_line":
            out[s.line : s.last_line] = git_lines(s.new_text)
        else:
            out[s.line] = out[s.line][: s.start] + s.new_text + out[s.line][s.end :]
    return out


def _span(p) -> tuple[int, int]:
    """The lines [a, b) a proposal replaces (a == b: it inserts before line a)."""
    if p.pattern.kind == "insert_line":
        return p.site.line, p.site.line
    if p.site.end_line >= 0:
        return p.site.line, p.site.end_line
    return p.site.line, p.site.line + 1


def judge(lines: list[str], p, rest) -> tuple[bool, bool]:
    """(right location, exact) of a proposal against the hunks to come: exact when its new line is
    that line's text after the hunk holding it (one line of a longer hunk counts); a block or an
    inserted line is exact when it is the hunk's."""
    s = p.site
    a, b = _span(p)
    if a == b or s.end_line >= 0:
        new_lines = git_lines(s.new_text)
        for st, d, add in rest:
            if (a == b and st <= a <= st + d) or (a < b and st < b and a < st + max(d, 1)):
                return True, (a, b) == (st, st + d) and new_lines == add
        return False, False
    new_line = applied(lines, p)[s.line]
    for st, d, add in rest:
        if st <= s.line < st + max(d, 1):
            exact = d == len(add) and add[s.line - st] == new_line
            if not exact and d != len(add):  # an uneven hunk: exact if the new line is among its lines
                exact = new_line in add
            return True, exact
    return False, False


def deletes_kept(lines: list[str], p, rest) -> bool:
    """The proposal removes a non-blank line that no hunk to come touches, with nothing like it
    (difflib ratio >= 0.5, as `dlm-lsp eval --next-edits`) among the lines it writes there."""
    if p.site.end_line < 0:
        return False  # a span inside one line, or an inserted line: nothing is removed
    a, b = _span(p)
    written = [x.strip() for x in git_lines(p.site.new_text)]
    for i in range(a, b):
        old = lines[i].strip()
        if not old or any(st <= i < st + d for st, d, _ in rest):
            continue
        if not any(difflib.SequenceMatcher(None, old, w).ratio() >= 0.5 for w in written):
            return True
    return False


def exact_next(lines: list[str], p, rest) -> bool:
    """The strict rule of `dlm-lsp eval --next-edits`: the document after the proposal is the
    document after the next hunk, byte for byte."""
    if not rest:
        return False
    st, d, add = rest[0]
    a, b = _span(p)
    if b < st or a > st + d:
        return False  # the proposal and the hunk are apart: the documents differ
    return after(lines, p) == lines[:st] + add + lines[st + d :]


def check_prompt(lines: list[str], p, path: str) -> tuple[Prompt, str]:
    s = p.site
    line = lines[s.line]
    region = line[: s.start] + line[s.end :]
    prefix = "".join(lines[max(0, s.line - 60) : s.line])[-6000:]
    suffix = "".join(lines[s.line + 1 : s.line + 61])[:3000]
    prompt = Prompt(prefix=prefix, region=region, cursor=s.start, suffix=suffix, history=(p.event,),
                    language="python", path=path, proposals=(MemoryProposal(s.new_text, p.support),))
    return prompt, line[: s.start] + s.new_text + line[s.end :]


def corpus_repeat(root: Path, split: str, every: int) -> dict[str, tuple[int, float]]:
    """kind -> (patterns, share recurring within their commit), over every `every`-th record."""
    by_commit: dict[str, list[tuple[str, tuple]]] = {}
    for n, rec in enumerate(records(root, split, None)):
        if n % every:
            continue
        lines = git_lines(rec["before"])
        for h in rec["hunks"]:
            s = h["at"] - 1 if h["del"] else h["at"]
            for x in extract(lines[s : s + h["del"]], git_lines(h["add"])):
                if x.pattern.kind != "delete_line":
                    by_commit.setdefault(rec["commit"], []).append((x.pattern.kind, x.pattern.key))
    kinds: dict[str, list[int]] = {}
    for keys in by_commit.values():
        for (kind, _), m in Counter(keys).items():
            k = kinds.setdefault(kind, [0, 0])
            k[0] += 1
            k[1] += m > 1
    return {kind: (seen, round(rep / seen, 3)) for kind, (seen, rep) in kinds.items()}


def _norm(lines) -> tuple[str, ...]:
    return tuple(x.strip() for x in lines)


def hunk_shape(d: int, add: list[str]) -> str:
    if d == 0:
        return "insert 1 line" if len(add) == 1 else "insert lines"
    if not add:
        return "delete"
    if d == len(add):
        return "1 line -> 1" if d == 1 else "n lines -> n"
    return "n lines -> m"


def miss_reason(old: list[str], add: list[str], seen_hunks: set, seen_keys: set, seen_added: set) -> str:
    """Why a next hunk got no exact proposal, by what it repeats of the record's earlier hunks."""
    if (_norm(old), _norm(add)) in seen_hunks:
        return "an earlier hunk's lines again (whitespace aside)"
    keys = [x.pattern.key for x in extract(old, add)]
    if keys and all(k in seen_keys for k in keys):
        return "an earlier hunk's token pattern again"
    added = [x for x in set(_norm(add)) - set(_norm(old)) if x]
    if added and any(x in seen_added for x in added):
        return "some added lines were added before"
    if keys:
        return "a token pattern not seen before"
    return "no token pattern (new code, a reformat, several lines)"


def misses(root: Path, split: str, limit: int | None, gate: float) -> None:
    """The replay of `main`, counting the next hunks without an exact proposal at `gate`, by shape
    and by what they repeat of the same record's earlier hunks (`miss_reason`)."""
    mem = EditMemory()
    clock = 0.0
    total = hits = 0
    counts: Counter = Counter()
    shapes: Counter = Counter()
    for rec in records(root, split, limit):
        seen_hunks: set = set()
        seen_keys: set = set()
        seen_added: set = set()
        for lines, edit, rest in cases(rec):
            clock += 1.2
            edit = Edit(edit.start, edit.old, edit.new, clock)
            mem.observe(rec["path"], edit, lines)
            seen_hunks.add((_norm(edit.old), _norm(edit.new)))
            seen_keys.update(x.pattern.key for x in extract(list(edit.old), list(edit.new)))
            seen_added.update(x for x in set(_norm(edit.new)) - set(_norm(edit.old)) if x)
            if not rest:
                continue
            total += 1
            st, d, add = rest[0]
            shape = hunk_shape(d, add)
            shapes[shape] += 1
            props = mem.propose(rec["path"], lines, edit.start, now=clock, limit=1)
            if props and props[0].support >= gate and exact_next(lines, props[0], rest):
                hits += 1
                counts[("exact proposal shown", shape)] += 1
                continue
            counts[(miss_reason(lines[st : st + d], add, seen_hunks, seen_keys, seen_added), shape)] += 1
    print(f"split {split}: {total} opportunities; an exact proposal at {gate}: {hits} ({100 * hits / total:.1f}%)")
    by_reason = Counter()
    for (reason, _), n in counts.items():
        by_reason[reason] += n
    order = [shape for shape, _ in shapes.most_common()]
    print("| next hunk | " + " | ".join(order) + " | all |")
    print("| --- |" + " --- |" * (len(order) + 1))
    print("| (opportunities) | " + " | ".join(str(shapes[x]) for x in order) + f" | {total} |")
    for reason, n in by_reason.most_common():
        print(f"| {reason} | " + " | ".join(str(counts[(reason, x)]) for x in order)
              + f" | {n} ({100 * n / total:.1f}%) |")


def sweep(rows: list[tuple], total: int, outcomes: int) -> dict[float, tuple[int, ...]]:
    """Threshold -> (total, rows at or over it, then the sum of each outcome over those), for rows of
    (confidence, then `outcomes` 0/1 outcomes)."""
    return {t: (total, len(over := [r for r in rows if r[0] >= t]),
                *(sum(r[i] for r in over) for i in range(1, outcomes + 1)))
            for t in THRESHOLDS}


def _exact_in_file(lines: list[str], p, hunks) -> bool:
    """The file after the proposal (every site of its group) is the file after the hunks its sites
    lie on (a group of two neighbouring uses can be two one-line hunks), and it lies on one."""
    rows = {s.line for s in p.sites}
    hit = [(st, d, add) for st, d, add in hunks if any(st <= r < st + max(d, 1) for r in rows)]
    if not hit:
        return False
    want = list(lines)
    for st, d, add in sorted(hit, reverse=True):
        want[st : st + d] = add
    return after(lines, p) == want


UNTOUCHED = 4  # files of the repository the commit did not change, asked too per edited file (jump_pairs)


def jump_pairs(root: Path, split: str, limit: int | None, calibration=True, proposals: int = 1,
               untouched: int = UNTOUCHED):
    """The jump replay's pairs: for every commit of `split` that changed several files, each file's
    hunks are replayed into a fresh memory (as the user edits one file, hunk after hunk), and every
    other file of the commit, as it was before the commit, is asked for its sites as the server's
    jump scan asks (lsp.next_edits: cursor in another document, the top of the file). So are the
    `untouched` files of the same repository that the commit did not change, nearest the edited
    file's folder first as the scan orders them (lsp.next_edits.nearest_files), each as its latest
    record up to the commit's date left it: a jump there is never right, and the scan meets such
    files too (without them, the replay would ask only files that were about to change).
    Yields (commit, the other file's lines, its hunks, its best `proposals` proposals) per pair;
    the memory's `calibration` as EditMemory takes it (None: the memory's own support, to fit on)."""
    from dlm.lsp.next_edits import folders_between

    by_commit: dict[str, list[dict]] = {}
    for rec in records(root, split, limit):
        by_commit.setdefault(rec["commit"], []).append(rec)
    # per repository, (date, path, before) of every record, oldest first: the untouched files' text
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for recs in by_commit.values():
        for r in recs:
            seen.setdefault(r["repo"], []).append((r.get("date", ""), r["path"], r["before"]))
    for files in seen.values():
        files.sort(key=lambda f: f[0])
    for commit, recs in by_commit.items():
        if len({r["path"] for r in recs}) < 2:
            continue
        changed = {r["path"] for r in recs}
        latest: dict[str, str] = {}
        for date, path, before in seen[recs[0]["repo"]]:
            if date <= recs[0].get("date", "") and path not in changed:
                latest[path] = before
        for a in recs:
            mem = EditMemory(calibration=calibration)
            clock = 0.0
            for lines, edit, _ in cases(a):
                clock += 1.2
                mem.observe(a["path"], Edit(edit.start, edit.old, edit.new, clock), lines)
            others = [(b["path"], b["before"], hunk_spans(b)) for b in recs if b["path"] != a["path"]]
            near = sorted(latest, key=lambda f: (folders_between(a["path"], f), f))[:untouched]
            for path, before, hunks in others + [(f, latest[f], []) for f in near]:
                lines = git_lines(before)
                yield commit, lines, hunks, mem.propose(path, lines, 0, now=clock + 1.2, limit=proposals,
                                                        cursor_here=False)


def jump_made(found: list, lines: list[str], hunks) -> tuple | None:
    """The server's jump for a pair's proposals, best first: (confidence, exact, location), or None
    when the best was made fewer than JUMP_MIN_APPLIED times (the server makes no jump then). A
    jump is exact when applying it gives the file after the hunks its sites lie on, byte for byte
    (`_exact_in_file`), at the right location when it lies on one."""
    from dlm.lsp.next_edits import JUMP_MIN_APPLIED

    if not found or found[0].applied < JUMP_MIN_APPLIED:
        return None
    return found[0].support, _exact_in_file(lines, found[0], hunks), judge(lines, found[0], hunks)[0]


def print_jumps(out: dict, pairs: int) -> None:
    print("threshold | jumps (of pairs) | exact (the hunks it lies on) % | location %")
    for t, (_, shown, exact, location) in out.items():
        n = max(shown, 1)
        print(f"  {t:.3f} | {shown} ({100 * shown / max(pairs, 1):.1f}%) | {100 * exact / n:.1f} | {100 * location / n:.1f}")


def jumps(root: Path, split: str, limit: int | None) -> dict[float, tuple[int, int, int, int]]:
    """How often a jump to another file would be right, with the shipped calibration (`jump_pairs`,
    `jump_made`). Returns threshold -> (pairs, jumps, exact, location), and prints it."""
    made: list[tuple[float, bool, bool]] = []
    pairs = 0
    for _, lines, hunks, found in jump_pairs(root, split, limit):
        pairs += 1
        if (jump := jump_made(found, lines, hunks)) is not None:
            made.append(jump)
    out = sweep(made, pairs, 2)
    print(f"split {split}: {pairs} (file edited, other file: of its commit, or one of the {UNTOUCHED} nearest "
          "it did not change) pairs")
    print_jumps(out, pairs)
    return out


FIT_PROPOSALS = 10_000  # proposals per opportunity the calibration is fitted on: all (memory.RANKED_SITES a pattern)


def train_proposals(root: Path, limit: int | None):
    """The train split replayed into one memory without a calibration (as `main` replays): per
    opportunity (record, lines, the cursor's line: the edit's, the hunks to come, every proposal)."""
    mem = EditMemory(calibration=None)
    clock = 0.0
    for rec in records(root, "train", limit):
        for lines, edit, rest in cases(rec):
            clock += 1.2
            edit = Edit(edit.start, edit.old, edit.new, clock)
            mem.observe(rec["path"], edit, lines)
            if rest:
                yield rec, lines, edit.start, rest, mem.propose(rec["path"], lines, edit.start, now=clock,
                                                                limit=FIT_PROPOSALS)


def fit_calibration(root: Path, limit: int | None, out: Path) -> None:
    """Fit the calibration model (edit_memory/calibration.py) on the train split: the `here` trees
    on every proposal of the in-file replay (`train_proposals`, as `main` replays), labelled by
    whether it is the next hunk byte for byte (exact_next); the `elsewhere` trees on every proposal
    of the jump replay (`jump_pairs`), labelled by whether it gives the other file after the hunks
    it lies on (`_exact_in_file`)."""
    from dlm.coder_model.edit_memory.edit_calibration import Calibration

    labelled: dict[str, list] = {"here": [], "elsewhere": []}
    opportunities = pairs = 0
    for _, lines, _, rest, props in train_proposals(root, limit):
        opportunities += 1
        labelled["here"] += [(p, exact_next(lines, p, rest)) for p in props]
    for _, lines, hunks, props in jump_pairs(root, "train", limit, calibration=None, proposals=FIT_PROPOSALS):
        pairs += 1
        labelled["elsewhere"] += [(p, _exact_in_file(lines, p, hunks)) for p in props]
    counts = {where: {"proposals": len(rows), "exact": sum(e for _, e in rows)} for where, rows in labelled.items()}
    cal = Calibration.fit(labelled, {
        "command": "python -m dlm.drivers.evaluation.edit_memory_tuning --split train --fit-calibration "
                   "coder_model/edit_memory/calibration.json",
        "split": "train", "opportunities": opportunities, "jump pairs": pairs, **counts,
        "date": time.strftime("%Y-%m-%d", time.gmtime())})
    out.write_text(json.dumps(cal.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
    for where, c in counts.items():
        print(f"calibration ({where}): {c['proposals']} proposals ({100 * c['exact'] / max(c['proposals'], 1):.1f}% "
              f"exact), {len(cal.trees[where].trees)} trees")
    print(f"{opportunities} opportunities, {pairs} jump pairs -> {out}")


def _fold(commit: str, folds: int) -> int:
    """A commit's fold: all records of a commit together (a commit's files share its renames)."""
    import hashlib

    return int(hashlib.sha256(("fold:" + commit).encode()).hexdigest(), 16) % folds


def cross_validate(root: Path, limit: int | None, folds: int = 5) -> dict[float, tuple[int, int, int, int, int]]:
    """How the calibration does on commits it was not fitted on: the train split replayed into one
    memory (as `fit_calibration`) and its jump replay, its commits cut into `folds` folds; for each
    fold a model fitted on the others chooses each opportunity's proposal (the most confident, then
    the nearest the cursor), and each jump pair's (the most confident, then the nearest the top, as
    the server's scan). Returns threshold -> (opportunities, shown, exact next hunk, right location,
    deletes kept lines), and prints it and the jumps' table. Valid and test are never read."""
    from dlm.coder_model.edit_memory.edit_calibration import Calibration
    from dlm.lsp.next_edits import JUMP_MIN_APPLIED

    replay: list[tuple[int, list[tuple]]] = []  # (fold, [(proposal, exact, location, deletes kept, distance)])
    for rec, lines, cursor, rest, props in train_proposals(root, limit):
        replay.append((_fold(rec["commit"], folds), [
            (p, exact_next(lines, p, rest), judge(lines, p, rest)[0], deletes_kept(lines, p, rest),
             abs(p.site.line - cursor)) for p in props]))
    jump_replay: list[tuple[int, list[tuple]]] = []  # (fold, [(proposal, exact, location, None, line)])
    for commit, lines, hunks, props in jump_pairs(root, "train", limit, calibration=None, proposals=FIT_PROPOSALS):
        jump_replay.append((_fold(commit, folds), [
            (p, _exact_in_file(lines, p, hunks), judge(lines, p, hunks)[0], None, p.site.line) for p in props]))
    chosen: list[tuple[float, bool, bool, bool]] = []
    jumped: list[tuple[float, bool, bool]] = []
    for k in range(folds):
        cal = Calibration.fit({"here": [(r[0], r[1]) for fold, rs in replay if fold != k for r in rs],
                               "elsewhere": [(r[0], r[1]) for fold, rs in jump_replay if fold != k for r in rs]})
        for fold, rs in replay:
            if fold == k and rs:
                conf, best = max(((min(0.95, cal(r[0])), r) for r in rs), key=lambda x: (x[0], -x[1][4]))
                chosen.append((conf, best[1], best[2], best[3]))
        for fold, rs in jump_replay:
            if fold == k and rs:
                conf, best = max(((min(0.95, cal(r[0])), r) for r in rs), key=lambda x: (x[0], -x[1][4]))
                if best[0].applied >= JUMP_MIN_APPLIED:  # as jump_made
                    jumped.append((conf, best[1], best[2]))
    out = sweep(chosen, len(replay), 3)
    print(f"train split, {folds} folds by commit: {len(replay)} opportunities")
    print("threshold | shown % | exact (next hunk) % | location % | deletes kept lines %")
    for t, (total, shown, *counts) in out.items():
        print(f"  {t:.3f} | {100 * shown / max(total, 1):.1f} | "
              + " | ".join(f"{100 * c / max(shown, 1):.1f}" for c in counts))
    print(f"\njumps, the same folds: {len(jump_replay)} (file edited, other file: of its commit, or one of the "
          f"{UNTOUCHED} nearest it did not change) pairs")
    print_jumps(sweep(jumped, len(jump_replay), 2), len(jump_replay))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("DLM_EDIT_HISTORIES", ""),
                    help="the edit-histories folder (or DLM_EDIT_HISTORIES)")
    ap.add_argument("--split", default="valid", choices=("train", "valid", "test"))
    ap.add_argument("--limit", type=int, default=None, help="records at most")
    ap.add_argument("--model-check", action="store_true", help="also the denoiser's check (embedded model)")
    ap.add_argument("--write", action="store_true", help="also the denoiser writing the site's line")
    ap.add_argument("--fresh-memory", action="store_true",
                    help="a new memory per record (default: one memory for the whole replay, as one server)")
    ap.add_argument("--corpus-repeat", type=int, metavar="K", default=0,
                    help="instead: per kind, how often a pattern recurs within its commit, over every K-th record "
                         "of --split (edit_memory.memory.CORPUS_REPEAT: --split train --corpus-repeat 7)")
    ap.add_argument("--fit-calibration", metavar="OUT", default="",
                    help="instead: fit the edit memory's calibration model on --split train and write it to OUT "
                         "(coder_model/edit_memory/calibration.json)")
    ap.add_argument("--misses", type=float, metavar="GATE", default=None,
                    help="instead: count the next hunks without an exact proposal at confidence GATE, by shape "
                         "and by what they repeat of the record's earlier hunks (use --split train)")
    ap.add_argument("--cross-validate", type=int, metavar="K", default=0,
                    help="instead: fit the calibration on K-1 of K folds of the train split's commits and judge it "
                         "on the other fold, each in turn (the held-out estimate that chooses the default gate)")
    ap.add_argument("--jumps", action="store_true",
                    help="instead: how often a jump to another file would be right (commits that changed several "
                         "files; each file replayed, the commit's other files and the nearest files it left alone "
                         "asked as the jump scan asks)")
    ap.add_argument("--no-calibration", action="store_true",
                    help="the memory's own support as the confidence, not the calibration model (an ablation)")
    args = ap.parse_args(argv)
    if not args.data:
        ap.error("give --data DIR or set DLM_EDIT_HISTORIES to the edit-histories folder")
    if args.fit_calibration:
        if args.split != "train":
            ap.error(f"--fit-calibration fits on the train split only (not {args.split}: valid is for choosing, "
                     "test is held out); pass --split train")
        fit_calibration(Path(args.data), args.limit, Path(args.fit_calibration))
        return
    if args.cross_validate:
        if args.split != "train" or args.cross_validate < 2:
            ap.error("--cross-validate K cuts the train split (pass --split train) into K >= 2 folds")
        cross_validate(Path(args.data), args.limit, args.cross_validate)
        return
    if args.jumps:
        jumps(Path(args.data), args.split, args.limit)
        return
    if args.misses is not None:
        misses(Path(args.data), args.split, args.limit, args.misses)
        return
    if args.corpus_repeat:
        print(corpus_repeat(Path(args.data), args.split, args.corpus_repeat))
        return
    engine = None
    if args.model_check or args.write:
        from dlm.coder_model.engine import load_engine

        engine = load_engine(None, device="cpu")
    rows: dict[str, list[tuple[float, bool, bool, bool]]] = {"memory": [], "checked": [], "written": []}
    opportunities = 0
    kinds: dict[str, list[int]] = {}
    lat: list[float] = []
    t_start = time.perf_counter()
    calibration = None if args.no_calibration else True
    mem = EditMemory(calibration=calibration)
    clock = 0.0
    for rec in records(Path(args.data), args.split, args.limit):
        if args.fresh_memory:
            mem = EditMemory(calibration=calibration)
        for lines, edit, rest in cases(rec):
            clock += 1.2  # the LSP replay's edit gap
            edit = Edit(edit.start, edit.old, edit.new, clock)
            mem.observe(rec["path"], edit, lines)
            if not rest:
                continue
            opportunities += 1
            t0 = time.perf_counter()
            props = mem.propose(rec["path"], lines, edit.start, now=clock, limit=1)
            lat.append((time.perf_counter() - t0) * 1000)
            if not props:
                continue
            p = props[0]
            loc, exact = judge(lines, p, rest)
            strict = exact_next(lines, p, rest)
            k = kinds.setdefault(p.pattern.kind, [0, 0, 0])
            k[0] += 1
            k[1] += loc
            k[2] += exact
            rows["memory"].append((p.support, loc, exact, strict, deletes_kept(lines, p, rest)))
            if engine is not None and args.model_check:
                prompt, expected = check_prompt(lines, p, rec["path"])
                pred = engine.predict(prompt, SamplerParams(), CancelToken())
                conf = pred.confidence if pred.text == prompt.region[: prompt.cursor] + p.site.new_text + \
                    prompt.region[prompt.cursor :] else -1.0
                rows["checked"].append((conf if conf is not None else p.support, loc, exact, strict,
                                        deletes_kept(lines, p, rest)))
            if engine is not None and args.write:
                prompt, expected = check_prompt(lines, p, rec["path"])
                free = Prompt(prefix=prompt.prefix, region=lines[p.site.line], cursor=p.site.start,
                              suffix=prompt.suffix, history=prompt.history, language="python", path=rec["path"])
                pred = engine.predict(free, SamplerParams(), CancelToken())
                wrote_it = pred.text == expected
                rows["written"].append((pred.confidence or 0.0 if wrote_it else -1.0, loc, exact and wrote_it,
                                        strict and wrote_it, False))
    secs = time.perf_counter() - t_start
    print(f"split {args.split}: {opportunities} opportunities (steps with a hunk to come), {secs:.0f} s")
    print("proposals by kind (made, right location, exact):", kinds)
    lat.sort()
    if lat:
        print(f"memory.propose latency p50 {lat[len(lat) // 2]:.2f} ms, p99 {lat[int(len(lat) * 0.99)]:.2f} ms")
    for name, rs in rows.items():
        if not rs:
            continue
        print(f"\n{name}: threshold | shown % | exact (line) % | exact (next hunk) % | location % | deletes kept lines %")
        for t in THRESHOLDS:
            shown = [r for r in rs if r[0] >= t]
            if not shown:
                print(f"  {t:.3f} | 0.0 | - | - | - | -")
                continue
            pct = [100 * sum(r[i] for r in shown) / len(shown) for i in (2, 3, 1, 4)]
            print(f"  {t:.3f} | {100 * len(shown) / opportunities:.1f} | {pct[0]:.1f} | {pct[1]:.1f} | {pct[2]:.1f}"
                  f" | {pct[3]:.1f}")


if __name__ == "__main__":
    main()
