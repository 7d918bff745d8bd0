"""``rlsched sim``: run one policy on a trace, or compare several.

    rlsched sim run --trace SPEC --ordering fifo --placement firstfit --seed N --out DIR
    rlsched sim compare --trace SPEC --policies fifo/firstfit,rlsched --seed N --out DIR

Policy names: :func:`rlsched.core.served.parse_policy_name`; measured workloads
(``pollux:...``, ``sia:...``, ``pollux-gen:...``) run on the interval engine, on the
trace's cluster or ``--cluster`` (a named one such as ``sia-64``, several GPU types). Policies see no true run
time unless ``--clairvoyant`` (a labelled reference). More: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.core.policy import allocator_names
from rlsched.core.served import SERVED_NAME, PolicyName, parse_policy_name

from .allocators import is_allocator  # importing it registers the simulator's peers

__all__ = ["register", "run_policy", "run_allocator", "policy_config", "parse_policies", "label", "CLAIRVOYANT_LABEL"]

log = logging.getLogger("rlsched.sim")


def register(subparsers) -> None:
    p = subparsers.add_parser("sim", help="discrete-event GPU-cluster simulator")
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--trace", required=True, help="alibaba2023:<list> | pai2020:<dir> | philly:<file> | helios:<file> | synthetic:<preset>[,k=v] | "
                       "pollux:<folder>/<file> | sia:<folder>/<file> | pollux-gen:seed=N[,jobs=160,hours=8,load=1.0,cluster=NAME] | "
                       "<jobs.yaml|json>")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--out", required=True, help="output folder")
        q.add_argument("--data-dir", default=None, help="trace data folder (default: $RLSCHED_DATA_DIR)")
        q.add_argument("--skip-bad", action="store_true", help="skip and count malformed trace rows instead of stopping")
        q.add_argument("--cluster", default=None,
                       help="YAML/JSON cluster description for traces without one; for measured workloads a named "
                       "cluster (pollux-64, sia-64), NODESxGPUS or TYPE:NODESxGPUS[+TYPE:NODESxGPUS...]")
        q.add_argument("--calibration", choices=("sia", "none"), default=None,
                       help="measured workloads: step times x the Sia artifact's calibration per application, or "
                       "not (default: the trace's; sia: workloads use it)")
        q.add_argument("--interval", type=float, default=None,
                       help="measured workloads: seconds between allocation decisions (default: the trace's, 60)")
        q.add_argument("--backfill", action="store_true", help="start later jobs when the head of the queue does not fit")
        q.add_argument("--scaling-interval", type=float, default=300.0,
                       help="seconds between decisions without events, and between a heuristic's scaling steps")
        q.add_argument("--decision-gap", type=float, default=30.0,
                       help="least seconds between two decisions on events (a burst makes one decision); 0: decide "
                       "at every event time (default 30, the chart's operator.decisionGapSeconds)")
        q.add_argument("--restart-cost", type=float, default=None,
                       help="seconds without progress after a worker change or a resume from preemption (default 30; "
                       "measured workloads: the trace's, per application on sia: workloads)")
        q.add_argument("--no-preemption", action="store_true",
                       help="nobody preempts (highest-class jobs, SRTF, Tiresias), as the operator's --no-preemption")
        q.add_argument("--max-time", type=float, default=float("inf"), help="stop at this simulated time")
        q.add_argument("--clairvoyant", action="store_true",
                       help="show the policies the jobs' true run times (a labelled reference run, never a baseline)")
        q.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("run", help="simulate one ordering/placement[/scaling] policy")
    common(r)
    r.add_argument("--policy", default=None,
                   help="a policy name: ordering/placement[/scaling][+backfill|+nobackfill], rlsched, or an allocation policy")
    r.add_argument("--ordering", default=None)
    r.add_argument("--placement", default=None)
    r.add_argument("--scaling", default=None)
    r.add_argument("--allocator", default=None,
                   help=f"measured workloads: allocation policy ({', '.join(allocator_names())})")
    r.set_defaults(func=_cmd_run)

    c = sub.add_parser("compare", help="simulate several policies on one trace; table, JSON and plots")
    common(c)
    c.add_argument("--policies", required=True,
                   help="comma list of ordering/placement[/scaling][+backfill|+nobackfill] or rlsched (the served learned "
                   "combination); allocation policies by name on measured workloads")
    c.add_argument("--clairvoyant-reference", default=None, metavar="POLICIES",
                   help="also run these ordering/placement[/scaling] with true run times, as labelled reference rows")
    c.set_defaults(func=_cmd_compare)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


# ------------------------------------------------------------------ helpers
def parse_policies(text: str) -> list[PolicyName]:
    """A comma list of policy names (:func:`rlsched.core.served.parse_policy_name`); a
    single word must be ``rlsched`` or an allocation policy (:mod:`.allocators`)."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        pol = parse_policy_name(item)
        if pol.allocator and not is_allocator(pol.allocator.partition("@")[0] if pol.placement else pol.allocator):
            raise ValueError(f"policy {item!r}: expected ordering/placement[/scaling][+backfill|+nobackfill], "
                             f"{SERVED_NAME!r} or an allocation policy ({', '.join(allocator_names())})")
        out.append(pol)
    if not out:
        raise ValueError("no policies given")
    return out


