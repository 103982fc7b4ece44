"""The corpus: pinned distributions read from their archives, license checks, exclusions,
near-duplicate removal, reproducible splits, the manifest, and pack / unpack.

No network: the distributions are wheels and sdists built here with zipfile / tarfile and
put into the cache, where the download step finds them; pip is replaced by a command
that fails, so a test that reached the network would fail instead.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import sys
import tarfile
import zipfile

import pytest
from dlm.drivers.training import corpus, dedup
from dlm.drivers.training import pypi_corpus as pypi
from dlm.drivers.training.corpus import EXCLUDED_PACKAGES, build_corpus, is_excluded, read_split

NO_PIP = [sys.executable, "-c", "import sys; sys.exit(1)"]  # "pip" that always fails


def _module(seed: int, lines: int = 12) -> str:
    """A distinct, plausible Python file (distinct words, so MinHash sees it as different)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "total", "count", "items", "value", "index", "result",
             "buffer", "offset", "limit", "name", "parts", "cache", "state", "token", "width", "depth"]
    body = "".join(f"    {rng.choice(words)}_{seed}_{j} = {rng.choice(words)} + {rng.randint(0, 999)}\n"
                   for j in range(lines))
    return f"def fn_{seed}(alpha, beta):\n    \"\"\"Module {seed}.\"\"\"\n{body}    return alpha\n"


def make_wheel(cache, name, version, metadata: str, files: dict[str, str], license_file: str | None = None):
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{metadata}")
        if license_file is not None:
            z.writestr(f"{dist_info}/licenses/LICENSE", license_file)
        for rel, text in files.items():
            z.writestr(rel, text)
    return path


def make_sdist(cache, name, version, pkg_info: str, files: dict[str, str]):
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        for rel, text in {"PKG-INFO": f"Name: {name}\nVersion: {version}\n{pkg_info}", **files}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


MIT_TEXT = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software"


@pytest.fixture
def pinned(tmp_path):
    """A cache with five distributions and the pinned list naming them (and an excluded one)."""
    cache = tmp_path / "cache"
    make_wheel(cache, "goodlib", "1.0", "License-Expression: MIT\n",
               {f"goodlib/m{i}.py": _module(i) for i in range(30)} | {"goodlib/data.bin": "\x00\x01"})
    make_wheel(cache, "classified", "2.1",
               "Classifier: License :: OSI Approved :: BSD License\nClassifier: Programming Language :: Python\n",
               {f"classified/c{i}.py": _module(100 + i) for i in range(10)})
    make_wheel(cache, "filelicensed", "0.3", "", {"filelicensed/f.py": _module(200)}, license_file=MIT_TEXT)
    make_wheel(cache, "copyleft", "1.0", "Classifier: License :: OSI Approved :: GNU General Public License v3 (GPLv3)\n",
               {"copyleft/g.py": _module(300)})
    make_sdist(cache, "oldsdist", "0.6.2", "License: BSD-3-Clause\n", {"oldsdist.py": _module(400)})
    pins = tmp_path / "pins.txt"
    pins.write_text("# test list\ngoodlib==1.0\nclassified==2.1  # bsd\nfilelicensed==0.3\ncopyleft==1.0\n"
                    "oldsdist==0.6.2\nClick==8.1.7\n")
    return pins, cache


def _rows(out):
    return [r for s in corpus.SPLITS for r in read_split(out, s)]


