"""Server robustness and scheduling on loopback, with the fake step backend.

The fake backend's result is a fixed function of the prompt: these tests are
about the protocol, limits and scheduling, never about model output.
"""

from __future__ import annotations

import socket
import threading
import time

import msgpack
import pytest
from dlm.coder_model.remote import auth
from dlm.coder_model.remote.batching import BatchScheduler, Request
from dlm.coder_model.remote.client import RemoteEngine
from dlm.coder_model.remote.wire import (
    HEADER,
    PARAM_CAPS,
    PROTOCOL_VERSION,
    Limits,
    encode_frame,
    predict_message,
)
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from remote_fakes import FakeBackend, fake_text, start_fake_server, wait_until

pytestmark = pytest.mark.timeout(120)

LIMITS = Limits(max_frame_bytes=4096, max_inflight=4, max_inflight_bytes=6000, handshake_timeout_s=0.5,
                frame_timeout_s=0.5, idle_timeout_s=30.0)


def prompt(i: int = 0, path: str = "a.py") -> Prompt:
    return Prompt(prefix="def f():\n", region=f"    return {i}", cursor=4, suffix="\n", path=path)


# --------------------------------------------------------------- raw client


class Raw:
    """A hand-driven client socket, to send what a real client never would."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def recv_frame(self) -> dict | None:
        """The next frame, or None at EOF."""
        while True:
            if len(self.buf) >= 4:
                (n,) = HEADER.unpack(self.buf[:4])
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    return msgpack.unpackb(body, raw=False)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def hello(self, token: bytes | None = None, version: int = PROTOCOL_VERSION, client: str | None = None) -> dict:
        challenge = self.recv_frame()
        assert challenge["t"] == "hello" and challenge["stage"] == "challenge"
        cn = auth.make_nonce()
        proof = auth.client_proof(token, challenge["nonce"], cn) if token else None
        msg = {"t": "hello", "id": 0, "stage": "response", "v": version, "nonce": cn, "proof": proof}
        if client is not None:
            msg["client"] = client
        self.send(msg)
        return self.recv_frame()

    def send(self, msg: dict) -> None:
        self.sock.sendall(encode_frame(msg))

    def expect_closed_with(self, code: str) -> dict:
        """Read until EOF; the last frame must be a connection-level error with `code`."""
        frames = []
        while (f := self.recv_frame()) is not None:
            frames.append(f)
        assert frames, "server closed without an error frame"
        err = frames[-1]
        assert err["t"] == "error" and err["id"] == 0 and err["code"] == code, err
        assert err["message"]
        return err

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def server():
    srv = start_fake_server(step_s=0.001, limits=LIMITS)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bystander(server):
    """A well-behaved client that must keep being served while others misbehave."""
    eng = RemoteEngine("127.0.0.1", server.port)
    assert eng.wait_connected(10)
    yield eng
    eng.close()


def assert_still_served(eng: RemoteEngine, i: int) -> None:
    pred = eng.predict(prompt(i), SamplerParams(steps=2), CancelToken())
    assert not pred.cancelled and pred.text == fake_text(prompt(i))
    assert eng.connects == 1, "the well-behaved client was disconnected"


# ------------------------------------------------------------- misbehaviour


def test_malformed_msgpack_closes_only_that_connection(server, bystander):
    raw = Raw(server.port)
    assert raw.hello()["stage"] == "welcome"
    body = b"\xc1\xc1\xc1"
    raw.sock.sendall(HEADER.pack(len(body)) + body)
    raw.expect_closed_with("bad_frame")
    assert_still_served(bystander, 1)


def test_oversized_frame_is_refused_before_reading_it(server, bystander):
    raw = Raw(server.port)
    raw.hello()
    raw.sock.sendall(HEADER.pack(LIMITS.max_frame_bytes + 1))  # the body is never sent
    assert "exceeds the limit" in raw.expect_closed_with("frame_too_large")["message"]
    assert_still_served(bystander, 2)


def test_oversized_prompt_through_engine_returns_empty_and_keeps_connection(server, bystander):
    big = Prompt(prefix="x" * (2 * LIMITS.max_frame_bytes), region="", cursor=0, suffix="")
    pred = bystander.predict(big, SamplerParams(steps=2), CancelToken())
    assert pred.cancelled and pred.text == ""
    assert "frame limit" in bystander.status().message
    assert_still_served(bystander, 3)


def test_unknown_type_closes_connection(server, bystander):
    raw = Raw(server.port)
    raw.hello()
    raw.send({"t": "launch_missiles", "id": 3})
    raw.expect_closed_with("unknown_type")
    assert_still_served(bystander, 4)


def test_half_sent_frame_times_out(server, bystander):
    raw = Raw(server.port)
    raw.hello()
    frame = encode_frame(predict_message(1, prompt(), SamplerParams()))
    raw.sock.sendall(frame[: len(frame) // 2])
    # Raw's socket gives up after 5 s without data: the server must close it first (frame_timeout_s)
    assert "half-sent" in raw.expect_closed_with("timeout")["message"]
    assert_still_served(bystander, 5)


def test_silent_connection_is_dropped_after_handshake_timeout(server, bystander):
    before = server.server.active_connections
    raw = Raw(server.port)
    assert raw.recv_frame()["stage"] == "challenge"  # ... and then the client says nothing
    raw.expect_closed_with("timeout")
    wait_until(lambda: server.server.active_connections <= before, 5, 0.02)
    assert server.server.active_connections == before  # nothing held for it
    assert_still_served(bystander, 6)


def test_predict_before_hello_is_refused(server):
    raw = Raw(server.port)
    raw.recv_frame()
    raw.send(predict_message(1, prompt(), SamplerParams()))
    raw.expect_closed_with("protocol")


def test_version_mismatch(server):
    raw = Raw(server.port)
    err = raw.hello(version=PROTOCOL_VERSION + 1)
    assert err["t"] == "error" and err["code"] == "version_mismatch"
    assert "same dlm-lsp version" in err["message"]


def test_request_level_errors_keep_the_connection(server):
    raw = Raw(server.port)
    raw.hello()
    raw.send({"t": "predict", "id": 5, "prompt": {"prefix": "", "region": "ab", "cursor": 9, "suffix": ""}})
    err = raw.recv_frame()
    assert err == {"t": "error", "id": 5, "code": "bad_request", "message": err["message"]}
    raw.send(predict_message(6, Prompt("", "<reject>", 0, ""), SamplerParams()))  # backend refuses it
    err = raw.recv_frame()
    assert err["id"] == 6 and err["code"] == "bad_request" and "rejects" in err["message"]
    # more in flight than allowed: the extra one is refused, the others are answered
    n = LIMITS.max_inflight + 1
    for i in range(n):
        raw.send(predict_message(100 + i, prompt(i), SamplerParams(steps=50)))
    frames = [raw.recv_frame() for _ in range(n)]
    refused = [f for f in frames if f["t"] == "error"]
    assert [f["code"] for f in refused] == ["too_many_requests"]
    results = {f["id"]: f["text"] for f in frames if f["t"] == "result"}
    assert results == {100 + i: fake_text(prompt(i)) for i in range(n) if 100 + i != refused[0]["id"]}
    # a duplicate id while the first is in flight
    raw.send(predict_message(7, prompt(7), SamplerParams(steps=50)))
    raw.send(predict_message(7, prompt(8), SamplerParams(steps=1)))
    first, second = raw.recv_frame(), raw.recv_frame()
    assert first["code"] == "duplicate_id" and second["t"] == "result" and second["text"] == fake_text(prompt(7))
    raw.close()


# ----------------------------------------------------------------- auth


def test_wrong_token_is_refused(tmp_path):
    token = b"s3cret-token-0123456789"
    srv = start_fake_server(token=token, limits=LIMITS)
    try:
        raw = Raw(srv.port)
        assert raw.hello(token=b"wrong-token-0123456789")["code"] == "auth_failed"
        wrong = RemoteEngine("127.0.0.1", srv.port, token=b"wrong-token-0123456789", backoff_max=0.2,
                             request_timeout=3600)
        none = RemoteEngine("127.0.0.1", srv.port, backoff_max=0.2)
        good = RemoteEngine("127.0.0.1", srv.port, token=token)
        try:
            assert good.wait_connected(10)
            assert not wrong.wait_connected(1.0) and not none.wait_connected(0.1)
            st = wrong.status()
            assert st.state == "disconnected" and "wrong token" in st.message
            assert "requires a token" in none.status().message
            # not connected: an empty result without a request (wrong has request_timeout=3600,
            # so a predict that waited for the server would hang until the test's timeout)
            assert wrong.predict(prompt(), SamplerParams(), CancelToken()).cancelled
            assert wrong.connects == 0 and wrong.status().extra["in_flight"] == 0
            pred = good.predict(prompt(1), SamplerParams(steps=2), CancelToken())
            assert pred.text == fake_text(prompt(1))
        finally:
            for e in (wrong, none, good):
                e.close()
    finally:
        srv.stop()


def test_client_with_token_refuses_server_without_auth(server):
    eng = RemoteEngine("127.0.0.1", server.port, token=b"a-token-that-is-long-enough", backoff_max=0.2)
    try:
        assert not eng.wait_connected(1.0)
        assert "cannot prove" in eng.status().message
    finally:
        eng.close()


# ------------------------------------------------------ idle + reconnect


def test_idle_close_then_immediate_reconnect():
    limits = Limits(handshake_timeout_s=1.0, frame_timeout_s=1.0, idle_timeout_s=0.3)
    srv = start_fake_server(limits=limits)
    eng = RemoteEngine("127.0.0.1", srv.port, backoff_initial=0.05)
    try:
        assert eng.wait_connected(10)
        wait_until(lambda: eng.connects >= 2, poll_s=0.05)
        assert eng.connects >= 2  # the server closed the idle connection; the client came back
        assert eng.wait_connected(5)
        pred = eng.predict(prompt(2), SamplerParams(steps=2), CancelToken())
        assert pred.text == fake_text(prompt(2))
    finally:
        eng.close()
        srv.stop()


# ------------------------------------------------------------ scheduling


def _request(i: int, steps: int, sink: dict, owner: str = "conn1", region: str | None = None) -> Request:
    def done(pred, err):
        sink[i] = (pred, err)

    p = prompt(i) if region is None else Prompt(prefix="", region=region, cursor=0, suffix="")
    return Request(owner, i, p, SamplerParams(steps=steps), done, prepared=len(p.region))


def _after_step(backend: FakeBackend, n: int, action) -> None:
    """Run `action` as the backend's n-th batched step ends (as if it came during that step)."""
    original_step = backend.step

    def step(jobs):
        errors = original_step(jobs)
        if len(backend.batch_sizes) == n:
            action()
        return errors

    backend.step = step


