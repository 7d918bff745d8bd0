"""Trace loaders: job specs (and a topology where the trace has one) from a SPEC string.

SPEC forms (see docs/simulator.md for the formats):

``alibaba2023:<list>``
    Alibaba GPU cluster trace 2023 (openb): ``openb_pod_list_<list>.csv`` and
    ``openb_node_list_gpu_node.csv`` in ``<data-dir>/alibaba-gpu-2023``.
    The four real-trace forms accept ``,arrival_scale=X``: submit times × X (X < 1
    compresses arrivals to raise the load; durations are kept); ``,nodes=N``: replay on
    N of the trace's nodes (every k-th node in file order, so the GPU-model mix is
    kept; jobs that fit none of them are dropped and counted in
    ``skipped["unfit_subset"]``); ``,load=X``: the arrival scale that makes the offered
    load (GPU-seconds asked / (GPUs × submission span)) equal X on the (sub)cluster.
    ``load`` and ``arrival_scale`` exclude each other.
``pai2020:<dir>``
    Alibaba PAI 2020 (header-less ``pai_job_table.csv``, ``pai_task_table.csv``,
    ``pai_machine_spec.csv``), ``<dir>`` absolute or under the data dir.
``philly:<file>``
    Microsoft Philly ``cluster_job_log`` (JSON list).
``helios:<file>``
    SenseTime Helios ``cluster_log.csv``.
``synthetic:<small|medium|large>[,key=value...]``
    the seeded generator of multi-worker training jobs (:func:`synthetic`).
``<path>.yaml|.yml|.json``
    a job list: ``{"cluster": <Topology.from_dict>, "jobs": [JobSpec fields...]}``
    or a bare list of jobs.

The data folder is ``data_dir`` or the environment variable ``RLSCHED_DATA_DIR``. A
malformed row raises :class:`TraceError` naming file and line, or with
``skip_bad=True`` is skipped and counted in ``Trace.skipped["malformed"]``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from rlsched.core import Bandwidth, Level, NodeSpec, Topology

from .job import JobSpec, comm_time, ideal_level, topology_limits

__all__ = ["Trace", "TraceError", "load_trace", "synthetic", "data_dir", "SYNTHETIC_PRESETS"]

ENV_DATA_DIR = "RLSCHED_DATA_DIR"
#: nodes per rack when a trace gives no rack (the Alibaba/PAI node lists): an
#: assumption, documented, since those traces carry no network topology
NODES_PER_RACK = 16
#: run time given to pods of the openb lists that carry no times (multigpu20)
TIMELESS_DURATION = 3600.0


class TraceError(ValueError):
    """A trace cannot be read; the message names the file (and line)."""


@dataclass
class Trace:
    """Jobs of a trace, the cluster it ran on (None when the trace has none) and what
    was skipped, by reason."""

    name: str
    jobs: list[JobSpec]
    topology: Topology | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The data folder: ``explicit``, else $RLSCHED_DATA_DIR, else None."""
    d = explicit if explicit else os.environ.get(ENV_DATA_DIR)
    return Path(d) if d else None


def load_trace(
    spec: str,
    *,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    skip_bad: bool = False,
) -> Trace:
    """Load the trace named by ``spec`` (module docstring)."""
    ddir = globals()["data_dir"](data_dir)
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        return synthetic(arg, seed=seed)
    if kind in ("alibaba2023", "pai2020", "philly", "helios"):
        arg, opts = _trace_options(arg)
        if kind == "alibaba2023":
            trace = _alibaba2023(arg or "default", _need_dir(ddir, "alibaba-gpu-2023"), skip_bad)
        elif kind == "pai2020":
            trace = _pai2020(_resolve(arg, ddir), skip_bad)
        elif kind == "philly":
            trace = _philly(_resolve(arg, ddir), skip_bad)
        else:
            trace = _helios(_resolve(arg, ddir), skip_bad)
        if "nodes" in opts:
            _subset_nodes(trace, int(opts["nodes"]))
        if "load" in opts:
            scale = _scale_for_load(trace, opts["load"])
        else:
            scale = opts.get("arrival_scale", 1.0)
        if scale != 1.0:
            trace.jobs = [j.with_(submit_time=j.submit_time * scale) for j in trace.jobs]
            trace.name += f",load={opts['load']:g}" if "load" in opts else f",arrival_scale={scale:g}"
            trace.notes.append(f"submit times scaled by {scale:.4g} (durations unchanged)")
        return trace
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        return _job_file(path)
    raise TraceError(
        f"unknown trace spec {spec!r}: use alibaba2023:<list>, pai2020:<dir>, philly:<file>, "
        "helios:<file>, synthetic:<small|medium|large>[,k=v...] or a .yaml/.json job file"
    )


