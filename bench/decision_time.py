"""How long one allocation decision takes, against FIFO's in the same run (issue 25, item 7).

Target: one decision over 16 nodes x 4 GPUs and 160 jobs in under 100 ms, and in
under 1 s over 1,024 nodes x 4 GPUs and 1,000 jobs. Every figure is also given as a
ratio to ``fifo/bestfit``'s decision time at the same size in the same run (the
baseline is always measured, whether or not ``--policies`` names it), and per policy
its growth in jobs and nodes.

**Where the inputs come from.** Decision inputs are what the interval engine
(:class:`rlsched.sim.interval.IntervalSimulator`) hands an allocator mid-run, taken from
the engine itself: each ``--capture-traces`` workload (default two of the Pollux OSDI'21
workloads at 1.5x load, 16 nodes x 4 GPUs, 60 s interval, 30 s restart) is run for
``--capture-hours`` (4 h) under each ``--capture-drivers`` policy (``tiresias-2q``:
fixed-size jobs, preemptive LAS, many multi-node gangs; ``fifo/bestfit/optimus``:
elastic resizes, so jobs carry throughput samples from several placements and batch
sizes), and the engine's ``AllocJob`` list is recorded every ``--capture-every``
decisions (10) after the first hour (a recording wrapper around the driving allocator;
nothing is changed on the way). Each recorded job is a job as a live scheduler sees it:
its ``BatchBounds``, its current allocation and batch, the
``ProfileSample``\\ s it measured on the placements it ran, its latest
``grad_sqr``/``grad_var``, attained service, age, restarts, epoch and metrics.

**Reaching a size** ``<nodes>x<gpus>:<jobs>`` (:func:`build_inputs`, a seeded numpy
``Generator``, ``--seed``): recorded snapshots are taken whole, in a shuffled order
(reshuffled each time the list is used up), each snapshot's jobs in turn, until there
are ``<jobs>`` jobs (the last snapshot contributes a random subset), so the mix of
running and waiting jobs, applications and histories is the mix the engine had at
those moments. Every job gets a new unique id (``<id>#<k>``), its age moved by up to
one interval either way (its submit time is then ``now - age``) and its attained
service scaled by a factor in [0.95, 1.05]; what it measured (profile, gradient
statistics, epoch, progress, metrics, batch) is kept. A running job keeps the shape
of its placement (GPUs per node, replica order): each of its node groups is put on a
distinct node of the larger cluster by best fit (fewest free GPUs that still hold the
group, ties broken at random), so no node is ever over capacity; a job whose shape no
longer fits becomes a waiting job (no GPUs, batch 0: a preempted job, progress kept).
``target_replicas`` and ``max_replicas`` are recomputed the way the engine computes
them for the new cluster's GPU count. On a small cluster the queue is long (16 x 4 with
160 jobs: the cluster full, about 150 jobs waiting); on 1,024 x 4 with 1,000 jobs the
cluster is full too, with more than half of the jobs running. ``inputs`` in the JSON
describes each size's input (running, waiting, GPUs used, multi-node jobs, profile
samples, applications).

**Measuring** (per size, per policy, in a child process so a slow policy can be
stopped): one warm-up decision (its time is reported as ``warmup_s``), then
``--repeats`` decisions each on a *fresh* allocator instance (created, and its inputs
copied, outside the timed region: allocators keep state between calls), and a
*steady* series: one instance called at ``now`` (reported as ``steady_first_s``),
then ``--repeats`` times at ``now + 60 s``, ``now + 120 s``, ... with the previous
decision applied to the jobs the way the engine applies it (new nodes, batch and accumulation steps, a restart counted
when the node list changes, age and attained service advanced, a ``ProfileSample``
from the measured application for a placement the job had not run on, its gradient
statistics and progress for the interval; no arrivals or completions) - this is what a
policy that carries state between intervals (``pollux-paper``'s population, fitted
models) costs in a run. Seconds are ``time.perf_counter`` around ``allocate`` alone
(CPU seconds of the process beside them); every decision is checked with
:func:`rlsched.core.allocation.check_allocations` outside the timed region. Reported:
median and max seconds of each series and the ratio of the median to FIFO's median
at the same size and series. Each policy has ``--max-seconds-per-policy`` of wall time
over all sizes, shared out evenly over the sizes still to measure (what a size leaves
unused goes to the next ones); a measurement still running when its share is spent is
stopped and recorded as skipped with the reason (decisions finished before that are
kept, the row marked partial); a child is limited to ``--max-memory-gb`` of address
space (a ``MemoryError`` is recorded as an error row). Targets are reported as pass/fail per policy, for
information: a miss never fails the benchmark.

    .venv/bin/python bench/decision_time.py --out bench/results/decision_time.json
    .venv/bin/python bench/decision_time.py --sizes 16x4:160 --policies fifo/bestfit,pollux-paper --repeats 3
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # before numpy loads: one BLAS thread unless the caller sets these (a decision is
    # single-threaded work on small products; the machine may be shared)
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import gc
import json
import math
import multiprocessing as mp
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlsched.core.allocation import (
    Allocation,
    AllocJob,
    AllocNode,
    ProfileSample,
    check_allocations,
    fixed_batch,
)

__all__ = [
    "Size", "parse_sizes", "capture", "build_inputs", "apply_decision", "growth", "main",
    "BASELINE", "TARGETS",
]

BASELINE = "fifo/bestfit"
DEFAULT_POLICIES = "fifo/bestfit,tiresias-2q,pollux-paper,goodput"
DEFAULT_SIZES = "16x4:160,64x4:400,256x4:1000,1024x4:1000"
#: issue 25 item 7: size -> seconds one decision must stay under (reported, never enforced)
TARGETS = {"16x4:160": 0.1, "1024x4:1000": 1.0}
DEFAULT_CAPTURE_TRACES = "pollux:workloads-1.5/workload-1,pollux:workloads-1.5/workload-6"
DEFAULT_CAPTURE_DRIVERS = "tiresias-2q,fifo/bestfit/optimus"
#: the engine's scheduling interval (s), also the step between steady calls
INTERVAL = 60.0
RESTART_COST = 30.0


# ---------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Size:
    nodes: int
    gpus: int
    jobs: int

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.gpus}:{self.jobs}"


def parse_sizes(text: str) -> list[Size]:
    """``16x4:160,1024x4:1000`` -> sizes (nodes x GPUs per node : jobs)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            cluster, jobs = part.split(":")
            nodes, gpus = cluster.lower().split("x")
            size = Size(int(nodes), int(gpus), int(jobs))
        except ValueError:
            raise ValueError(f"bad size {part!r}: want NODESxGPUS:JOBS, e.g. 16x4:160") from None
        if min(size.nodes, size.gpus, size.jobs) < 1:
            raise ValueError(f"bad size {part!r}: every number must be >= 1")
        out.append(size)
    if not out:
        raise ValueError("no sizes given")
    return out


