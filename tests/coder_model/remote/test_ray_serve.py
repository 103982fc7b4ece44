"""`dlm-lsp serve --engine ray`: our ingress in front of Ray Serve replicas of the tiny model.

One local Ray cluster for the module (Ray's start-up takes seconds), 2 CPU replicas behind
one address, clients through RemoteEngine, as an editor would connect. Skipped where Ray
Serve is not installed (CI does not install the `ray` extra).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install -e '.[ray]'): the --engine ray "
                          "tests need it")
ray_serve = pytest.importorskip("dlm.coder_model.remote.ray_serve",
                                reason="ray is installed without Serve (pip install 'ray[serve]')")
from dlm.coder_model.remote.client import RemoteEngine
from dlm.coder_model.remote.tcp_server import ServerOptions, ServerThread
from dlm.coder_model.types import CancelToken, Prompt, SamplerParams
from ray import serve

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

TOKEN = b"ray-ingress-token-0123456789"
PARAMS = SamplerParams(steps=4, block_len=4, max_blocks=1, threshold=0.5)
SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x):\n"


def keystrokes(n: int, path: str) -> list[Prompt]:
    line = "        self.x = x + 1 + y + z"
    return [Prompt(prefix=SOURCE, region=line[: 8 + k % 20], cursor=8 + k % 20, suffix="\n\nprint(1)\n",
                   language="python", path=path) for k in range(n)]


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint):
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    config = ray_serve.ReplicaConfig(model_dir=tiny_checkpoint, device="cpu", replicas=2, cpus=0.5, threads=1)
    forwarder, deployment = ray_serve.start_forwarder(config)
    info = deployment.describe()
    srv = ServerThread(forwarder, ServerOptions(port=0, token=TOKEN, model_name=info["model"],
                                                device=info["device"])).start()
    yield srv, forwarder, deployment
    srv.stop()
    serve.shutdown()
    ray.shutdown()


def engine(srv, **kw) -> RemoteEngine:
    eng = RemoteEngine("127.0.0.1", srv.port, token=TOKEN, request_timeout=60, **kw)
    assert eng.wait_connected(30), eng.status().message
    return eng


@contextlib.contextmanager
def connected(srv, n: int) -> Iterator[list[RemoteEngine]]:
    """`n` engines connected to the ingress, closed after."""
    engines = [engine(srv) for _ in range(n)]
    try:
        yield engines
    finally:
        for e in engines:
            e.close()


def running_replicas() -> list[str]:
    """Names of the replica actors alive now."""
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and f"#{ray_serve.DEPLOYMENT_NAME}#" in a["name"]]


def wait_replicas(n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        dep = serve.status().applications[ray_serve.APP_NAME].deployments[ray_serve.DEPLOYMENT_NAME]
        if dep.replica_states.get("RUNNING", 0) == n and len(dep.replica_states) == 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"{n} replicas not running after {timeout} s: {serve.status()}")


class Typist(threading.Thread):
    """One editor typing: one request after another, as the LSP sends them; records every answer
    and any exception (the Engine contract: predict never raises)."""

    def __init__(self, eng: RemoteEngine, prompts: list[Prompt], pause_s: float = 0.0):
        super().__init__(daemon=True)
        self.eng, self.prompts, self.pause_s = eng, prompts, pause_s
        self.stop = threading.Event()  # set: the editor stops typing after the request in flight
        self.preds: list = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        for p in self.prompts:
            if self.stop.is_set():
                break
            try:
                self.preds.append(self.eng.predict(p, PARAMS, CancelToken()))
            except BaseException as exc:  # noqa: BLE001 - recorded: the test fails on any
                self.errors.append(exc)
            time.sleep(self.pause_s)

    @property
    def empties(self) -> int:
        return sum(1 for p in self.preds if p.cancelled)


def start_typing(engines: list[RemoteEngine], n: int, name: str, pause_s: float = 0.0) -> list[Typist]:
    """One Typist per engine, started: `n` keystrokes each, into a file `{name}{i}.py` of its own."""
    typists = [Typist(e, keystrokes(n, f"{name}{i}.py"), pause_s=pause_s) for i, e in enumerate(engines)]
    for t in typists:
        t.start()
    return typists


def test_the_ingress_reaches_the_replicas_over_grpc(cluster):
    _srv, forwarder, _deployment = cluster
    response = forwarder.handle.describe.remote()
    assert response.by_reference is False  # Serve's gRPC data path, not object references
    assert response.result(timeout_s=60)["budget"]["max_context"] > 0


def test_a_serve_without_the_grpc_choice_keeps_its_default_path():
    class OldHandle:  # the shape of a Ray Serve whose options() has no _by_reference
        def options(self, *, method_name=None, multiplexed_model_id=None):
            raise AssertionError("options() must not be called with an argument it does not take")

    old = OldHandle()
    assert ray_serve.grpc_handle(old) is old


def test_many_clients_answered_with_cache_affinity(cluster):
    srv, forwarder, _ = cluster
    with connected(srv, 4) as engines:
        typists = start_typing(engines, 8, "doc")
        for t in typists:
            t.join(300)
        for t in typists:
            assert not t.errors and len(t.preds) == 8
            assert all(not p.cancelled and p.steps > 0 for p in t.preds)
            # the last keystrokes reuse the prefix cache: they went to the replica holding it
            assert t.preds[-1].cached_tokens > 0 and t.preds[-2].cached_tokens > 0
        assert forwarder.stats.failed == 0
        assert len(forwarder.routes) == 4  # one per connection
        used = {r for counts in forwarder.routes.values() for r in counts}
        assert len(used) == 2, f"4 connections all went to one of the 2 replicas: {dict(forwarder.routes)}"


def test_cancel_reaches_the_replica(cluster):
    srv, forwarder, _ = cluster
    eng = engine(srv)
    try:
        assert not eng.predict(keystrokes(1, "warm.py")[0], PARAMS, CancelToken()).cancelled  # warm the route
        owner = next(o for o, c in forwarder.routes.items() if c)
        time.sleep(1.0)  # the replica's id reaches the router in its 0.1 s pushes; until then any replica may answer
        # 16 x 64 = 1,024 steps if not stopped, planned to a 2 s deadline (without one the replica
        # refuses it as too long: it checks requests by its measured step times)
        long = SamplerParams(steps=16, block_len=16, max_blocks=64, threshold=1.0)
        cancel = CancelToken()
        threading.Timer(0.15, cancel.cancel).start()
        pred = eng.predict(keystrokes(2, "warm.py")[1], long, cancel, deadline=time.monotonic() + 2.0)
        assert pred.cancelled and not pred.late
        end, ends = time.monotonic() + 30, []
        while time.monotonic() < end and not ends:
            stats = forwarder._owner_handle(owner).stats.remote().result(timeout_s=30)
            ends = [e for e in stats["cancelled_ends"] if e["owner"] == f"{forwarder.session}-{owner}"]
            time.sleep(0.1)
        # the replica's scheduler stopped it on the cancel (a deadline or a finish gives cancelled=False)
        assert ends and ends[0]["cancelled"] and not ends[0]["error"], stats["cancelled_ends"]
        assert ends[0]["steps"] < 1024
        assert forwarder.stats.cancelled >= 1  # and the ingress answered it cancelled
    finally:
        eng.close()


def test_replica_killed_mid_typing(cluster):
    srv, forwarder, _ = cluster
    with connected(srv, 3) as engines:
        typists = start_typing(engines, 30, "kill", pause_s=0.02)
        while min(len(t.preds) for t in typists) < 5:
            time.sleep(0.05)
        # the replica that client 0 uses (its caches are there)
        victim_id = forwarder.routes[next(iter(forwarder.routes))].most_common(1)[0][0]
        victim = next(name for name in running_replicas() if name.endswith(victim_id))
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        for t in typists:
            t.join(300)
        for t in typists:
            assert not t.errors, t.errors  # the Engine contract: predict never raises
            assert len(t.preds) == 30
            assert t.empties <= 1, f"{t.empties} empty answers: more than the one request in flight"
            assert not t.preds[-1].cancelled and not t.preds[-2].cancelled  # recovered
        assert all(e.reconnects == 0 for e in engines)  # the connection to the ingress stayed up
        # forwarder.replica_lost counts the requests the kill caught in flight (retried on the other
        # replica); it may be 0 when the kill fell between requests or Ray's router retried by itself
        wait_replicas(2)  # Serve replaced the replica


def test_scale_from_1_to_2_under_load(cluster):
    srv, forwarder, deployment = cluster
    deployment.scale(1)
    wait_replicas(1)
    with connected(srv, 3) as engines:
        typists = start_typing(engines, 25, "scale", pause_s=0.05)
        while min(len(t.preds) for t in typists) < 3:
            time.sleep(0.05)
        deployment.scale(2)
        wait_replicas(2)
        for t in typists:
            t.join(300)
        for t in typists:
            assert not t.errors and len(t.preds) == 25
            assert t.empties == 0  # scaling up loses nothing
        # new connections spread over both replicas
        with connected(srv, 4) as late:
            owners_before = set(forwarder.routes)
            for i, e in enumerate(late):
                for p in keystrokes(2, f"late{i}.py"):
                    assert not e.predict(p, PARAMS, CancelToken()).cancelled
            fresh = {o: c for o, c in forwarder.routes.items() if o not in owners_before}
            assert len({r for c in fresh.values() for r in c}) == 2, fresh


def test_autoscale_adds_a_replica_under_load_and_removes_it_when_idle(cluster):
    srv, _forwarder, deployment = cluster
    deployment.scale(1)
    wait_replicas(1)
    # sized for one request per replica: four editors typing without pause are load for two
    deployment.autoscale(1, 2, target_ongoing=1, downscale_delay_s=2.0)
    try:
        with connected(srv, 4) as engines:
            typists = start_typing(engines, 100_000, "auto")
            wait_replicas(2, timeout=180)  # added by Ray Serve itself: nobody called scale
            for t in typists:
                t.stop.set()
            for t in typists:
                t.join(120)
            for t in typists:
                assert not t.is_alive() and not t.errors and t.preds
                assert t.empties == 0  # scaling up under load lost no request
            wait_replicas(1, timeout=180)  # idle: back to the minimum
            for i, e in enumerate(engines):  # and still answering, on the replica that stayed
                assert not e.predict(keystrokes(1, f"after{i}.py")[0], PARAMS, CancelToken()).cancelled
    finally:
        deployment.scale(2)
        wait_replicas(2)


def test_bad_token_refused_at_the_ingress(cluster):
    srv, forwarder, _ = cluster
    admitted = forwarder.stats.admitted
    wrong = RemoteEngine("127.0.0.1", srv.port, token=b"not-the-token-0123456789", backoff_max=0.2)
    none = RemoteEngine("127.0.0.1", srv.port, backoff_max=0.2)
    try:
        assert not wrong.wait_connected(1.5) and not none.wait_connected(0.2)
        assert "wrong token" in wrong.status().message
        assert "requires a token" in none.status().message
        assert wrong.predict(keystrokes(1, "x.py")[0], PARAMS, CancelToken()).cancelled  # empty, no raise
        assert forwarder.stats.admitted == admitted  # nothing reached a replica
    finally:
        wrong.close()
        none.close()


def test_a_second_ingress_attaches_to_the_replicas_and_leaves_them_running(cluster):
    # Two ingresses (two boxes behind a load balancer): `serve --engine ray --attach` deploys
    # nothing, answers from the same replicas, and stopping it (SIGTERM, as a service manager does)
    # leaves them running for the first.
    import subprocess
    import sys

    from dlm.coder_model.remote.client import parse_host_port
    from dlm.coder_model.remote.listening import read_listening_address

    srv, _, deployment = cluster
    with pytest.raises(LookupError, match="without --attach"):
        ray_serve.attach_forwarder(app_name="no-such-app")
    assert ray_serve.attach_forwarder().description["model"] == deployment.describe()["model"]
    cmd = [sys.executable, "-m", "dlm.coder_model.remote.remote_cli", "--engine", "ray", "--attach",
           "--ray-address", ray.get_runtime_context().gcs_address, "--listen", "127.0.0.1:0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        address = read_listening_address(proc.stderr, 120)
        assert address is not None, "the attached ingress did not start"
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        eng = RemoteEngine("127.0.0.1", parse_host_port(address)[1], request_timeout=60)
        try:
            assert eng.wait_connected(30), eng.status().message
            pred = eng.predict(keystrokes(1, "second.py")[0], PARAMS, CancelToken())
            assert not pred.cancelled and pred.steps > 0
        finally:
            eng.close()
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
    assert serve.status().applications[ray_serve.APP_NAME].deployments[ray_serve.DEPLOYMENT_NAME]
    eng = engine(srv)
    try:
        pred = eng.predict(keystrokes(1, "first.py")[0], PARAMS, CancelToken())
        assert not pred.cancelled and pred.steps > 0
    finally:
        eng.close()
