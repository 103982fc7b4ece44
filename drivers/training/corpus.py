"""Training corpus: a pinned list of permissively licensed PyPI distributions, plus
algorithmic-python, deduplicated and split by file.

    python -m dlm.drivers.training.corpus --out data/corpus [--packages FILE] [--cache DIR]
        [--algorithmic DIR] [--root DIR ...] [--count tokenizer|chars]
    python -m dlm.drivers.training.corpus pack --corpus data/corpus --out .carry/corpus
    python -m dlm.drivers.training.corpus unpack --parts .carry/corpus --out data/corpus

Build: every `name==version` of the package list (corpus_packages.txt beside
this file) is downloaded by pip into the cache (a wheel, else the sdist; the
download is the one step that needs the network) and read from the archive;
a distribution whose own files do not show a permissive license, or that the
evaluation or the edit histories draw from (EXCLUDED_PACKAGES,
EDIT_HISTORY_PACKAGES), is refused and listed as refused in the manifest.
algorithmic-python (files.jsonl.gz, MIT; found by --algorithmic,
$DLM_ALGORITHMIC_PYTHON or next to the repository) is added, and any --root
folder of local sources. Source files are kept by extension
(dlm.coder_model.languages), exact duplicates (whitespace-normalised) and
near-duplicates (MinHash, dlm.drivers.training.dedup) are dropped keeping
the first in list order, and each file goes to train / valid / test by a
hash of its content. Nothing depends on what is installed on the machine:
the same list gives byte-identical split files anywhere.

Output: {train,valid,test}.jsonl.gz of {"path", "language", "text", "source",
"license"} and manifest.json (files and tokens per source, license, split and
language; refused distributions; archive hashes).

Pack / unpack move a built corpus to the GPU machine: xz-compressed JSONL
parts of at most 35 MiB each plus the manifest, read back into the same
split files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dlm.coder_model.budget import CHARS_PER_TOKEN
from dlm.coder_model.languages import language_for_path
from dlm.coder_model.tokenizer import SPECIAL_TOKENS
from dlm.drivers.training import dedup
from dlm.drivers.training import pypi_corpus as pypi

# The held-out evaluation draws from these: never train on them.
EXCLUDED_PACKAGES = (
    "django", "sympy", "xarray", "astropy", "scikit-learn", "sklearn",
    "matplotlib", "mpl_toolkits", "sphinx", "pylint",
)
# The projects of the edit-history data: their (later) sources could leak the
# "after" side of the edit-history test commits.
EDIT_HISTORY_PACKAGES = (
    "rich", "aiohttp", "httpx", "starlette", "more_itertools", "click", "flask",
    "jinja2", "werkzeug", "requests", "pluggy", "attr", "attrs",
)
# Path fragments that are never training data.
EXCLUDED_FRAGMENTS = ("/shared/eval/", "/eval/safim", "/dlm/", "/dlm_lsp", "/work/main/")
# A file inside a permissive distribution can still carry a copyleft header (vendored code).
COPYLEFT_MARKERS = ("GNU General Public License", "GNU Lesser General Public", "GNU Affero", "Mozilla Public")

MIN_BYTES, MAX_BYTES = 200, 200_000
SPLIT_PERMILLE = {"test": 20, "valid": 10}  # the rest is train
SPLITS = ("train", "valid", "test")
PART_BYTES = 35 * 1024 * 1024
ALGORITHMIC_ENV = "DLM_ALGORITHMIC_PYTHON"


def excluded_names() -> set[str]:
    names = set()
    for n in EXCLUDED_PACKAGES + EDIT_HISTORY_PACKAGES:
        names |= {n, pypi.normalize(n), n.replace("-", "_")}
    return names


def is_excluded(path: str) -> bool:
    """True for files of the excluded packages or the evaluation set."""
    norm = path.replace(os.sep, "/")
    if any(f in norm for f in EXCLUDED_FRAGMENTS):
        return True
    parts = norm.lower().split("/")
    for part in parts:
        # "<name>-<version>.dist-info": the version holds no dash, the name may
        name = part
        for meta in (".dist-info", ".egg-info"):
            if part.endswith(meta):
                name = part[: -len(meta)].rsplit("-", 1)[0]
        for listed in (EXCLUDED_PACKAGES, EDIT_HISTORY_PACKAGES):
            if name in listed or name.replace("_", "-") in listed or name.replace("-", "_") in listed:
                return True
    return False


def looks_generated(text: str) -> bool:
    lines = text.splitlines()
    if not lines:
        return True
    longest = max(len(line) for line in lines)
    return longest > 1000 or sum(len(line) for line in lines) / len(lines) > 120


def content_digest(text: str) -> str:
    """sha1 of the whitespace-normalised text: the exact-duplicate key and the split hash."""
    return hashlib.sha1(" ".join(text.split()).encode("utf-8", "surrogatepass")).hexdigest()


def split_of(digest: str) -> str:
    bucket = int(digest[:8], 16) % 1000
    if bucket < SPLIT_PERMILLE["test"]:
        return "test"
    if bucket < SPLIT_PERMILLE["test"] + SPLIT_PERMILLE["valid"]:
        return "valid"
    return "train"


def default_algorithmic() -> Path | None:
    """algorithmic-python: $DLM_ALGORITHMIC_PYTHON, else data/algorithmic-python in the checkout."""
    env = os.environ.get(ALGORITHMIC_ENV)
    if env:
        return Path(env)
    cand = Path(__file__).resolve().parents[2] / "data" / "algorithmic-python"
    return cand if (cand / "files.jsonl.gz").is_file() else None


def default_tokenizer() -> Path:
    from dlm.coder_model.checkpoint import embedded_checkpoint_dir

    return embedded_checkpoint_dir() / "tokenizer.json"


@dataclass
class Record:
    path: str
    language: str
    text: str
    source: str  # distribution name==version, "algorithmic-python/<repo>" or "root:<dir>"
    license: str

    def row(self) -> dict:
        return {"path": self.path, "language": self.language, "text": self.text,
                "source": self.source, "license": self.license}


def accept(path: str, size: int, languages: set[str] | None) -> str:
    """The file's language if its path and size make it a candidate, else ''."""
    lang = language_for_path(path)
    if not lang or (languages and lang not in languages):
        return ""
    if not MIN_BYTES <= size <= MAX_BYTES or is_excluded("/" + path):
        return ""
    return lang