def _load(args):
    from rlsched.core import Topology

    from .traces import default_topology, load_trace

    trace = load_trace(args.trace, data_dir=args.data_dir, seed=args.seed, skip_bad=args.skip_bad)
    if _is_measured(trace):
        from .traces.common import data_dir
        from .traces.pollux import with_cluster

        cluster = _measured_cluster(args.cluster, trace)
        return with_cluster(trace, cluster, data_dir(args.data_dir)), cluster
    if args.calibration is not None:
        raise ValueError("--calibration is for measured workloads (pollux:, sia:, pollux-gen:)")
    topo = trace.topology
    if args.cluster:
        import yaml

        topo = Topology.from_dict(yaml.safe_load(Path(args.cluster).read_text()))
    if topo is None:
        topo = default_topology(trace.jobs)
        trace.notes.append(f"trace has no cluster: using {len(topo)} nodes x 8 GPUs (--cluster to change)")
    return trace, topo


def _is_measured(trace) -> bool:
    from .traces.pollux import MeasuredTrace

    return isinstance(trace, MeasuredTrace)


def _measured_cluster(text: str | None, trace):
    """The cluster of a measured run (:class:`~.measured.MeasuredCluster`): the trace's
    (Pollux's 16 x 4 unless the spec names another), or ``--cluster`` (a name,
    ``NODESxGPUS``, ``TYPE:NODESxGPUS[+...]``, or a cluster file whose nodes all have the
    same GPUs, of the default type)."""
    from .measured import CLUSTERS, ClusterError, MeasuredCluster, parse_cluster

    if not text:
        return trace.cluster
    if text.strip() in CLUSTERS or ("x" in text.lower() and not Path(text).exists()):
        try:
            return parse_cluster(text)
        except ClusterError as exc:
            raise ValueError(f"--cluster {text}: {exc}") from None
    import yaml

    from rlsched.core import Topology

    topo = Topology.from_dict(yaml.safe_load(Path(text).read_text()))
    sizes = {nd.gpus for nd in topo.nodes}
    if len(sizes) != 1:
        raise ValueError(f"--cluster {text}: measured workloads need nodes with equal GPUs, got {sorted(sizes)}")
    nodes, gpus = len(topo.nodes), sizes.pop()
    if nodes < 1 or gpus < 1:
        raise ValueError(f"--cluster {text}: need at least one node with one GPU")
    return MeasuredCluster.uniform(nodes, gpus)