_TRACE_OPTIONS = ("arrival_scale", "nodes", "load")


def _trace_options(arg: str) -> tuple[str, dict[str, float]]:
    """``name[,arrival_scale=X][,nodes=N][,load=X]``: the trace name/path and its options."""
    name, *rest = arg.split(",")
    opts: dict[str, float] = {}
    for item in rest:
        k, eq, v = item.partition("=")
        k = k.strip()
        if k not in _TRACE_OPTIONS or not eq:
            raise TraceError(f"unknown trace option {item!r}; known: arrival_scale=X, nodes=N, load=X")
        try:
            opts[k] = float(v)
        except ValueError:
            raise TraceError(f"{k}={v!r} is not a number") from None
        if not opts[k] > 0:
            raise TraceError(f"{k} must be > 0")
    if "nodes" in opts and opts["nodes"] != int(opts["nodes"]):
        raise TraceError(f"nodes={opts['nodes']:g} is not a whole number")
    if "load" in opts and "arrival_scale" in opts:
        raise TraceError("give load=X or arrival_scale=X, not both")
    return name, opts


def _subset_nodes(trace: Trace, n: int) -> None:
    """Keep ``n`` of the trace's nodes, every k-th in file order; drop (and count) the
    jobs that no kept node can host."""
    if trace.topology is None:
        raise TraceError("nodes=N needs a trace that carries its cluster")
    nodes = trace.topology.nodes
    if n > len(nodes):
        raise TraceError(f"nodes={n} but the trace has only {len(nodes)} nodes")
    idx = np.unique(np.floor(np.arange(n) * len(nodes) / n).astype(int))
    keep = [nodes[i] for i in idx]
    trace.topology = Topology(_racked([dict(name=x.name, gpus=x.gpus, gpu_model=x.gpu_model, cpu_milli=x.cpu_milli, memory_mib=x.memory_mib) for x in keep]), trace.topology.bandwidth)
    kept = []
    for j in trace.jobs:
        if any(x.gpus >= j.gpus_per_worker and (j.gpu_models is None or x.gpu_model in j.gpu_models) for x in keep):
            kept.append(j)
        else:
            trace.skip("unfit_subset")
    trace.jobs = kept
    trace.name += f",nodes={n}"
    trace.notes.append(f"replayed on {n} of {len(nodes)} nodes; {trace.skipped.get('unfit_subset', 0)} jobs fit none of them and were dropped")


def _scale_for_load(trace: Trace, load: float) -> float:
    """Arrival scale giving offered load ``load``: Σ GPUs × duration over
    (cluster GPUs × submission span × scale)."""
    if trace.topology is None or not trace.jobs:
        raise TraceError("load=X needs a trace with jobs and a cluster")
    work = sum(j.workers * j.gpus_per_worker * j.duration for j in trace.jobs if j.duration)
    span = max(j.submit_time for j in trace.jobs) - min(j.submit_time for j in trace.jobs)
    if span <= 0 or work <= 0:
        raise TraceError("load=X needs jobs with durations submitted over a time span")
    return work / (load * trace.topology.total_gpus * span)


def _need_dir(ddir: Path | None, sub: str) -> Path:
    if ddir is None:
        raise TraceError(f"no data folder: pass --data-dir or set {ENV_DATA_DIR} (looking for {sub}/)")
    p = ddir / sub
    if not p.is_dir():
        raise TraceError(f"{p}: no such folder (data folder {ddir})")
    return p


def _resolve(arg: str, ddir: Path | None) -> Path:
    if not arg:
        raise TraceError("trace spec needs a path after ':'")
    p = Path(arg)
    if not p.is_absolute() and not p.exists() and ddir is not None:
        p = ddir / arg
    if not p.exists():
        raise TraceError(f"{p}: no such file or folder")
    return p


