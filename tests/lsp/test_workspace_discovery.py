"""Which files the workspace index reads (lsp.gitignore, lsp.discovery): .gitignore
semantics, vendored folders, secrets, special files, caps, and files that misbehave."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from dlm.lsp import discovery
from dlm.lsp.gitignore import IgnoreStack
from workspace_fakes import stack, write

LIMITS = discovery.Limits.for_files(max_files=10_000, max_file_bytes=1_000_000)


def walked(root: Path, limits: discovery.Limits = LIMITS, exclude: tuple[str, ...] = ()) -> list[str]:
    return [
        c.rel for c in discovery.walk(str(root), limits, discovery.ignore_stack(str(root), exclude)).files
    ]


# ---- .gitignore semantics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "path", "is_dir", "ignored"),
    [
        ("*.log", "a.log", False, True),
        ("*.log", "deep/er/a.log", False, True),  # no slash: any depth
        ("*.log\n!keep.log", "sub/keep.log", False, False),  # negation re-includes
        ("!keep.log\n*.log", "keep.log", False, True),  # the last match wins
        ("build/", "build", True, True),  # dir/ matches directories ...
        ("build/", "build", False, False),  # ... only
        ("build/", "src/build", True, True),
        ("/top.py", "top.py", False, True),  # anchored to the .gitignore's folder
        ("/top.py", "sub/top.py", False, False),
        ("doc/frotz", "doc/frotz", False, True),  # a middle slash anchors too
        ("doc/frotz", "a/doc/frotz", False, False),
        ("**/tmp", "x/y/tmp", True, True),
        ("docs/**/gen.py", "docs/gen.py", False, True),  # /**/: zero or more folders
        ("docs/**/gen.py", "docs/a/b/gen.py", False, True),
        ("lib/**", "lib/x/y.py", False, True),
        ("lib/**", "lib", True, False),
        ("a?.py", "ab.py", False, True),
        ("a?.py", "a/.py", False, False),  # ? never matches /
        ("*.py", "a/b.py", False, True),
        ("x*.py", "x/y.py", False, False),  # * never matches /
        ("[ab].py", "b.py", False, True),
        ("[!ab].py", "c.py", False, True),
        ("[!ab].py", "a.py", False, False),
        ("\\#notacomment.py", "#notacomment.py", False, True),
        ("# a comment\n\n", "# a comment", False, False),
        ("\\!bang.py", "!bang.py", False, True),
        ("trail.py   ", "trail.py", False, True),  # trailing spaces dropped
    ],
)
def test_gitignore_rules(rules: str, path: str, is_dir: bool, ignored: bool):
    assert stack(rules).ignored(path, is_dir) is ignored


def test_a_file_in_an_excluded_folder_cannot_be_reincluded():
    s = stack("gen/\n!gen/keep.py")
    assert s.ignored("gen/keep.py", False)  # git does not look inside gen/


def test_nested_gitignore_applies_below_its_folder_and_overrides(tmp_path: Path):
    write(tmp_path, ".gitignore", "*.gen.py\n")
    write(tmp_path, "pkg/.gitignore", "!*.gen.py\n/local.py\n")
    for rel in ("a.gen.py", "pkg/b.gen.py", "pkg/local.py", "pkg/sub/local.py", "other/local.py", "main.py"):
        write(tmp_path, rel)
    assert walked(tmp_path) == ["main.py", "other/local.py", "pkg/b.gen.py", "pkg/sub/local.py"]


def test_gitignore_above_the_root_and_info_exclude(tmp_path: Path):
    (tmp_path / ".git" / "info").mkdir(parents=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("secret_notes.py\n")
    write(tmp_path, ".gitignore", "proj/generated/\n")
    root = tmp_path / "proj"
    for rel in ("generated/x.py", "secret_notes.py", "ok.py"):
        write(root, rel)
    assert walked(root) == ["ok.py"]


def test_exclude_option_has_the_last_word(tmp_path: Path):
    write(tmp_path, ".gitignore", "!fixtures/\n")
    for rel in ("fixtures/a.py", "src/a.py"):
        write(tmp_path, rel)
    assert walked(tmp_path, exclude=("fixtures/",)) == ["src/a.py"]


# ---- what is never read --------------------------------------------------------------------------


def test_vendored_and_build_folders_are_skipped(tmp_path: Path):
    for d in ("node_modules/x", ".git", ".venv/lib", "venv", "build", "dist", "__pycache__", "target",
              ".tox/py", "site-packages", "pkg.egg-info", "myenv"):  # fmt: skip
        write(tmp_path, f"{d}/mod.py")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")  # a virtualenv by any name
    write(tmp_path, "src/app.py")
    assert walked(tmp_path) == ["src/app.py"]


SECRETS = (".env", ".env.local", "prod.env", ".envrc", "server.pem", "tls.key", "id_rsa", "id_ed25519.pub",
           ".netrc", ".npmrc", ".pypirc", "credentials", "aws_credentials.py", "client_secret.json",
           "cert.p12", "cert.pfx", "kubeconfig", ".aws/config.py", ".ssh/config.py", ".gnupg/x.py",
           "settings_secrets.py")  # fmt: skip


@pytest.mark.parametrize("rel", SECRETS)
def test_secret_names(rel: str):
    assert discovery.is_secret_path(rel)


def test_secret_files_are_never_listed_and_secret_lines_never_read(tmp_path: Path):
    for rel in SECRETS:
        write(tmp_path, rel, "API_KEY = 'hunter2'\n")
    write(
        tmp_path,
        "keys.py",
        "KEY = '''\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n'''\n",
    )
    # a key cut before its END line: its body lines (base64) are masked with it
    write(tmp_path, "ssh.py", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n")
    write(tmp_path, "aws.py", "AWS = 'AKIAABCDEFGHIJKLMNOP'\n")
    write(tmp_path, "app.py", "def main():\n    pass\n")
    files = walked(tmp_path)
    assert not any(discovery.is_secret_path(f) for f in files)
    # a file with a key keeps its other lines; the key's lines are emptied (line numbers kept)
    keys = discovery.read_source(str(tmp_path / "keys.py"), 1_000_000)
    assert isinstance(keys, discovery.Source)
    assert "PRIVATE KEY" not in keys.text and "MIIE" not in keys.text and keys.text.count("\n") == 5
    assert keys.text.startswith("KEY = ")
    ssh = discovery.read_source(str(tmp_path / "ssh.py"), 1_000_000)
    assert isinstance(ssh, discovery.Source) and "b3Bl" not in ssh.text and "PRIVATE" not in ssh.text
    assert ssh.text == "\n\n"
    aws = discovery.read_source(str(tmp_path / "aws.py"), 1_000_000)
    assert isinstance(aws, discovery.Source) and "AKIA" not in aws.text
    assert discovery.read_source(str(tmp_path / "app.py"), 1_000_000).text == "def main():\n    pass\n"


def test_binary_non_utf8_and_non_source(tmp_path: Path):
    (tmp_path / "blob.py").write_bytes(b"x = 1\n\0\0\0")
    (tmp_path / "latin.py").write_bytes("café = 1\n".encode("latin-1"))
    write(tmp_path, "notes.txt", "hello\n")
    write(tmp_path, "image.png", "PNG")
    write(tmp_path, "ok.py", "é = 1\n")
    assert walked(tmp_path) == ["blob.py", "latin.py", "ok.py"]  # by name: content decides below
    assert discovery.read_source(str(tmp_path / "blob.py"), 1000) == "binary"
    assert discovery.read_source(str(tmp_path / "latin.py"), 1000) == "not_utf8"
    assert discovery.read_source(str(tmp_path / "ok.py"), 1000).text == "é = 1\n"


def test_a_50_mb_minified_file_is_skipped_without_reading_it(tmp_path: Path):
    big = tmp_path / "bundle.min.js"
    with open(big, "wb") as f:  # 50 MB on one line, sparse: costs no disk
        f.truncate(50 * 1024 * 1024)
    write(tmp_path, "app.js", "export const a = 1;\n")
    result = discovery.walk(str(tmp_path), LIMITS, discovery.ignore_stack(str(tmp_path)))
    assert [c.rel for c in result.files] == ["app.js"]
    assert result.skipped["too_large"] == 1
    assert discovery.read_source(str(big), 1_000_000) == "too_large"
    # under the size cap but minified (one enormous line): skipped as well
    write(tmp_path, "small.min.js", "var a=1;" * 5000)
    assert discovery.read_source(str(tmp_path / "small.min.js"), 1_000_000) == "minified"


def test_a_fifo_a_socket_and_symlinks_are_never_opened(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.py")  # opening it for reading would block forever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.py"))
    write(tmp_path, "real.py")
    (tmp_path / "link.py").symlink_to(tmp_path / "real.py")
    (tmp_path / "loop").symlink_to(tmp_path)  # a symlink loop
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "outside.py").symlink_to("/etc/passwd")
    done: list = []
    t = threading.Thread(
        target=lambda: done.append(discovery.walk(str(tmp_path), LIMITS, IgnoreStack())), daemon=True
    )
    t.start()
    t.join(30)
    assert done, "the walk hung"
    result = done[0]
    sock.close()
    assert [c.rel for c in result.files] == ["real.py"]
    assert result.skipped["special"] == 2 and result.skipped["symlink"] == 5
    # read_source refuses them too, without blocking (a file swapped for a FIFO after the walk)
    assert discovery.read_source(str(tmp_path / "pipe.py"), 1000) == "special"
    assert discovery.read_source(str(tmp_path / "link.py"), 1000) == "unreadable"  # O_NOFOLLOW


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_files_and_folders_are_skipped(tmp_path: Path):
    write(tmp_path, "locked.py").chmod(0)
    write(tmp_path, "closed/inside.py")
    (tmp_path / "closed").chmod(0)
    write(tmp_path, "ok.py")
    try:
        result = discovery.walk(str(tmp_path), LIMITS, IgnoreStack())
        assert [c.rel for c in result.files] == ["locked.py", "ok.py"]
        assert result.skipped["unreadable_dir"] == 1
        assert discovery.read_source(str(tmp_path / "locked.py"), 1000) == "unreadable"
    finally:
        (tmp_path / "closed").chmod(0o700)


def test_unreadable_files_are_skipped_even_as_root(tmp_path: Path, monkeypatch):
    write(tmp_path, "locked.py")
    real_open, real_scandir = os.open, os.scandir

    def deny_open(path, *a, **k):
        if str(path).endswith("locked.py"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    def deny_scandir(path):
        if str(path).endswith("closed"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    write(tmp_path, "closed/inside.py")
    monkeypatch.setattr(discovery.os, "open", deny_open)
    monkeypatch.setattr(discovery.os, "scandir", deny_scandir)
    result = discovery.walk(str(tmp_path), LIMITS, IgnoreStack())
    assert [c.rel for c in result.files] == ["locked.py"] and result.skipped["unreadable_dir"] == 1
    assert discovery.read_source(str(tmp_path / "locked.py"), 1000) == "unreadable"


def test_files_that_vanish_or_change_while_read(tmp_path: Path, monkeypatch):
    p = write(tmp_path, "a.py", "x = 1\n")
    assert discovery.read_source(str(tmp_path / "gone.py"), 1000) == "vanished"
    real_read = os.read

    def read_and_append(fd, n):  # the file grows between fstat and the end of the read
        data = real_read(fd, n)
        if data:
            with open(p, "a") as f:
                f.write("y = 2\n")
        return data

    monkeypatch.setattr(discovery.os, "read", read_and_append)
    assert discovery.read_source(str(p), 1000) == "changed"


def test_caps_stop_a_huge_tree_early_with_a_reason(tmp_path: Path):
    for i in range(60):
        write(tmp_path, f"d{i // 10}/m{i}.py")
    result = discovery.walk(str(tmp_path), discovery.Limits(max_files=25, max_file_bytes=1000, max_entries=10**6),
                            IgnoreStack())  # fmt: skip
    assert len(result.files) == 25 and "maxFiles" in result.stopped
    result = discovery.walk(str(tmp_path), discovery.Limits(max_files=1000, max_file_bytes=1000, max_entries=30),
                            IgnoreStack())  # fmt: skip
    assert len(result.files) < 30 and "entries" in result.stopped


def test_roots_that_must_not_be_indexed(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "me"))
    (tmp_path / "home" / "me" / "proj").mkdir(parents=True)
    assert "/" in discovery.refusal("/")
    assert "home directory" in discovery.refusal(str(tmp_path / "home" / "me"))
    assert "holds the home directory" in discovery.refusal(str(tmp_path / "home"))
    assert discovery.refusal(str(tmp_path / "home" / "me" / "proj")) == ""


def test_single_paths_follow_the_same_rules(tmp_path: Path):
    write(tmp_path, ".gitignore", "gen/\n")
    write(tmp_path, "pkg/.gitignore", "local_*.py\n")
    ignore = discovery.ignore_stack(str(tmp_path))
    allowed = {rel: discovery.path_allowed(str(tmp_path), rel, ignore)
               for rel in ("a.py", "gen/x.py", "pkg/local_a.py", ".env", "node_modules/x/y.js", "n.txt", "../x.py")}  # fmt: skip
    assert allowed == {"a.py": "", "gen/x.py": "ignored", "pkg/local_a.py": "ignored", ".env": "not_source",
                       "node_modules/x/y.js": "vendored", "n.txt": "not_source", "../x.py": "outside the root"}  # fmt: skip
    assert discovery.path_allowed(str(tmp_path), "deploy/.env.py", ignore) == "secret"
