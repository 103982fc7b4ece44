"""`dlm-lsp [--stdio | --tcp HOST:PORT]`: run the language server.

Imports nothing heavy: torch and the model load in a background thread after
the server has started (lsp.engine_holder.EngineHolder).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.hosted.settings import EngineSettingsError, add_engine_arguments, settings_from_args
from dlm.coder_model.remote.client import parse_host_port


def _host_port(value: str) -> tuple[str, int]:
    """argparse type for HOST:PORT (the port is required)."""
    try:
        return parse_host_port(value, default_port=None)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (for example 127.0.0.1:7777)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    mode.add_argument("--tcp", metavar="HOST:PORT", type=_host_port, help="listen for one LSP client on TCP")
    parser.add_argument("--model", metavar="DIR", help="checkpoint directory (default: the embedded model)")
    add_device_argument(parser)
    parser.add_argument("--remote", metavar="HOST:PORT", help="use a model served by `dlm-lsp serve`")
    parser.add_argument("--token-file", metavar="F", help="shared token for --remote (or env DLM_TOKEN)")
    parser.add_argument("--tls", action="store_true", help="use TLS for --remote")
    add_engine_arguments(parser)
    parser.add_argument(
        "--log-file", metavar="F",
        help="also write logs here (default: stderr until the client is initialized, then window/logMessage)",
    )
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR, any case (default INFO)")
    # Tests: "module:function" called as function(model, device) -> Engine (env DLM_ENGINE_FACTORY too).
    parser.add_argument("--engine-factory", help=argparse.SUPPRESS)


def engine_problem(args: argparse.Namespace) -> str:
    """What is wrong with the command line's --engine options ('' when nothing)."""
    try:
        settings = settings_from_args(args)
        if settings is None:
            return ""
        if getattr(args, "remote", None) or getattr(args, "model", None):
            return "--engine names a model server; --remote and --model name another engine: give one of them"
        settings.resolved()
    except EngineSettingsError as exc:
        return f"--engine: {exc}"
    return ""


def run(args: argparse.Namespace) -> int:
    handler: logging.Handler
    handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(args.log_level)
    if args.log_level != "DEBUG":  # pygls logs every message at INFO
        logging.getLogger("pygls").setLevel(logging.WARNING)
    if args.remote:
        try:
            _host_port(args.remote)
        except argparse.ArgumentTypeError as exc:
            print(f"dlm-lsp: --remote {exc}", file=sys.stderr)
            return 2

    problem = engine_problem(args)
    if problem:
        print(f"dlm-lsp: {problem}", file=sys.stderr)
        return 2

    from dlm.lsp.engine_holder import make_engine_factory, names_engine
    from dlm.lsp.heap import fix_mmap_threshold
    from dlm.lsp.server import create_server

    fix_mmap_threshold()  # the index's dropped tables go back to the system

    # The model thread re-takes the GIL between small torch ops; with the default 5 ms switch
    # interval the event loop waits up to 5 ms per handoff to read the next keystroke.
    sys.setswitchinterval(0.0005)

    server = create_server(make_engine_factory(args), command_line_engine=names_engine(args))
    # Once the client is initialized, INFO and above go to it as window/logMessage with their
    # level: Neovim's lsp.log records everything on stderr as [ERROR]. stderr keeps what comes
    # before initialize (and DEBUG); --log-file keeps everything.
    from dlm.lsp.pygls_protocol import ClientLogHandler, NotSentToClient

    to_client = ClientLogHandler(server, fallback=None if args.log_file else handler)
    to_client.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root.addHandler(to_client)
    if not args.log_file:
        handler.addFilter(NotSentToClient(to_client))
    if server.command_line_engine:
        # else `initialize` starts it, once it knows whether the user's settings name a hosted engine
        # (docs/engines.md): the embedded model is not loaded for a user who asked for another
        server.holder.start()
    if args.tcp:
        host, port = args.tcp
        server.start_tcp(host, port)
    else:
        server.start_io()
    leave(server)  # never returns: the serving process ends there


def leave(server) -> NoReturn:
    """The one way a serving process ends, whatever ended it (lsp.framing.Link): the client's
    `exit` (exit code 0 after `shutdown`, else 1: LSP spec), or the client going away (end of its
    input, a write to it that failed, its end of stdout closed; exit code 0), at any moment: while
    idle, while answers or notifications are written, while the model loads or the workspace is
    indexed. One INFO line says which; then the logs are flushed and the process leaves at once.

    At once (os._exit), because waiting for the interpreter's shutdown is wrong in each case: the
    loader thread may be inside torch (its import, or reading weights in C++), and tearing its
    thread state down under it aborts the process (SIGABRT, "terminate called without an active
    exception"); a thread still blocks in a read of stdin when the client closed only stdout, and
    the interpreter would join it (the executor's exit hook) forever; a prediction or the indexer
    would be waited for. Nothing of theirs needs saving: `shutdown` saved the index; without it the
    next start re-reads what changed.
    """
    link = getattr(server, "link", None)
    code = link.exit_code if link is not None else None
    shut_down = bool(getattr(server.protocol, "_shutdown", False))
    if code is not None:
        message = "exit after shutdown" if shut_down else "exit without shutdown (code 1: LSP specification)"
    else:
        code = 0
        message = (link.ended if link is not None else None) or "the client went away"
        if not shut_down:
            message += " without shutdown"
    if server.holder.loading():
        message += "; the model is still loading: not waiting for it"
    log = logging.getLogger(__name__)
    log.info("%s; exiting with code %d", message, code)
    if not shut_down:
        _stop_children()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the client closed it, or `exit` did: nothing is left to say there
            pass
    os._exit(code)


def _stop_children() -> None:
    """The git children of the edit memory (their process groups), which `shutdown` stops: os._exit
    skips the atexit hook that would kill them (on Linux PDEATHSIG kills them anyway)."""
    git_read = sys.modules.get("dlm.coder_model.edit_memory.git_read")
    if git_read is not None:
        try:
            git_read.kill_all()
        except Exception:  # leaving goes on; their deadline ends them
            logging.getLogger(__name__).debug("could not stop the git children", exc_info=True)
