"""`dlm-lsp serve`: run the model on this (GPU) machine for remote editors.

    dlm-lsp serve --listen 0.0.0.0:7341 --model DIR --token-file ~/.config/dlm/token \\
                  [--tls-cert cert.pem --tls-key key.pem]

Binding anything but a loopback address requires a token (auth.py).
"""

from __future__ import annotations

import argparse
import logging
import sys

from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.remote.listening import DEFAULT_PORT, network_config, serve_until_stopped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="HOST:PORT",
                        help=f"address to listen on (default 127.0.0.1:{DEFAULT_PORT}; port 0 picks a free one)")
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="checkpoint directory (default: the embedded model)")
    add_device_argument(parser)
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file holding the shared secret token (default: $DLM_TOKEN); required to listen "
                        "on a non-loopback address")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="TLS certificate chain (enables TLS)")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="TLS private key")
    parser.add_argument("--max-batch", type=int, default=32,
                        help="requests whose denoising steps share one forward pass (default 32)")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="masked slots of one forward pass (default 4096 on a GPU, 0 on a CPU: one request "
                        "per pass, as a CPU gains nothing from batching)")
    parser.add_argument("--max-connection-slots", type=int, default=2048,
                        help="masked slots one connection may have in the batch at once; its further requests "
                        "wait their turn (default 2048)")
    parser.add_argument("--max-inflight", type=int, default=64, help="requests in flight per connection")
    parser.add_argument("--max-frame-bytes", type=int, default=4 << 20, help="largest accepted frame")
    parser.add_argument("--max-inflight-bytes", type=int, default=16 << 20,
                        help="frame bytes of the requests in flight per connection (default 16 MiB)")
    parser.add_argument("--max-connections", type=int, default=256,
                        help="connections held at once; more are refused with an error (default 256)")
    parser.add_argument("--max-caches", type=int, default=64,
                        help="prefix KV caches kept, one per (connection, document), least recently used evicted")
    parser.add_argument("--handshake-timeout", type=float, default=5.0, help="seconds to authenticate")
    parser.add_argument("--idle-timeout", type=float, default=600.0,
                        help="seconds without a frame before an idle connection is closed")
    from dlm.coder_model.remote import ray_options

    ray_options.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR, any case (default INFO)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "engine", "builtin") == "ray":
        return _run_ray(args)
    from dlm.coder_model.remote.tcp_server import RemoteServer, ServerOptions

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    # Every configuration check runs before the (slow) model load, so mistakes fail in a second.
    try:
        host, port, token, ssl_context, limits = network_config(args)
        if args.max_batch_tokens is not None and args.max_batch_tokens < 0:
            raise ValueError(f"--max-batch-tokens {args.max_batch_tokens}: use 0 or more")
        if args.max_connection_slots < 1:
            raise ValueError(f"--max-connection-slots {args.max_connection_slots}: use at least 1")
    except ValueError as exc:  # AuthConfigError is a ValueError
        print(f"dlm-lsp serve: {exc}", file=sys.stderr)
        return 2

    from dlm.coder_model.remote.backend import load_scheduler

    try:
        scheduler, name, device = load_scheduler(args.model, args.device, max_batch=args.max_batch,
                                                 max_caches=args.max_caches, max_batch_tokens=args.max_batch_tokens,
                                                 max_owner_slots=args.max_connection_slots)
    except (OSError, ValueError) as exc:
        print(f"dlm-lsp serve: cannot load the model: {exc}", file=sys.stderr)
        return 1
    options = ServerOptions(host=host, port=port, token=token, ssl_context=ssl_context, limits=limits,
                            model_name=name, device=device, max_connections=args.max_connections)
    described = (f"model {name} on {device}, auth {'token' if token else 'none (loopback only)'}, "
                 f"tls {'on' if ssl_context else 'off'}")
    return serve_until_stopped(RemoteServer(scheduler, options), host, port, described)


def _run_ray(args: argparse.Namespace) -> int:
    from dlm.coder_model.remote import ray_options

    try:
        ray_options.check_arguments(args)
    except ValueError as exc:
        print(f"dlm-lsp serve: {exc}", file=sys.stderr)
        return 2
    try:
        from dlm.coder_model.remote import ray_serve
    except ImportError as exc:
        print(f"dlm-lsp serve: {ray_options.RAY_MISSING} ({exc})", file=sys.stderr)
        return 2
    return ray_serve.run(args)


def main(argv: list[str] | None = None) -> int:
    """`python -m dlm.coder_model.remote.remote_cli ...` = `dlm-lsp serve ...`, for drivers of the
    model side (drivers/bench) that must not start the editor side's CLI."""
    parser = argparse.ArgumentParser(prog="dlm-lsp serve", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
