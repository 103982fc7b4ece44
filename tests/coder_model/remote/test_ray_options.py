"""`dlm-lsp serve --engine ray` options: checked before anything starts, and a clear message
where Ray is not installed (these run without Ray, in CI)."""

from __future__ import annotations

import argparse
import sys

import pytest
from dlm.coder_model.remote import ray_options, serve_cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_builtin_is_the_default_engine():
    args = parse()
    assert args.engine == "builtin" and args.replicas == 1
    ray_options.check_arguments(parse("--replicas", "0"))  # ignored without --engine ray


@pytest.mark.parametrize("argv, message", [
    (("--replicas", "0"), "--replicas 0"),
    (("--replica-cpus", "-1"), "0 or more"),
    (("--replica-threads", "0"), "--replica-threads 0"),
])
def test_bad_ray_options_refused_before_start(argv, message, capsys):
    assert serve_cli.run(parse("--engine", "ray", *argv)) == 2
    assert message in capsys.readouterr().err


def test_engine_ray_without_ray_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dlm.coder_model.remote.ray_serve", None)  # import fails as without Ray
    assert serve_cli.run(parse("--engine", "ray")) == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[ray]'" in err and "--engine ray" in err


def test_unknown_engine_refused():
    with pytest.raises(SystemExit):
        parse("--engine", "kubernetes")