def _run_until(sched: BatchScheduler, condition) -> None:
    sched.start()
    wait_until(condition)
    sched.stop()


def test_requests_join_and_leave_the_batch_between_steps():
    backend = FakeBackend(step_s=0.0)
    sched = BatchScheduler(backend, max_batch=8)
    results: dict = {}
    late = _request(3, 2, results)
    _after_step(backend, 2, lambda: sched.submit(late))  # a request arrives while others are mid-decode
    sched.submit(_request(1, 1, results))
    sched.submit(_request(2, 4, results))
    _run_until(sched, lambda: len(results) >= 3)
    assert {i: r[0].text for i, r in results.items()} == {i: fake_text(prompt(i)) for i in (1, 2, 3)}
    # step 1: {1, 2}; 1 leaves; step 2: {2}; 3 joins; steps 3-4: {2, 3}
    assert backend.batch_sizes == [2, 1, 2, 2]
    assert backend.released == 3
    assert sched.stats.forward_passes == 4 and sched.stats.request_steps == 7


def test_cancel_stops_a_request_within_one_step():
    backend = FakeBackend(step_s=0.0)
    sched = BatchScheduler(backend, max_batch=8)
    results: dict = {}
    victim = _request(1, 1000, results)
    _after_step(backend, 5, victim.cancel.cancel)  # arrives during step 5
    sched.submit(victim)
    sched.submit(_request(2, 10, results))
    _run_until(sched, lambda: len(results) >= 2)
    pred, err = results[1]
    assert err is None and pred.cancelled and pred.text == ""
    assert victim.steps_run == 5  # no step after the one during which it was cancelled
    assert results[2][0].text == fake_text(prompt(2))  # the other request was not disturbed
    assert backend.batch_sizes == [2] * 5 + [1] * 5
    assert sched.stats.cancelled == 1


