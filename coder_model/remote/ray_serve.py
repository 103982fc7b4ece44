"""`dlm-lsp serve --engine ray`: our protocol at the front, Ray Serve replicas of the model behind it.

    dlm-lsp serve --engine ray --replicas 2 --listen 0.0.0.0:7341 --token-file ~/.config/dlm/token

What runs where:
- The ingress is this process: the same `RemoteServer` as plain `dlm-lsp serve`
  (tcp_server.py: handshake with the HMAC token, TLS, frames, per-connection limits), so the
  editor side is unchanged (`--remote HOST:PORT`). Only its model side differs:
  `RayForwarder` takes the place of the batching scheduler and forwards each request
  to a replica through a Ray Serve deployment handle. It holds no model.
- `ModelReplica` is the Ray Serve deployment: each replica loads the checkpoint and runs
  the existing `BatchScheduler` + `ModelBackend` (continuous batching, fairness between
  connections, per-connection prefix caches, deadlines, confidence), as plain `serve` does.

Across the hop:
- Cache affinity: each connection is a Ray Serve *multiplexed model id*
  (`<ingress session>-conn<N>`), and the replica registers it with `@serve.multiplexed`.
  Ray's router sends a request to a replica that has its id loaded, so a connection's
  requests land on the replica holding its prefix caches; a new id goes to the replica with
  the fewest. The registration reaches the router asynchronously (the controller's
  long poll), so the first requests of a new connection may land on two replicas; both
  answer correctly, one of them without cache reuse. When a replica dies, the id is on no
  live replica and the next request goes to another one: cold, but answered.
  Evicting an id (`max_num_models_per_replica`) or closing the connection drops its caches.
- Deadlines: the ingress forwards the time the request has left (`deadline_ms` minus the
  time it spent in the ingress); the replica's scheduler plans its steps to it.
- Cancellation: a `cancel` frame (or a closed connection) cancels the DeploymentResponse;
  Ray cancels the replica's asyncio task, which sets the request's CancelToken, so the
  replica's scheduler drops it before its next denoising step and its slot is free.
- More ingresses: `--attach` makes this process an ingress for replicas another one deployed
  (`attach_forwarder`); it deploys nothing and never removes them (docs/remote.md, "A team").
- A replica that dies: its requests in flight are sent again to another replica (at most
  `REPLICA_LOST_RETRIES` times, while their deadline lasts); a request that still finds no
  replica is answered with a request error, which RemoteEngine turns into an empty
  suggestion. The connection stays up, and Ray Serve's controller starts a new replica.

Why Ray Serve: it runs Python replicas as they are (our backend moves in unchanged),
installs from PyPI and runs a local cluster on one CPU machine (for tests), and brings what
we would otherwise write ourselves: multi-node clusters (`ray start`), replica health
checks and restarts, scaling (`num_replicas`, or autoscaling on queue depth), cancellation
that reaches the replica, and a dashboard with latency and queue depth. Considered:
NVIDIA Triton (Python backend; the model would be rewritten to its tensor I/O and custom
batching, no per-client state, and its C++ server is not on PyPI), KServe / Seldon (need
Kubernetes), BentoML (HTTP services and runners; replicas on more boxes again through
Kubernetes / its cloud), vLLM / TGI / SGLang (autoregressive LLM servers: they own the
decoding loop, and our model is a masked-diffusion denoiser with its own sampler), Celery
or Dask queues (no request cancellation reaching a running task, no affinity). Serve's
own HTTP and gRPC ingresses were not used: the editor would need a second transport and a
second auth scheme, while this ingress keeps the protocol, the token handshake and TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import inspect
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

# The ingress reaches the replicas over Ray Serve's gRPC path (`grpc_handle`), not by object
# reference; the rest of Serve's settings are its defaults. Measured on the 2-vCPU VM on a quiet
# machine (BENCHMARKS.md "Remote serving on Ray Serve"): gRPC cut what a request spends between
# the handle and the replica's handler from 5.3-5.8 ms to 3.7-4.0 ms p50 (on a loaded machine, the
# load hides the difference); replica code on the replica's main loop gave nothing more.
import ray
from dlm.coder_model.layout import LayoutBudget
from dlm.coder_model.remote.batching import Request, SchedulerStats
from dlm.coder_model.remote.ray_options import check_autoscale
from dlm.coder_model.remote.wire import ProtocolError
from dlm.coder_model.types import CancelToken, Prediction, Prompt, SamplerParams
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, TaskCancelledError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError, RequestCancelledError

log = logging.getLogger("dlm.remote.ray")

APP_NAME = "dlm"
DEPLOYMENT_NAME = "dlm_model"
# A request whose replica died is sent this many more times (each to whichever replica the
# router picks, after RETRY_BACKOFF_S x attempt), as long as its deadline lasts.
REPLICA_LOST_RETRIES = 3
RETRY_BACKOFF_S = 0.1
# Connections one replica keeps the caches of (its multiplexed ids); the least recently used
# one beyond this is forgotten (its next request starts cold).
MAX_OWNERS_PER_REPLICA = 512
# Requests Ray's router lets one replica hold at once. The replica's scheduler queues and
# batches them itself, fairly between connections; a lower bound would make the router hold
# them back and, once the replica with a connection's caches is full, send them elsewhere.
MAX_ONGOING_PER_REPLICA = 4096
# Autoscaling (--autoscale MIN-MAX): how long the load must stay above the target before Ray
# Serve adds a replica (ReplicaConfig.downscale_delay_s: below it, before one is removed).
UPSCALE_DELAY_S = 3.0
REPLICA_SWITCH_INTERVAL_S = 0.0005  # the replica process's GIL switch interval (ModelReplica)
_REPLICA_LOST = (RayActorError, ActorUnavailableError, ReplicaUnavailableError, DeploymentUnavailableError)
_CANCELLED = (RequestCancelledError, TaskCancelledError, asyncio.CancelledError, concurrent.futures.CancelledError)


# ------------------------------------------------------------------------------- replica side


class _OwnerSession:
    """What a replica holds for one connection (a multiplexed id): the key of its prefix caches.
    Ray Serve calls `__del__` when it evicts the id; the caches go with it."""

    def __init__(self, scheduler, owner: str):
        self._scheduler = scheduler
        self.owner = owner

    def __del__(self) -> None:
        self._scheduler.forget(self.owner)


class ModelReplica:
    """One Ray Serve replica: the checkpoint, loaded once, behind the batching scheduler."""

    def __init__(self, model_dir: str | None, device: str = "auto", *, max_batch: int = 32,
                 max_batch_tokens: int | None = None, max_caches: int = 64, max_owner_slots: int = 2048,
                 threads: int | None = None):
        from dlm.coder_model.remote.backend import load_scheduler  # torch: replica side only

        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        # The scheduler thread re-takes the GIL after each small torch op; Serve's own threads in
        # this process (its event loop, metrics) hold it up to the 5 ms default switch interval
        # each time (as dlm-lsp's server_cli does for its event loop). BENCHMARKS.md "Remote serving on Ray Serve".
        sys.setswitchinterval(REPLICA_SWITCH_INTERVAL_S)
        self.scheduler, self.name, self.device = load_scheduler(
            model_dir, device, max_batch=max_batch, max_caches=max_caches, max_batch_tokens=max_batch_tokens,
            max_owner_slots=max_owner_slots)
        self.scheduler.start()
        # Tokenizing off the event loop, as the plain server does on its worker pool.
        self._prepare_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="dlm-replica-prepare")
        # How the last requests the ingress cancelled ended here (cancelled=True: the cancel reached
        # the scheduler before the request finished), for `stats` and the tests.
        self._cancelled_ends: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Serve (a unit test building it directly)
            self.replica_id = f"local-{os.getpid()}"

    def describe(self) -> dict[str, Any]:
        b = self.scheduler.budget
        return {"model": self.name, "device": self.device, "replica": self.replica_id,
                "budget": {"max_context": b.max_context, "max_history": b.max_history, "max_suffix": b.max_suffix}}

    def stats(self) -> dict[str, Any]:
        return {"replica": self.replica_id, **self.scheduler.stats.snapshot(),
                "cancelled_ends": list(self._cancelled_ends)}

    @serve.multiplexed(max_num_models_per_replica=MAX_OWNERS_PER_REPLICA)
    async def _session(self, owner: str) -> _OwnerSession:
        return _OwnerSession(self.scheduler, owner)

    async def predict(self, request_id: int, prompt: Prompt, params: SamplerParams,
                      deadline_ms: float | None) -> dict[str, Any]:
        """One request of the connection named by the multiplexed id: {"replica", "prediction"}
        or {"replica", "code", "message"} (a request error). Never raises but for cancellation."""
        owner = serve.get_multiplexed_model_id() or "anonymous"
        await self._session(owner)  # registers the id here, so the router sends its next requests here
        problem = self.scheduler.check_request(params, deadline_ms)
        if problem is not None:
            self.scheduler.stats.refused += 1
            return {"replica": self.replica_id, "code": "bad_request", "message": problem}
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def on_done(pred: Prediction | None, err: ProtocolError | None) -> None:  # scheduler thread
            loop.call_soon_threadsafe(_settle, done, pred, err)

        req = Request(owner, request_id, prompt, params, on_done, deadline_ms=deadline_ms)
        try:
            req.prepared = await loop.run_in_executor(self._prepare_pool, self.scheduler.prepare, prompt, params)
        except ValueError as exc:  # a prompt this model cannot take
            return {"replica": self.replica_id, "code": "bad_request", "message": str(exc)}
        self.scheduler.submit(req)
        try:
            pred, err = await asyncio.shield(done)
        except asyncio.CancelledError:  # the ingress cancelled the DeploymentResponse
            req.cancel.cancel()  # the scheduler drops it before its next step
            done.add_done_callback(lambda f: self._note_cancelled_end(req, f))
            raise
        if err is not None:
            return {"replica": self.replica_id, "code": err.code, "message": err.message}
        return {"replica": self.replica_id, "prediction": pred}

    def _note_cancelled_end(self, req: Request, done: asyncio.Future) -> None:
        pred, err = done.result()
        self._cancelled_ends.append({"owner": req.owner, "id": req.request_id, "error": err is not None,
                                     "cancelled": bool(pred and pred.cancelled), "steps": pred.steps if pred else 0})

    async def forget(self) -> None:
        """The connection named by the multiplexed id closed: drop its caches here."""
        owner = serve.get_multiplexed_model_id()
        if owner:
            self.scheduler.forget(owner)

    def __del__(self) -> None:
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.stop(timeout=1.0)


def _settle(done: asyncio.Future, pred: Prediction | None, err: ProtocolError | None) -> None:
    if not done.done():
        done.set_result((pred, err))


# ------------------------------------------------------------------------------- deployment


@dataclass
class ReplicaConfig:
    """How the replicas are built and placed (the --engine ray options)."""

    model_dir: str | None = None
    device: str = "auto"
    replicas: int = 1
    # (min, max): Ray Serve adds and removes replicas with load instead of keeping `replicas`
    autoscale: tuple[int, int] | None = None
    # the load one replica is sized for: requests queued or running on it (Ray Serve's
    # target_ongoing_requests). One typing editor has about one request in flight, and one
    # replica's batching scheduler answers a few at the speed of one.
    target_ongoing: float = 4.0
    downscale_delay_s: float = 60.0
    cpus: float = 1.0
    gpus: float | None = None  # None: 1 when device is cuda*, else 0
    threads: int | None = None
    max_batch: int = 32
    max_batch_tokens: int | None = None
    max_caches: int = 64
    max_owner_slots: int = 2048

    def replica_count(self) -> dict[str, Any]:
        """The deployment's size options: a fixed number, or Ray Serve's autoscaling on load."""
        if self.autoscale is None:
            return {"num_replicas": self.replicas}
        low, high = self.autoscale
        return {"autoscaling_config": {
            "min_replicas": low, "max_replicas": high, "initial_replicas": low,
            "target_ongoing_requests": self.target_ongoing,
            # Up fast (a team arriving in the morning waits for a replica's start-up, seconds,
            # not for the delay); down slowly (a removed replica takes its prefix caches along).
            "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": self.downscale_delay_s}}

    def describe_size(self) -> str:
        if self.autoscale is None:
            return f"{self.replicas} replica(s)"
        return f"{self.autoscale[0]}-{self.autoscale[1]} replicas (autoscaling, {self.target_ongoing:g} requests each)"

    def actor_options(self) -> dict[str, Any]:
        gpus = self.gpus if self.gpus is not None else (1.0 if str(self.device).startswith("cuda") else 0.0)
        return {"num_cpus": self.cpus, "num_gpus": gpus}


class RayDeployment:
    """The replicas as one Ray Serve application (`serve.run`), and its handle."""

    def __init__(self, config: ReplicaConfig, app_name: str = APP_NAME):
        self.config = config
        self.app_name = app_name
        self.handle = None

    def _application(self):
        c = self.config
        deployment = serve.deployment(
            ModelReplica, name=DEPLOYMENT_NAME, **c.replica_count(), ray_actor_options=c.actor_options(),
            max_ongoing_requests=MAX_ONGOING_PER_REPLICA, health_check_period_s=2.0, health_check_timeout_s=30.0,
            # a log line per keystroke in every replica costs time and says nothing the ingress's log does not
            logging_config={"enable_access_log": False})
        return deployment.bind(c.model_dir, c.device, max_batch=c.max_batch, max_batch_tokens=c.max_batch_tokens,
                               max_caches=c.max_caches, max_owner_slots=c.max_owner_slots, threads=c.threads)

    def deploy(self):
        """Start (or update to) the configured replicas; returns once they are running."""
        serve.start(proxy_location="Disabled")  # no HTTP proxy: our ingress is the only door
        self.handle = serve.run(self._application(), name=self.app_name, route_prefix=None)
        return self.handle

    def scale(self, replicas: int) -> None:
        """Change to a fixed number of replicas in place (running replicas and their caches stay;
        autoscaling, if it was on, ends)."""
        if replicas < 1:
            raise ValueError(f"replicas={replicas}: use at least 1")
        self.config.replicas, self.config.autoscale = replicas, None
        serve.run(self._application(), name=self.app_name, route_prefix=None)

    def autoscale(self, low: int, high: int, target_ongoing: float | None = None,
                  downscale_delay_s: float | None = None) -> None:
        """Let Ray Serve choose between `low` and `high` replicas by load, in place."""
        self.config.autoscale = check_autoscale(low, high)
        if target_ongoing is not None:
            self.config.target_ongoing = target_ongoing
        if downscale_delay_s is not None:
            self.config.downscale_delay_s = downscale_delay_s
        serve.run(self._application(), name=self.app_name, route_prefix=None)

    def running(self) -> int:
        """Replicas running now (what autoscaling has chosen)."""
        dep = serve.status().applications[self.app_name].deployments[DEPLOYMENT_NAME]
        return dep.replica_states.get("RUNNING", 0)

    def describe(self) -> dict[str, Any]:
        return self.handle.describe.remote().result(timeout_s=60)

    def shutdown(self) -> None:
        serve.delete(self.app_name)


# ------------------------------------------------------------------------------- ingress side


class _ForwardedCancel(CancelToken):
    """The request's CancelToken, which also cancels its DeploymentResponse (tcp_server.py cancels a
    request by `req.cancel.cancel()`, on a cancel frame or a closed connection)."""

    __slots__ = ("on_cancel",)

    def __init__(self, already: bool):
        super().__init__()
        self.on_cancel = None
        if already:
            super().cancel()

    def cancel(self) -> None:
        super().cancel()
        if self.on_cancel is not None:
            self.on_cancel()


def grpc_handle(handle):
    """`handle` sending its requests to the replicas over Ray Serve's gRPC data path (the path of
    Serve's "throughput optimized" mode; every replica serves it) instead of as Ray object
    references. A Ray Serve too old for the choice (its `options` has no `_by_reference`) keeps its
    default path: the requests go through either way."""
    if "_by_reference" not in inspect.signature(handle.options).parameters:
        return handle
    return handle.options(_by_reference=False)


class RayForwarder:
    """The model side of the ingress's RemoteServer (server.Scheduler): each request goes to a
    replica of the deployment, the connection's id as its multiplexed model id (affinity)."""

    def __init__(self, handle, description: dict[str, Any]):
        self.handle = grpc_handle(handle)
        self.description = description
        self.stats = SchedulerStats()
        b = description["budget"]
        self._budget = LayoutBudget(max_context=b["max_context"], max_history=b["max_history"],
                                    max_suffix=b["max_suffix"])
        # Connection ids restart at conn1 in every ingress process; replicas outlive it.
        self.session = uuid.uuid4().hex[:12]
        self.replica_lost = 0  # replica failures seen by requests (each then retried)
        self.routes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._handles: dict[str, Any] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def budget(self) -> LayoutBudget:
        return self._budget

    def prepare(self, prompt: Prompt, params: SamplerParams) -> None:
        return None  # the replica tokenizes (it has the tokenizer); the ingress holds no model

    def check_request(self, params: SamplerParams, deadline_ms: float | None) -> str | None:
        return None  # the replica checks it by its own measured step times

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _owner_handle(self, owner: str):
        h = self._handles.get(owner)
        if h is None:
            h = self._handles[owner] = self.handle.options(multiplexed_model_id=f"{self.session}-{owner}")
        return h

    def submit(self, req: Request) -> None:
        """Called on the server's event loop, with a validated request."""
        token = _ForwardedCancel(req.cancel.cancelled)
        req.cancel = token  # tcp_server.py reads req.cancel when it cancels, so cancels reach the replica
        self.stats.admitted += 1
        task = asyncio.get_running_loop().create_task(self._forward(req, token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, owner: str) -> None:
        h = self._handles.pop(owner, None)
        self.routes.pop(owner, None)
        if h is not None:
            try:
                h.forget.remote()  # goes to the replica holding the id; the result is not awaited
            except Exception as exc:  # noqa: BLE001 - the replica's LRU drops the caches in time anyway
                log.info("could not tell the replicas that %s closed: %s", owner, exc)

    async def _forward(self, req: Request, token: _ForwardedCancel) -> None:
        loop = asyncio.get_running_loop()
        handle = self._owner_handle(req.owner)
        failures = 0
        while True:
            if token.cancelled:
                return self._answer_cancelled(req)
            left_ms = None
            if req.deadline_ms is not None:
                left_ms = req.deadline_ms - (time.monotonic() - req.received) * 1e3
                if left_ms <= 0:
                    return self._answer_cancelled(req, late=True)
            response = handle.predict.remote(req.request_id, req.prompt, req.params, left_ms)
            # DeploymentResponse.cancel may wait for the request's assignment: off the event loop.
            token.on_cancel = lambda r=response: loop.run_in_executor(None, r.cancel)
            try:
                reply = await response
            except _CANCELLED:
                return self._answer_cancelled(req)
            except _REPLICA_LOST as exc:
                failures += 1
                self.replica_lost += 1
                if failures > REPLICA_LOST_RETRIES:
                    self.stats.failed += 1
                    return req.on_done(None, ProtocolError(
                        "server_error", f"the model replicas did not answer ({type(exc).__name__}) after "
                        f"{failures} tries; the cluster is restarting replicas, retry in a few seconds",
                        request_id=req.request_id, fatal=False))
                log.warning("request %s of %s: replica lost (%s); sending it to another one", req.request_id,
                            req.owner, type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S * failures)
                continue
            except Exception as exc:
                log.exception("request %s of %s failed in the engine", req.request_id, req.owner)
                self.stats.failed += 1
                return req.on_done(None, ProtocolError(
                    "server_error", f"the engine failed this request: {type(exc).__name__}: {exc}; see the "
                    "ingress log", request_id=req.request_id, fatal=False))
            finally:
                token.on_cancel = None
            self.routes[req.owner][reply["replica"]] += 1
            if "prediction" in reply:
                pred = reply["prediction"]
                if pred.cancelled:
                    self.stats.cancelled += 1
                else:
                    self.stats.completed += 1
                return req.on_done(pred, None)
            if reply["code"] == "bad_request":  # refused by the replica's checks, as plain serve refuses
                self.stats.refused += 1
            else:
                self.stats.failed += 1
            return req.on_done(None, ProtocolError(reply["code"], reply["message"], request_id=req.request_id,
                                                   fatal=False))

    def _answer_cancelled(self, req: Request, late: bool = False) -> None:
        self.stats.cancelled += 1
        queue_ms = (time.monotonic() - req.received) * 1e3
        req.on_done(Prediction(text="", cancelled=True, queue_ms=queue_ms, late=late), None)


def connect(address: str | None, *, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at `address` (None: $RAY_ADDRESS, a running local one, or a new one)."""
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if num_cpus is not None and address is None:
        kwargs["num_cpus"] = num_cpus
    ray.init(address=address, **kwargs)


def start_forwarder(config: ReplicaConfig, *, app_name: str = APP_NAME) -> tuple[RayForwarder, RayDeployment]:
    """Deploy the replicas (ray must be connected) and the ingress's forwarder to them."""
    deployment = RayDeployment(config, app_name)
    handle = deployment.deploy()
    return RayForwarder(handle, deployment.describe()), deployment


def attach_forwarder(*, app_name: str = APP_NAME) -> RayForwarder:
    """A forwarder to replicas another ingress deployed (`--attach`; ray must be connected).
    LookupError, saying what to start, when the cluster runs no such application."""
    app = serve.status().applications.get(app_name)
    if app is None or DEPLOYMENT_NAME not in app.deployments:
        raise LookupError(f"the Ray cluster runs no {app_name!r} replicas of dlm-lsp to attach to: start the "
                          "first ingress without --attach (it deploys them), then --attach the others")
    handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name)
    return RayForwarder(handle, handle.describe.remote().result(timeout_s=60))


# ------------------------------------------------------------------------------- CLI


def run(args: argparse.Namespace) -> int:
    """`dlm-lsp serve --engine ray`: the checks and the listening line of plain serve, the model on Ray."""
    from dlm.coder_model.remote.listening import network_config, serve_until_stopped
    from dlm.coder_model.remote.tcp_server import RemoteServer, ServerOptions

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        host, port, token, ssl_context, limits = network_config(args)
        if args.model is not None and not os.path.isdir(args.model):
            # checked here, in a second, rather than by replicas failing to start on the cluster
            raise ValueError(f"--model {args.model!r} is not a directory; give a checkpoint directory (the same "
                             "path on every box of the cluster), or leave --model out for the embedded model")
    except ValueError as exc:
        print(f"dlm-lsp serve: {exc}", file=sys.stderr)
        return 2
    config = ReplicaConfig(model_dir=args.model, device=args.device, replicas=args.replicas or 1, autoscale=args.autoscale,
                           target_ongoing=args.target_ongoing_requests, cpus=args.replica_cpus,
                           gpus=args.replica_gpus, threads=args.replica_threads, max_batch=args.max_batch,
                           max_batch_tokens=args.max_batch_tokens, max_caches=args.max_caches,
                           max_owner_slots=args.max_connection_slots)
    attach = bool(getattr(args, "attach", False))
    deployment: RayDeployment | None = None
    try:
        connect(args.ray_address)
        if attach:  # replicas another ingress deployed: this one neither starts nor removes them
            forwarder = attach_forwarder()
        else:
            forwarder, deployment = start_forwarder(config)
    except LookupError as exc:
        print(f"dlm-lsp serve: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; each is a start-up failure to report
        print(f"dlm-lsp serve: cannot start the Ray Serve replicas: {type(exc).__name__}: {exc}; check "
              "--ray-address (`ray status` on the head node) and that the model loads with plain `dlm-lsp serve`",
              file=sys.stderr)
        return 1
    info = forwarder.description
    size = "the running replicas (attached)" if attach else config.describe_size()
    options = ServerOptions(host=host, port=port, token=token, ssl_context=ssl_context, limits=limits,
                            model_name=info["model"], device=f"ray:{info['device']} {size}",
                            max_connections=args.max_connections)
    described = (f"model {info['model']} on Ray Serve, {size}, {info['device']}; "
                 f"auth {'token' if token else 'none (loopback only)'}, tls {'on' if ssl_context else 'off'}")
    try:
        # SIGTERM (a service manager's stop) ends serving like Ctrl-C, so the replicas are removed too.
        return serve_until_stopped(RemoteServer(forwarder, options), host, port, described,
                                   stop_on_sigterm=True)
    finally:
        if deployment is not None:  # the ingress that deployed the replicas removes them; --attach never does
            deployment.shutdown()
