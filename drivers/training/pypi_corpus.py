"""Pinned PyPI distributions as training sources: download, license check, source files.

The corpus is defined by a list of `name==version` lines (corpus_packages.txt
beside this file), not by what happens to be installed: each distribution is
fetched with pip by that exact pin (a wheel when there is one, else the sdist)
into a cache folder, and its files are read from the archive itself. pip is
given a fixed target (CPython 3.11, manylinux2014 x86_64) so that every
machine picks the same wheel file, whatever it runs on.

A distribution is refused, and listed as refused in the manifest, when its
own metadata and license files do not show a permissive license (see
PERMISSIVE), or when it is one of the excluded packages (the held-out
evaluation and edit-history projects).
"""

from __future__ import annotations

import email.parser
import hashlib
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PACKAGES = Path(__file__).with_name("corpus_packages.txt")

# Where pip looks is the user's pip configuration; which file it picks is fixed here.
PIP_TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
              "--abi", "none", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
              "--platform", "any"]  # fmt: skip

# SPDX ids (lower case) we accept; everything else is refused.
PERMISSIVE = {
    "mit", "mit-0", "bsd-2-clause", "bsd-3-clause", "0bsd", "bsd", "apache-2.0", "isc", "psf-2.0",
    "python-2.0", "unlicense", "zlib", "cc0-1.0",
}  # fmt: skip
# Trove classifier tails -> SPDX id
_CLASSIFIERS = {
    "mit license": "mit", "bsd license": "bsd", "apache software license": "apache-2.0",
    "isc license (iscl)": "isc", "python software foundation license": "psf-2.0",
    "the unlicense (unlicense)": "unlicense", "zlib/libpng license": "zlib",
    "mit no attribution license (mit-0)": "mit-0",
}  # fmt: skip
# Free-text `License:` fields and license files: (pattern, SPDX id), first match wins.
# Copyleft patterns come first so that "BSD or GPL" style texts are not taken as BSD.
_TEXT_RULES = [
    (r"\bA?GPL|GNU (LESSER |LIBRARY |AFFERO )?GENERAL PUBLIC", "gpl"),
    (r"\bMPL\b|MOZILLA PUBLIC", "mpl"),
    (r"\bEPL\b|ECLIPSE PUBLIC", "epl"),
    (r"APACHE LICENSE,? VERSION 2\.0|\bAPACHE[- ]?(SOFTWARE )?(LICENSE)?[- ,]*(V(ERSION)?)? ?2(\.0)?\b|^APACHE$",
     "apache-2.0"),
    (r"\bMIT\b|PERMISSION IS HEREBY GRANTED, FREE OF CHARGE", "mit"),
    (r"\bISC\b|PERMISSION TO USE, COPY, MODIFY, AND(/OR)? DISTRIBUTE THIS SOFTWARE FOR ANY PURPOSE", "isc"),
    (r"\bBSD\b|REDISTRIBUTION AND USE IN SOURCE AND BINARY FORMS", "bsd"),
    (r"\bPSF\b|PYTHON SOFTWARE FOUNDATION", "psf-2.0"),
    (r"UNLICENSE|FREE AND UNENCUMBERED SOFTWARE RELEASED INTO THE PUBLIC DOMAIN", "unlicense"),
]  # fmt: skip
_LICENSE_FILE = re.compile(r"(^|/)(LICEN[CS]E|COPYING|NOTICE)[^/]*$", re.IGNORECASE)


