"""The `dlm-lsp` console script.

`dlm-lsp [--stdio | --tcp HOST:PORT] ...` runs the language server;
`dlm-lsp SUBCOMMAND ...` runs one of the tools below. Each subcommand lives
in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
this file only dispatches, so that `dlm-lsp --help` never imports torch.

Every command takes `--log-level LEVEL` (DEBUG, INFO, WARNING or ERROR, in any
case).

Bare `dlm-lsp` typed in a terminal (stdin is a TTY) prints a hint to stderr
that it is a language server your editor starts, and what to try instead, and
then serves anyway: an editor may start its servers on a pseudo-terminal
(Emacs's default process connection is a pty), and refusing to run there
would break that editor. The hint costs an editor nothing (stderr).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "predict": ("dlm.lsp.predict_cli", "predict the edit at a position of a file"),
    "bench": ("dlm.drivers.bench.typing_latency", "replay typing through the real server and print latency"),
    "eval": ("dlm.drivers.evaluation.eval_cli", "replay held-out typing through the server: precision per confidence threshold"),
    "serve": ("dlm.coder_model.remote.remote_cli", "serve the model to remote editors over TCP"),
    "http": ("dlm.lsp.http_endpoint", "OpenAI-compatible /v1/completions endpoint (Zed)"),
}
SERVER_MODULE = "dlm.lsp.server_cli"
# Options of any command that name a file or folder (argparse dests).
PATH_OPTIONS = ("file", "model", "token_file", "tls_cert", "tls_key", "log_file", "server_log", "corpus",
                "edit_histories", "safim_dir", "out", "repo")

TTY_HINT = (
    "dlm-lsp is a language server that talks LSP on stdin/stdout; your editor starts it. "
    "Try `dlm-lsp predict FILE --line N --col M` or `dlm-lsp --help`. "
    "(Serving LSP on this terminal now; Ctrl-D or Ctrl-C quits.)"
)


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # a broken install, not a user error
        raise SystemExit(f"dlm-lsp: cannot import {module} ({exc}); reinstall dlm-lsp") from exc


def parser_for(argv: list[str]):
    """(module, parser, remaining argv) for a command line: a subcommand's or the server's."""
    if argv and argv[0] in SUBCOMMANDS:
        name = argv[0]
        module_name, help_text = SUBCOMMANDS[name]
        module = _load(module_name)
        parser = argparse.ArgumentParser(prog=f"dlm-lsp {name}", description=help_text)
        module.add_arguments(parser)
        return module, parser, argv[1:]
    module = _load(SERVER_MODULE)
    parser = argparse.ArgumentParser(
        prog="dlm-lsp",
        description="Edit-prediction language server on a masked-diffusion coder model. "
        "Your editor starts it (`dlm-lsp --stdio`) and talks LSP on stdin/stdout.",
        epilog="subcommands: "
        + "; ".join(f"{n}: {h}" for n, (_, h) in SUBCOMMANDS.items())
        + ". Run `dlm-lsp SUBCOMMAND --help` for each.",
    )
    module.add_arguments(parser)
    return module, parser, argv


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stdin
        return False


def expand_paths(args: argparse.Namespace) -> argparse.Namespace:
    """`~` and $VARS expanded in every path option: editors pass arguments without a shell,
    so `--model ~/models/x` from a settings file would otherwise name a folder called `~`."""
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, (str, Path)):
            setattr(args, name, type(value)(expand_path(str(value))))
    return args


def expand_path(value: str) -> str:
    return os.path.expanduser(os.path.expandvars(value))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    module, parser, rest = parser_for(argv)
    args = expand_paths(parser.parse_args(rest))
    if module.__name__ == SERVER_MODULE and getattr(args, "tcp", None) is None and _stdin_is_terminal():
        print(TTY_HINT, file=sys.stderr, flush=True)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
