"""`dlm-lsp eval`: one command line for the three replays through the real server.

- `--repo DIR`: held-out lines of a repository typed against an index of the rest (eval_repo);
- `--next-edits`: commits of the edit histories replayed as edits (eval_edits);
- otherwise: typing a corpus, edit histories or SAFIM (eval_typing).

The options are eval_typing's parser, shared by all three.
"""

from __future__ import annotations

import argparse
import logging

from dlm.drivers.evaluation import eval_typing

add_arguments = eval_typing.add_arguments


def run(args: argparse.Namespace) -> int:
    thresholds = eval_typing.thresholds_of(args)
    if thresholds is None:
        return 2
    # the server's window/logMessage notifications are for editors; pygls' client warns on each
    logging.getLogger("pygls.protocol.json_rpc").setLevel(logging.ERROR)
    if getattr(args, "next_edits", False):
        from dlm.drivers.evaluation.eval_edits import EDIT_GAP_S, run_next_edits

        if args.edit_gap_s is None:
            args.edit_gap_s = EDIT_GAP_S
        return run_next_edits(args, thresholds)
    if getattr(args, "repo", None):
        from dlm.drivers.evaluation.eval_repo import run_repo

        if args.cases is None:
            args.cases = 400
        return run_repo(args, thresholds)
    return eval_typing.run(args, thresholds)