def test_pinned_distributions_are_read_from_their_archives_and_licenses_checked(pinned, tmp_path):
    pins, cache = pinned
    manifest = build_corpus([], tmp_path / "out", packages=pins, cache=cache, pip=NO_PIP)
    rows = _rows(tmp_path / "out")
    sources = {r["source"] for r in rows}
    assert sources == {"goodlib==1.0", "classified==2.1", "filelicensed==0.3", "oldsdist==0.6.2"}
    assert len(rows) == 30 + 10 + 1 + 1  # the .bin and the METADATA are not source files
    assert {r["license"] for r in rows if r["source"] == "classified==2.1"} == {"bsd"}
    assert {r["license"] for r in rows if r["source"] == "filelicensed==0.3"} == {"mit"}
    assert all(r["language"] == "python" and r["path"].startswith(r["source"] + "/") for r in rows)
    refused = {r["name"]: r["reason"] for r in manifest["refused"]}
    assert set(refused) == {"copyleft", "click"}
    assert "gpl" in refused["copyleft"] and "excluded" in refused["click"]
    assert {d["name"] for d in manifest["distributions"]} == {"goodlib", "classified", "filelicensed", "oldsdist"}
    assert all(len(d["sha256"]) == 64 for d in manifest["distributions"])


def test_manifest_counts_files_and_tokens_per_source_and_license(pinned, tmp_path):
    from dlm.coder_model.tokenizer import Tokenizer

    pins, cache = pinned
    manifest = build_corpus([], tmp_path / "out", packages=pins, cache=cache, pip=NO_PIP, count="tokenizer")
    tok = Tokenizer.from_file(corpus.default_tokenizer())
    rows = _rows(tmp_path / "out")
    want_tokens = sum(len(tok.encode(r["text"])) for r in rows)
    assert manifest["totals"] == {"files": len(rows), "tokens": want_tokens, "chars": sum(len(r["text"]) for r in rows)}
    good = [r for r in rows if r["source"] == "goodlib==1.0"]
    assert manifest["by_source"]["goodlib==1.0"]["tokens"] == sum(len(tok.encode(r["text"])) for r in good)
    assert sum(v["files"] for v in manifest["by_license"].values()) == len(rows)
    assert manifest["by_license"]["bsd"]["files"] == 10 + 1  # classified (classifier) + oldsdist (License:)
    assert sum(v["files"] for v in manifest["splits"].values()) == len(rows)
    assert "embedded tokenizer" in manifest["token_count"]


def test_the_same_list_gives_byte_identical_split_files(pinned, tmp_path):
    pins, cache = pinned
    m1 = build_corpus([], tmp_path / "a", packages=pins, cache=cache, pip=NO_PIP)
    m2 = build_corpus([], tmp_path / "b", packages=pins, cache=cache, pip=NO_PIP)
    for split in corpus.SPLITS:
        assert (tmp_path / "a" / f"{split}.jsonl.gz").read_bytes() == (tmp_path / "b" / f"{split}.jsonl.gz").read_bytes()
    assert m1["split_sha256"] == m2["split_sha256"]


def test_a_missing_download_is_a_clear_error(tmp_path):
    pins = tmp_path / "pins.txt"
    pins.write_text("nosuchthing==1.0\n")
    with pytest.raises(pypi.CorpusSourceError, match="could not download nosuchthing==1.0"):
        build_corpus([], tmp_path / "out", packages=pins, cache=tmp_path / "cache", pip=NO_PIP)


@pytest.mark.parametrize("bad", ["requests>=2\n", "a==1\nA==2\n", "just a sentence\n"])
def test_a_bad_package_list_says_which_line(tmp_path, bad):
    pins = tmp_path / "pins.txt"
    pins.write_text(bad)
    with pytest.raises(pypi.CorpusSourceError, match=r"pins\.txt:\d"):
        pypi.read_pins(pins)


def test_the_shipped_package_list_is_pinned_sorted_and_excludes_nothing_it_must_not():
    pins = pypi.read_pins(pypi.DEFAULT_PACKAGES)
    assert 40 <= len(pins) <= 160
    keys = [p.key for p in pins]
    assert keys == sorted(keys)
    excluded = corpus.excluded_names()
    assert not [k for k in keys if k in excluded or k.replace("-", "_") in excluded]


