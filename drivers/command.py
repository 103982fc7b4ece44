"""One driver's command line: `python -m dlm.drivers.X` parses its own arguments and runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def run_command(module: str, doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int], argv: Sequence[str] | None = None) -> int:
    """Build the parser `add_arguments` fills (the same one `dlm-lsp eval` and `bench` fill), parse
    `argv` and hand the namespace to `run`; its exit status is the command's."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
