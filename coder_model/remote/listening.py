"""The listening side of `dlm-lsp serve` (plain and on Ray) and `dlm-lsp http`: the address,
token, TLS and limits they are configured with, the line that announces the address, and the
run of a server until it is stopped."""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
import time

DEFAULT_PORT = 7341
# What `dlm-lsp serve` (and `dlm-lsp http`) print on stderr once bound, before the address;
# read_listening_address finds a port-0 server's address by it: keep the format.
LISTENING = "listening on "


def read_listening_address(stream, timeout_s: float) -> str | None:
    """The address a starting `dlm-lsp serve` ("HOST:PORT") or `dlm-lsp http` (its URL) prints
    on stderr, read line by line from `stream` (the process's stderr pipe, text mode); None when
    the stream ends first or `timeout_s` has passed (checked between lines)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            return None
        if LISTENING in line:
            return line.split(LISTENING, 1)[1].split()[0]
    return None


def build_ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not (cert and key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS certificate {cert!r} / key {key!r}: {exc}; check both are PEM "
                         "files and the key matches the certificate") from None
    return ctx


def network_config(args: argparse.Namespace):
    """(host, port, token, ssl_context, limits) of the listening side, shared by plain serve and
    `--engine ray`; ValueError (AuthConfigError is one) says what is wrong."""
    from dlm.coder_model.remote import auth
    from dlm.coder_model.remote.client import parse_host_port
    from dlm.coder_model.remote.wire import Limits

    host, port = parse_host_port(args.listen, DEFAULT_PORT)
    token = auth.load_token(args.token_file)
    auth.check_bind_allowed(host, token)
    ssl_context = build_ssl_context(args.tls_cert, args.tls_key)
    limits = Limits(max_frame_bytes=args.max_frame_bytes, max_inflight=args.max_inflight,
                    max_inflight_bytes=args.max_inflight_bytes,
                    handshake_timeout_s=args.handshake_timeout, idle_timeout_s=args.idle_timeout)
    if args.max_connections < 1:
        raise ValueError(f"--max-connections {args.max_connections}: use at least 1")
    return host, port, token, ssl_context, limits


def serve_until_stopped(server, host: str, port: int, described: str, stop_on_sigterm: bool = False) -> int:
    """Runs `server` (a tcp_server.RemoteServer) until Ctrl-C, or SIGTERM with `stop_on_sigterm`
    (a service manager's stop), printing the listening line with `described` once bound: 0 when
    it stopped, 1 when it could not listen."""

    async def main() -> None:
        bound = await server.start()
        # read_listening_address (tests, `dlm-lsp bench --remote`) finds a port-0 server by this line
        print(f"dlm-lsp serve: {LISTENING}{host}:{bound} ({described})", file=sys.stderr, flush=True)
        if stop_on_sigterm:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        try:
            await server.serve_forever()
        except asyncio.CancelledError:
            if not stop_on_sigterm:
                raise
        finally:
            await server.aclose()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"dlm-lsp serve: cannot listen on {host}:{port}: {exc.strerror or exc}; pick another port or "
              "stop the process using it", file=sys.stderr)
        return 1
    return 0