def test_cancel_frame_stops_server_work():
    srv = start_fake_server(step_s=0.005, limits=LIMITS)
    eng = RemoteEngine("127.0.0.1", srv.port)
    try:
        assert eng.wait_connected(10)
        cancel = CancelToken()
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("p", eng.predict(prompt(), SamplerParams(steps=PARAM_CAPS["steps"]),
                                                                            cancel)))
        t.start()
        wait_until(lambda: srv.stats.request_steps >= 3, poll_s=0.005)
        cancel.cancel()
        t.join(5)
        assert out["p"].cancelled and out["p"].text == ""
        wait_until(lambda: srv.stats.cancelled >= 1, poll_s=0.005)
        assert srv.stats.cancelled == 1
        steps = srv.stats.request_steps
        time.sleep(0.2)  # ~40 steps' worth of time
        assert srv.stats.request_steps == steps < PARAM_CAPS["steps"]  # the server stopped stepping it
        assert srv.stats.completed == 0
        # the connection is still usable
        assert eng.predict(prompt(1), SamplerParams(steps=2), CancelToken()).text == fake_text(prompt(1))
    finally:
        eng.close()
        srv.stop()


def test_disconnected_client_cancels_its_requests():
    srv = start_fake_server(step_s=0.005, limits=LIMITS)
    try:
        raw = Raw(srv.port)
        raw.hello()
        raw.send(predict_message(1, prompt(), SamplerParams(steps=PARAM_CAPS["steps"])))
        wait_until(lambda: srv.stats.request_steps >= 2, poll_s=0.005)
        raw.close()
        wait_until(lambda: srv.stats.cancelled >= 1)
        assert srv.stats.cancelled == 1
    finally:
        srv.stop()


