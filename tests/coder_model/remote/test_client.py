"""RemoteEngine behaviour on loopback: no server, a killed server, many clients, TLS.

Uses the fake step backend (results are a fixed function of the prompt, so a
mismatched response is detectable); model behaviour is in test_remote_model.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dlm.coder_model.remote.client import RemoteEngine
from dlm.coder_model.remote.wire import PARAM_CAPS, Limits
from dlm.coder_model.types import CancelToken, Engine, Prompt, SamplerParams
from remote_fakes import fake_text, start_fake_server, wait_until

pytestmark = pytest.mark.timeout(180)
FAKES = Path(__file__).with_name("remote_fakes.py")


def prompt(i: int, path: str = "a.py") -> Prompt:
    return Prompt(prefix="x = 1\n", region=f"y = {i}", cursor=2, suffix="\n", path=path)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_engine_is_an_engine_and_returns_at_once_without_server():
    # request_timeout=3600: a predict that waited for a connection would hang until the test's timeout
    eng = RemoteEngine("127.0.0.1", _free_port(), backoff_initial=0.05, backoff_max=0.2, request_timeout=3600)
    try:
        assert isinstance(eng, Engine)
        pred = eng.predict(prompt(1), SamplerParams(), CancelToken())
        assert pred.cancelled and pred.text == ""
        assert eng.connects == 0 and eng.status().extra["in_flight"] == 0  # returned before any connection
        wait_until(lambda: eng.status().state == "disconnected", 5, 0.02)
        st = eng.status()
        assert st.state == "disconnected" and "refused" in st.message.lower()
    finally:
        eng.close()


def _spawn_fake_server(port: int, step_s: float) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(FAKES), str(port), str(step_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("listening on"), f"fake server did not start: {line!r}"
    return proc


def test_killed_server_gives_empty_result_then_reconnect():
    port = _free_port()
    proc = _spawn_fake_server(port, 0.01)
    eng = RemoteEngine("127.0.0.1", port, backoff_initial=0.05, backoff_max=0.3)
    proc2 = None
    try:
        assert eng.wait_connected(20)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault(
            "p", eng.predict(prompt(1), SamplerParams(steps=PARAM_CAPS["steps"]), CancelToken())))
        t.start()
        time.sleep(0.3)  # the request is being stepped on the server
        assert t.is_alive()
        proc.kill()
        proc.wait(10)
        t.join(10)
        assert not t.is_alive(), "predict blocked after the server died"
        assert out["p"].cancelled and out["p"].text == ""
        wait_until(lambda: not eng.connected, 5, 0.02)
        assert eng.status().state == "disconnected"
        assert eng.predict(prompt(2), SamplerParams(steps=1), CancelToken()).cancelled  # empty, at once

        proc2 = _spawn_fake_server(port, 0.001)  # the server comes back on the same port
        assert eng.wait_connected(20)
        assert eng.reconnects == 1 and eng.status().state == "ready"
        pred = eng.predict(prompt(3), SamplerParams(steps=2), CancelToken())
        assert not pred.cancelled and pred.text == fake_text(prompt(3))
    finally:
        eng.close()
        for p in (proc, proc2):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


def test_32_clients_x_50_requests_no_lost_or_mismatched_response():
    n_clients, n_requests, threads_per_client = 32, 50, 2
    srv = start_fake_server(step_s=0.001, limits=Limits(max_inflight=8), max_batch=32)
    engines = [RemoteEngine("127.0.0.1", srv.port) for _ in range(n_clients)]
    failures: list[str] = []
    count = [0]
    lock = threading.Lock()

    def worker(c: int, w: int) -> None:
        eng = engines[c]
        for i in range(w, n_requests, threads_per_client):
            p = Prompt(prefix="", region=f"client {c} request {i}", cursor=0, suffix="", path=f"c{c}/f{i % 3}.py")
            pred = eng.predict(p, SamplerParams(steps=1 + (c + i) % 4), CancelToken())
            with lock:
                count[0] += 1
                if pred.cancelled or pred.text != fake_text(p):
                    failures.append(f"client {c} request {i}: got {pred.text!r} cancelled={pred.cancelled}")

    try:
        assert all(e.wait_connected(20) for e in engines)
        threads = [threading.Thread(target=worker, args=(c, w)) for c in range(n_clients)
                   for w in range(threads_per_client)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        assert count[0] == n_clients * n_requests
        assert srv.stats.completed == n_clients * n_requests
        assert max(srv.backend.batch_sizes) > 1  # requests of different clients shared steps
        assert all(e.connects == 1 for e in engines)
    finally:
        for e in engines:
            e.close()
        srv.stop()


# ------------------------------------------------------------------ TLS


def _self_signed(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    try:
        from cryptography import x509
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("neither the cryptography package nor the openssl command is available to make a cert")
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
        return str(cert), str(key)
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                     x509.DNSName("localhost")]), critical=False)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return str(cert), str(key)


def test_tls(tmp_path):
    from dlm.coder_model.remote.listening import build_ssl_context

    cert, key = _self_signed(tmp_path)
    token = b"tls-and-token-0123456789"
    srv = start_fake_server(token=token, ssl_context=build_ssl_context(cert, key),
                            limits=Limits(handshake_timeout_s=1.0))
    good = RemoteEngine("127.0.0.1", srv.port, token=token, tls=True, cafile=cert)
    untrusted = RemoteEngine("127.0.0.1", srv.port, token=token, tls=True, backoff_max=0.3)  # system CAs
    plain = RemoteEngine("127.0.0.1", srv.port, token=token, backoff_max=0.3)
    try:
        assert good.wait_connected(20)
        pred = good.predict(prompt(4), SamplerParams(steps=2), CancelToken())
        assert pred.text == fake_text(prompt(4)) and good.status().extra["tls"] is True
        assert not untrusted.wait_connected(1.5)
        assert "certificate" in untrusted.status().message.lower()
        assert not plain.wait_connected(1.5)  # a plaintext client never gets a hello from a TLS port
        assert plain.status().state == "disconnected"
    finally:
        for e in (good, untrusted, plain):
            e.close()
        srv.stop()


def test_tls_options_validation(tmp_path):
    from dlm.coder_model.remote.listening import build_ssl_context

    assert build_ssl_context(None, None) is None
    with pytest.raises(ValueError, match="both"):
        build_ssl_context("cert.pem", None)
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a cert")
    with pytest.raises(ValueError, match="PEM"):
        build_ssl_context(str(bogus), str(bogus))
