"""Command-line options of `dlm-lsp serve --engine ray` (ray_serve.py).

Kept apart from ray_serve.py, which imports Ray: `dlm-lsp serve --help` must work, and
plain `dlm-lsp serve` must start, on an install without the `ray` extra.
"""

from __future__ import annotations

import argparse

ENGINES = ("builtin", "ray")
RAY_MISSING = ("--engine ray needs Ray Serve, which is not installed: pip install -e '.[ray]' in the dlm-lsp "
               "checkout (or pip install 'ray[serve]>=2.40' into the same environment), or leave out --engine ray")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, default="builtin",
                        help="builtin: the model runs in this process (default). ray: this process is an "
                        "ingress speaking the same protocol, and the model runs as Ray Serve replicas on a "
                        "Ray cluster (pip install -e '.[ray]')")
    group = parser.add_argument_group("--engine ray")
    group.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="Ray cluster to join: HEAD_IP:6379, auto (the one `ray start` started on this "
                       "machine) or local (a new one-machine cluster for this process); default: $RAY_ADDRESS, "
                       "else a cluster `ray start` started here, else a new one-machine cluster")
    group.add_argument("--replicas", type=int, default=None,
                       help="model replicas (default 1); each holds a copy of the model and its own prefix caches")
    group.add_argument("--autoscale", type=_replica_range, default=None, metavar="MIN-MAX",
                       help="let Ray Serve add and remove replicas with load, between MIN and MAX (e.g. 1-4); "
                       "replaces --replicas")
    group.add_argument("--target-ongoing-requests", type=float, default=4.0, metavar="N",
                       help="with --autoscale: requests queued or running per replica that Ray Serve sizes for "
                       "(default 4: about four editors typing at once per replica)")
    group.add_argument("--attach", action="store_true",
                       help="another ingress for the replicas a first `serve --engine ray` started on this "
                       "cluster: it deploys nothing and leaves the replicas running when it stops. Run one on "
                       "each box behind a TCP load balancer (or DNS), so editors reach the model while an "
                       "ingress or its box is down")
    group.add_argument("--replica-cpus", type=float, default=1.0,
                       help="CPUs Ray reserves per replica (default 1)")
    group.add_argument("--replica-gpus", type=float, default=None,
                       help="GPUs Ray reserves per replica (default: 1 with --device cuda, else 0)")
    group.add_argument("--replica-threads", type=int, default=None,
                       help="torch threads per replica (default: torch's own choice)")


def check_autoscale(low: int, high: int) -> tuple[int, int]:
    """(low, high) when it is a replica range Ray Serve can scale in, else ValueError saying why."""
    if low < 1:
        raise ValueError(f"--autoscale {low}-{high}: the least is 1 replica (an ingress with none answers nothing)")
    if high < low:
        raise ValueError(f"--autoscale {low}-{high}: MAX must be at least MIN")
    return low, high


def _replica_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not (sep and low.strip().isdigit() and high.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"--autoscale {text!r}: write MIN-MAX, two whole numbers of replicas, e.g. 1-4")
    try:
        return check_autoscale(int(low), int(high))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError (with what to do) for --engine ray options that cannot work."""
    if args.engine != "ray":
        return
    if getattr(args, "attach", False) and (args.replicas is not None or getattr(args, "autoscale", None)):
        raise ValueError("--attach serves the replicas the first ingress started (their number is its "
                         "--replicas or --autoscale): leave those out of --attach")
    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas {args.replicas}: use at least 1")
    if getattr(args, "autoscale", None) is not None and args.replicas is not None:
        raise ValueError("--replicas and --autoscale both give the number of replicas: keep one of them")
    if not getattr(args, "target_ongoing_requests", 1.0) > 0:
        raise ValueError(f"--target-ongoing-requests {args.target_ongoing_requests}: use a number above 0")
    if args.replica_cpus < 0 or (args.replica_gpus is not None and args.replica_gpus < 0):
        raise ValueError("--replica-cpus and --replica-gpus must be 0 or more")
    if args.replica_threads is not None and args.replica_threads < 1:
        raise ValueError(f"--replica-threads {args.replica_threads}: use at least 1")