# ------------------------------------------------------ one client cannot hurt another


def _collect(raw: Raw, n: int) -> dict[int, dict]:
    frames = {}
    while len(frames) < n:
        f = raw.recv_frame()
        assert f is not None, f"connection closed after {len(frames)} of {n} answers"
        frames[f["id"]] = f
    return frames


def test_bad_requests_of_one_client_fail_only_themselves():
    """Client B's NaN temperature, 4096-slot block or broken decode once failed all 8 of A's requests."""
    srv = start_fake_server(step_s=0.002, limits=Limits(max_inflight=16))
    a, b = Raw(srv.port), Raw(srv.port)
    try:
        a.hello(), b.hello()
        for i in range(8):
            a.send(predict_message(1 + i, prompt(i), SamplerParams(steps=300)))
        wait_until(lambda: 8 in srv.backend.batch_sizes, poll_s=0.005)  # all of A's are mid-decode
        nan = predict_message(1, prompt(), SamplerParams(steps=5))
        nan["params"]["temperature"] = float("nan")
        b.send(nan)
        huge = predict_message(2, prompt(), SamplerParams(steps=5))
        huge["params"]["block_len"] = 4096
        b.send(huge)
        for rid, region in ((3, "<explode>"), (4, "<explode-alone>")):  # the batched pass / its own decode fails
            b.send(predict_message(rid, Prompt("", region, 0, "", path="b.py"), SamplerParams(steps=5)))
        got_b = _collect(b, 4)
        assert {rid: (f["t"], f["code"]) for rid, f in got_b.items()} == {
            1: ("error", "bad_request"), 2: ("error", "bad_request"),
            3: ("error", "server_error"), 4: ("error", "server_error")}
        assert "temperature" in got_b[1]["message"] and "block_len" in got_b[2]["message"]
        got_a = _collect(a, 8)
        assert {rid: (f["t"], f.get("text")) for rid, f in got_a.items()} == {
            1 + i: ("result", fake_text(prompt(i))) for i in range(8)}
        assert srv.stats.failed == 2 and srv.stats.completed == 8
        assert max(srv.backend.batch_sizes) >= 9  # B's broken requests really shared steps with A's
    finally:
        a.close(), b.close()
        srv.stop()


def test_slow_prompt_preparation_does_not_stall_other_clients(server, bystander):
    """16 prompts of 3.9 MB once held another client's 0.17 s request for 79 s: preparation
    (cutting, tokenizing) runs on worker threads, so the scheduler keeps stepping others."""
    backend = server.backend
    backend.release_prepare.clear()
    backend.prepare_started.clear()
    raw = Raw(server.port)
    try:
        raw.hello()
        raw.send(predict_message(1, Prompt("", "<slow-prepare>", 0, "", path="big.py"), SamplerParams(steps=2)))
        assert backend.prepare_started.wait(10)
        # the slow preparation is blocked right now; another client is served meanwhile
        assert_still_served(bystander, 40)
        assert not backend.release_prepare.is_set()
        backend.release_prepare.set()
        f = raw.recv_frame()
        assert f["t"] == "result" and f["id"] == 1 and f["text"] == fake_text(Prompt("", "<slow-prepare>", 0, "",
                                                                                   path="big.py"))
        assert backend.prepare_threads and all(n.startswith("dlm-remote-prepare") for n in backend.prepare_threads)
    finally:
        backend.release_prepare.set()
        raw.close()


