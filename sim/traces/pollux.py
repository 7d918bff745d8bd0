"""``pollux:<folder>/<file>``, ``sia:<folder>/<file>`` and ``pollux-gen:seed=N[,...]``:
measured-job workloads on the Pollux OSDI'21 simulator data (Qiao et al., OSDI 2021)
and its heterogeneous extension, the Sia SOSP'23 data (Jayaram Subramanya et al.).

Each returns a :class:`MeasuredTrace` for a cluster (:class:`~..measured.MeasuredCluster`,
``cluster=NAME`` in the spec): ``pollux:`` and ``pollux-gen:`` in Pollux's setting (16 ×
4 T4, 60 s interval, 30 s restart), ``sia:`` in the Sia artifact's (its 64-GPU mix, its
calibration and restart costs). :func:`load` reads a published workload CSV under strict
rules, :func:`generate` samples a new one from ``traces/philly.csv`` the way the published
ones were (OSDI'21 §5.1), never reading them. Rules and sampling: docs/design-notes.md,
docs/simulator.md.
"""

from __future__ import annotations

import contextlib
import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator

import numpy as np

from rlsched.core.allocation import ProfileSample

from ..measured import (
    DEFAULT_CLUSTER,
    DEFAULT_GPU_TYPE,
    SIA_CALIBRATION,
    SIA_RESTART_COST,
    Application,
    ClusterError,
    MeasuredCluster,
    MeasuredJobSpec,
    ProfileError,
    load_applications,
    load_seed_profile,
    parse_cluster,
)
from .common import TraceError, need_dir, parse_float, parse_int

__all__ = [
    "FORM",
    "SIA_FORM",
    "GEN_FORM",
    "DATA_SUBDIR",
    "SIA_SUBDIR",
    "REFERENCE_GPUS",
    "with_cluster",
    "load_sia",
    "WORKLOAD_COLUMNS",
    "PHILLY_COLUMNS",
    "PHILLY_CLUSTER",
    "MeasuredTrace",
    "load",
    "generate",
    "philly_pool",
    "GPU_HOUR_EDGES",
    "BUCKET_APPS",
    "APP_CONFIGS",
    "MIN_DURATION",
    "MAX_GPU_HOURS",
    "WINDOW_START",
]

FORM = "pollux:<folder>/<file>[,cluster=NAME]"
SIA_FORM = "sia:<folder>/<file>[,cluster=NAME][,calibration=sia|none][,restart=sia|SECONDS]"
GEN_FORM = ("pollux-gen:seed=N[,jobs=160,hours=8,load=1.0,start=2][,cluster=NAME]"
            "[,calibration=sia|none][,restart=sia|SECONDS]")
#: the data's folder under the data folder
DATA_SUBDIR = "pollux-osdi21"
#: the Sia data's folder (step times per GPU type; the ``aws`` ones are Pollux's)
SIA_SUBDIR = "sia-sosp23"
#: GPUs of the cluster the Pollux workloads were drawn for: ``pollux-gen`` scales its
#: job count by a cluster's GPUs over these
REFERENCE_GPUS = 64
WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
PHILLY_COLUMNS = ("timestamp", "duration", "gpu_time")
#: the Philly column naming the job's virtual cluster (the tenant: Jeon et al., ATC'19)
PHILLY_CLUSTER = "cluster"

# ------------------------------------------------------------------ generator constants
# Measured once, offline, on the published workloads (all 24 files; the distinct jobs
# are the 1,920 of workloads-1.5/, of which the lower loads are subsets) and on
# traces/philly.csv. The generator never reads the workloads.

