#!/usr/bin/env python3
"""Bridge to the released Pollux policy (PyPI ``adaptdl-sched==0.2.11``, ``adaptdl==0.2.11``).

Run by the Python of the optional Pollux environment (``make pollux-env``), never by
rlsched's own: it imports nothing of rlsched and copies nothing of the released packages.
Its client is :class:`rlsched.sim.peers.pollux.PolluxAllocator`; the JSON-lines protocol
and what each job gives the policy: docs/benchmark.md, "The Pollux bridge".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback

PROTOCOL = 1
#: the paper's simulator caps a job at 64 replicas
MAX_REPLICAS = 64
EPS = 1e-8

log = logging.getLogger("pollux_bridge")


class BadRequest(ValueError):
    """A request the bridge cannot serve; the message says which field."""


def _load():
    """Import the released packages (and silence pymoo's hint printed on stdout)."""
    import numpy as np
    import pymoo
    from pymoo.config import Config

    Config.show_compile_hint = False
    import adaptdl.goodput as goodput
    import adaptdl_sched.policy.pollux as pollux
    import adaptdl_sched.policy.speedup as speedup
    import adaptdl_sched.policy.utils as utils

    logging.getLogger(pollux.__name__).setLevel(logging.WARNING)
    return np, pymoo, goodput, pollux, speedup, utils


def _versions(np, pymoo) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0], "numpy": np.__version__, "pymoo": getattr(pymoo, "__version__", "?")}
    for dist in ("adaptdl", "adaptdl-sched", "scipy", "autograd"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


# ---------------------------------------------------------------------------- parsing
def _num(d: dict, key: str, where: str, *, integer: bool = False, minimum: float | None = None, optional: bool = False):
    v = d.get(key)
    if v is None:
        if optional:
            return None
        raise BadRequest(f"{where}: missing {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"{where}: {key!r} must be a finite number, got {v!r}")
    if integer:
        if v != int(v):
            raise BadRequest(f"{where}: {key!r} must be an integer, got {v!r}")
        v = int(v)
    if minimum is not None and v < minimum:
        raise BadRequest(f"{where}: {key!r} must be >= {minimum}, got {v!r}")
    return v


def parse_nodes(raw) -> dict[int, int]:
    if not isinstance(raw, list):
        raise BadRequest("'nodes' must be a list")
    nodes: dict[int, int] = {}
    for k, n in enumerate(raw):
        if not isinstance(n, dict):
            raise BadRequest(f"nodes[{k}] must be an object")
        idx = _num(n, "index", f"nodes[{k}]", integer=True)
        if idx in nodes:
            raise BadRequest(f"nodes[{k}]: duplicate index {idx}")
        nodes[idx] = _num(n, "gpus", f"nodes[{k}]", integer=True, minimum=0)
    return nodes


def parse_job(j, k: int, nodes: dict[int, int]) -> dict:
    if not isinstance(j, dict):
        raise BadRequest(f"jobs[{k}] must be an object")
    jid = j.get("id")
    if not isinstance(jid, str) or not jid:
        raise BadRequest(f"jobs[{k}]: 'id' must be a non-empty string")
    w = f"job {jid}"
    out = {"id": jid}
    out["submit_time"] = _num(j, "submit_time", w)
    out["age"] = _num(j, "age", w, minimum=0)
    out["attained_service"] = _num(j, "attained_service", w, minimum=0)
    out["num_restarts"] = _num(j, "num_restarts", w, integer=True, minimum=0)
    out["min_replicas"] = _num(j, "min_replicas", w, integer=True, minimum=0)
    out["max_replicas"] = _num(j, "max_replicas", w, integer=True, minimum=0)
    alloc = j.get("allocation", [])
    if not isinstance(alloc, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in alloc):
        raise BadRequest(f"{w}: 'allocation' must be a list of node indices")
    unknown = sorted(set(alloc) - set(nodes))
    if unknown:
        raise BadRequest(f"{w}: allocation on unknown nodes {unknown}")
    out["allocation"] = list(alloc)
    lim = j.get("limits")
    if not isinstance(lim, dict):
        raise BadRequest(f"{w}: 'limits' must be an object")
    lw = f"{w} limits"
    out["init_batch_size"] = _num(lim, "init_batch_size", lw, integer=True, minimum=1)
    out["max_batch_size"] = _num(lim, "max_batch_size", lw, integer=True, minimum=1)
    out["min_local_bsz"] = _num(lim, "min_local_bsz", lw, integer=True, minimum=1)
    out["max_local_bsz"] = _num(lim, "max_local_bsz", lw, integer=True, minimum=1)
    if out["init_batch_size"] > out["max_batch_size"] or out["min_local_bsz"] > out["max_local_bsz"]:
        raise BadRequest(f"{w}: limits need init_batch_size <= max_batch_size and min_local_bsz <= max_local_bsz")
    out["fixed_batch_size"] = _num(j, "fixed_batch_size", w, integer=True, minimum=1, optional=True)
    out["grad_sqr"] = _num(j, "grad_sqr", w, minimum=0, optional=True)
    out["grad_var"] = _num(j, "grad_var", w, minimum=0, optional=True)
    prof = j.get("profile", [])
    if not isinstance(prof, list):
        raise BadRequest(f"{w}: 'profile' must be a list")
    samples: dict[tuple[int, int, int], tuple[float, float]] = {}
    for s, row in enumerate(prof):
        if not isinstance(row, list) or len(row) != 5:
            raise BadRequest(f"{w}: profile[{s}] must be [num_nodes, num_replicas, atomic_bsz, step_time, sync_time]")
        d = dict(zip(("num_nodes", "num_replicas", "atomic_bsz", "step_time", "sync_time"), row))
        sw = f"{w} profile[{s}]"
        n = _num(d, "num_nodes", sw, integer=True, minimum=1)
        r = _num(d, "num_replicas", sw, integer=True, minimum=n)
        b = _num(d, "atomic_bsz", sw, integer=True, minimum=1)
        step = _num(d, "step_time", sw)
        sync = _num(d, "sync_time", sw, minimum=0)
        if not 0 <= sync < step:
            raise BadRequest(f"{sw}: need 0 <= sync_time < step_time, got {sync!r}, {step!r}")
        samples.setdefault((n, r, b), (float(step), float(sync)))  # the first measurement of a configuration
    out["profile"] = samples
    return out


def parse_request(req) -> tuple[str, dict[int, int], list[dict]]:
    if not isinstance(req, dict):
        raise BadRequest("a request must be a JSON object")
    resource = req.get("resource")
    if not isinstance(resource, str) or not resource:
        raise BadRequest("'resource' must name the GPU resource")
    nodes = parse_nodes(req.get("nodes"))
    raw = req.get("jobs")
    if not isinstance(raw, list):
        raise BadRequest("'jobs' must be a list")
    jobs = [parse_job(j, k, nodes) for k, j in enumerate(raw)]
    ids = [j["id"] for j in jobs]
    if len(set(ids)) != len(ids):
        raise BadRequest("duplicate job ids")
    return resource, nodes, jobs


# ---------------------------------------------------------------------------- batch sizes
def split_batch(batch_size: int, replicas: int, job: dict) -> tuple[int, int]:
    """(per-GPU batch, accumulation steps) that train ``batch_size`` on ``replicas``
    GPUs: accumulate when the per-GPU share exceeds the largest local batch, and at
    least once on one GPU above the initial batch size (AdaptDL's rule)."""
    local = math.ceil(batch_size / replicas - EPS)
    accum = math.ceil(local / job["max_local_bsz"] - EPS) - 1
    if replicas == 1 and batch_size > job["init_batch_size"]:
        accum = max(accum, 1)
    return math.ceil(local / (accum + 1) - EPS), accum


def cap_batch(atomic: int, accum: int, replicas: int, job: dict) -> tuple[int, int]:
    """Cap the per-GPU batch so the total batch stays within ``max_batch_size``."""
    atomic = min(int(atomic), job["max_batch_size"] // (replicas * (accum + 1)))
    if atomic < 1:
        raise BadRequest(f"job {job['id']}: {replicas} replicas with {accum} accumulation steps exceed "
                         f"max_batch_size {job['max_batch_size']}")
    return atomic, int(accum)


# ---------------------------------------------------------------------------- the bridge
def fixed_cluster_policy(pollux):
    """The released policy on a cluster of fixed size: it keeps every node (its
    autoscaler's wish for fewer nodes is not applied; the paper's simulator did the
    same). Nothing else of the policy changes."""

    class FixedClusterPolicy(pollux.PolluxPolicy):
        def _desired_nodes(self, utilities, values, nodes):
            return len(nodes)

    return FixedClusterPolicy()


class Bridge:
    def __init__(self, mods, *, autoscale: bool = False) -> None:
        self.np, _, self.goodput, pollux, self.speedup, self.utils = mods
        self.autoscale = autoscale
        self.policy = pollux.PolluxPolicy() if autoscale else fixed_cluster_policy(pollux)
        #: job id -> (its samples, the fitted perf params); refitted when the samples change
        self._fits: dict[str, tuple[tuple, object]] = {}

    def perf_params(self, job: dict):
        samples = job["profile"]
        if not samples:
            return None, False
        key = tuple(sorted(samples.items()))
        hit = self._fits.get(job["id"])
        if hit is not None and hit[0] == key:
            return hit[1], False
        np = self.np
        conf = list(samples)
        step = np.array([samples[c][0] for c in conf])
        sync = np.array([samples[c][1] for c in conf])
        params = self.goodput.fit_perf_params(
            np.array([c[0] for c in conf]), np.array([c[1] for c in conf]), np.array([c[2] for c in conf]),
            step - sync, step)
        self._fits[job["id"]] = (key, params)
        return params, True

    def handle(self, req) -> dict:
        t0 = time.perf_counter()
        gpu, nodes, jobs = parse_request(req)
        self._fits = {k: v for k, v in self._fits.items() if k in {j["id"] for j in jobs}}
        utils = self.utils
        infos, goodputs, fits = {}, {}, 0
        for job in jobs:
            params, fitted = self.perf_params(job)
            fits += fitted
            most = max((c[1] for c in job["profile"]), default=0)
            max_r = min(max(2 * most, 1), MAX_REPLICAS, job["max_batch_size"] // job["min_local_bsz"], job["max_replicas"])
            min_r = job["min_replicas"] if job["min_replicas"] > 1 else 0
            if max_r < max(min_r, 1):
                continue  # cannot run at all: no GPUs
            if params is None:
                speedup = lambda n, r: r  # noqa: E731  (no measurement yet: linear)
            else:
                sqr, var = job["grad_sqr"], job["grad_var"]
                grad = self.goodput.GradParams(0.0, 1.0) if sqr is None or var is None else self.goodput.GradParams(sqr, var)
                gfn = self.goodput.GoodputFunction(params, grad, job["init_batch_size"])
                goodputs[job["id"]] = gfn
                speedup = self.speedup.SpeedupFunction(
                    gfn, job["max_batch_size"], (job["min_local_bsz"], job["max_local_bsz"]), accumulation=True)
            info = utils.JobInfo({gpu: 1}, speedup, job["submit_time"], min_r, max_r, preemptible=True)
            info.num_restarts = job["num_restarts"]
            info.age = job["age"]
            infos[job["id"]] = info
        node_infos = {i: utils.NodeInfo({gpu: g}, preemptible=False) for i, g in nodes.items()}
        desired = len(nodes)
        allocations: dict = {}
        if infos and node_infos and any(nodes.values()):
            prev = {j["id"]: list(j["allocation"]) for j in jobs if j["allocation"] and j["id"] in infos}
            # fixed: no node can be added (a template without GPUs); autoscale: the released
            # allocator's template, the largest node, which may be requested
            template = utils.NodeInfo({gpu: max(nodes.values()) if self.autoscale else 0}, preemptible=False)
            allocations, desired = self.policy.optimize(infos, node_infos, prev, template)
        by_id = {j["id"]: j for j in jobs}
        out = {}
        for jid, alloc in allocations.items():
            if not alloc:
                continue
            job = by_id[jid]
            alloc = [int(i) for i in alloc]
            r, n = len(alloc), len(set(alloc))
            if job["fixed_batch_size"] is not None:
                atomic, accum = split_batch(job["fixed_batch_size"], r, job)
            elif jid in goodputs:
                _, atomic, accum = goodputs[jid].optimize(
                    n, r, max_batch_size=job["max_batch_size"],
                    atomic_bsz_range=(job["min_local_bsz"], job["max_local_bsz"]), accumulation=True)
            else:
                atomic, accum = split_batch(max(job["init_batch_size"], job["min_local_bsz"] * r), r, job)
            atomic, accum = cap_batch(atomic, accum, r, job)
            out[jid] = {"nodes": alloc, "atomic_bsz": atomic, "accum_steps": accum}
        return {"allocations": out,
                "info": {"desired_nodes": int(desired), "seconds": time.perf_counter() - t0, "fits": fits}}


def serve(bridge: Bridge, inp, out) -> None:
    for line in inp:
        if not line.strip():
            continue
        try:
            reply = bridge.handle(json.loads(line))
        except (BadRequest, json.JSONDecodeError) as e:
            log.warning("bad request: %s", e)
            reply = {"error": f"bad request: {e}"}
        except Exception as e:  # the policy failed on this request: report it, keep serving
            log.error("policy failed:\n%s", traceback.format_exc())
            reply = {"error": f"policy failed: {type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the genetic algorithm's random numbers")
    ap.add_argument("--cluster", choices=("fixed", "autoscale"), default="fixed",
                    help="fixed (default): the cluster's nodes are all there is, as in the paper's evaluation; "
                         "autoscale: as the released allocator calls the policy (it may want more or fewer nodes)")
    ap.add_argument("--check", action="store_true", help="print the package versions as JSON and exit")
    args = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="pollux_bridge: %(levelname)s %(message)s")
    # The protocol owns the real stdout; whatever a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        mods = _load()
    except ImportError as e:
        msg = f"the Pollux packages do not import ({type(e).__name__}: {e}); run `make pollux-env`"
        log.error("%s", msg)
        proto.write(json.dumps({"error": msg}) + "\n")
        proto.flush()
        return 2
    versions = _versions(mods[0], mods[1])
    if args.check:
        proto.write(json.dumps(versions) + "\n")
        proto.flush()
        return 0
    import random

    random.seed(args.seed)
    mods[0].random.seed(args.seed)
    bridge = Bridge(mods, autoscale=args.cluster == "autoscale")
    proto.write(json.dumps({"ready": True, "protocol": PROTOCOL, "cluster": args.cluster, "versions": versions}) + "\n")
    proto.flush()
    serve(bridge, sys.stdin, proto)
    return 0


if __name__ == "__main__":
    sys.exit(main())
