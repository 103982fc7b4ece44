"""`dlm-lsp serve --engine ray` options: checked before anything starts, and a clear message
where Ray is not installed (these run without Ray, in CI)."""

from __future__ import annotations

import argparse
import sys

import pytest
from dlm.coder_model.remote import ray_options, remote_cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    remote_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_builtin_is_the_default_engine():
    args = parse()
    assert args.engine == "builtin" and args.replicas is None and args.autoscale is None  # None: 1 replica
    ray_options.check_arguments(parse("--replicas", "0"))  # ignored without --engine ray


@pytest.mark.parametrize("argv, message", [
    (("--replicas", "0"), "--replicas 0"),
    (("--replica-cpus", "-1"), "0 or more"),
    (("--replica-threads", "0"), "--replica-threads 0"),
    (("--replicas", "2", "--autoscale", "1-3"), "keep one of them"),
    (("--autoscale", "1-2", "--target-ongoing-requests", "0"), "above 0"),
    (("--attach", "--replicas", "2"), "leave those out of --attach"),
    (("--attach", "--autoscale", "1-2"), "leave those out of --attach"),
])
def test_bad_ray_options_refused_before_start(argv, message, capsys):
    assert remote_cli.run(parse("--engine", "ray", *argv)) == 2
    assert message in capsys.readouterr().err


def test_engine_ray_without_ray_says_how_to_install(monkeypatch, capsys):
    import dlm.coder_model.remote as remote_package

    # the import fails as it does without Ray (the attribute too: collecting test_ray_serve.py imported it)
    monkeypatch.setitem(sys.modules, "dlm.coder_model.remote.ray_serve", None)
    monkeypatch.delattr(remote_package, "ray_serve", raising=False)
    assert remote_cli.run(parse("--engine", "ray")) == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[ray]'" in err and "--engine ray" in err


def test_unknown_engine_refused():
    with pytest.raises(SystemExit):
        parse("--engine", "kubernetes")


def test_engine_ray_checks_the_model_dir_before_starting_ray(tmp_path, capsys):
    pytest.importorskip("dlm.coder_model.remote.ray_serve",
                        reason="Ray Serve is not installed: this check runs in ray_serve.run")
    assert remote_cli.run(parse("--engine", "ray", "--model", str(tmp_path / "missing"))) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("0-2", "the least is 1 replica"),
    ("3-2", "MAX must be at least MIN"),
    ("2", "write MIN-MAX"),
    ("a-b", "write MIN-MAX"),
])
def test_bad_autoscale_range_refused_by_the_parser(text, message, capsys):
    with pytest.raises(SystemExit):
        parse("--engine", "ray", "--autoscale", text)
    assert message in capsys.readouterr().err


def test_autoscale_range_parsed():
    args = parse("--engine", "ray", "--autoscale", "1-4", "--target-ongoing-requests", "2")
    ray_options.check_arguments(args)
    assert args.autoscale == (1, 4) and args.target_ongoing_requests == 2.0