#: Philly jobs shorter than this (s) are not sampled: the shortest Philly job matched
#: by a published job ran 61 s, while 8 % of the window's jobs ran < 60 s.
MIN_DURATION = 60.0
#: Philly jobs of this many GPU-hours or more are not sampled (the largest matched:
#: 818 GPU-hours; 0.2 % of the window's jobs are larger).
MAX_GPU_HOURS = 1000.0
#: hour of the day the published 8-hour window starts (02:00): all 1,920 published
#: jobs match a Philly submission at 02:00 + ``time`` in their bucket, 0–46 % for
#: every other start hour.
WINDOW_START = 2
#: GPU-time bucket edges in GPU-hours (the paper's decades: < 1, 1–10, 10–100,
#: 100–1000). Bracketed by the 521 published jobs with a single Philly candidate:
#: cifar10/ncf ≤ 0.986 h, deepspeech2/bert 1.018–9.30 h, yolov3 12.1–51.4 h,
#: imagenet 105.6–818 h. Bucket shares in the 02:00–10:00 pool: 78.3 / 15.2 / 4.6 /
#: 1.9 %; in the published jobs: 78.3 / 15.5 / 4.5 / 1.8 %.
GPU_HOUR_EDGES = (1.0, 10.0, 100.0)
#: each bucket's models with their share within the bucket, measured: cifar10 743 :
#: ncf 760 (binomial p = 0.68 against even, kept as measured), deepspeech2 173 :
#: bert 124 (p = 0.005 against even: the published mix leans to deepspeech2, so the
#: measured share is used); yolov3 and imagenet alone in theirs.
BUCKET_APPS: tuple[tuple[tuple[str, float], ...], ...] = (
    (("cifar10", 743 / 1503), ("ncf", 760 / 1503)),
    (("deepspeech2", 173 / 297), ("bert", 124 / 297)),
    (("yolov3", 1.0),),
    (("imagenet", 1.0),),
)
#: the (num_replicas, batch_size) pairs the published jobs of each model use, drawn
#: uniformly (counts among the 1,920 jobs; χ² against uniform p ≥ 0.42 for each):
#: bert 29/27/29/39, cifar10 190/181/200/172, deepspeech2 56/56/61, imagenet
#: 13/12/9, ncf 760, yolov3 86. The Philly job's own GPU count is not used, as in
#: the published workloads (ncf always 1 GPU, whatever the Philly job had).
APP_CONFIGS: dict[str, tuple[tuple[int, int], ...]] = {
    "bert": ((6, 384), (8, 384), (12, 384), (16, 384)),
    "cifar10": ((6, 2048), (8, 2048), (12, 4096), (16, 4096)),
    "deepspeech2": ((6, 320), (8, 320), (12, 640)),
    "imagenet": ((24, 3200), (32, 6400), (48, 6400)),
    "ncf": ((1, 32768),),
    "yolov3": ((4, 64),),
}

_GEN_DEFAULTS = {"jobs": 160.0, "hours": 8.0, "load": 1.0, "start": float(WINDOW_START)}


