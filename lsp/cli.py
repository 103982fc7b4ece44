"""The `dlm-lsp` console script.

`dlm-lsp [--stdio | --tcp HOST:PORT] ...` runs the language server;
`dlm-lsp SUBCOMMAND ...` runs one of the tools below. Each subcommand lives
in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
this file only dispatches, so that `dlm-lsp --help` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "predict": ("dlm.lsp.predict_cli", "predict the edit at a position of a file"),
    "bench": ("dlm.lsp.bench", "replay typing through the real server and print latency"),
    "serve": ("dlm.coder_model.remote.serve_cli", "serve the model to remote editors over TCP"),
    "http": ("dlm.lsp.http_endpoint", "OpenAI-compatible /v1/completions endpoint (Zed)"),
}
SERVER_MODULE = "dlm.lsp.server_cli"


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # a broken install, not a user error
        raise SystemExit(f"dlm-lsp: cannot import {module} ({exc}); reinstall dlm-lsp") from exc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        name = argv.pop(0)
        module_name, help_text = SUBCOMMANDS[name]
        module = _load(module_name)
        parser = argparse.ArgumentParser(prog=f"dlm-lsp {name}", description=help_text)
        module.add_arguments(parser)
        return int(module.run(parser.parse_args(argv)) or 0)

    module = _load(SERVER_MODULE)
    parser = argparse.ArgumentParser(
        prog="dlm-lsp",
        description="Edit-prediction language server on a masked-diffusion coder model.",
        epilog="subcommands: "
        + "; ".join(f"{n}: {h}" for n, (_, h) in SUBCOMMANDS.items())
        + ". Run `dlm-lsp SUBCOMMAND --help` for each.",
    )
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