# ---------------------------------------------------------------------- capture
class _Recorder:
    """Wraps the driving allocator; keeps the engine's job list every ``every``
    decisions from ``start`` seconds on. Changes nothing."""

    def __init__(self, inner, every: int, start: float) -> None:
        self.inner, self.every, self.start = inner, every, start
        self.name = inner.name
        self.clairvoyant, self.type_aware = inner.clairvoyant, inner.type_aware
        self.calls = 0
        self.snapshots: list[tuple[float, list[AllocJob]]] = []

    def allocate(self, jobs, nodes, now):
        if now >= self.start and self.calls % self.every == 0 and jobs:
            self.snapshots.append((now, list(jobs)))  # the engine builds fresh views each call
        self.calls += 1
        return self.inner.allocate(jobs, nodes, now)


def capture(data_dir: str | os.PathLike | None, traces: Sequence[str], drivers: Sequence[str], *,
            hours: float = 4.0, every: int = 10, start_hours: float = 1.0):
    """Run each trace under each driver in the interval engine and record its job lists.

    Returns ``(snapshots, apps, info)``: snapshots as ``(source, now, jobs)``, the
    measured applications by name (for the steady series), and what was captured."""
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.traces import load_trace

    snapshots: list[tuple[str, float, list[AllocJob]]] = []
    apps: dict[str, Any] = {}
    info = []
    for spec in traces:
        trace = load_trace(spec, data_dir=data_dir)
        apps.update(trace.apps)
        cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost, max_time=hours * 3600.0,
                             record_series=False)
        for driver in drivers:
            inner = make_allocator(driver, seed=0)
            rec = _Recorder(inner, every, start_hours * 3600.0)
            t0 = time.perf_counter()
            try:
                IntervalSimulator(trace.jobs, trace.apps, rec, nodes=trace.nodes, gpus_per_node=trace.gpus_per_node,
                                  config=cfg).run()
            finally:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()
            src = f"{spec}@{driver}"
            snapshots.extend((src, now, jobs) for now, jobs in rec.snapshots)
            info.append({"trace": spec, "driver": driver, "nodes": trace.nodes, "gpus_per_node": trace.gpus_per_node,
                         "hours": hours, "snapshots": len(rec.snapshots),
                         "jobs_per_snapshot": [len(j) for _, j in rec.snapshots],
                         "wall_s": round(time.perf_counter() - t0, 3)})
    if not snapshots:
        raise RuntimeError("the capture recorded no job lists (traces too short for --capture-hours?)")
    return snapshots, apps, info


