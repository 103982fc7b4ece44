"""Shared-token authentication for remote mode.

Both ends hold the same secret token (a file, or the DLM_TOKEN environment
variable). The token never crosses the wire: the server sends a random
challenge nonce, the client answers with HMAC-SHA256(token, "client" |
server nonce | client nonce) and its own nonce, and the server proves it
knows the token too with HMAC(token, "server" | ...) so a client cannot be
fooled by an impostor that merely accepts everything. Nonces are fresh per
connection, so a recorded handshake cannot be replayed. The token does not
encrypt the traffic: use TLS (--tls-cert/--tls-key) on untrusted networks.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
import sys

TOKEN_ENV = "DLM_TOKEN"
NONCE_BYTES = 32
MIN_TOKEN_CHARS = 16
_DOMAIN = b"dlm-lsp/remote/1 "


class AuthConfigError(ValueError):
    """The token or bind address configuration is unusable; the message says how to fix it."""


def load_token(token_file: str | None = None, *, env: dict[str, str] | None = None) -> bytes | None:
    """The token from `token_file` if given, else from $DLM_TOKEN, else None.

    Surrounding whitespace is stripped (files usually end with a newline).
    """
    env = os.environ if env is None else env
    if token_file:
        try:
            with open(token_file, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise AuthConfigError(f"cannot read token file {token_file!r}: {exc.strerror}; check the path") from None
        token = raw.strip()
        if not token:
            raise AuthConfigError(
                f"token file {token_file!r} is empty; write a secret into it, e.g. "
                f"`python -c 'import secrets; print(secrets.token_hex(32))' > {token_file}`"
            )
        _warn_if_readable_by_others(token_file)
    else:
        value = env.get(TOKEN_ENV, "").strip()
        if not value:
            return None
        token = value.encode("utf-8")
    if len(token) < MIN_TOKEN_CHARS:
        raise AuthConfigError(
            f"the token has {len(token)} characters; use at least {MIN_TOKEN_CHARS} random ones, e.g. "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return token


def _warn_if_readable_by_others(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if os.name == "posix" and mode & (stat.S_IRGRP | stat.S_IROTH):
        print(f"dlm-lsp: warning: token file {path} is readable by other users; run `chmod 600 {path}`",
              file=sys.stderr)


def make_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def client_proof(token: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(token, _DOMAIN + b"client " + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(token: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(token, _DOMAIN + b"server " + server_nonce + client_nonce, hashlib.sha256).digest()


def proofs_match(expected: bytes, got: object) -> bool:
    return isinstance(got, bytes) and hmac.compare_digest(expected, got)


def is_loopback_host(host: str) -> bool:
    """True if every address `host` resolves to is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_bind_allowed(host: str, token: bytes | None) -> None:
    """Refuse to expose an unauthenticated model server beyond this machine."""
    if token is None and not is_loopback_host(host):
        raise AuthConfigError(
            f"refusing to listen on {host!r} (not a loopback address) without a token: anyone who can reach "
            f"the port could use the model. Pass --token-file FILE (or set {TOKEN_ENV}) on the server and the "
            "same token on each client, or listen on 127.0.0.1 and use an SSH tunnel"
        )
