"""A trace SPEC to a :class:`~.common.Trace`: the registry of ``source:`` prefixes, the
replay options of the real traces and :func:`load_trace`. ``pollux:``, ``sia:`` and
``pollux-gen:`` give a :class:`~.pollux.MeasuredTrace` instead (:mod:`.pollux`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rlsched.core import Topology

from . import alibaba2023, helios, jobfile, pai2020, philly, pollux
from .common import ESTIMATE_ERROR, Trace, TraceError, racked, with_estimates
from .common import data_dir as _data_dir
from .synthetic import FORM as SYNTHETIC_FORM
from .synthetic import synthetic

__all__ = ["Source", "SOURCES", "TRACE_OPTIONS", "load_trace", "parse_options", "apply_options", "subset_nodes", "window_jobs", "scale_for_load"]


@dataclass(frozen=True)
class Source:
    """A real trace: how its spec is written and its loader ``(arg, data folder,
    skip_bad) -> Trace``, ``arg`` being the spec after ``source:`` without options."""

    form: str
    load: Callable[[str, Path | None, bool], Trace]


#: the real traces by ``source:`` prefix; each takes the :data:`TRACE_OPTIONS`
SOURCES: dict[str, Source] = {
    "alibaba2023": Source(alibaba2023.FORM, alibaba2023.load),
    "pai2020": Source(pai2020.FORM, pai2020.load),
    "philly": Source(philly.FORM, philly.load),
    "helios": Source(helios.FORM, helios.load),
}

#: options of the real traces:
#: ``name[,arrival_scale=X][,nodes=N][,window=N][,load=X[,tail=Q]][,estimates=F][,estimate_error=S]``
TRACE_OPTIONS = ("arrival_scale", "nodes", "window", "load", "tail", "estimates", "estimate_error")


def load_trace(
    spec: str,
    *,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    skip_bad: bool = False,
) -> Trace | pollux.MeasuredTrace:
    """Load the trace named by ``spec`` (the forms are in :mod:`rlsched.sim.traces`);
    ``pollux:``/``sia:``/``pollux-gen:`` give a :class:`~.pollux.MeasuredTrace`."""
    ddir = _data_dir(data_dir)
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        return synthetic(arg, seed=seed)
    if kind == "pollux":
        return pollux.load(arg, ddir, skip_bad)
    if kind == "sia":
        return pollux.load_sia(arg, ddir, skip_bad)
    if kind == "pollux-gen":
        return pollux.generate(arg, ddir, seed)
    source = SOURCES.get(kind)
    if source is not None:
        arg, opts = parse_options(arg)
        return apply_options(source.load(arg, ddir, skip_bad), opts, seed=seed)
    path = Path(spec)
    if path.suffix.lower() in jobfile.SUFFIXES or path.exists():
        return jobfile.read(path)
    forms = [s.form for s in SOURCES.values()] + [SYNTHETIC_FORM, pollux.FORM, pollux.SIA_FORM, pollux.GEN_FORM]
    raise TraceError(f"unknown trace spec {spec!r}: use {', '.join(forms)} or a .yaml/.json job file")


def parse_options(arg: str) -> tuple[str, dict[str, float]]:
    """``name[,arrival_scale=X][,nodes=N][,load=X][,estimates=F][,estimate_error=S]``:
    the trace name/path and its options."""
    name, *rest = arg.split(",")
    opts: dict[str, float] = {}
    for item in rest:
        k, eq, v = item.partition("=")
        k = k.strip()
        if k not in TRACE_OPTIONS or not eq:
            raise TraceError(f"unknown trace option {item!r}; known: arrival_scale=X, nodes=N, window=N, load=X, tail=Q, estimates=F, "
                             "estimate_error=S")
        try:
            opts[k] = float(v)
        except ValueError:
            raise TraceError(f"{k}={v!r} is not a number") from None
        if k == "estimates":
            if not 0 <= opts[k] <= 1:
                raise TraceError("estimates must be in [0, 1]")
        elif k == "estimate_error":
            if not opts[k] >= 0:
                raise TraceError("estimate_error must be >= 0")
        elif k == "tail":
            if not 0 < opts[k] <= 1:
                raise TraceError("tail must be in (0, 1]")
        elif not opts[k] > 0:
            raise TraceError(f"{k} must be > 0")
    for k in ("nodes", "window"):
        if k in opts and opts[k] != int(opts[k]):
            raise TraceError(f"{k}={opts[k]:g} is not a whole number")
    if "load" in opts and "arrival_scale" in opts:
        raise TraceError("give load=X or arrival_scale=X, not both")
    if "tail" in opts and "load" not in opts:
        raise TraceError("tail=Q needs load=X (it changes how the load is measured)")
    if "estimate_error" in opts and "estimates" not in opts:
        raise TraceError("estimate_error=S needs estimates=F (the share of jobs with an estimate)")
    return name, opts


def apply_options(trace: Trace, opts: dict[str, float], *, seed: int = 0) -> Trace:
    """``nodes`` first (:func:`subset_nodes`), then ``window`` (:func:`window_jobs`, drawn
    from ``seed``), then the arrival scale: ``arrival_scale``
    or the one that gives offered load ``load`` (:func:`scale_for_load`), then the
    simulated users' estimates: a share ``estimates`` of the jobs (default none: the
    real traces carry no estimate) gets an estimate of its run time with log-normal
    error ``estimate_error`` (:func:`~.common.with_estimates`, drawn from ``seed``)."""
    if "nodes" in opts:
        subset_nodes(trace, int(opts["nodes"]))
    if "window" in opts:
        window_jobs(trace, int(opts["window"]), seed)
    if "load" in opts:
        scale = scale_for_load(trace, opts["load"], tail=opts.get("tail", 1.0))
    else:
        scale = opts.get("arrival_scale", 1.0)
    if scale != 1.0:
        trace.jobs = [j.with_(submit_time=j.submit_time * scale) for j in trace.jobs]
        trace.name += (f",load={opts['load']:g}" + (f",tail={opts['tail']:g}" if "tail" in opts else "")
                       if "load" in opts else f",arrival_scale={scale:g}")
        trace.notes.append(f"submit times scaled by {scale:.4g} (durations unchanged)")
    if opts.get("estimates", 0) > 0:
        frac, sigma = opts["estimates"], opts.get("estimate_error", ESTIMATE_ERROR)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x657374]))  # "est": its own stream
        trace.jobs = with_estimates(trace.jobs, frac, sigma, rng)
        trace.name += f",estimates={frac:g},estimate_error={sigma:g}"
        trace.notes.append(f"simulated users' run-time estimates for {frac:.0%} of the jobs, log-normal error sigma={sigma:g}")
    return trace


def subset_nodes(trace: Trace, n: int) -> None:
    """Keep ``n`` of the trace's nodes, every k-th in file order; drop (and count) the
    jobs that no kept node can host."""
    if trace.topology is None:
        raise TraceError("nodes=N needs a trace that carries its cluster")
    nodes = trace.topology.nodes
    if n > len(nodes):
        raise TraceError(f"nodes={n} but the trace has only {len(nodes)} nodes")
    idx = np.unique(np.floor(np.arange(n) * len(nodes) / n).astype(int))
    keep = [nodes[i] for i in idx]
    trace.topology = Topology(racked([dict(name=x.name, gpus=x.gpus, gpu_model=x.gpu_model, cpu_milli=x.cpu_milli, memory_mib=x.memory_mib) for x in keep]), trace.topology.bandwidth)
    kept = []
    for j in trace.jobs:
        if any(x.gpus >= j.gpus_per_worker and (j.gpu_models is None or x.gpu_model in j.gpu_models) for x in keep):
            kept.append(j)
        else:
            trace.skip("unfit_subset")
    trace.jobs = kept
    trace.name += f",nodes={n}"
    trace.notes.append(f"replayed on {n} of {len(nodes)} nodes; {trace.skipped.get('unfit_subset', 0)} jobs fit none of them and were dropped")


def window_jobs(trace: Trace, n: int, seed: int) -> None:
    """Keep ``n`` jobs submitted one after another (by submit time), from a start drawn
    from ``seed``, their submit times shifted so the first is at 0: each seed replays
    a different stretch of a real trace (the evaluation protocol's seeds)."""
    if n > len(trace.jobs):
        raise TraceError(f"window={n} but the trace has only {len(trace.jobs)} jobs")
    jobs = sorted(trace.jobs, key=lambda j: j.submit_time)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x77696E]))  # "win": its own stream
    start = int(rng.integers(0, len(jobs) - n + 1))
    kept = jobs[start:start + n]
    t0 = kept[0].submit_time
    trace.jobs = [j.with_(submit_time=j.submit_time - t0) for j in kept]
    trace.name += f",window={n}"
    trace.notes.append(f"a window of {n} consecutive jobs from job {start} of {len(jobs)} (seed {seed})")


def scale_for_load(trace: Trace, load: float, tail: float = 1.0) -> float:
    """Arrival scale giving offered load ``load``: Σ GPUs × duration over
    (cluster GPUs × submission span × scale). With ``tail`` < 1 each duration counts
    at most the ``tail``-quantile of the durations: in a heavy-tailed trace a handful
    of jobs running for days would otherwise set the rate alone (their work lands long
    after the submissions end), and the jobs would hardly ever queue."""
    if trace.topology is None or not trace.jobs:
        raise TraceError("load=X needs a trace with jobs and a cluster")
    durations = np.array([j.duration or 0.0 for j in trace.jobs], dtype=float)
    if tail < 1.0:
        durations = np.minimum(durations, np.quantile(durations, tail))
    gpus = np.array([j.workers * j.gpus_per_worker for j in trace.jobs], dtype=float)
    work = float((gpus * durations).sum())
    span = max(j.submit_time for j in trace.jobs) - min(j.submit_time for j in trace.jobs)
    if span <= 0 or work <= 0:
        raise TraceError("load=X needs jobs with durations submitted over a time span")
    return work / (load * trace.topology.total_gpus * span)
