"""``rlsched operator ...``: run the operator with its options, or print its CRDs
for kubectl."""

from __future__ import annotations

import argparse
import sys

from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, DEFAULT_TOPOLOGY_LEVELS, LABEL_ALLOW_SECRET_MOUNTS
from rlsched.core.contract import LABEL_POD_SECURITY_ENFORCE, parse_gpu_types, parse_topology_levels
from rlsched.core.contract import POD_SECURITY_BASELINE, POD_SECURITY_LEVELS
from rlsched.core.policy import allocator_names
from rlsched.core.served import SERVED

__all__ = ["register", "allocator_arg"]


def register(subparsers) -> None:
    p = subparsers.add_parser("operator", help="the TrainingJob operator (kopf)")
    sub = p.add_subparsers(dest="operator_command", metavar="ACTION")

    r = sub.add_parser("run", help="run the operator")
    r.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    r.add_argument("--namespace", "-n", help="watch one namespace (default: all)")
    r.add_argument("--cycle", type=float, default=5.0, help="seconds between scheduling cycles (default 5)")
    r.add_argument("--decision-gap", type=float, default=0.0,
                   help="with --decision-interval: least seconds between two decisions of the allocation policy "
                   "on a change of its jobs (default 0)")
    r.add_argument("--decision-interval", type=float, default=None,
                   help="the allocation policy decides on changes of its jobs (a job arrives, ends or becomes "
                   "movable) and else every this many seconds, as the simulator's engines (default: every cycle)")
    r.add_argument("--start-timeout", type=float, default=120.0, help="seconds a gang may stay Pending (default 120)")
    r.add_argument("--grace-period", type=int, default=30, help="termination grace period of preempted/removed workers")
    r.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME,
                   help=f"schedulerName of worker pods (default {DEFAULT_SCHEDULER_NAME})")
    r.add_argument("--allocator", default=SERVED.allocator, type=allocator_arg,
                   help="the allocation policy deciding every job's workers and global batch at once "
                   f"({', '.join(allocator_names(live=True))}: core's live allocation policies, "
                   "core/live_allocation.py; options as goodput@restart_delay=60,p=0.5; or a heuristic "
                   "as one allocator: ordering/placement[/scaling][+backfill|+nobackfill], e.g. "
                   f"fifo/das/rlpto+nobackfill); default: the served policy ({SERVED.allocator}, core/served.py)")
    r.add_argument("--min-run-time", type=float, default=0.0,
                   help="seconds a job runs before it may be preempted (default 0: none)")
    r.add_argument("--gpu-types", default="",
                   help='GPU Feature Discovery products -> GPU types, JSON, e.g. {"Tesla-T4": "aws"} '
                        "(an unmapped product is its own type; the chart's gpuTypes)")
    r.add_argument("--topology-levels", default=",".join(DEFAULT_TOPOLOGY_LEVELS),
                   help="node-label keys of the topology, coarse to fine (last: hostname), as the extender's")
    r.add_argument("--patience", type=int, default=5, help="evaluations with gain < beta before a job converged")
    r.add_argument("--mu", type=float, default=0.1, help="priority step per user request (RLPTO mu)")
    r.add_argument("--promote-at", type=float, default=1.0, help="priority at which a normal job becomes urgent")
    r.add_argument("--demote-at", type=float, default=-1.0, help="priority at which an urgent job becomes normal")
    r.add_argument("--metrics-port", type=int, default=9090, help="Prometheus port (-1: off)")
    r.add_argument("--peering", help="kopf peering object name for HA (default: standalone)")
    r.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    r.add_argument("--forecast-interval", type=float, default=3600.0, help="seconds between LSP forecasts (0: off)")
    r.add_argument("--gru-model", help="weights of the LSP GRU (default: ARIMA only)")
    r.add_argument("--pod-security-level", choices=POD_SECURITY_LEVELS, default=POD_SECURITY_BASELINE,
                   help=f"Pod Security Standard worker templates must meet in namespaces without a "
                   f"{LABEL_POD_SECURITY_ENFORCE} label (default {POD_SECURITY_BASELINE})")
    r.add_argument("--allow-secret-mounts", action="store_true",
                   help=f"let worker templates read Secrets in every namespace (default: only in namespaces "
                   f"labelled {LABEL_ALLOW_SECRET_MOUNTS}=true)")
    r.add_argument("--verbose", "-v", action="store_true")
    r.set_defaults(func=_run)

    c = sub.add_parser("crd", help="print the TrainingJob CRD (and kopf peering CRDs with --peering)")
    c.add_argument("--peering", action="store_true")
    c.set_defaults(func=_crd)

    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    w = subparsers.add_parser("why", help="where a TrainingJob stands and why it is not running")
    w.add_argument("job", help="the TrainingJob's name")
    w.add_argument("--namespace", "-n", default=None, help="its namespace (default: the kubeconfig context's)")
    w.add_argument("--kubeconfig", default=None, help="kubeconfig file (default ~/.kube/config or $KUBECONFIG)")
    w.set_defaults(func=_why)


def allocator_arg(text: str) -> str:
    """``--allocator``: a name core's live allocation builds; anything else, ``none``
    among them, is a usage error naming the choices."""
    from rlsched.core.live_allocation import check_live_allocator

    try:
        return check_live_allocator(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    import kopf

    from .controller import OperatorConfig
    from .main import run

    kopf.configure(verbose=args.verbose)
    cfg = OperatorConfig(
        kubeconfig=args.kubeconfig, namespace=args.namespace, cycle_s=args.cycle, decision_gap_s=args.decision_gap,
        decision_interval_s=args.decision_interval,
        start_timeout_s=args.start_timeout, grace_period_s=args.grace_period,
        scheduler_name=args.scheduler_name, allocator=args.allocator,
        topology_levels=parse_topology_levels(args.topology_levels), min_run_s=args.min_run_time,
        patience=args.patience, mu=args.mu, promote_at=args.promote_at, demote_at=args.demote_at,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        peering=args.peering, priority=args.priority, forecast_interval_s=args.forecast_interval,
        gru_model=args.gru_model, pod_security_level=args.pod_security_level,
        allow_secret_mounts=args.allow_secret_mounts, gpu_types=parse_gpu_types(args.gpu_types, "--gpu-types"),
    )
    return run(cfg)


def _crd(args: argparse.Namespace) -> int:
    from .main import crd_path, peering_crd_path, queue_crd_path

    sys.stdout.write(crd_path().read_text())
    sys.stdout.write("---\n" + queue_crd_path().read_text())
    if args.peering:
        sys.stdout.write("---\n" + peering_crd_path().read_text())
    return 0


def _why(args) -> int:
    from .why import run_why

    return run_why(args.job, args.namespace, args.kubeconfig)