def decode_source(data: bytes) -> str | None:
    """UTF-8 text worth training on, or None (binary, generated, copyleft header, or holding
    the text of a special token such as "<eom>": the tokenizer would encode it as that token,
    and an <eom> inside a target teaches the model to stop mid-region)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if looks_generated(text) or any(m in text[:4000] for m in COPYLEFT_MARKERS):
        return None
    if any(name in text for name in SPECIAL_TOKENS):
        return None
    return text


# -- sources ----------------------------------------------------------------------------------------
def package_records(
    pins: list[pypi.Pin], cache: Path, languages: set[str] | None, log, pip: list[str] | None = None
) -> tuple[list[Record], list[pypi.Distribution]]:
    excluded = excluded_names()
    records: list[Record] = []
    dists: list[pypi.Distribution] = []
    for pin in pins:
        if pin.key in excluded or pin.key.replace("-", "_") in excluded:
            # refused before any download: the name is enough
            dist = pypi.Distribution(pin, Path(), "", "", "not inspected")
            dist.refused = "excluded: the held-out evaluation or the edit histories draw from it"
            dists.append(dist)
            continue
        archive = pypi.download(pin, cache, pip)
        dist = pypi.inspect(pin, archive, excluded)
        dists.append(dist)
        if dist.refused:
            log(f"[corpus] refused {pin.name}=={pin.version}: {dist.refused}")
            continue
        source = f"{pin.key}=={pin.version}"
        lang_of: dict[str, str] = {}

        def keep(name: str, size: int, lang_of: dict[str, str] = lang_of) -> bool:
            lang_of[name] = accept(name, size, languages)
            return bool(lang_of[name])

        for path, data in pypi.iter_archive_sources(archive, source, keep):
            text = decode_source(data)
            if text is not None:
                records.append(Record(path, lang_of[path[len(source) + 1 :]], text, source, dist.license))
    return records, dists


def algorithmic_records(folder: Path, languages: set[str] | None) -> list[Record]:
    files = folder / "files.jsonl.gz"
    if not files.is_file():
        raise pypi.CorpusSourceError(
            f"{files} does not exist; pass --algorithmic with the folder holding files.jsonl.gz "
            f"(or set ${ALGORITHMIC_ENV}), or --algorithmic none to build without it")
    out = []
    with gzip.open(files, "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            path = f"algorithmic-python/{rec['repo']}/{rec['path']}"
            lang = accept(path, len(rec["text"].encode("utf-8", "surrogatepass")), languages)
            text = decode_source(rec["text"].encode("utf-8", "surrogatepass")) if lang else None
            if text is not None:
                out.append(Record(path, lang, text, f"algorithmic-python/{rec['repo']}", "mit"))
    return out


def root_records(roots: Iterable[Path], languages: set[str] | None) -> list[Record]:
    """Source files under local folders (sorted walk; the license is whatever the folder's is)."""
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if is_excluded(dirpath + "/"):
                dirnames[:] = []
                continue
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    lang = accept(str(path), path.stat().st_size, languages)
                    text = decode_source(path.read_bytes()) if lang else None
                except OSError:
                    continue
                if text is not None:
                    out.append(Record(str(path), lang, text, f"root:{root}", "local"))
    return out


# -- writing ------------------------------------------------------------------------------------------
class SplitWriter:
    """A gzip JSONL file with a fixed header (no name, mtime 0): same rows, same bytes."""

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)

    def write(self, row: dict) -> None:
        self._gz.write((json.dumps(row) + "\n").encode("utf-8", "surrogatepass"))

    def close(self) -> None:
        self._gz.close()
        self._raw.close()