@dataclass
class MeasuredTrace:
    """Measured jobs, the profiles of their applications (step times on each GPU type
    of ``cluster``), and the cluster and engine setting they are meant for (Pollux's:
    16 nodes × 4 T4 GPUs, 60 s scheduling interval, 30 s restart per re-allocation;
    ``restart_costs`` and ``calibration``: per application, the Sia artifact's where it
    is the setting, :class:`~..interval.IntervalConfig`); ``skipped`` counts dropped rows
    by reason, ``notes`` says what was assumed. ``philly_gpu_hours`` (``pollux-gen``
    only; empty for the published workloads): job id -> GPU-hours of the Philly job it
    was sampled from (``gpu_time`` of the list), what the trace knows of the request's
    size beside its model — not the engine's work (that follows the model)."""

    name: str
    jobs: list[MeasuredJobSpec]
    apps: dict[str, Application]
    cluster: MeasuredCluster = DEFAULT_CLUSTER
    interval: float = 60.0
    restart_cost: float = 30.0
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    philly_gpu_hours: dict[str, float] = field(default_factory=dict)
    restart_costs: dict[str, float] | None = None
    calibration: dict[str, float] | None = None
    #: per application, the one-GPU seed profile a job naming it declares (read with the
    #: Sia data's step times, for its cluster's types; empty on Pollux's data)
    seeds: dict[str, tuple[ProfileSample, ...]] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def interval_config(self, **overrides):
        """The interval engine's config of its setting (:class:`~..interval.IntervalConfig`),
        with ``overrides``."""
        from ..interval import IntervalConfig

        kw = dict(interval=self.interval, restart_cost=self.restart_cost, restart_costs=self.restart_costs,
                  calibration=self.calibration)
        kw.update(overrides)
        return IntervalConfig(**kw)

    @property
    def nodes(self) -> int:
        """Nodes of its cluster."""
        return self.cluster.total_nodes

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node of its cluster, which must have one GPU type (else use ``cluster``)."""
        if not self.cluster.homogeneous:
            raise TraceError(f"{self.name}: cluster {self.cluster.name!r} mixes GPU types ({self.cluster.describe()}); "
                             "run it with its cluster (IntervalSimulator(cluster=trace.cluster))")
        return self.cluster.groups[0].gpus_per_node


# ------------------------------------------------------------------ pollux:<folder>/<file>
class _OutOfRange(ValueError):
    """A well-formed row the measured profile cannot describe."""


def _profiles(root: Path) -> Path:
    return need_dir(root, "traces")


def _first_file(types: tuple[str, ...] | None) -> str:
    return "placements.csv" if types is None else f"placements-{types[0]}.csv"


def _known_apps(traces: Path, types: tuple[str, ...] | None = None) -> list[str]:
    """Applications with step times on every one of ``types`` (None: Pollux's layout)."""
    files = ["placements.csv"] if types is None else [f"placements-{t}.csv" for t in types]
    return sorted(p.name for p in traces.iterdir() if all((p / f).is_file() for f in files))


def _workload_path(arg: str, root: Path) -> Path:
    """``arg`` under ``root`` (``.csv`` optional); refused if it leaves ``root``."""
    if not arg.strip():
        raise TraceError(f"pollux: needs a file: {FORM}, e.g. pollux:workloads/workload-6")
    base = root.resolve()
    cands = [root / arg] if arg.lower().endswith(".csv") else [root / f"{arg}.csv", root / arg]
    for p in cands:
        real = p.resolve()
        if not real.is_relative_to(base):
            raise TraceError(f"pollux:{arg}: {real} is outside the data's folder {base}; give <folder>/<file> under it")
    for p in cands:
        if p.is_file():
            return p
    raise TraceError(f"{cands[0]}: no such workload file")



@contextlib.contextmanager
def _reader(path: Path, columns: tuple[str, ...]) -> Iterator[csv.DictReader]:
    """A CSV reader of ``path`` that has every one of ``columns``; TraceError naming the
    file otherwise."""
    try:
        f = open(path, newline="")
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing columns {missing} (need {','.join(columns)})")
        yield reader

def _file_options(arg: str, form: str, allowed: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``<file>[,k=v...]`` of a workload spec: the file and its options, each of ``allowed``."""
    name, *rest = arg.split(",")
    opts: dict[str, str] = {}
    for item in (p.strip() for p in rest):
        if not item:
            continue
        k, eq, v = item.partition("=")
        if not eq or k.strip() not in allowed or not v.strip():
            raise TraceError(f"unknown workload option {item!r}; form: {form}")
        opts[k.strip()] = v.strip()
    return name, opts


def _cluster_option(opts: dict[str, str], default: MeasuredCluster) -> MeasuredCluster:
    if "cluster" not in opts:
        return default
    try:
        return parse_cluster(opts["cluster"])
    except ClusterError as exc:
        raise TraceError(str(exc)) from None


def cluster_profiles(data_dir: Path | None, cluster: MeasuredCluster) -> tuple[Path, tuple[str, ...] | None]:
    """Where the step times of ``cluster``'s GPU types are, and the types to read
    (None: the Pollux layout): Pollux's data for an all-``aws`` cluster, the Sia data's
    otherwise (its ``aws`` files are Pollux's, byte for byte)."""
    if cluster.gpu_types == (DEFAULT_GPU_TYPE,):
        return _profiles(need_dir(data_dir, DATA_SUBDIR)), None
    return need_dir(need_dir(data_dir, SIA_SUBDIR), "traces"), cluster.gpu_types


def _load_apps(data_dir: Path | None, cluster: MeasuredCluster, names: tuple[str, ...]) -> dict[str, Application]:
    folder, types = cluster_profiles(data_dir, cluster)
    for t in types or ():
        if not any((folder / n / f"placements-{t}.csv").is_file() for n in names):
            known = sorted({p.stem.split("-", 1)[1] for p in folder.glob("*/placements-*.csv")})
            raise TraceError(f"cluster {cluster.name!r}: no step times on GPU type {t!r} in {folder} "
                             f"(types: {', '.join(known)})")
    try:
        return load_applications(folder, names, gpu_types=types)
    except ProfileError as exc:
        raise TraceError(f"cluster {cluster.name!r}: {exc}") from None


def _load_seeds(trace: MeasuredTrace, data_dir: Path | None) -> None:
    """``trace.seeds`` for its applications and its cluster's types, where the Sia data
    has a seed profile (none on an all-``aws`` cluster: Pollux's setting)."""
    trace.seeds = {}
    if trace.cluster.gpu_types == (DEFAULT_GPU_TYPE,):
        return
    folder = need_dir(data_dir, SIA_SUBDIR) / "seed"
    for app in trace.apps:
        if (folder / f"{app}.csv").is_file():
            try:
                trace.seeds[app] = load_seed_profile(folder / f"{app}.csv", trace.cluster.gpu_types)
            except ProfileError as exc:
                raise TraceError(str(exc)) from None


def with_cluster(trace: MeasuredTrace, cluster: MeasuredCluster, data_dir: Path | None) -> MeasuredTrace:
    """``trace`` on ``cluster``: its applications' step times read for the cluster's
    GPU types (the jobs unchanged)."""
    if cluster == trace.cluster:
        return trace
    trace.apps = _load_apps(data_dir, cluster, tuple(sorted(trace.apps)))
    trace.cluster = cluster
    _load_seeds(trace, data_dir)
    trace.notes = [n for n in trace.notes if not n.startswith(("the paper's setting", _SETTING))]
    _setting_note(trace)
    return trace


def _sia_setting(trace: MeasuredTrace, kind: str, cal: str, restart: str | None) -> None:
    """Put ``trace`` in the Sia artifact's setting where asked: its calibration of step
    times per application (``cal="sia"``, or ``"none"``) and its restart cost per
    application (``restart="sia"``, or seconds for one for all; None: the trace's own)."""
    if cal not in ("sia", "none"):
        raise TraceError(f"{kind}: calibration={cal!r}: expected sia or none")
    trace.calibration = {a: SIA_CALIBRATION[a] for a in trace.apps} if cal == "sia" else None
    if restart == "sia":
        trace.restart_costs = {a: SIA_RESTART_COST[a] for a in trace.apps}
    elif restart is not None:
        try:
            trace.restart_cost = float(restart)
        except ValueError:
            raise TraceError(f"{kind}: restart={restart!r}: expected sia or seconds") from None
        if not (math.isfinite(trace.restart_cost) and trace.restart_cost >= 0):
            raise TraceError(f"{kind}: restart={restart!r} must be >= 0 seconds")
    trace.notes.append(
        "the Sia artifact's setting: step times x " + ("its calibration per application" if trace.calibration else "1")
        + ", restart " + ("its cost per application" if trace.restart_costs else f"{trace.restart_cost:g} s"))


def load(arg: str, data_dir: Path | None, skip_bad: bool = False) -> MeasuredTrace:
    """The workload ``<data>/pollux-osdi21/<file>[.csv]`` on Pollux's cluster, or the
    one ``cluster=NAME`` names (the rules are in the module docstring)."""
    arg, opts = _file_options(arg, FORM, ("cluster",))
    return _load_file(arg, data_dir, skip_bad, DATA_SUBDIR, "pollux", _cluster_option(opts, DEFAULT_CLUSTER))


def load_sia(arg: str, data_dir: Path | None, skip_bad: bool = False) -> MeasuredTrace:
    """The workload ``<data>/sia-sosp23/<file>[.csv]`` (the Philly workloads:
    ``workloads/philly/workload-N``) in the Sia artifact's setting: its 64-GPU mix
    (``cluster=NAME`` for another), its calibration of step times (``calibration=none``
    to drop it) and its restart cost per application (``restart=SECONDS`` for one for
    all)."""
    arg, opts = _file_options(arg, SIA_FORM, ("cluster", "calibration", "restart"))
    trace = _load_file(arg, data_dir, skip_bad, SIA_SUBDIR, "sia", _cluster_option(opts, _named("sia-64")))
    _sia_setting(trace, "sia", opts.get("calibration", "sia"), opts.get("restart", "sia"))
    for k in ("cluster", "calibration", "restart"):
        if k in opts:
            trace.name += f",{k}={opts[k]}"
    return trace


def _named(name: str) -> MeasuredCluster:
    return parse_cluster(name)


def _load_file(arg: str, data_dir: Path | None, skip_bad: bool, subdir: str, kind: str,
               cluster: MeasuredCluster) -> MeasuredTrace:
    root = need_dir(data_dir, subdir)
    path = _workload_path(arg, root)
    traces, types = cluster_profiles(data_dir, cluster)
    known = _known_apps(traces, types)
    name = arg[: -len(".csv")] if arg.lower().endswith(".csv") else arg
    trace = MeasuredTrace(f"{kind}:{name}", [], {}, cluster=cluster)
    apps: dict[str, Application] = {}
    seen: set[str] = set()
    with _reader(path, WORKLOAD_COLUMNS) as reader:
        for row in reader:
            line = reader.line_num
            app = (row.get("application") or "").strip()
            if app not in known:
                raise TraceError(f"{path}:{line}: unknown application {app!r}: no profile {traces / app}/{_first_file(types)} (profiles: {', '.join(known)})")
            if app not in apps:  # a broken profile raises ProfileError: never a skipped row
                apps[app] = load_applications(traces, (app,), gpu_types=types)[app]
            try:
                job = _job(row, app, seen)
                _check(job, apps[app])
            except _OutOfRange as exc:
                if not skip_bad:
                    raise TraceError(f"{path}:{line}: {exc}") from exc
                trace.skip("out_of_range")
                continue
            except (ValueError, TypeError) as exc:
                if not skip_bad:
                    raise TraceError(f"{path}:{line}: {exc}") from exc
                trace.skip("malformed")
                continue
            seen.add(job.id)
            trace.jobs.append(job)
    if not trace.jobs:
        raise TraceError(f"{path}: no jobs" + (f" (skipped {trace.skipped})" if trace.skipped else ""))
    order = sorted(range(len(trace.jobs)), key=lambda k: trace.jobs[k].submit_time)
    if order != list(range(len(order))):
        trace.jobs = [trace.jobs[k] for k in order]
        trace.notes.append("jobs sorted by submit time (the file was not)")
    used = {j.application for j in trace.jobs}
    trace.apps = {a: p for a, p in sorted(apps.items()) if a in used}
    if cluster != DEFAULT_CLUSTER and kind == "pollux":
        trace.name += f",cluster={cluster.name}"
    _load_seeds(trace, data_dir)
    _setting_note(trace)
    return trace


def _job(row: dict, app: str, seen: set[str]) -> MeasuredJobSpec:
    name = (row.get("name") or "").strip()
    if not name:
        raise ValueError("missing name")
    if name in seen:
        raise ValueError(f"repeated job name {name!r}")
    t = parse_float(row.get("time"), "time")
    if t < 0:
        raise ValueError(f"negative time {t:g}")
    reps = parse_int(row.get("num_replicas"), "num_replicas")
    bsz = parse_int(row.get("batch_size"), "batch_size")
    if reps < 1 or bsz < 1:
        raise ValueError(f"num_replicas and batch_size must be >= 1, got {reps}, {bsz}")
    return MeasuredJobSpec(name, t, app, reps, bsz)


def _check(job: MeasuredJobSpec, app: Application) -> None:
    b = max((app.bounds_on(t) for t in app.gpu_types), key=lambda x: x.min_local_batch)
    if not b.init_batch <= job.batch_size <= b.largest:
        raise _OutOfRange(f"{job.application} batch_size {job.batch_size} outside the measured runs [{b.init_batch}, {b.largest}]")
    if job.num_replicas * b.min_local_batch > job.batch_size:
        raise _OutOfRange(f"{job.application} batch_size {job.batch_size} over {job.num_replicas} GPUs is below the smallest measured per-GPU batch {b.min_local_batch}")


_SETTING = "setting: "


def _setting_note(trace: MeasuredTrace) -> None:
    c = trace.cluster
    where = (f"the paper's setting: {trace.nodes} nodes x {trace.gpus_per_node} GPUs" if c == DEFAULT_CLUSTER
             else f"{_SETTING}cluster {c.name} ({c.describe()})")
    restart = "a restart cost per application" if trace.restart_costs else f"{trace.restart_cost:g} s restart"
    trace.notes.append(f"{where}, {trace.interval:g} s scheduling interval, {restart} per re-allocation")
    cap = max(g.nodes * g.gpus_per_node for g in c.groups)
    big = sum(j.num_replicas > cap for j in trace.jobs)
    if big:
        trace.notes.append(f"{big} jobs ask for more than the {cap} GPUs of the default cluster" if c == DEFAULT_CLUSTER
                           else f"{big} jobs ask for more than the {cap} GPUs of the cluster's largest GPU type")


# ------------------------------------------------------------------ pollux-gen:seed=N,...
def _gen_options(arg: str, seed: int) -> tuple[int, dict[str, float], MeasuredCluster, dict[str, str]]:
    opts = dict(_GEN_DEFAULTS)
    given_seed: int | None = None
    cluster = DEFAULT_CLUSTER
    setting: dict[str, str] = {}
    for item in (p.strip() for p in arg.split(",")):
        if not item:
            continue
        k, eq, v = item.partition("=")
        k = k.strip()
        if k == "cluster" and eq:
            cluster = _cluster_option({"cluster": v.strip()}, DEFAULT_CLUSTER)
            continue
        if k in ("calibration", "restart") and eq:
            setting[k] = v.strip()
            continue
        if not eq or (k != "seed" and k not in opts):
            raise TraceError(f"pollux-gen: unknown option {item!r}; form: {GEN_FORM}")
        try:
            x = float(v)
        except ValueError:
            raise TraceError(f"pollux-gen: {k}={v.strip()!r} is not a number") from None
        if not math.isfinite(x):
            raise TraceError(f"pollux-gen: {k}={v.strip()!r} is not finite")
        if k == "seed":
            if x != int(x) or x < 0:
                raise TraceError(f"pollux-gen: seed={v.strip()} must be a whole number >= 0")
            given_seed = int(x)
        else:
            opts[k] = x
    if opts["jobs"] != int(opts["jobs"]) or opts["jobs"] < 1:
        raise TraceError(f"pollux-gen: jobs={opts['jobs']:g} must be a whole number >= 1")
    if not 0 < opts["hours"] <= 24:
        raise TraceError(f"pollux-gen: hours={opts['hours']:g} must be in (0, 24]")
    if not opts["load"] > 0:
        raise TraceError(f"pollux-gen: load={opts['load']:g} must be > 0")
    if opts["start"] != int(opts["start"]) or not 0 <= opts["start"] < 24:
        raise TraceError(f"pollux-gen: start={opts['start']:g} must be an hour 0..23")
    if given_seed is None:
        if seed < 0:
            raise TraceError(f"pollux-gen: seed {seed} must be >= 0")
        given_seed = int(seed)
    return given_seed, opts, cluster, setting


def philly_pool(path: Path, start: int = WINDOW_START, hours: float = 8.0, *,
                clusters: bool = False) -> tuple[np.ndarray, ...]:
    """(offset into the window in s, GPU-hours) of the Philly jobs of ``path`` that the
    generator samples: ``duration >= MIN_DURATION``, ``gpu_time <`` :data:`MAX_GPU_HOURS`,
    submitted at a time of day in ``[start, start + hours)`` h of any day; file order.
    With ``clusters`` a third array, each job's ``cluster`` column (:data:`PHILLY_CLUSTER`:
    Philly's *virtual cluster*, the team that submitted it), which the file must then
    have, non-empty on every row. A malformed row raises :class:`TraceError` naming file
    and line."""
    offs: list[int] = []
    gpu_h: list[float] = []
    vcs: list[str] = []
    span = hours * 3600.0
    with _reader(path, PHILLY_COLUMNS + ((PHILLY_CLUSTER,) if clusters else ())) as reader:
        for row in reader:
            try:
                ts = row.get("timestamp") or ""
                try:
                    if len(ts) != 19 or ts[10] != " ":
                        raise ValueError
                    when = datetime.fromisoformat(ts)
                except ValueError:
                    raise ValueError(f"timestamp is not 'YYYY-MM-DD HH:MM:SS': {ts!r}") from None
                dur = parse_float(row.get("duration"), "duration")
                gt = parse_float(row.get("gpu_time"), "gpu_time")
                if dur < 0 or gt < 0:
                    raise ValueError(f"negative duration or gpu_time: {dur:g}, {gt:g}")
                vc = (row.get(PHILLY_CLUSTER) or "").strip() if clusters else ""
                if clusters and not vc:
                    raise ValueError(f"empty {PHILLY_CLUSTER}")
            except ValueError as exc:
                raise TraceError(f"{path}:{reader.line_num}: {exc}") from exc
            if dur < MIN_DURATION or gt >= MAX_GPU_HOURS * 3600:
                continue
            off = ((when.hour - start) % 24) * 3600 + when.minute * 60 + when.second
            if off < span:
                offs.append(off)
                gpu_h.append(gt / 3600.0)
                if clusters:
                    vcs.append(vc)
    if clusters:
        return np.array(offs, dtype=np.int64), np.array(gpu_h, dtype=float), np.array(vcs, dtype=object)
    return np.array(offs, dtype=np.int64), np.array(gpu_h, dtype=float)


def generate(arg: str, data_dir: Path | None, seed: int = 0) -> MeasuredTrace:
    """A new workload from ``traces/philly.csv`` (the rule is in the module docstring);
    ``arg`` = ``seed=N[,jobs=160][,hours=8][,load=1.0][,start=2][,cluster=NAME]``, and
    ``calibration=``/``restart=`` as for ``sia:`` (default: Pollux's setting).
    ``jobs`` is for Pollux's 64 GPUs: on a cluster of G GPUs ``jobs × load × G / 64``
    are drawn (the same arrival rate per GPU), the same seed giving the same jobs in
    the same order (a prefix or superset)."""
    seed, o, cluster, setting = _gen_options(arg, seed)
    jobs, hours, load_x, start = int(o["jobs"]), o["hours"], o["load"], int(o["start"])
    root = need_dir(data_dir, DATA_SUBDIR)
    traces = _profiles(root)
    offs, gpu_h, vcs = philly_pool(traces / "philly.csv", start, hours, clusters=True)
    n = int(round(jobs * load_x * (cluster.total_gpus / REFERENCE_GPUS)))
    if n < 1:
        raise TraceError(f"pollux-gen: jobs={jobs} x load={load_x:g} rounds to no job")
    if n > len(offs):
        raise TraceError(f"pollux-gen: {n} jobs asked but the {hours:g} h window from {start:02d}:00 holds {len(offs)} Philly jobs")
    rng = np.random.default_rng(seed)
    # the permutation's draws do not depend on n, and row k of u is the k-th job's:
    # the same seed at a higher load gives a superset of the jobs
    pick = rng.permutation(len(offs))[:n]
    u = rng.random((n, 2))
    bucket = np.searchsorted(np.asarray(GPU_HOUR_EDGES), gpu_h[pick], side="right")
    rows = []
    for k in range(n):
        choices = BUCKET_APPS[int(bucket[k])]
        cum, app = 0.0, choices[-1][0]
        for a, share in choices:
            cum += share
            if u[k, 0] < cum:
                app = a
                break
        cfg = APP_CONFIGS[app]
        reps, bsz = cfg[min(int(u[k, 1] * len(cfg)), len(cfg) - 1)]
        rows.append((int(offs[pick[k]]), k, app, reps, bsz, str(vcs[pick[k]]), float(gpu_h[pick[k]])))
    rows.sort()  # (time, k) is unique: the tenant never breaks a tie
    name = f"pollux-gen:seed={seed},jobs={jobs},hours={hours:g},load={load_x:g},start={start}"
    if cluster != DEFAULT_CLUSTER:
        name += f",cluster={cluster.name}"
    name += "".join(f",{k}={setting[k]}" for k in ("calibration", "restart") if k in setting)
    trace = MeasuredTrace(
        name,
        [MeasuredJobSpec(f"{app}-{i}", float(t), app, reps, bsz, vc)
         for i, (t, _, app, reps, bsz, vc, _h) in enumerate(rows)],
        {},
        cluster=cluster,
        philly_gpu_hours={f"{r[2]}-{i}": r[6] for i, r in enumerate(rows)},
    )
    used = tuple(sorted({j.application for j in trace.jobs}))
    folder, types = cluster_profiles(data_dir, cluster)
    missing = [a for a in used if a not in _known_apps(folder, types)]
    if missing:
        raise TraceError(f"{folder}: no measured profile for {', '.join(missing)}" + (f" on {', '.join(types)}" if types else ""))
    trace.apps = _load_apps(data_dir, cluster, used)
    _load_seeds(trace, data_dir)
    trace.notes.append(
        f"{n} jobs sampled from the {len(offs)} Philly jobs submitted {start:02d}:00 + {hours:g} h of any day "
        f"(duration >= {MIN_DURATION:g} s, < {MAX_GPU_HOURS:g} GPU-hours); model by GPU-time bucket; "
        f"tenant: the Philly job's virtual cluster ({len(set(j.tenant for j in trace.jobs))} tenants)"
    )
    if setting:
        _sia_setting(trace, "pollux-gen", setting.get("calibration", "none"), setting.get("restart"))
    _setting_note(trace)
    return trace
