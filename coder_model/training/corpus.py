"""Training corpus: real source files from the packages installed on this machine.

    python -m dlm.coder_model.training.corpus --out data/corpus

walks the Python installations' site-packages and standard library (and any
extra --root), keeps source files by extension, drops the packages the
project's held-out evaluation draws from (EXCLUDED_PACKAGES) and anything
under the shared evaluation set, deduplicates by content, and splits by file
(a stable hash of the content) into train / valid / test JSONL files of
{"path", "language", "text"}. The same machine gives the same corpus.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# The held-out evaluation draws from these: never train on them.
EXCLUDED_PACKAGES = (
    "django", "sympy", "xarray", "astropy", "scikit-learn", "sklearn",
    "matplotlib", "mpl_toolkits", "sphinx", "pylint",
)
# The projects of ../shared/data/edit-histories: their installed (later) sources
# could leak the "after" side of the edit-history test commits.
EDIT_HISTORY_PACKAGES = (
    "rich", "aiohttp", "httpx", "starlette", "more_itertools", "click", "flask",
    "jinja2", "werkzeug", "requests", "pluggy", "attr", "attrs",
)
# Path fragments that are never training data.
EXCLUDED_FRAGMENTS = ("/shared/eval/", "/eval/safim", "/dlm/", "/dlm_lsp", "/work/main/")

LANGUAGES = {
    ".py": "python", ".js": "javascript", ".mjs": "javascript", ".ts": "typescript",
    ".tsx": "tsx", ".rs": "rust", ".go": "go", ".c": "c", ".h": "c", ".cc": "cpp",
    ".cpp": "cpp", ".hpp": "cpp", ".java": "java",
}
MIN_BYTES, MAX_BYTES = 200, 200_000
SPLIT_PERMILLE = {"test": 20, "valid": 10}  # the rest is train


def default_roots() -> list[Path]:
    roots: set[Path] = set()
    for key in ("stdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(Path(p))
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        for v in pyenv.iterdir():
            for lib in v.glob("lib/python3*/"):
                roots.add(lib)
    for p in ("/usr/lib/python3", "/usr/lib/node_modules", "/usr/share/nodejs"):
        if Path(p).is_dir():
            roots.add(Path(p))
    return sorted(roots)


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


def iter_source_files(roots: list[Path]) -> Iterator[tuple[Path, str]]:
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if is_excluded(dirpath + "/"):
                dirnames[:] = []
                continue
            # skip test data trees of big vendored packages and caches
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".git", "site-packages")
                           or dirpath == str(root)]
            for name in filenames:
                lang = LANGUAGES.get(Path(name).suffix)
                if lang:
                    yield Path(dirpath) / name, lang


def looks_generated(text: str) -> bool:
    lines = text.splitlines()
    if not lines:
        return True
    longest = max(len(line) for line in lines)
    return longest > 1000 or sum(len(line) for line in lines) / len(lines) > 120


def split_of(digest: str) -> str:
    bucket = int(digest[:8], 16) % 1000
    if bucket < SPLIT_PERMILLE["test"]:
        return "test"
    if bucket < SPLIT_PERMILLE["test"] + SPLIT_PERMILLE["valid"]:
        return "valid"
    return "train"


def build_corpus(roots: list[Path], out: Path, languages: set[str] | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    counts: dict[str, dict[str, int]] = {}
    files = {s: gzip.open(out / f"{s}.jsonl.gz", "wt", encoding="utf-8") for s in ("train", "valid", "test")}
    try:
        for path, lang in iter_source_files(roots):
            if languages and lang not in languages:
                continue
            try:
                size = path.stat().st_size
                if not MIN_BYTES <= size <= MAX_BYTES:
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if looks_generated(text):
                continue
            # dedupe on whitespace-normalised content: the same file ships in many pythons
            digest = hashlib.sha1(" ".join(text.split()).encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            split = split_of(digest)
            files[split].write(json.dumps({"path": str(path), "language": lang, "text": text}) + "\n")
            c = counts.setdefault(split, {})
            c[lang] = c.get(lang, 0) + 1
    finally:
        for f in files.values():
            f.close()
    manifest = {"roots": [str(r) for r in roots], "excluded": EXCLUDED_PACKAGES + EDIT_HISTORY_PACKAGES, "counts": counts}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_split(corpus: Path, split: str) -> Iterator[dict]:
    with gzip.open(corpus / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data/corpus"))
    ap.add_argument("--root", type=Path, action="append", help="extra source roots (default: installed packages)")
    ap.add_argument("--languages", default="", help="comma list, e.g. python,javascript (default: all)")
    args = ap.parse_args(argv)
    roots = default_roots() + (args.root or [])
    manifest = build_corpus(roots, args.out, set(filter(None, args.languages.split(","))) or None)
    json.dump(manifest["counts"], sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