def run_allocator(trace, cluster, name: str, config, progress=None, seed: int = 0):
    """Simulate a measured workload under allocation policy ``name`` on ``cluster``
    (a :class:`~.measured.MeasuredCluster`, or (nodes, GPUs per node) of the default
    GPU type); returns (SimResult, metrics dict)."""
    from .allocators import make_allocator
    from .interval import IntervalSimulator
    from .measured import DEFAULT_CLUSTER, MeasuredCluster
    from .metrics import compute_metrics

    if not isinstance(cluster, MeasuredCluster):
        cluster = MeasuredCluster.uniform(int(cluster[0]), int(cluster[1]))
    allocator = make_allocator(name, seed=seed)
    try:
        sim = IntervalSimulator(trace.jobs, trace.apps, allocator, cluster=cluster, config=config,
                                seeds=getattr(trace, "seeds", None))
        res = sim.run(progress=progress)
    finally:
        close = getattr(allocator, "close", None)
        if close is not None:
            close()
    res.skipped = dict(trace.skipped)
    m = compute_metrics(res)
    m["config"] = {
        "trace": trace.name, "allocator": name, "clairvoyant": res.clairvoyant, "nodes": cluster.total_nodes,
        "gpus_per_node": sim.gpus_per_node, "interval": config.interval, "restart_cost": config.restart_cost,
    }
    if cluster.gpu_types != DEFAULT_CLUSTER.gpu_types:
        m["config"]["cluster"] = cluster.to_dict()
    for key in ("restart_costs", "calibration"):
        if getattr(config, key):
            m["config"][key] = dict(getattr(config, key))
    return res, m


def _interval_config(args, trace):
    from .measured import SIA_CALIBRATION

    over = {"interval": args.interval if args.interval is not None else trace.interval, "max_time": args.max_time}
    if args.restart_cost is not None:
        over.update(restart_cost=args.restart_cost, restart_costs=None)
    if args.calibration is not None:
        over["calibration"] = {a: SIA_CALIBRATION[a] for a in trace.apps} if args.calibration == "sia" else None
    return trace.interval_config(**over)


def run_policy(trace, topology, ordering: str, placement: str, scaling: str | None, seed: int, config, progress=None,
               *, allocator: str = ""):
    """Simulate one policy triple, or (``allocator``) an allocation policy whose new
    workers ``placement`` places; returns (SimResult, metrics dict)."""
    from rlsched.core import make_ordering, make_placement, make_scaling
    from rlsched.core.live_allocation import LiveAllocation, make_live_allocator

    from .engine import Simulator
    from .metrics import compute_metrics

    # one independent stream per policy, all from the run seed
    so, sp, ss = np.random.SeedSequence(seed).spawn(3)
    if allocator:
        sim = Simulator(trace.jobs, topology, placement=make_placement(placement, rng=np.random.default_rng(sp)),
                        allocation=LiveAllocation(make_live_allocator(allocator)), seed=seed, config=config)
    else:
        sim = Simulator(
            trace.jobs,
            topology,
            ordering=make_ordering(ordering, rng=np.random.default_rng(so)),
            placement=make_placement(placement, rng=np.random.default_rng(sp)),
            scaling=make_scaling(scaling, rng=np.random.default_rng(ss)) if scaling and scaling != "none" else None,
            seed=seed,
            config=config,
        )
    res = sim.run(progress=progress)
    res.skipped = dict(trace.skipped)
    m = compute_metrics(res)
    m["config"] = {
        "trace": trace.name,
        "ordering": ordering,
        "placement": placement,
        "scaling": scaling or "none",
        "allocator": allocator or None,
        "seed": seed,
        "backfill": config.backfill,
        "preemption": config.preemption,
        "clairvoyant": config.clairvoyant,
        "decision_gap": config.decision_gap,
        "nodes": len(topology),
    }
    return res, m


def policy_config(config, pol: PolicyName):
    """The event engine's config for policy ``pol``: its own backfill when its name says."""
    return config if pol.backfill is None else replace(config, backfill=pol.backfill)


def _config(args):
    from .engine import SimConfig

    return SimConfig(
        backfill=args.backfill,
        scaling_interval=args.scaling_interval,
        decision_gap=args.decision_gap,
        restart_cost=30.0 if args.restart_cost is None else args.restart_cost,
        max_time=args.max_time,
        preemption=not args.no_preemption,
        clairvoyant=args.clairvoyant,
    )