class TokenCounter:
    """Tokens of texts with the embedded tokenizer (batched), or characters / CHARS_PER_TOKEN (coder_model.budget)."""

    def __init__(self, how: str, tokenizer: Path | None = None) -> None:
        self.how = how
        self._tok = None
        if how == "tokenizer":
            from dlm.coder_model.tokenizer import Tokenizer

            path = tokenizer or default_tokenizer()
            self._tok = Tokenizer.from_file(path)
            self.description = f"tokens of the embedded tokenizer ({path.name}, {self._tok.vocab_size} ids)"
        elif how == "chars":
            self.description = f"characters / {CHARS_PER_TOKEN} (an estimate)"
        else:
            raise ValueError(f"--count must be 'tokenizer' or 'chars', not {how!r}")

    def count(self, texts: list[str]) -> list[int]:
        if self._tok is None:
            return [round(len(t) / CHARS_PER_TOKEN) for t in texts]
        out: list[int] = []
        for i in range(0, len(texts), 256):
            out += [len(ids) for ids in self._tok.encode_batch(texts[i : i + 256])]
        return out


def _add(table: dict, key: str, files: int, tokens: int, chars: int) -> None:
    row = table.setdefault(key, {"files": 0, "tokens": 0, "chars": 0})
    row["files"] += files
    row["tokens"] += tokens
    row["chars"] += chars