def test_prompt_bytes_in_flight_are_capped_per_connection(server, bystander):
    raw = Raw(server.port)
    try:
        raw.hello()
        big = Prompt(prefix="x" * 3500, region="y", cursor=0, suffix="")
        raw.send(predict_message(1, big, SamplerParams(steps=200)))
        raw.send(predict_message(2, big, SamplerParams(steps=1)))  # 2 x 3.5 KB > max_inflight_bytes=6000
        refused = raw.recv_frame()
        assert refused["id"] == 2 and refused["code"] == "too_many_requests"
        assert "bytes" in refused["message"] and str(LIMITS.max_inflight_bytes) in refused["message"]
        assert raw.recv_frame()["id"] == 1  # the first is answered ...
        raw.send(predict_message(3, big, SamplerParams(steps=1)))  # ... which frees its bytes
        f = raw.recv_frame()
        assert f["t"] == "result" and f["id"] == 3 and f["text"] == fake_text(big)
    finally:
        raw.close()
    assert_still_served(bystander, 41)


def test_client_label_is_not_an_identity_and_not_logged(caplog):
    """The label a client sends in hello is its own choice: caches are keyed by the connection
    the server assigned, and a connection's caches are dropped when it closes."""
    caplog.set_level("DEBUG", logger="dlm.remote")
    srv = start_fake_server(limits=LIMITS)
    owners: list[str] = []
    original_begin = srv.backend.begin

    def begin(request):
        owners.append(request.owner)
        return original_begin(request)

    srv.backend.begin = begin
    try:
        for _ in range(2):  # two connections presenting the same label
            raw = Raw(srv.port)
            assert raw.hello(client="victim-label-1234")["stage"] == "welcome"
            raw.send(predict_message(1, prompt(), SamplerParams(steps=1)))
            assert raw.recv_frame()["t"] == "result"
            raw.close()
        assert len(owners) == 2 and owners[0] != owners[1] and "victim-label-1234" not in owners
        wait_until(lambda: len(srv.backend.forgotten) >= 2)
        assert srv.backend.forgotten == owners  # each connection's caches dropped when it closed
        assert caplog.records and "victim-label-1234" not in caplog.text
    finally:
        srv.stop()


def test_connection_cap_refuses_with_a_clear_error():
    srv = start_fake_server(limits=LIMITS, max_connections=2)
    engines = [RemoteEngine("127.0.0.1", srv.port) for _ in range(2)]
    try:
        assert all(e.wait_connected(10) for e in engines)
        raw = Raw(srv.port)
        err = raw.hello()
        assert err["t"] == "error" and err["code"] == "too_many_connections"
        assert "--max-connections" in err["message"] and "2 connections" in err["message"]
        assert raw.recv_frame() is None  # and the refused connection is closed
        assert srv.server.stats["refused_connections"] == 1
        assert_still_served(engines[0], 50)  # the held ones go on
        engines.pop().close()
        wait_until(lambda: srv.server.active_connections <= 1, poll_s=0.02)
        assert Raw(srv.port).hello()["stage"] == "welcome"  # a freed slot is usable again
    finally:
        for e in engines:
            e.close()
        srv.stop()


def test_welcome_announces_the_models_budget(server):
    welcome = Raw(server.port).hello()
    b = server.backend.budget
    assert welcome["budget"] == {"max_context": b.max_context, "max_history": b.max_history,
                                 "max_suffix": b.max_suffix}
    assert welcome["limits"]["max_inflight_bytes"] == LIMITS.max_inflight_bytes


def test_connections_still_in_their_handshake_are_capped_too():
    srv = start_fake_server(limits=Limits(handshake_timeout_s=30.0), max_connections=2)
    silent = [Raw(srv.port) for _ in range(2)]
    try:
        for raw in silent:
            assert raw.recv_frame()["stage"] == "challenge"  # ... and then they say nothing
        extra = Raw(srv.port)
        err = extra.recv_frame()
        assert err["t"] == "error" and err["code"] == "too_many_connections"
        assert extra.recv_frame() is None
    finally:
        for raw in silent:
            raw.close()
        srv.stop()
