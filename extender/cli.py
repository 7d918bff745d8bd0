"""``rlsched extender serve``: run the kube-scheduler extender with its options
(placement policy and weights, topology labels, request limits and timeouts)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal

import numpy as np

from ..core.contract import DEFAULT_TOPOLOGY_LEVELS, parse_topology_levels

__all__ = ["register", "serve"]

log = logging.getLogger("rlsched.extender")

#: the placements the extender serves (``config.POLICIES``, spelt here so that building
#: the command line does not import the serving stack; a test keeps the two equal)
SERVED_POLICIES = ("das", "das-agent", "firstfit", "bestfit", "loadbalance", "topology", "fgd", "random")


def register(subparsers) -> None:
    p = subparsers.add_parser("extender", help="kube-scheduler extender (filter/prioritize)")
    sub = p.add_subparsers(dest="extender_command", metavar="ACTION")
    s = sub.add_parser("serve", help="serve /filter, /prioritize, /metrics, ...")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--host", default="127.0.0.1")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    src.add_argument("--static-nodes", metavar="FILE", help="load nodes (and pods) once from a NodeList YAML/JSON file")
    s.add_argument("--policy", default="das", choices=SERVED_POLICIES)
    s.add_argument("--model", default=None,
                   help="DAS model file (.safetensors or .json; default: the committed trained weights "
                   "core/weights/das.safetensors; 'none': the documented default parameters); "
                   "unreadable -> default parameters, logged and counted")
    s.add_argument("--topology-levels", default=",".join(DEFAULT_TOPOLOGY_LEVELS),
                   help="node-label keys, coarse to fine (last: hostname)")
    s.add_argument("--assume-ttl", type=float, default=30.0, help="seconds a scored, unbound pod keeps its GPUs")
    s.add_argument("--settle-timeout", type=float, default=0.5,
                   help="seconds to wait for a job's scored pods to show up bound before scoring its next pod (watch mode)")
    s.add_argument("--max-body-mib", type=float, default=10.0)
    s.add_argument("--read-timeout", type=float, default=10.0, help="seconds to receive a request body")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection has to send complete request headers (from accept, or from the "
                   "first byte of the next request on a kept-alive connection); then it is closed")
    s.add_argument("--idle-timeout", type=float, default=120.0,
                   help="seconds a kept-alive connection may stay idle (above kube-scheduler's 90 s, so the "
                   "client closes first)")
    s.add_argument("--max-connections", type=int, default=1024,
                   help="open connections beyond this are closed when accepted")
    s.add_argument("--debug-mib", type=float, default=16.0,
                   help="memory budget (MiB) of the /debug explanations kept (oldest dropped first)")
    s.add_argument("--seed", type=int, default=0, help="seed of the reconnect jitter")
    s.add_argument("--gc-gen0", type=_positive_int, default=GC_GEN0,
                   help="allocations between two young-generation garbage collections (Python's default: 700)")
    s.add_argument("--log-level", default="INFO")
    s.set_defaults(func=serve)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0


async def _serve(args: argparse.Namespace) -> int:
    from .. import __version__
    from .app import make_app
    from .config import build_extender, load_static
    from .server import ServeLimits, serve_app

    limits = ServeLimits(header_timeout=args.header_timeout, idle_timeout=args.idle_timeout,
                         max_connections=args.max_connections)
    levels = parse_topology_levels(args.topology_levels)
    model = resolve_model(args.policy, args.model)
    ext = build_extender(
        args.policy,
        model,
        levels=levels,
        assume_ttl=args.assume_ttl,
        settle_timeout=0.0 if args.static_nodes else args.settle_timeout,
        debug_bytes=int(args.debug_mib * 1024 * 1024),
    )
    tasks: list[asyncio.Task] = []
    api = None
    if args.static_nodes:
        n, m = load_static(args.static_nodes, ext.cache)
        log.info("loaded %d nodes and %d pods from %s", n, m, args.static_nodes)
    else:
        from .watch import Watcher, connect, make_binder

        api = await connect(args.kubeconfig)
        ext.binder = make_binder(api)
        watcher = Watcher(ext.cache, api, np.random.default_rng(args.seed))
        tasks.append(asyncio.create_task(watcher.run(), name="watch"))
    app = make_app(
        ext,
        max_body=int(args.max_body_mib * 1024 * 1024),
        read_timeout=args.read_timeout,
        version={"version": __version__},
    )
    served = await serve_app(app, args.host, args.port, limits, metrics=ext.metrics)
    tasks.append(asyncio.create_task(_freeze_when_synced(ext.cache, args.gc_gen0), name="gc"))
    log.info("extender (policy %s) listening on http://%s:%d", ext.policy.name, args.host, served.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiters = [asyncio.create_task(stop.wait())] + tasks
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    rc = 0
    for t in done:
        if t is not waiters[0] and t.exception() is not None:
            log.error("background task %s failed: %s", t.get_name(), t.exception())
            rc = 1
    for t in waiters:
        t.cancel()
    await served.close()
    if api is not None:
        await api.api_client.close()
    return rc


#: allocations between young-generation collections while serving (docs/performance.md)
GC_GEN0 = 10_000


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


async def _freeze_when_synced(cache, gen0: int) -> None:
    """Keep the garbage collector off what lives as long as the process: once the
    caches hold the cluster, its objects (nodes, pods, the node table, the model) are
    moved out of the collector's generations (``gc.freeze``), and ``gen0`` allocations
    start a collection instead of 700. A full collection otherwise walks every cached
    object again and again, a quarter of a request's time at 1,000 nodes."""
    gc.set_threshold(gen0, *gc.get_threshold()[1:])
    while not cache.ready:
        await asyncio.sleep(0.05)
    gc.collect()
    gc.freeze()
    log.info("caches synced: %d objects frozen out of garbage collection", gc.get_freeze_count())
    await asyncio.Event().wait()  # a task of the server's lifetime, cancelled with it


def resolve_model(policy: str, model: str | None) -> str | None:
    """The model file the extender serves: ``--model`` as given, the committed trained
    DAS weights when DAS runs without one, nothing for ``none`` or a heuristic
    (:func:`rlsched.core.das.resolve_placement_model`, as the operator resolves it)."""
    from ..core.das import resolve_placement_model

    return resolve_placement_model(policy, model)