# ---------------------------------------------------------------------- inputs
def _max_replicas(j: AllocJob, total: int) -> int:
    """The engine's ``max_replicas`` for the job on a cluster of ``total`` GPUs
    (:meth:`rlsched.sim.interval.IntervalSimulator._max_replicas`)."""
    from rlsched.sim.measured import MAX_REPLICAS

    batch = j.target_batch_size or j.bounds.init_batch
    want = j.target_replicas or 1
    cap = min(batch // j.bounds.min_local_batch, total, MAX_REPLICAS.get(j.application, total))
    return max(cap, min(want, total), 1)


def build_inputs(snapshots: Sequence[tuple[str, float, Sequence[AllocJob]]], size: Size,
                 rng: np.random.Generator) -> tuple[list[AllocJob], list[AllocNode], float]:
    """``size.jobs`` jobs on ``size.nodes`` x ``size.gpus`` from the recorded snapshots
    (the module docstring says how). Returns ``(jobs, nodes, now)``."""
    nodes = [AllocNode(i, size.gpus, f"node-{i}") for i in range(size.nodes)]
    total = size.nodes * size.gpus
    free = np.full(size.nodes, size.gpus, dtype=np.int64)
    max_age = max(j.age for _, _, jobs in snapshots for j in jobs)
    now = math.ceil((max_age + 3600.0) / INTERVAL) * INTERVAL
    picked: list[AllocJob] = []
    order: list[int] = []
    k = 0
    while len(picked) < size.jobs:
        if not order:
            order = list(rng.permutation(len(snapshots)))
        snap = list(snapshots[order.pop()][2])
        need = size.jobs - len(picked)
        if len(snap) > need:
            keep = sorted(rng.choice(len(snap), size=need, replace=False))
            snap = [snap[i] for i in keep]
        for j in snap:
            alloc = _remap(j.allocation, free, size.gpus, rng)
            age = max(j.age + float(rng.uniform(-INTERVAL, INTERVAL)), 0.0)
            new = dataclasses.replace(
                j, id=f"{j.id}#{k}", submit_time=now - age, age=age,
                attained_service=j.attained_service * float(rng.uniform(0.95, 1.05)),
                target_replicas=min(j.target_replicas, total) if j.target_replicas else j.target_replicas,
            )
            new.max_replicas = _max_replicas(new, total)
            if alloc:
                new.allocation = alloc
            else:
                new.allocation, new.batch_size, new.atomic_bsz, new.accum_steps = (), 0, 0, 0
            picked.append(new)
            k += 1
    return picked, nodes, float(now)


def _remap(alloc: tuple[int, ...], free: np.ndarray, gpus: int, rng: np.random.Generator) -> tuple[int, ...]:
    """The same placement shape on distinct nodes with room (best fit, random ties),
    taken from ``free``; ``()`` when it does not fit (nothing taken)."""
    if not alloc:
        return ()
    groups: dict[int, int] = {}
    for n in alloc:
        groups[n] = groups.get(n, 0) + 1
    if max(groups.values()) > gpus:
        return ()
    chosen: dict[int, int] = {}
    used = np.zeros(free.shape[0], dtype=bool)
    for old, c in sorted(groups.items(), key=lambda kv: -kv[1]):
        ok = (free >= c) & ~used
        if not ok.any():
            return ()
        room = np.where(ok, free, np.iinfo(np.int64).max)
        best = np.flatnonzero(room == room.min())
        pick = int(best[rng.integers(best.size)])
        chosen[old] = pick
        used[pick] = True
    for old, c in groups.items():
        free[chosen[old]] -= c
    return tuple(chosen[n] for n in alloc)


def describe_inputs(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> dict:
    running = [j for j in jobs if j.allocation]
    apps: dict[str, int] = {}
    for j in jobs:
        apps[j.application] = apps.get(j.application, 0) + 1
    return {
        "nodes": len(nodes), "gpus_per_node": nodes[0].gpus if nodes else 0, "jobs": len(jobs), "now": now,
        "running": len(running), "waiting": len(jobs) - len(running),
        "gpus_used": sum(len(j.allocation) for j in running), "gpus_total": sum(n.gpus for n in nodes),
        "multi_gpu_running": sum(1 for j in running if len(j.allocation) > 1),
        "multi_node_running": sum(1 for j in running if len(set(j.allocation)) > 1),
        "profile_samples_mean": round(float(np.mean([len(j.profile) for j in jobs])), 2),
        "profile_samples_max": max(len(j.profile) for j in jobs),
        "with_grad_stats": sum(1 for j in jobs if j.grad_sqr is not None),
        "applications": dict(sorted(apps.items())),
    }


# ---------------------------------------------------------------------- steady feedback
def apply_decision(jobs: Sequence[AllocJob], result: Mapping[str, Allocation], apps: Mapping[str, Any],
                   dt: float = INTERVAL) -> list[AllocJob]:
    """The jobs ``dt`` seconds after ``result`` was applied, as the interval engine
    would show them (module docstring); new objects, ``jobs`` untouched."""
    from rlsched.sim.measured import placement_of

    out = []
    for j in jobs:
        a = result.get(j.id, Allocation())
        nj = dataclasses.replace(j, age=j.age + dt)
        nodes = tuple(a.nodes)
        if not nodes:
            nj.allocation, nj.batch_size, nj.atomic_bsz, nj.accum_steps = (), 0, 0, 0
            out.append(nj)
            continue
        app = apps[j.application]
        if a.atomic_bsz is None:
            atomic, accum = fixed_batch(j.target_batch_size or j.bounds.init_batch, len(nodes), j.bounds)
        else:
            atomic, accum = int(a.atomic_bsz), int(a.accum_steps or 0)
        delay = 0.0
        if sorted(nodes) != sorted(j.allocation):
            delay = RESTART_COST
            if j.profile or j.attained_service > 0:  # the first start is not a restart
                nj.num_restarts = j.num_restarts + 1
        place = placement_of(nodes)
        r = len(nodes)
        batch = r * atomic * (accum + 1)
        nj.allocation, nj.atomic_bsz, nj.accum_steps, nj.batch_size = nodes, atomic, accum, batch
        nj.attained_service = j.attained_service + dt * r
        cost, step, sync = app.update_time(place, atomic, accum)
        if all((p.num_nodes, p.num_replicas, p.atomic_bsz) != (len(place), r, atomic) for p in j.profile):
            nj.profile = j.profile + (ProfileSample(len(place), r, atomic, step, sync),)
        nj.grad_sqr, nj.grad_var = app.grad_stats(batch, j.epoch)
        target = float(app.epoch_progress[min(j.epoch, app.max_epochs - 1)])
        gained = app.gain(batch, j.epoch) / cost * max(dt - delay, 0.0)
        nj.progress = min(j.progress + gained, max(target - 1e-6, j.progress))  # stays in its epoch
        out.append(nj)
    return out


# ---------------------------------------------------------------------- serialisation
def _job_dict(j: AllocJob) -> dict:
    d = dataclasses.asdict(j)
    d["oracle"] = None
    return d


def _alloc_dict(result: Mapping[str, Allocation]) -> dict:
    return {jid: {"nodes": list(a.nodes), "atomic_bsz": a.atomic_bsz, "accum_steps": a.accum_steps}
            for jid, a in result.items()}


# ---------------------------------------------------------------------- measuring (child)
def _copy_jobs(jobs: Sequence[AllocJob]) -> list[AllocJob]:
    return [dataclasses.replace(j) for j in jobs]


def _make(policy: str, seed: int):
    """An allocator from ``name[@key=value[,key=value]]`` (the options are numbers,
    passed to the allocator's constructor, e.g. ``goodput@refit_tolerance=0.05``)."""
    from rlsched.core.live_allocation import parse_allocator_options
    from rlsched.sim.allocators import make_allocator

    name, kwargs = parse_allocator_options(policy)
    return make_allocator(name, seed=seed, **kwargs)


def _timed(alloc, jobs, nodes, now):
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    result = alloc.allocate(jobs, nodes, now)
    t = time.perf_counter() - t0
    c = time.process_time() - c0
    return result, t, c


def _close(alloc) -> None:
    close = getattr(alloc, "close", None)
    if close is not None:
        close()


def _measure(conn, policy: str, seed: int, jobs, nodes, now: float, apps, repeats: int, save: bool,
             max_memory_gb: float) -> None:
    """Child process: the warm-up, fresh and steady series; one message per decision."""
    try:
        if max_memory_gb > 0:
            import resource

            lim = int(max_memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

        def send(phase: str, call: int, inp, result, t: float, c: float) -> None:
            err = None
            try:
                check_allocations(inp, nodes, result)
            except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
                err = f"{type(exc).__name__}: {exc}"
            msg = {"kind": "call", "phase": phase, "call": call, "seconds": t, "cpu_seconds": c, "invalid": err,
                   "gpus_allocated": sum(len(a.nodes) for a in result.values()),
                   "jobs_running": sum(1 for a in result.values() if a.nodes)}
            if save:
                msg["decision"] = {"jobs": [_job_dict(j) for j in inp], "output": _alloc_dict(result)}
            conn.send(msg)

        # warm-up: a throw-away instance, the first decision of this process
        alloc = _make(policy, seed)
        inp = _copy_jobs(jobs)
        result, t, c = _timed(alloc, inp, nodes, now)
        _close(alloc)
        send("warmup", 0, inp, result, t, c)
        # fresh: a new instance per decision, made outside the timed region
        for i in range(repeats):
            alloc = _make(policy, seed)
            inp = _copy_jobs(jobs)
            result, t, c = _timed(alloc, inp, nodes, now)
            _close(alloc)
            send("fresh", i, inp, result, t, c)
        # steady: one instance, successive intervals, each decision applied
        alloc = _make(policy, seed)
        try:
            inp = _copy_jobs(jobs)
            result, t, c = _timed(alloc, inp, nodes, now)
            send("steady-first", 0, inp, result, t, c)
            for i in range(repeats):
                inp = apply_decision(inp, result, apps)
                result, t, c = _timed(alloc, inp, nodes, now + INTERVAL * (i + 1))
                send("steady", i, inp, result, t, c)
        finally:
            _close(alloc)
        conn.send({"kind": "done"})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        try:
            conn.send({"kind": "error", "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc(limit=8)})
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()


def _series(calls: list[dict]) -> dict:
    secs = [c["seconds"] for c in calls]
    return {
        "calls": len(calls),
        "seconds": [round(s, 6) for s in secs],
        "cpu_seconds": [round(c["cpu_seconds"], 6) for c in calls],
        "median_s": statistics.median(secs) if secs else None,
        "max_s": max(secs) if secs else None,
        "gpus_allocated": [c["gpus_allocated"] for c in calls],
        "jobs_running": [c["jobs_running"] for c in calls],
        "invalid": [c["invalid"] for c in calls if c["invalid"]],
    }


def run_one(policy: str, size: Size, inputs, apps, *, repeats: int, seed: int, deadline: float, save: bool,
            max_memory_gb: float, on_call=None) -> tuple[dict, list[dict]]:
    """Measure ``policy`` on one size's inputs in a child process stopped at
    ``deadline`` (perf_counter); returns the row and the saved decisions."""
    jobs, nodes, now = inputs
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_measure, args=(child, policy, seed, jobs, nodes, now, apps, repeats, save,
                                              max_memory_gb), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    child.close()
    calls: list[dict] = []
    status, reason, tb, timed_out = "ok", None, None, False
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not parent.poll(left):
                status, reason, timed_out = "skipped", "stopped", True
                break
            try:
                msg = parent.recv()
            except EOFError:
                status, reason = "error", f"the measuring process ended without a result (exit code {proc.exitcode})"
                break
            if msg["kind"] == "call":
                calls.append(msg)
                if on_call is not None:
                    on_call(msg)
            elif msg["kind"] == "done":
                break
            else:
                status, reason, tb = "error", msg["error"], msg.get("traceback")
                break
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    by = {ph: [c for c in calls if c["phase"] == ph] for ph in ("warmup", "fresh", "steady-first", "steady")}
    done = len(calls)
    expected = 2 + 2 * repeats
    if status != "ok" and done:
        status = "partial"
    row = {
        "policy": policy, "size": size.label, "nodes": size.nodes, "gpus_per_node": size.gpus, "jobs": size.jobs,
        "status": status, "reason": reason, "decisions": done, "decisions_expected": expected,
        "warmup_s": by["warmup"][0]["seconds"] if by["warmup"] else None,
        "steady_first_s": by["steady-first"][0]["seconds"] if by["steady-first"] else None,
        "fresh": _series(by["fresh"]), "steady": _series(by["steady"]),
        "invalid": [f"{c['phase']}[{c['call']}]: {c['invalid']}" for c in calls if c["invalid"]],
        "wall_s": round(time.perf_counter() - t0, 3), "timed_out": timed_out,
    }
    if tb:
        row["traceback"] = tb
    saved = [{"policy": policy, "size": size.label, "phase": c["phase"], "call": c["call"], **c["decision"]}
             for c in calls if "decision" in c]
    return row, saved


# ---------------------------------------------------------------------- report
def growth(rows: Sequence[dict], policy: str, series: str) -> dict:
    """How ``policy``'s median grows: between consecutive measured sizes, and the
    least-squares exponents of ``t ~ jobs^a * nodes^b`` when the sizes allow it."""
    pts = [(r["jobs"], r["nodes"], r[series]["median_s"]) for r in rows
           if r["policy"] == policy and r[series]["median_s"] and r[series]["calls"]]
    pairs = []
    for (j0, n0, t0), (j1, n1, t1) in zip(pts, pts[1:]):
        pairs.append({"from": f"{n0} nodes, {j0} jobs", "to": f"{n1} nodes, {j1} jobs",
                      "jobs_ratio": j1 / j0, "nodes_ratio": n1 / n0, "time_ratio": t1 / t0})
    out: dict[str, Any] = {"pairs": pairs, "exponent_jobs": None, "exponent_nodes": None}
    if len(pts) >= 3:
        a = np.array([[1.0, math.log(j), math.log(n)] for j, n, _ in pts])
        y = np.array([math.log(t) for _, _, t in pts])
        coef, _, rank, _ = np.linalg.lstsq(a, y, rcond=None)
        if rank == 3:
            out["exponent_jobs"], out["exponent_nodes"] = float(coef[1]), float(coef[2])
    return out


def _ratios(rows: list[dict]) -> None:
    base = {r["size"]: r for r in rows if r["policy"] == BASELINE}
    for r in rows:
        b = base.get(r["size"])
        for series in ("fresh", "steady"):
            m, bm = r[series]["median_s"], (b[series]["median_s"] if b else None)
            r[series]["ratio_to_fifo"] = (m / bm) if (m and bm) else None


def _targets(rows: list[dict], policies: Sequence[str]) -> dict:
    """Per policy and target size: pass/fail of the fresh and steady medians (both must
    pass). A measurement stopped before any decision finished is a miss when it was
    stopped after more seconds than the target (``lower_bound_s``), else unknown."""
    out = {}
    for p in policies:
        res = {}
        for label, limit in TARGETS.items():
            r = next((r for r in rows if r["policy"] == p and r["size"] == label), None)
            if r is None:
                res[label] = {"measured": False}
                continue
            f, s = r["fresh"]["median_s"], r["steady"]["median_s"]
            bound = r.get("stopped_after_s") if r["decisions"] == 0 else None
            fp = (f < limit) if f is not None else (False if bound is not None and bound >= limit else None)
            sp = (s < limit) if s is not None else (False if bound is not None and bound >= limit else None)
            if fp is False or sp is False:
                verdict = False
            elif fp is None or sp is None:
                verdict = None
            else:
                verdict = True
            res[label] = {"measured": True, "limit_s": limit, "fresh_median_s": f, "steady_median_s": s,
                          "lower_bound_s": bound, "fresh_pass": fp, "steady_pass": sp, "pass": verdict,
                          "status": r["status"], "reason": r["reason"]}
        out[p] = res
    return out


def _fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    if unit == "x":
        return f"{x:.2f}x"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/decision_time.json")
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help=f"comma list of allocation policies (default {DEFAULT_POLICIES}); "
                         f"{BASELINE} is always measured")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of NODESxGPUS:JOBS")
    ap.add_argument("--repeats", type=int, default=5, help="timed decisions per series (fresh and steady)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the input generator (allocators get seed 0)")
    ap.add_argument("--max-seconds-per-policy", type=float, default=120.0,
                    help="wall seconds a policy may take over all sizes (an even share per size, unused shares "
                         "carried over); a measurement past its share is stopped and recorded as skipped")
    ap.add_argument("--max-memory-gb", type=float, default=8.0,
                    help="address-space limit of each measuring process (0: none)")
    ap.add_argument("--data-dir", default=None, help="data folder with pollux-osdi21/ (default: $RLSCHED_DATA_DIR)")
    ap.add_argument("--capture-traces", default=DEFAULT_CAPTURE_TRACES)
    ap.add_argument("--capture-drivers", default=DEFAULT_CAPTURE_DRIVERS)
    ap.add_argument("--capture-hours", type=float, default=4.0)
    ap.add_argument("--capture-every", type=int, default=10, help="record every N-th decision")
    ap.add_argument("--save-decisions", default=None,
                    help="also write every decision's input jobs and output here (JSON; large at big sizes)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        ap.error(str(exc))

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rlsched.sim.traces import TraceError, data_dir

    console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)
    t_start = time.perf_counter()
    requested = [p.strip() for p in args.policies.split(",") if p.strip()]
    policies = [BASELINE] + [p for p in dict.fromkeys(requested) if p != BASELINE]
    if BASELINE not in requested:
        console.print(f"note: {BASELINE} is the baseline; measured although --policies does not name it")
    skipped: dict[str, str] = {}
    for p in list(policies):
        try:
            _close(_make(p, 0))
        except (ValueError, TypeError, ImportError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            console.print(f"note: skipping policy {p!r}: make_allocator does not know it ({why})")
            skipped[p] = why
            policies.remove(p)
    if BASELINE in skipped:
        console.print(f"error: the baseline {BASELINE} is not available")
        return 2

    ddir = data_dir(args.data_dir)
    if ddir is None or not (ddir / "pollux-osdi21").is_dir():
        console.print(f"bench/decision_time.py: error: no pollux-osdi21/ under the data folder {ddir}: "
                      "pass --data-dir or set RLSCHED_DATA_DIR")
        return 2
    traces = [t for t in args.capture_traces.split(",") if t]
    drivers = [d for d in args.capture_drivers.split(",") if d]
    t0 = time.perf_counter()
    with console.status("capturing decision inputs from the interval engine"):
        try:
            snapshots, apps, cap_info = capture(ddir, traces, drivers, hours=args.capture_hours,
                                                every=args.capture_every)
        except (TraceError, RuntimeError) as exc:
            console.print(f"bench/decision_time.py: error: {exc}")
            return 2
    capture_s = time.perf_counter() - t0
    console.print(f"captured {len(snapshots)} job lists ({sum(len(s[2]) for s in snapshots)} job views) "
                  f"in {capture_s:.1f} s")

    rng = np.random.default_rng(args.seed)
    inputs = {s.label: build_inputs(snapshots, s, rng) for s in sizes}
    described = {label: describe_inputs(*inp) for label, inp in inputs.items()}

    rows: list[dict] = []
    saved: list[dict] = []
    saved_inputs = {}
    budget = {p: args.max_seconds_per_policy for p in policies}
    per_row = 2 + 2 * args.repeats
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console) as prog:
        task = prog.add_task("decisions", total=len(sizes) * len(policies) * per_row)
        for k, size in enumerate(sizes):
            for p in policies:
                prog.update(task, description=f"{p} @ {size.label}")
                # this size's share of what is left of the policy's budget (unused shares carry over)
                share = budget[p] / (len(sizes) - k)
                start = time.perf_counter()
                row, dec = run_one(p, size, inputs[size.label], apps, repeats=args.repeats, seed=0,
                                   deadline=start + share, save=bool(args.save_decisions),
                                   max_memory_gb=args.max_memory_gb, on_call=lambda _m: prog.advance(task))
                budget[p] -= time.perf_counter() - start
                prog.advance(task, per_row - row["decisions"])
                if row.pop("timed_out"):
                    row["stopped_after_s"] = round(share, 3)
                    row["reason"] = (f"stopped at this size's share ({share:.0f} s) of --max-seconds-per-policy "
                                     f"{args.max_seconds_per_policy:g} s: {row['decisions']} of {per_row} decisions "
                                     "done" + ("" if row["decisions"] else f"; one decision takes over {share:.0f} s"))
                saved.extend(dec)
                rows.append(row)
                f = row["fresh"]["median_s"]
                msg = (f"{p:14s} {size.label:>12s}  fresh median {_fmt(f)}  "
                       f"steady median {_fmt(row['steady']['median_s'])}")
                if row["status"] != "ok":
                    msg += f"  [{row['status']}: {row['reason']}]"
                if row["invalid"]:
                    msg += f"  INVALID: {row['invalid'][0]}"
                prog.console.print(msg)

    _ratios(rows)
    report = {
        "benchmark": "one allocation decision: seconds per allocate() call, ratio to fifo/bestfit in the same run",
        "issue": "25 item 7",
        "baseline_policy": BASELINE,
        "targets": dict(TARGETS),
        "target_results": _targets(rows, policies),
        "policies": policies,
        "skipped_policies": skipped,
        "sizes": [s.label for s in sizes],
        "repeats": args.repeats,
        "inputs": described,
        "rows": rows,
        "growth": {p: {s: growth(rows, p, s) for s in ("fresh", "steady")} for p in policies},
        "capture": {"snapshots": len(snapshots), "seconds": round(capture_s, 3), "runs": cap_info,
                    "every": args.capture_every, "from_hour": 1.0, "seed": args.seed},
        "config": {"max_seconds_per_policy": args.max_seconds_per_policy, "max_memory_gb": args.max_memory_gb,
                   "interval_s": INTERVAL, "restart_cost_s": RESTART_COST,
                   "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine()},
        "wall_s": None,
    }
    report["wall_s"] = round(time.perf_counter() - t_start, 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.save_decisions:
        for label, (jobs, nodes, now) in inputs.items():
            saved_inputs[label] = {"nodes": [dataclasses.asdict(n) for n in nodes], "now": now,
                                   "jobs": [_job_dict(j) for j in jobs]}
        sp = Path(args.save_decisions)
        sp.parent.mkdir(parents=True, exist_ok=True)
        sp.write_text(json.dumps({"inputs": saved_inputs, "decisions": saved}) + "\n")

    print(f"{'policy':14s} {'size':>12s} {'fresh med':>10s} {'max':>10s} {'xFIFO':>8s} "
          f"{'steady med':>10s} {'max':>10s} {'xFIFO':>8s}  status")
    for r in rows:
        fr, st = r["fresh"], r["steady"]
        print(f"{r['policy']:14s} {r['size']:>12s} {_fmt(fr['median_s']):>10s} {_fmt(fr['max_s']):>10s} "
              f"{_fmt(fr.get('ratio_to_fifo'), 'x'):>8s} {_fmt(st['median_s']):>10s} {_fmt(st['max_s']):>10s} "
              f"{_fmt(st.get('ratio_to_fifo'), 'x'):>8s}  {r['status']}" + (f" ({r['reason']})" if r["reason"] else ""))
    for p, res in report["target_results"].items():
        parts = []
        for label, t in res.items():
            if not t["measured"]:
                continue
            verdict = {True: "pass", False: "MISS", None: "n/a"}[t["pass"]]
            if t["lower_bound_s"] is not None:
                verdict += f" (no decision finished within {t['lower_bound_s']:.0f} s)"
            parts.append(f"{label} < {_fmt(t['limit_s'])}: {verdict}")
        if parts:
            print(f"target {p}: " + "; ".join(parts))
    for p, why in skipped.items():
        print(f"skipped {p}: {why}")
    print(f"wall {report['wall_s']:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