class _Rows:
    """Iterate CSV rows with line numbers; bad rows raise or are counted."""

    def __init__(self, path: Path, trace: Trace, skip_bad: bool, header: bool) -> None:
        self.path, self.trace, self.skip_bad, self.header = path, trace, skip_bad, header

    def each(self, fn: Callable[[int, list[str] | dict[str, str]], None]) -> None:
        try:
            f = open(self.path, newline="")
        except OSError as exc:
            raise TraceError(f"{self.path}: {exc.strerror}") from exc
        with f:
            if self.header:
                reader: Iterable = csv.DictReader(f)
                start = 2
            else:
                reader = csv.reader(f)
                start = 1
            for line, row in enumerate(reader, start):
                try:
                    fn(line, row)
                except (ValueError, KeyError, TypeError) as exc:
                    if not self.skip_bad:
                        why = f"missing column {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
                        raise TraceError(f"{self.path}:{line}: {why}") from exc
                    self.trace.skip("malformed")


def _int(s: str | None, what: str) -> int:
    v = _float(s, what)
    if v != int(v):
        raise ValueError(f"{what} is not an integer: {s!r}")
    return int(v)


def _float(s: str | None, what: str) -> float:
    if s is None or s == "":
        raise ValueError(f"missing {what}")
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{what} is not a number: {s!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{what} is not finite: {s!r}")
    return v


def _racked(nodes: list[dict]) -> list[NodeSpec]:
    """NodeSpecs in file order, NODES_PER_RACK to a rack (the traces give no racks)."""
    return [
        NodeSpec(rack=f"rack-{k // NODES_PER_RACK}", block="block-0", nvlink_domain_size=n["gpus"], **n)
        for k, n in enumerate(nodes)
    ]


# ---------------------------------------------------------------- Alibaba 2023
def _alibaba2023(name: str, folder: Path, skip_bad: bool) -> Trace:
    trace = Trace(f"alibaba2023:{name}", [])
    nodes: list[dict] = []

    def node(line: int, r: dict) -> None:
        gpus = _int(r["gpu"], "gpu")
        if gpus < 0:
            raise ValueError(f"negative gpu count {gpus}")
        if gpus == 0:
            return
        nodes.append(
            dict(
                name=r["sn"] or f"line-{line}",
                gpus=gpus,
                gpu_model=r["model"] or "unknown",
                cpu_milli=_int(r["cpu_milli"], "cpu_milli"),
                memory_mib=_int(r["memory_mib"], "memory_mib"),
            )
        )

    _Rows(folder / "openb_node_list_gpu_node.csv", trace, skip_bad, header=True).each(node)
    trace.topology = Topology(_racked(nodes))

    pods = folder / f"openb_pod_list_{name}.csv"
    if not pods.exists():
        known = sorted(p.name[len("openb_pod_list_") : -4] for p in folder.glob("openb_pod_list_*.csv"))
        raise TraceError(f"{pods}: no such pod list; known: {', '.join(known)}")
    sharing = 0
    with open(pods, newline="") as f:
        header = next(csv.reader(f), [])
    timeless = "creation_time" not in header
    if timeless:
        trace.notes.append(
            f"{pods.name} has no times: pods arrive 1 s apart in file order and run {TIMELESS_DURATION:.0f} s each"
        )

    def pod(line: int, r: dict) -> None:
        nonlocal sharing
        num_gpu = _int(r["num_gpu"], "num_gpu")
        if num_gpu < 0:
            raise ValueError(f"negative num_gpu {num_gpu}")
        if num_gpu == 0:
            trace.skip("no_gpu")
            return
        milli = _int(r["gpu_milli"], "gpu_milli") if r.get("gpu_milli") else 1000
        if milli < 1000:
            sharing += 1
        if timeless:  # the re-sampled lists carry no times: arrive 1 s apart, in order
            created = began = float(line - 2)
            deleted = began + TIMELESS_DURATION
        else:
            created = _float(r["creation_time"], "creation_time")
            deleted = _float(r["deletion_time"], "deletion_time")
            sched = r.get("scheduled_time") or ""
            began = _float(sched, "scheduled_time") if sched else created
            if deleted < began:
                raise ValueError(f"deletion_time {deleted} before start {began}")
        spec = r.get("gpu_spec") or ""
        models = frozenset(m for m in spec.split("|") if m) or None
        trace.jobs.append(
            JobSpec(
                id=r["name"] or f"line-{line}",
                submit_time=created,
                workers=1,
                gpus_per_worker=num_gpu,
                gpu_models=models,
                cpu_milli=_int(r["cpu_milli"], "cpu_milli"),
                memory_mib=_int(r["memory_mib"], "memory_mib"),
                queue="normal",
                duration=max(deleted - began, 1.0),
            )
        )

    _Rows(pods, trace, skip_bad, header=True).each(pod)
    trace.notes.append(
        f"{sharing} GPU-sharing pods (gpu_milli < 1000) count as one whole GPU; "
        f"{trace.skipped.get('no_gpu', 0)} pods without GPUs skipped"
    )
    _shift_to_zero(trace)
    return trace


def _shift_to_zero(trace: Trace) -> None:
    if trace.jobs:
        t0 = min(j.submit_time for j in trace.jobs)
        if t0 != 0:
            trace.jobs = [j.with_(submit_time=j.submit_time - t0) for j in trace.jobs]


# ---------------------------------------------------------------- PAI 2020
PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK_COLUMNS = (
    "job_name", "task_name", "inst_num", "status", "start_time", "end_time",
    "plan_cpu", "plan_mem", "plan_gpu", "gpu_type",
)
PAI_MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")


def _pai2020(folder: Path, skip_bad: bool) -> Trace:
    """One job per GPU task (``job_name/task_name``): ``inst_num`` workers of
    ``ceil(plan_gpu / 100)`` GPUs (plan_gpu is percent of one GPU; sharing tasks count
    as one GPU); submit = the job's start_time; duration = task end − start.
    plan_cpu is percent of a core (×10 → milli-CPU), plan_mem and cap_mem GB."""
    trace = Trace(f"pai2020:{folder}", [])

    def cols(row: list[str], names: tuple[str, ...]) -> dict[str, str]:
        if len(row) != len(names):
            raise ValueError(f"expected {len(names)} columns ({', '.join(names)}), got {len(row)}")
        return dict(zip(names, row))

    nodes: list[dict] = []

    def machine(line: int, row: list[str]) -> None:
        r = cols(row, PAI_MACHINE_COLUMNS)
        gpus = _int(r["cap_gpu"], "cap_gpu")
        if gpus <= 0:
            return
        nodes.append(
            dict(
                name=r["machine"] or f"line-{line}",
                gpus=gpus,
                gpu_model=r["gpu_type"] or "unknown",
                cpu_milli=int(_float(r["cap_cpu"], "cap_cpu") * 1000),
                memory_mib=int(_float(r["cap_mem"], "cap_mem") * 1024),
            )
        )

    _Rows(folder / "pai_machine_spec.csv", trace, skip_bad, header=False).each(machine)
    trace.topology = Topology(_racked(nodes)) if nodes else None

    submit: dict[str, float] = {}

    def job(line: int, row: list[str]) -> None:
        r = cols(row, PAI_JOB_COLUMNS)
        if r["start_time"]:
            submit[r["job_name"]] = _float(r["start_time"], "start_time")

    _Rows(folder / "pai_job_table.csv", trace, skip_bad, header=False).each(job)

    def task(line: int, row: list[str]) -> None:
        r = cols(row, PAI_TASK_COLUMNS)
        plan_gpu = _float(r["plan_gpu"], "plan_gpu") if r["plan_gpu"] else 0.0
        if plan_gpu <= 0:
            trace.skip("no_gpu")
            return
        if not r["start_time"] or not r["end_time"]:
            trace.skip("no_time")
            return
        start, end = _float(r["start_time"], "start_time"), _float(r["end_time"], "end_time")
        if end < start:
            raise ValueError(f"end_time {end} before start_time {start}")
        gtype = r["gpu_type"]
        trace.jobs.append(
            JobSpec(
                id=f"{r['job_name']}/{r['task_name']}",
                submit_time=min(submit.get(r["job_name"], start), start),
                workers=max(_int(r["inst_num"], "inst_num"), 1),
                gpus_per_worker=max(math.ceil(plan_gpu / 100.0), 1),
                gpu_models=frozenset([gtype]) if gtype and gtype != "MISC" else None,
                cpu_milli=int(_float(r["plan_cpu"], "plan_cpu") * 10) if r["plan_cpu"] else 0,
                memory_mib=int(_float(r["plan_mem"], "plan_mem") * 1024) if r["plan_mem"] else 0,
                duration=max(end - start, 1.0),
            )
        )

    _Rows(folder / "pai_task_table.csv", trace, skip_bad, header=False).each(task)
    _shift_to_zero(trace)
    return trace


# ---------------------------------------------------------------- Philly
def _philly_time(s, what: str) -> float | None:
    if s is None or s == "None" or s == "":
        return None
    if not isinstance(s, str):
        raise ValueError(f"{what} is not a time string: {s!r}")
    try:
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        raise ValueError(f"{what} is not 'YYYY-MM-DD HH:MM:SS': {s!r}") from None


def _philly(path: Path, skip_bad: bool) -> Trace:
    """``cluster_job_log``: a JSON list of jobs with ``jobid``, ``submitted_time``,
    ``status`` and ``attempts`` [{start_time, end_time, detail: [{ip, gpus: [...]}]}].
    Workers = machines of the last attempt, GPUs per worker = most GPUs on one of
    them; duration = last attempt end − first attempt start. The "line" of an error
    is the job's 1-based position in the list."""
    trace = Trace(f"philly:{path}", [])
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of jobs")
    for line, j in enumerate(data, 1):
        try:
            if not isinstance(j, dict) or "jobid" not in j:
                raise ValueError("job entry needs a 'jobid'")
            sub = _philly_time(j.get("submitted_time"), "submitted_time")
            attempts = j.get("attempts") or []
            if not isinstance(attempts, list):
                raise ValueError("attempts must be a list")
            if sub is None or not attempts:
                trace.skip("no_attempt")
                continue
            starts = [_philly_time(a.get("start_time"), "start_time") for a in attempts]
            ends = [_philly_time(a.get("end_time"), "end_time") for a in attempts]
            detail = attempts[-1].get("detail") or []
            if starts[0] is None or ends[-1] is None or not detail:
                trace.skip("no_time")
                continue
            gpw = max(len(d.get("gpus") or []) for d in detail)
            if gpw == 0:
                trace.skip("no_gpu")
                continue
            if ends[-1] < starts[0]:
                raise ValueError("last end_time before first start_time")
            trace.jobs.append(
                JobSpec(
                    id=str(j["jobid"]),
                    submit_time=sub,
                    workers=len(detail),
                    gpus_per_worker=gpw,
                    duration=max(ends[-1] - starts[0], 1.0),
                )
            )
        except (ValueError, TypeError, AttributeError) as exc:
            if not skip_bad:
                raise TraceError(f"{path}:{line}: {exc}") from exc
            trace.skip("malformed")
    _shift_to_zero(trace)
    return trace


# ---------------------------------------------------------------- Helios
def _helios_time(s: str, what: str) -> float:
    if not s:
        raise ValueError(f"missing {what}")
    try:
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return _float(s, what)  # some releases carry epoch seconds


def _helios(path: Path, skip_bad: bool) -> Trace:
    """``cluster_log.csv`` (header: job_id, user, vc, jobname, gpu_num, cpu_num,
    node_num, state, submit_time, start_time, end_time, duration, queue; only
    job_id, gpu_num, node_num, submit_time and duration or start/end_time are needed).
    Workers = node_num, GPUs per worker = ceil(gpu_num / node_num)."""
    trace = Trace(f"helios:{path}", [])

    def row(line: int, r: dict) -> None:
        gpus = _int(r.get("gpu_num"), "gpu_num")
        if gpus < 0:
            raise ValueError(f"negative gpu_num {gpus}")
        if gpus == 0:
            trace.skip("no_gpu")
            return
        nodes = max(_int(r.get("node_num") or "1", "node_num"), 1)
        sub = _helios_time(r.get("submit_time", ""), "submit_time")
        if r.get("duration"):
            dur = _float(r["duration"], "duration")
        else:
            dur = _helios_time(r.get("end_time", ""), "end_time") - _helios_time(r.get("start_time", ""), "start_time")
        if dur < 0:
            raise ValueError(f"negative duration {dur}")
        if dur == 0:
            trace.skip("zero_duration")
            return
        trace.jobs.append(
            JobSpec(
                id=str(r.get("job_id") or f"line-{line}"),
                submit_time=sub,
                workers=nodes,
                gpus_per_worker=math.ceil(gpus / nodes),
                duration=dur,
            )
        )

    _Rows(path, trace, skip_bad, header=True).each(row)
    _shift_to_zero(trace)
    return trace


# ---------------------------------------------------------------- job file
def _job_file(path: Path) -> Trace:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from exc
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise their own error types
        raise TraceError(f"{path}: cannot parse: {exc}") from exc
    topo = None
    if isinstance(data, dict):
        if "cluster" in data:
            try:
                topo = Topology.from_dict(data["cluster"])
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}: cluster: {exc}") from exc
        data = data.get("jobs")
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a list of jobs (or a mapping with 'jobs')")
    jobs = []
    for k, d in enumerate(data, 1):
        try:
            if not isinstance(d, dict):
                raise ValueError("job entry must be a mapping")
            jobs.append(JobSpec.from_dict(d))
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}: job #{k}: {exc}") from exc
    return Trace(str(path), jobs, topo)