def build_corpus(
    roots: list[Path],
    out: Path,
    languages: set[str] | None = None,
    *,
    packages: Path | None = None,
    cache: Path = Path("data/pip-cache"),
    algorithmic: Path | None = None,
    count: str = "chars",
    near_threshold: float = 0.8,
    pip: list[str] | None = None,
    log=lambda msg: print(msg, file=sys.stderr),
) -> dict:
    """Build the corpus in `out` from the pinned `packages` list (if given), `algorithmic`
    (if given) and local `roots`; returns the manifest (also written to out/manifest.json)."""
    records: list[Record] = []
    dists: list[pypi.Distribution] = []
    pins: list[pypi.Pin] = []
    if packages is not None:
        pins = pypi.read_pins(packages)
        recs, dists = package_records(pins, cache, languages, log, pip)
        records += recs
        log(f"[corpus] {len(pins)} pins: {sum(not d.refused for d in dists)} used, "
            f"{sum(bool(d.refused) for d in dists)} refused, {len(recs)} candidate files")
    if algorithmic is not None:
        recs = algorithmic_records(algorithmic, languages)
        records += recs
        log(f"[corpus] algorithmic-python: {len(recs)} candidate files")
    records += root_records(roots, languages)

    # exact duplicates, then near-duplicates; the first in list order stays
    seen: set[str] = set()
    unique: list[tuple[Record, str]] = []
    for rec in records:
        digest = content_digest(rec.text)
        if digest not in seen:
            seen.add(digest)
            unique.append((rec, digest))
    reps = dedup.near_duplicate_clusters([r.text for r, _ in unique], near_threshold)
    kept = [(r, d) for i, (r, d) in enumerate(unique) if reps[i] == i]
    log(f"[corpus] {len(records)} files, {len(records) - len(unique)} exact and "
        f"{len(unique) - len(kept)} near duplicates dropped, {len(kept)} kept")

    counter = TokenCounter(count)
    log(f"[corpus] counting {counter.description} of {sum(len(r.text) for r, _ in kept) / 1e6:.1f}M characters")
    tokens = counter.count([r.text for r, _ in kept])
    out.mkdir(parents=True, exist_ok=True)
    writers = {s: SplitWriter(out / f"{s}.jsonl.gz") for s in SPLITS}
    by_source: dict = {}
    by_license: dict = {}
    by_split: dict = {}
    counts: dict[str, dict[str, int]] = {}
    try:
        for (rec, digest), n_tok in zip(kept, tokens):
            split = split_of(digest)
            writers[split].write(rec.row())
            _add(by_source, rec.source, 1, n_tok, len(rec.text))
            _add(by_license, rec.license, 1, n_tok, len(rec.text))
            _add(by_split, split, 1, n_tok, len(rec.text))
            c = counts.setdefault(split, {})
            c[rec.language] = c.get(rec.language, 0) + 1
    finally:
        for w in writers.values():
            w.close()

    manifest = {
        "format": 2,
        "package_list": None if packages is None else {
            "path": packages.name, "sha256": hashlib.sha256(packages.read_bytes()).hexdigest(), "pins": len(pins)},
        "algorithmic_python": None if algorithmic is None else str(algorithmic.name),
        "roots": [str(r) for r in roots],
        "excluded": list(EXCLUDED_PACKAGES + EDIT_HISTORY_PACKAGES),
        "token_count": counter.description,
        "dedup": {"candidates": len(records), "exact_duplicates": len(records) - len(unique),
                  "near_duplicates": len(unique) - len(kept), "near_threshold": near_threshold,
                  "minhash": f"{dedup.NUM_PERM} permutations, {dedup.BANDS} bands, word {dedup.SHINGLE}-grams"},
        "totals": {"files": len(kept), "tokens": sum(tokens), "chars": sum(len(r.text) for r, _ in kept)},
        "splits": by_split,
        "counts": counts,  # split -> language -> files
        "by_license": dict(sorted(by_license.items())),
        "by_source": dict(sorted(by_source.items())),
        "distributions": [
            {"name": d.pin.key, "version": d.pin.version, "archive": d.archive.name, "sha256": d.sha256,
             "license": d.license, "license_evidence": d.license_evidence, "license_files": d.license_files}
            for d in dists if not d.refused],
        "refused": [{"name": d.pin.key, "version": d.pin.version, "reason": d.refused} for d in dists if d.refused],
        "split_sha256": {s: hashlib.sha256((out / f"{s}.jsonl.gz").read_bytes()).hexdigest() for s in SPLITS},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_split(corpus: Path, split: str) -> Iterator[dict]:
    with gzip.open(corpus / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


# -- pack / unpack ------------------------------------------------------------------------------------
def pack(corpus: Path, out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Write the corpus as corpus-NNNNN.jsonl.xz parts of at most `part_bytes` each (rows
    {path, language, split, text, source, license}, splits in order) plus manifest.json."""
    if not (corpus / "manifest.json").is_file():
        raise pypi.CorpusSourceError(f"{corpus} holds no manifest.json; build the corpus there first")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("corpus-*.jsonl.xz"):
        old.unlink()  # parts of an earlier pack would be read back as part of this one
    parts: list[Path] = []
    state = {"comp": None, "file": None, "written": 0, "pending": 0}

    def close_part() -> None:
        if state["comp"] is not None:
            state["file"].write(state["comp"].flush())
            state["file"].close()
            state["comp"] = None

    def open_part() -> None:
        path = out / f"corpus-{len(parts):05d}.jsonl.xz"
        parts.append(path)
        state.update(comp=lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=6), file=open(path, "wb"),  # noqa: SIM115 (closed by close_part)
                     written=0, pending=0)

    # xz buffers input before it emits output: bound the part by what was emitted plus
    # everything fed since (xz never grows data by more than a small overhead)
    overhead = 64 * 1024
    try:
        for split in SPLITS:
            for row in read_split(corpus, split):
                line = (json.dumps({"split": split, **row}) + "\n").encode("utf-8", "surrogatepass")
                if len(line) * 1.01 + overhead > part_bytes:
                    raise pypi.CorpusSourceError(
                        f"{row['path']} alone ({len(line)} bytes) exceeds the part size {part_bytes}; "
                        "pack with a larger part size")
                if state["comp"] is None or (
                    state["written"] + (state["pending"] + len(line)) * 1.01 + overhead > part_bytes):
                    close_part()
                    open_part()
                emitted = state["comp"].compress(line)
                state["pending"] += len(line)
                if emitted:
                    state["file"].write(emitted)
                    state["written"] += len(emitted)
                    state["pending"] = 0  # xz emits in order: what is still buffered is recent input
    finally:
        close_part()
    (out / "manifest.json").write_bytes((corpus / "manifest.json").read_bytes())
    return parts


def unpack(parts_dir: Path, out: Path) -> dict:
    """Read packed parts back into {train,valid,test}.jsonl.gz + manifest.json; returns files per split."""
    parts = sorted(parts_dir.glob("corpus-*.jsonl.xz"))
    if not parts or not (parts_dir / "manifest.json").is_file():
        raise pypi.CorpusSourceError(
            f"{parts_dir} holds no corpus-*.jsonl.xz parts and manifest.json; make them with "
            "`python -m dlm.drivers.training.corpus pack`")
    manifest = json.loads((parts_dir / "manifest.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    writers = {s: SplitWriter(out / f"{s}.jsonl.gz") for s in SPLITS}
    files = dict.fromkeys(SPLITS, 0)
    try:
        for part in parts:
            try:
                with lzma.open(part, "rt", encoding="utf-8") as f:
                    for line in f:
                        row = json.loads(line)
                        split = row.pop("split")
                        writers[split].write(row)
                        files[split] += 1
            except (lzma.LZMAError, EOFError, json.JSONDecodeError, KeyError) as exc:
                raise pypi.CorpusSourceError(f"{part} is damaged ({exc!r}); copy it again from the packed corpus") from exc
    finally:
        for w in writers.values():
            w.close()
    want = {s: manifest.get("splits", {}).get(s, {}).get("files") for s in SPLITS}
    if any(want[s] is not None and want[s] != files[s] for s in SPLITS):
        raise pypi.CorpusSourceError(
            f"the parts in {parts_dir} hold {files} files per split but the manifest says {want}; "
            "a part is missing: copy all corpus-*.jsonl.xz parts")
    (out / "manifest.json").write_bytes((parts_dir / "manifest.json").read_bytes())
    return files


# -- command line -------------------------------------------------------------------------------------
def _algorithmic_arg(value: str | None) -> Path | None:
    if value == "none":
        return None
    if value:
        return Path(value)
    found = default_algorithmic()
    if found is None:
        raise pypi.CorpusSourceError(
            "algorithmic-python (files.jsonl.gz) not found: pass --algorithmic DIR or set "
            f"${ALGORITHMIC_ENV}, or --algorithmic none to build without it")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in ("build", "pack", "unpack") else "build"
    ap = argparse.ArgumentParser(prog=f"python -m dlm.drivers.training.corpus {command}",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    try:
        if command == "pack":
            ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
            ap.add_argument("--out", type=Path, default=Path(".carry/corpus"))
            ap.add_argument("--part-mib", type=float, default=PART_BYTES / 2**20)
            args = ap.parse_args(argv)
            parts = pack(args.corpus, args.out, int(args.part_mib * 2**20))
            print(json.dumps({p.name: p.stat().st_size for p in parts}, indent=1))
            return 0
        if command == "unpack":
            ap.add_argument("--parts", type=Path, default=Path(".carry/corpus"))
            ap.add_argument("--out", type=Path, default=Path("data/corpus"))
            args = ap.parse_args(argv)
            print(json.dumps(unpack(args.parts, args.out)))
            return 0
        ap.add_argument("--out", type=Path, default=Path("data/corpus"))
        ap.add_argument("--packages", type=Path, default=pypi.DEFAULT_PACKAGES,
                        help="pinned name==version list (default: corpus_packages.txt of this package)")
        ap.add_argument("--cache", type=Path, default=Path("data/pip-cache"), help="where pip downloads go")
        ap.add_argument("--algorithmic", default=None,
                        help=f"algorithmic-python folder, or 'none' (default: ${ALGORITHMIC_ENV} or next to the repo)")
        ap.add_argument("--root", type=Path, action="append", default=[], help="extra local source folders")
        ap.add_argument("--languages", default="", help="comma list, e.g. python,javascript (default: all)")
        ap.add_argument("--count", choices=("tokenizer", "chars"), default="tokenizer",
                        help="token counts in the manifest: the embedded tokenizer, or characters/CHARS_PER_TOKEN")
        args = ap.parse_args(argv)
        manifest = build_corpus(
            args.root, args.out, set(filter(None, args.languages.split(","))) or None,
            packages=args.packages, cache=args.cache, algorithmic=_algorithmic_arg(args.algorithmic),
            count=args.count)
    except pypi.CorpusSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump({"totals": manifest["totals"], "splits": manifest["splits"], "refused": len(manifest["refused"])},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