class CorpusSourceError(RuntimeError):
    """A pinned list, a download or an archive that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Pin:
    name: str  # as written in the list
    version: str

    @property
    def key(self) -> str:
        return normalize(self.name)


@dataclass
class Distribution:
    pin: Pin
    archive: Path
    sha256: str
    license: str  # SPDX-ish id, e.g. "mit", or "refused: ..." reasons go to `refused`
    license_evidence: str  # where the license was read
    license_files: list[str] = field(default_factory=list)
    refused: str = ""  # why it is not used ('' = used)


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> list[Pin]:
    """`name==version` lines; '#' starts a comment. Sorted by normalised name."""
    pins: dict[str, Pin] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CorpusSourceError(f"cannot read the package list {path}: {exc}") from exc
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)", line)
        if not m:
            raise CorpusSourceError(f"{path}:{n}: {raw!r} is not a pin; write one `name==version` per line")
        pin = Pin(m.group(1), m.group(2))
        if pin.key in pins:
            raise CorpusSourceError(f"{path}:{n}: {pin.name} is listed twice; keep one pin per distribution")
        pins[pin.key] = pin
    return [pins[k] for k in sorted(pins)]


def _archive_matches(path: Path, pin: Pin) -> bool:
    stem = path.name
    for ext in (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    else:
        return False
    parts = stem.split("-")
    return len(parts) >= 2 and normalize(parts[0]) == pin.key and parts[1] == pin.version


def find_archive(cache: Path, pin: Pin) -> Path | None:
    """The cached wheel (preferred) or sdist of a pin, or None."""
    if not cache.is_dir():
        return None
    found = sorted(p for p in cache.iterdir() if p.is_file() and _archive_matches(p, pin))
    wheels = [p for p in found if p.suffix == ".whl"]
    return (wheels or found or [None])[0]


def download(pin: Pin, cache: Path, pip: list[str] | None = None) -> Path:
    """The pin's archive in `cache`, fetched with pip if not there yet (wheel, else sdist)."""
    have = find_archive(cache, pin)
    if have is not None:
        return have
    cache.mkdir(parents=True, exist_ok=True)
    pip = pip or [sys.executable, "-m", "pip"]
    spec = f"{pin.name}=={pin.version}"
    tries = [
        ["download", "--no-deps", "--only-binary=:all:", *PIP_TARGET, "-d", str(cache), spec],
        # no wheel for any platform: the sdist (pip prepares its metadata in an isolated build env)
        ["download", "--no-deps", "--no-binary=:all:", "-d", str(cache), spec],
    ]
    errors = []
    for args in tries:
        proc = subprocess.run([*pip, "-q", *args], capture_output=True, text=True, check=False)
        have = find_archive(cache, pin)
        if have is not None:
            return have
        errors.append(proc.stderr.strip().splitlines()[-1:] or [f"pip exited {proc.returncode}"])
    raise CorpusSourceError(
        f"pip could not download {spec} ({'; '.join(e[0] for e in errors)}); check the pin exists on "
        "PyPI and that pip can reach its index, or put the wheel/sdist into the cache folder by hand"
    )