# ---------------------------------------------------------------- synthetic
SYNTHETIC_PRESETS = {
    "small": dict(jobs=200, nodes=16, gpus_per_node=8, racks=2),
    "medium": dict(jobs=2000, nodes=64, gpus_per_node=8, racks=8),
    "large": dict(jobs=100_000, nodes=1000, gpus_per_node=8, racks=50),
}

#: (name, compute seconds per step, gradient GB, batch per worker, weight)
MODEL_ZOO = (
    ("resnet50", 0.12, 0.10, 64, 0.30),
    ("vgg16", 0.15, 0.55, 64, 0.15),
    ("bert-base", 0.25, 0.44, 32, 0.25),
    ("transformer", 0.30, 0.80, 32, 0.15),
    ("gpt2-medium", 0.40, 1.40, 8, 0.15),
)


def _parse_kv(arg: str) -> tuple[str, dict[str, str]]:
    parts = [p.strip() for p in arg.split(",") if p.strip()]
    preset = "small"
    kv: dict[str, str] = {}
    for p in parts:
        if "=" in p:
            k, _, v = p.partition("=")
            kv[k.strip()] = v.strip()
        else:
            preset = p
    return preset, kv


def synthetic(arg: str = "small", *, seed: int = 0) -> Trace:
    """Seeded multi-worker training jobs on a uniform cluster.

    ``arg`` = ``<small|medium|large>[,jobs=N,nodes=N,gpus_per_node=N,racks=N,
    arrival_rate=X,max_workers=N,load=X,runtime_sigma=X,seed=N]``. Each job picks a model from
    :data:`MODEL_ZOO`, a worker count (powers of two up to ``max_workers``) and GPUs
    per worker, a target ideal run time (log-normal, median 30 min, shape
    ``runtime_sigma``, default 1.1; clipped to 2 min .. 7 days) from which its
    dataset size follows, and a convergence threshold ``beta``. Arrivals are Poisson;
    without ``arrival_rate`` the rate gives an offered load of ``load`` (default 0.6)
    of the cluster's GPUs.
    """
    preset, kv = _parse_kv(arg)
    if preset not in SYNTHETIC_PRESETS:
        raise TraceError(f"unknown synthetic preset {preset!r}; known: {', '.join(SYNTHETIC_PRESETS)}")
    p: dict[str, float] = dict(SYNTHETIC_PRESETS[preset])
    p.update(max_workers=8, load=0.6, runtime_sigma=1.1, seed=seed)
    known = set(p) | {"arrival_rate"}
    for k, v in kv.items():
        if k not in known:
            raise TraceError(f"synthetic: unknown parameter {k!r}; known: {', '.join(sorted(known))}")
        try:
            p[k] = float(v) if k in ("arrival_rate", "load", "runtime_sigma") else int(v)
        except ValueError:
            raise TraceError(f"synthetic: {k}={v!r} is not a number") from None
    n, nodes, gpn, racks = int(p["jobs"]), int(p["nodes"]), int(p["gpus_per_node"]), int(p["racks"])
    if n < 1 or nodes < 1 or gpn < 1 or racks < 1 or p["max_workers"] < 1 or p["load"] <= 0 or p["runtime_sigma"] < 0:
        raise TraceError("synthetic: jobs, nodes, gpus_per_node, racks, max_workers must be >= 1, load > 0, runtime_sigma >= 0")
    topo = Topology.uniform(nodes, gpn, racks=min(racks, nodes), blocks=max(1, min(racks, nodes) // 10))
    rng = np.random.default_rng(int(p["seed"]))

    zoo_w = np.array([m[4] for m in MODEL_ZOO])
    model = rng.choice(len(MODEL_ZOO), size=n, p=zoo_w / zoo_w.sum())
    max_w = int(p["max_workers"])
    w_choices = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= max_w] or [1]
    w_p = np.array([0.5 ** k for k in range(len(w_choices))])
    workers = np.array(w_choices)[rng.choice(len(w_choices), size=n, p=w_p / w_p.sum())]
    g_choices = [g for g in (1, 2, 4, 8) if g <= gpn] or [1]
    g_p = np.array([0.55, 0.2, 0.1, 0.15][: len(g_choices)])
    gpw = np.array(g_choices)[rng.choice(len(g_choices), size=n, p=g_p / g_p.sum())]
    runtime = np.clip(rng.lognormal(math.log(1800.0), float(p["runtime_sigma"]), size=n), 120.0, 7 * 86400.0)
    beta = rng.choice([0.001, 0.002, 0.004], size=n)
    tau = rng.uniform(3.0, 8.0, size=n)
    acc_max = rng.uniform(0.7, 0.95, size=n)
    max_epochs = rng.integers(20, 61, size=n)

    gpus = workers * gpw
    if "arrival_rate" in p:
        rate = float(p["arrival_rate"])
        if rate <= 0:
            raise TraceError("synthetic: arrival_rate must be > 0")
    else:
        rate = p["load"] * topo.total_gpus / float((gpus * runtime).mean())
    submit = np.cumsum(rng.exponential(1.0 / rate, size=n))
    submit -= submit[0]

    limits = topology_limits(topo)
    bw = topo.bandwidth
    width = len(str(n - 1))
    fastest: dict[int, float] = {}  # GPUs -> best bandwidth any placement reaches
    jobs = []
    for k in range(n):
        name, ct, grad, batch, _ = MODEL_ZOO[int(model[k])]
        w, g = int(workers[k]), int(gpw[k])
        n_gpu = w * g
        best_bw = fastest.get(n_gpu)
        if best_bw is None:
            lvl = int(ideal_level(n_gpu, limits))
            best_bw = fastest[n_gpu] = max(bw.at(Level(v)) for v in range(lvl, int(Level.CLUSTER) + 1))
        step = ct + comm_time(grad, n_gpu, best_bw)
        thr = w * batch / step
        # epochs to converge (noise-free): where the per-epoch gain falls below beta
        span = float(acc_max[k]) - 0.1
        eff = 1.0 / (1.0 + 0.05 * (w - 1))
        e_conv = max(tau[k] * math.log(max(span * eff / (tau[k] * beta[k]), 1.0 + 1e-9)) / eff, 1.0)
        e_run = min(e_conv + 3, float(max_epochs[k]))
        jobs.append(
            JobSpec(
                id=f"job-{k:0{width}d}",
                submit_time=float(submit[k]),
                workers=w,
                gpus_per_worker=g,
                min_workers=1,
                max_workers=min(2 * w, 2 * max_w),
                compute_time=ct,
                grad_gb=grad,
                batch_per_worker=batch,
                samples_per_epoch=max(int(runtime[k] * thr / e_run), batch),
                max_epochs=int(max_epochs[k]),
                beta=float(beta[k]),
                convergence={"tau": float(tau[k]), "acc_max": float(acc_max[k])},
            )
        )
    return Trace(f"synthetic:{arg}", jobs, topo)


def default_topology(jobs: list[JobSpec]) -> Topology:
    """A cluster for traces that carry none: 64 nodes × 8 GPUs in 8 racks, grown so
    the largest job fits."""
    need = max((j.workers * j.gpus_per_worker for j in jobs), default=8)
    nodes = max(64, math.ceil(need / 8))
    return Topology.uniform(nodes, 8, racks=8, bandwidth=Bandwidth())