#: how a clairvoyant row is labelled in printouts and tables
CLAIRVOYANT_LABEL = "(clairvoyant reference)"


def label(policy: str, clairvoyant: bool) -> str:
    """A policy's name as printed: clairvoyant runs carry :data:`CLAIRVOYANT_LABEL`."""
    return f"{policy} {CLAIRVOYANT_LABEL}" if clairvoyant else policy


def _progress(quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=quiet,
        transient=False,
    )


def _fail(msg: str) -> int:
    print(f"rlsched sim: error: {msg}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------ commands
def _cmd_run(args) -> int:
    from .metrics import write_metrics
    from .traces import TraceError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.policy and (args.ordering or args.placement or args.scaling or args.allocator):
            raise ValueError("give --policy NAME or --ordering/--placement[/--scaling] (or --allocator), not both")
        pol = parse_policies(args.policy)[0] if args.policy else None
        if args.policy and "," in args.policy:
            raise ValueError("--policy takes one policy name (compare runs several)")
        trace, topo = _load(args)
        if _is_measured(trace):
            if pol is not None:
                args.allocator = pol.label
            if args.ordering and args.placement and not args.allocator:
                args.allocator = f"{args.ordering}/{args.placement}" + (f"/{args.scaling}" if args.scaling else "")
            if not args.allocator:
                raise ValueError("a measured workload runs an allocation policy: give --policy or --allocator NAME "
                                 "(or --ordering and --placement [--scaling])")
            with _progress(args.quiet) as prog:
                task = prog.add_task(args.allocator, total=len(trace.jobs))
                _, m = run_allocator(trace, topo, args.allocator, _interval_config(args, trace),
                                     progress=lambda n, tot: prog.update(task, completed=n), seed=args.seed)
        else:
            if pol is None:
                if args.allocator or not (args.ordering and args.placement):
                    raise ValueError("give --policy, or --ordering and --placement (--allocator is for measured workloads)")
                pol = parse_policy_name(f"{args.ordering}/{args.placement}" + (f"/{args.scaling}" if args.scaling else ""))
            elif pol.allocator and not pol.placement:
                raise ValueError(f"policy {pol.label!r} is an allocation policy of measured workloads; "
                                 "give ordering/placement[/scaling], <allocator>/<placement> or rlsched")
            config = policy_config(_config(args), pol)
            with _progress(args.quiet) as prog:
                task = prog.add_task(pol.label, total=len(trace.jobs))
                _, m = run_policy(
                    trace, topo, pol.ordering, pol.placement, pol.scaling, args.seed, config,
                    progress=lambda n, tot: prog.update(task, completed=n), allocator=pol.allocator,
                )
                m["config"]["policy"] = pol.label
    except (TraceError, ValueError, OSError, RuntimeError) as exc:
        return _fail(str(exc))
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    out = write_metrics(m, Path(args.out) / "metrics.json")
    print(
        (f"{CLAIRVOYANT_LABEL} " if m["clairvoyant"] else "") +
        f"{m['jobs_completed']} jobs completed ({m['jobs_unfittable']} unfittable, {m['jobs_skipped']} skipped): "
        f"JCT mean {_fmt(m['jct_mean'])} s, p95 {_fmt(m['jct_p95'])} s, GPU util {_fmt(m['gpu_util_mean'])} -> {out}"
    )
    return 0


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


TABLE_COLUMNS = (
    ("jct_mean", "JCT mean s"), ("jct_p95", "JCT p95 s"), ("wait_mean", "wait s"),
    ("slowdown_mean", "slowdown"), ("makespan", "makespan s"), ("gpu_util_mean", "GPU util"),
    ("frag_share_mean", "idle share*"), ("fee_total", "fee $"), ("accuracy_final_mean", "accuracy"),
    ("jobs_completed", "done"), ("jobs_unfittable", "unfit"),
)


def _cmd_compare(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .metrics import dumps
    from .traces import TraceError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        policies = [(pol, args.clairvoyant) for pol in parse_policies(args.policies)]
        if args.clairvoyant_reference:
            policies += [(pol, True) for pol in parse_policies(args.clairvoyant_reference)]
        trace, topo = _load(args)
        measured = _is_measured(trace)
        for pol, _ in policies:
            if not measured and pol.allocator and not pol.placement:
                raise ValueError(f"policy {pol.label!r}: measured workloads run "
                                 "allocation policies (tiresias-2q, optimus-oracle, pollux, ordering/placement); other "
                                 "traces run ordering/placement[/scaling] or rlsched")
        config = _interval_config(args, trace) if measured else _config(args)
    except (TraceError, ValueError, OSError) as exc:
        return _fail(str(exc))
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    results = {}
    try:
        with _progress(args.quiet) as prog:
            overall = prog.add_task("policies", total=len(policies))
            for pol, clair in policies:
                name = pol.label
                if measured:
                    task = prog.add_task(f"  {name}", total=len(trace.jobs))
                    res, m = run_allocator(trace, topo, name, config, seed=args.seed,
                                           progress=lambda n, tot, task=task: prog.update(task, completed=n))
                    clair = res.clairvoyant
                    shown = label(name, clair)
                    if shown in results:
                        continue
                else:
                    shown = label(name, clair)
                    if shown in results:
                        continue  # the same run twice
                    task = prog.add_task(f"  {shown}", total=len(trace.jobs))
                    res, m = run_policy(
                        trace, topo, pol.ordering, pol.placement, pol.scaling, args.seed,
                        replace(policy_config(config, pol), clairvoyant=clair),
                        progress=lambda n, tot, task=task: prog.update(task, completed=n), allocator=pol.allocator,
                    )
                    m["config"]["policy"] = name
                rows.append({"policy": name, "clairvoyant": clair, "metrics": m})
                results[shown] = res
                prog.advance(overall)
    except (ValueError, RuntimeError) as exc:
        return _fail(str(exc))
    (out / "compare.json").write_text(dumps(rows))

    nodes, gpus = (topo.total_nodes, topo.total_gpus) if measured else (len(topo), topo.total_gpus)
    table = Table(title=f"{trace.name}: {len(trace.jobs)} jobs on {nodes} nodes / {gpus} GPUs, seed {args.seed}")
    table.add_column("policy")
    for _, head in TABLE_COLUMNS:
        table.add_column(head, justify="right")
    for row in rows:
        table.add_row(label(row["policy"], row["clairvoyant"]), *(_fmt(row["metrics"].get(k)) for k, _ in TABLE_COLUMNS))
    # a wide table: give it room when the output is not a terminal (logs, CI)
    console = Console(width=None if sys.stdout.isatty() else 180)
    console.print(table)
    console.print("* idle share: unallocated GPUs while jobs wait (fragmentation + blocking)")
    if any(row["clairvoyant"] for row in rows):
        console.print(f"{CLAIRVOYANT_LABEL}: the policy saw the jobs' true run times, which no live scheduler knows; not a baseline")
    plots = _plots(results, rows, out)
    console.print(f"wrote {out / 'compare.json'} and {', '.join(str(p) for p in plots)}")
    return 0


def _plots(results, rows, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        jct = np.sort([r.end - r.submit for r in res.records])
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for row in rows:
        s = row["metrics"]["series"]
        t = np.asarray(s["t"]) / 3600.0
        a1.plot(t, s["gpu_util"], label=label(row["policy"], row["clairvoyant"]), lw=1)
        a2.plot(t, s["queue_len"], label=label(row["policy"], row["clairvoyant"]), lw=1)
    a1.set_ylabel("GPU utilization")
    a1.set_ylim(0, 1.02)
    a2.set_ylabel("queued jobs")
    a2.set_xlabel("time (h)")
    a1.legend(fontsize=8)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "utilization_queue.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