@pytest.mark.parametrize(
    ("metadata", "want"),
    [
        ("License-Expression: Apache-2.0 OR BSD-2-Clause\n", "apache-2.0"),
        ("License-Expression: MIT AND GPL-3.0-only\n", "gpl-3.0-only"),
        ("License-Expression: MPL-2.0\n", "mpl-2.0"),
        ("Classifier: License :: OSI Approved :: MIT License\n"
         + "Classifier: License :: OSI Approved :: Apache Software License\n", "mit"),
        ("License: BSD or GPL, your choice\n", "gpl"),
        ("License: Apache 2.0\n", "apache-2.0"),
        ("License: UNKNOWN\n", ""),
    ],
)
def test_license_detection(tmp_path, metadata, want):
    path = make_wheel(tmp_path, "x", "1", metadata, {"x/a.py": "pass\n"})
    with pypi.Archive(path) as archive:
        spdx, evidence, _ = pypi.detect_license(archive)
    assert spdx == want, evidence


def test_near_duplicates_are_removed_keeping_the_first(tmp_path):
    base = _module(7, lines=40)
    lines = base.splitlines(keepends=True)
    variant = "".join(lines[:20]) + "    changed_line = 1\n" + "".join(lines[21:])  # one line differs
    other = _module(8, lines=40)
    src = tmp_path / "src"
    for name, text in (("a_first.py", base), ("b_variant.py", variant), ("c_other.py", other)):
        (src / "pkg").mkdir(parents=True, exist_ok=True)
        (src / "pkg" / name).write_text(text)
    manifest = build_corpus([src], tmp_path / "out")
    names = sorted(r["path"].rsplit("/", 1)[-1] for r in _rows(tmp_path / "out"))
    assert names == ["a_first.py", "c_other.py"]
    assert manifest["dedup"]["near_duplicates"] == 1


def test_minhash_similarity_tracks_jaccard():
    a = " ".join(f"w{i}" for i in range(400))
    b = " ".join(f"w{i}" for i in range(40, 440))  # 356 of 436 shingles shared: Jaccard ~0.82
    c = " ".join(f"v{i}" for i in range(400))
    sa, sb, sc = dedup.signature(a), dedup.signature(b), dedup.signature(c)
    assert 0.65 < float((sa == sb).mean()) < 0.97
    assert float((sa == sc).mean()) < 0.1
    assert dedup.near_duplicate_clusters([a, c, b], 0.7) == [0, 1, 0]
    assert dedup.signature("") is None


def test_excluded_packages_and_eval_never_enter_the_corpus(tmp_path):
    files = {
        "site-packages/goodpkg/mod{i}.py": 0,
        "site-packages/django/db/models{i}.py": 1000,
        "site-packages/scikit_learn-1.5.dist-info/x{i}.py": 2000,
        "site-packages/sklearn/base{i}.py": 3000,
        "site-packages/mpl_toolkits/a{i}.py": 4000,
        "shared/eval/safim/leak{i}.py": 5000,
    }
    for i in range(12):
        for rel, seed in files.items():
            p = tmp_path / "src" / rel.format(i=i)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_module(seed + i))
    dup = tmp_path / "src/site-packages/goodpkg/dup.py"
    dup.write_text((tmp_path / "src/site-packages/goodpkg/mod0.py").read_text())  # kept once
    manifest = build_corpus([tmp_path / "src"], tmp_path / "out")
    paths = [r["path"] for r in _rows(tmp_path / "out")]
    assert len(paths) == 12 and all("/goodpkg/" in p for p in paths)
    assert sum(sum(c.values()) for c in manifest["counts"].values()) == 12


@pytest.mark.parametrize("pkg", EXCLUDED_PACKAGES)
def test_every_excluded_package_is_recognised(pkg):
    assert is_excluded(f"/usr/lib/python3/site-packages/{pkg}/core.py")
    assert is_excluded(f"/usr/lib/python3/site-packages/{pkg}-9.9.dist-info/RECORD.py")
    assert not is_excluded(f"/usr/lib/python3/site-packages/{pkg}x_other/core.py")