# -- reading archives -------------------------------------------------------------------------------
class Archive:
    """Read-only view of a wheel (zip) or sdist (tar/zip): member names and texts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            if zipfile.is_zipfile(path):
                self._zip = zipfile.ZipFile(path)
                self._tar = None
                self.names = sorted(i.filename for i in self._zip.infolist() if not i.is_dir())
            else:
                self._zip = None
                self._tar = tarfile.open(path)  # noqa: SIM115 (closed by close())
                self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
                self.names = sorted(self._members)
        except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
            raise CorpusSourceError(f"{path} is not a readable wheel or sdist ({exc}); delete it from the "
                                    "cache and build again to download it anew") from exc

    def size(self, name: str) -> int:
        return self._zip.getinfo(name).file_size if self._zip else self._members[name].size

    def read(self, name: str) -> bytes:
        if self._zip:
            return self._zip.read(name)
        f = self._tar.extractfile(self._members[name])
        return f.read() if f else b""

    def close(self) -> None:
        (self._zip or self._tar).close()

    def __enter__(self) -> Archive:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _metadata_name(names: list[str]) -> str | None:
    meta = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    meta = meta or [n for n in names if re.fullmatch(r"[^/]+/PKG-INFO", n)]
    return meta[0] if meta else None


def _from_text(text: str) -> str:
    upper = text.upper()
    for pattern, spdx in _TEXT_RULES:
        if re.search(pattern, upper, re.MULTILINE):
            return spdx
    return ""


def _from_expression(expr: str) -> str:
    """SPDX expression -> one accepted id, or the first refused one. OR: any accepted; AND: all."""
    alternatives = re.split(r"\s+OR\s+", expr.strip().strip("()"), flags=re.IGNORECASE)
    refused = ""
    for alt in alternatives:
        ids = [i.strip("() ").lower() for i in re.split(r"\s+AND\s+", alt, flags=re.IGNORECASE)]
        ids = [i.split(" with ")[0] for i in ids if i]
        if ids and all(i in PERMISSIVE for i in ids):
            return ids[0]
        refused = refused or next((i for i in ids if i not in PERMISSIVE), alt.lower())
    return refused


def detect_license(archive: Archive) -> tuple[str, str, list[str]]:
    """(SPDX-ish id or '', evidence, license file names) from the distribution's own files.

    Order: License-Expression (PEP 639), then the license classifiers, then the
    License field, then the texts of the license files.
    """
    files = [n for n in archive.names if _LICENSE_FILE.search(n) and n.count("/") <= 3]
    meta_name = _metadata_name(archive.names)
    if meta_name:
        msg = email.parser.Parser().parsestr(archive.read(meta_name).decode("utf-8", "replace"))
        expr = msg.get("License-Expression")
        if expr:
            return _from_expression(expr), f"License-Expression: {expr.strip()}", files
        tails = [c.split("::")[-1].strip().lower() for c in msg.get_all("Classifier") or []
                 if c.startswith("License ::") and "OSI Approved ::" in c or c.startswith("License :: Public")]
        tails = [t for t in tails if t != "osi approved"]
        if tails:
            ids = [_CLASSIFIERS.get(t) or _from_text(t) or t for t in tails]
            # several classifiers mean "any of these" (dual licensing) unless one is copyleft,
            # which the authors would not list next to a permissive one without meaning it
            copyleft = [i for i in ids if i not in PERMISSIVE]
            return (copyleft[0] if copyleft else ids[0]), "classifiers: " + "; ".join(tails), files
        field_text = (msg.get("License") or "").strip()
        if field_text and field_text.upper() not in ("UNKNOWN", "NONE") and len(field_text) < 2000:
            found = _from_text(field_text)
            if found:
                return found, f"License: {field_text.splitlines()[0][:80]}", files
    for name in files:
        text = archive.read(name)[:20000].decode("utf-8", "replace")
        found = _from_text(text)
        if found:
            return found, f"license file {name}", files
    return "", "no license in METADATA, classifiers or license files", files


def inspect(pin: Pin, archive_path: Path, excluded: set[str]) -> Distribution:
    """License and exclusion verdict for one downloaded distribution."""
    sha = hashlib.sha256(archive_path.read_bytes()).hexdigest()
    with Archive(archive_path) as archive:
        spdx, evidence, files = detect_license(archive)
    dist = Distribution(pin, archive_path, sha, spdx or "unknown", evidence, files)
    if pin.key in excluded or pin.key.replace("-", "_") in excluded:
        dist.refused = "excluded: the held-out evaluation or the edit histories draw from it"
    elif spdx not in PERMISSIVE:
        dist.refused = f"license {spdx or 'not found'} is not permissive ({evidence})"
    return dist


def iter_archive_sources(
    archive_path: Path, prefix: str, keep: Callable[[str, int], bool]
) -> Iterator[tuple[str, bytes]]:
    """(corpus path, bytes) of the archive's files that `keep(member name, size)` accepts,
    in name order; the others are never read."""
    with Archive(archive_path) as archive:
        for name in archive.names:
            if keep(name, archive.size(name)):
                yield f"{prefix}/{name}", archive.read(name)