def test_split_is_by_file_and_stable():
    digests = [f"{random.Random(i).getrandbits(160):040x}" for i in range(3000)]
    splits = [corpus.split_of(d) for d in digests]
    assert splits == [corpus.split_of(d) for d in digests]
    share = {s: splits.count(s) / len(splits) for s in ("train", "valid", "test")}
    assert 0.01 < share["test"] < 0.03 and 0.004 < share["valid"] < 0.02


def test_algorithmic_python_is_a_source(tmp_path):
    folder = tmp_path / "algo"
    folder.mkdir()
    with gzip.open(folder / "files.jsonl.gz", "wt") as f:
        for i in range(5):
            f.write(json.dumps({"repo": "Some/Repo", "commit": "0" * 40, "path": f"sorts/s{i}.py",
                                "language": "python", "text": _module(600 + i)}) + "\n")
    manifest = build_corpus([], tmp_path / "out", algorithmic=folder)
    rows = _rows(tmp_path / "out")
    assert len(rows) == 5 and {r["license"] for r in rows} == {"mit"}
    assert rows[0]["path"].startswith("algorithmic-python/Some/Repo/sorts/")
    assert manifest["by_source"]["algorithmic-python/Some/Repo"]["files"] == 5
    with pytest.raises(pypi.CorpusSourceError, match="files.jsonl.gz does not exist"):
        build_corpus([], tmp_path / "out2", algorithmic=tmp_path / "nowhere")


def test_pack_and_unpack_round_trip(pinned, tmp_path):
    pins, cache = pinned
    built = tmp_path / "built"
    build_corpus([], built, packages=pins, cache=cache, pip=NO_PIP)
    limit = 8 * 1024 + 64 * 1024  # the bound's 64 KiB allowance plus a few files: several parts
    parts = corpus.pack(built, tmp_path / "packed", part_bytes=limit)
    assert len(parts) > 1 and all(p.stat().st_size <= limit for p in parts)
    files = corpus.unpack(tmp_path / "packed", tmp_path / "unpacked")
    assert sum(files.values()) == 42
    for split in corpus.SPLITS:
        assert (built / f"{split}.jsonl.gz").read_bytes() == (tmp_path / "unpacked" / f"{split}.jsonl.gz").read_bytes()
    assert (tmp_path / "unpacked" / "manifest.json").read_text() == (built / "manifest.json").read_text()

    parts[-1].unlink()  # a part lost on the way is noticed
    with pytest.raises(pypi.CorpusSourceError, match="a part is missing"):
        corpus.unpack(tmp_path / "packed", tmp_path / "unpacked2")


def test_command_line_build_pack_unpack(pinned, tmp_path, monkeypatch, capsys):
    pins, cache = pinned
    monkeypatch.setattr(pypi, "download", lambda pin, cache_dir, pip=None: pypi.find_archive(cache_dir, pin))
    out = tmp_path / "c"
    assert corpus.main(["--out", str(out), "--packages", str(pins), "--cache", str(cache),
                        "--algorithmic", "none", "--count", "chars"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["files"] == 42
    assert corpus.main(["pack", "--corpus", str(out), "--out", str(tmp_path / "p")]) == 0
    assert corpus.main(["unpack", "--parts", str(tmp_path / "p"), "--out", str(tmp_path / "u")]) == 0
    assert len(list(read_split(tmp_path / "u", "train"))) == len(list(read_split(out, "train")))
    assert corpus.main(["unpack", "--parts", str(tmp_path / "empty"), "--out", str(tmp_path / "u2")]) == 2
    assert "no corpus-*.jsonl.xz parts" in capsys.readouterr().err


def test_files_holding_special_token_text_are_dropped(tmp_path):
    src = tmp_path / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "plain.py").write_text(_module(900))
    (src / "layouty.py").write_text(_module(901) + 'END = "<eom>"\n')  # would encode as the <eom> token
    build_corpus([tmp_path / "src"], tmp_path / "out")
    assert [r["path"].rsplit("/", 1)[-1] for r in _rows(tmp_path / "out")] == ["plain.py"]
