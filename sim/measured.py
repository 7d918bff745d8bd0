"""Measured jobs: speed and convergence read from real profiles, not invented curves.

The profiles are the Pollux OSDI'21 simulator data (Qiao et al., "Pollux: Co-adaptive
Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI 2021): step times per
placement and real training runs per batch size, for six applications. Step time,
statistical efficiency, progress and completion follow the paper's simulator; the engine
keeps the truth and policies see what the job measured. Details: docs/design-notes.md.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rlsched.core.allocation import ProfileSample
from rlsched.core.batch import BatchBounds

__all__ = [
    "MeasuredJobSpec",
    "Application",
    "ProfileError",
    "load_applications",
    "APPLICATIONS",
    "MAX_LOCAL_BSZ",
    "DEFAULT_GPU_TYPE",
    "TYPE_GPUS_PER_NODE",
    "SIA_CALIBRATION",
    "SIA_RESTART_COST",
    "ClusterError",
    "NodeGroup",
    "MeasuredCluster",
    "CLUSTERS",
    "DEFAULT_CLUSTER",
    "parse_cluster",
    "UNMODELLED",
    "SEED_TYPES",
    "load_seed_profile",
    "StepProfile",
    "MAX_REPLICAS",
    "FIXED_BATCH",
    "placement_of",
]

#: the six applications of the data, in the paper's Table 1
APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
#: the GPU type of the Pollux data (``placements.csv``): AWS g4dn.12xlarge, 4 × T4 per node
DEFAULT_GPU_TYPE = "aws"
#: per-GPU batch limits narrower than the measured range (GPU memory), by application
#: and GPU type: yolov3 fits 8 samples on a T4 (Pollux artifact's application table),
#: deepspeech2 57 on an RTX 2080 Ti (Sia artifact, ``applications.py``)
MAX_LOCAL_BSZ: dict[str, dict[str, int]] = {"yolov3": {"aws": 8}, "deepspeech2": {"rtx": 57}}
#: applications of the data this engine does not model, and why
UNMODELLED = {"gpt_pmp": "pipeline-model-parallel (stages and micro-batches per replica)"}
#: applications that do not scale past one GPU in the paper's setting: ncf runs on
#: one GPU under every elastic policy (Pollux artifact, simulator.py)
MAX_REPLICAS = {"ncf": 1}
#: applications whose global batch stays the job's own (``MeasuredJobSpec.batch_size``)
#: under every policy in the paper's setting, adaptive ones included: ncf trains at its
#: 32,768 (Pollux artifact, ``simulator.py``, ``Cluster.__init__``); found by replaying
#: our engine's decisions in the artifact's simulator side by side (docs/benchmark.md)
FIXED_BATCH = frozenset({"ncf"})


#: GPUs per node of each GPU type of the data (the Sia artifact's ``simulator_config.py``)
TYPE_GPUS_PER_NODE = {"aws": 4, "azure": 8, "dgx": 8, "dgx-ext": 8, "quad": 4, "rtx": 8}
#: the Sia artifact's calibration: each application's step times multiplied by this to
#: match real runs (``SLOWDOWNS``, fitted on ``rtx``)
SIA_CALIBRATION = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
#: the Sia artifact's restart cost per application, seconds (``applications.py``)
SIA_RESTART_COST = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0}


#: the seed profiles' GPU names (``seed/<app>.csv``, column ``gpu_type``) as the types of
#: the step-time files: each seed row is that type's one-GPU row (checked on the data)
SEED_TYPES = {"t4": "aws", "v100": "azure", "dgx": "dgx-ext", "quad": "quad", "rtx": "rtx"}


class ClusterError(ValueError):
    """A cluster description that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of type ``gpu_type`` (a key of the data)."""

    gpu_type: str
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if not self.gpu_type or self.nodes < 1 or self.gpus_per_node < 1:
            raise ClusterError(f"node group {self.gpu_type!r}: need a GPU type, nodes >= 1 and GPUs per node >= 1")


@dataclass(frozen=True, slots=True)
class MeasuredCluster:
    """A cluster for measured jobs: groups of nodes, each of one GPU type; nodes are
    numbered group after group. ``name``: how results name it."""

    name: str
    groups: tuple[NodeGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ClusterError(f"cluster {self.name!r}: no nodes")
        types = [g.gpu_type for g in self.groups]
        if len(set(types)) != len(types):
            raise ClusterError(f"cluster {self.name!r}: GPU type listed twice in {types}")

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int, gpu_type: str = DEFAULT_GPU_TYPE) -> "MeasuredCluster":
        """``nodes`` × ``gpus_per_node`` GPUs of one type."""
        return cls(f"{nodes}x{gpus_per_node}" + ("" if gpu_type == DEFAULT_GPU_TYPE else f"-{gpu_type}"),
                   (NodeGroup(gpu_type, nodes, gpus_per_node),))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(g.gpu_type for g in self.groups)

    @property
    def homogeneous(self) -> bool:
        return len(self.groups) == 1

    @property
    def total_nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def total_gpus(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups)

    def node_types(self) -> list[tuple[str, int]]:
        """(GPU type, GPUs) of each node, in node order."""
        return [(g.gpu_type, g.gpus_per_node) for g in self.groups for _ in range(g.nodes)]

    def describe(self) -> str:
        return " + ".join(f"{g.nodes} x {g.gpus_per_node} {g.gpu_type}" for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "groups": [[g.gpu_type, g.nodes, g.gpus_per_node] for g in self.groups]}


#: named clusters: Pollux's testbed (16 × 4 T4, the default) and the Sia paper's
#: 64-GPU mix (Sia artifact, ``simulator_config.py``: 6 × 4 T4, 2 × 8 A100, 3 × 8 RTX 2080 Ti)
CLUSTERS: dict[str, MeasuredCluster] = {
    "pollux-64": MeasuredCluster("pollux-64", (NodeGroup("aws", 16, 4),)),
    "sia-64": MeasuredCluster("sia-64", (NodeGroup("aws", 6, 4), NodeGroup("dgx-ext", 2, 8), NodeGroup("rtx", 3, 8))),
}
#: the default cluster of the measured workloads
DEFAULT_CLUSTER = CLUSTERS["pollux-64"]
CLUSTER_FORM = "NAME (" + ", ".join(CLUSTERS) + ") | NODESxGPUS | TYPE:NODESxGPUS[+TYPE:NODESxGPUS...]"


def parse_cluster(text: str) -> MeasuredCluster:
    """A cluster from its name (:data:`CLUSTERS`), ``NODESxGPUS`` (all ``aws``) or
    ``TYPE:NODESxGPUS[+TYPE:NODESxGPUS...]`` (e.g. ``aws:6x4+dgx-ext:2x8+rtx:3x8``)."""
    text = text.strip()
    if text in CLUSTERS:
        return CLUSTERS[text]
    groups = []
    for part in text.split("+"):
        t, colon, size = part.strip().rpartition(":")
        n, x, g = size.lower().partition("x")
        if not (x and n.strip().isdigit() and g.strip().isdigit()) or (colon and not t.strip()):
            raise ClusterError(f"cluster {text!r}: expected {CLUSTER_FORM}")
        groups.append(NodeGroup(t.strip() if colon else DEFAULT_GPU_TYPE, int(n), int(g)))
    if len(groups) == 1 and groups[0].gpu_type == DEFAULT_GPU_TYPE and ":" not in text:
        return MeasuredCluster.uniform(groups[0].nodes, groups[0].gpus_per_node)
    return MeasuredCluster(text, tuple(groups))


class ProfileError(ValueError):
    """A measured profile is missing or malformed; the message names the file."""


@dataclass(frozen=True, slots=True)
class MeasuredJobSpec:
    """A job of a measured workload: its application and the user's request.

    ``tenant``: the team that submitted it, where the trace knows (``pollux-gen``: the
    Philly virtual cluster of the sampled Philly job; None for the published workloads,
    which carry no tenant). The interval engine charges the job to the queue of that
    name when it is given queues (:class:`~rlsched.sim.interval.IntervalSimulator`)."""

    id: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("job id must not be empty")
        if self.submit_time < 0 or not math.isfinite(self.submit_time):
            raise ValueError(f"job {self.id}: submit_time must be finite and >= 0")
        if self.num_replicas < 1 or self.batch_size < 1:
            raise ValueError(f"job {self.id}: need num_replicas >= 1 and batch_size >= 1")
        if self.tenant is not None and (not isinstance(self.tenant, str) or not self.tenant):
            raise ValueError(f"job {self.id}: tenant must be a non-empty string or None, got {self.tenant!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MeasuredJobSpec":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown job keys {sorted(unknown)}")
        tenant = d.get("tenant")  # absent in dicts written before jobs carried a tenant
        return cls(str(d["id"]), float(d["submit_time"]), str(d["application"]), int(d["num_replicas"]),
                   int(d["batch_size"]), None if tenant is None else str(tenant))


def placement_of(nodes: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """GPUs per node used (in first-use order) of a node-per-replica list."""
    counts: dict[int, int] = {}
    for i in nodes:
        counts[i] = counts.get(i, 0) + 1
    return tuple(counts.values())


def _read(path: Path, columns: tuple[str, ...]) -> dict[str, list[str]]:
    try:
        with open(path, newline="") as f:
            r = csv.DictReader(f)
            missing = [c for c in columns if c not in (r.fieldnames or ())]
            if missing:
                raise ProfileError(f"{path}: missing columns {missing}")
            rows = list(r)
    except OSError as e:
        raise ProfileError(f"{path}: {e.strerror or e}") from None
    if not rows:
        raise ProfileError(f"{path}: no rows")
    return {c: [row[c] for row in rows] for c in columns}


def _floats(path: Path, col: dict[str, list[str]], name: str) -> np.ndarray:
    try:
        a = np.array([float(x) for x in col[name]], dtype=float)
    except ValueError as e:
        raise ProfileError(f"{path}: column {name}: {e}") from None
    if not np.isfinite(a).all():
        raise ProfileError(f"{path}: column {name} has non-finite values")
    return a


class StepProfile:
    """Measured step times of one application on one GPU type: ``placements`` (one
    row per placement and per-GPU batch) and, where measured, ``scalability`` (more
    node and GPU counts). ``max_local_bsz`` caps the per-GPU batch (GPU memory)."""

    def __init__(self, placements: Path, scalability: Path | None = None, *, gpu_type: str = "",
                 max_local_bsz: int | None = None) -> None:
        self.gpu_type = gpu_type
        p = Path(placements)
        c = _read(p, ("placement", "local_bsz", "step_time", "sync_time"))
        bsz, step, sync = (_floats(p, c, k) for k in ("local_bsz", "step_time", "sync_time"))
        by_place: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
        for s, b, t, y in zip(c["placement"], bsz, step, sync):
            if not s.isdigit():
                raise ProfileError(f"{p}: placement {s!r} is not a digit string")
            by_place.setdefault(tuple(int(ch) for ch in s if ch != "0"), []).append((b, t, y))
        #: measured placement (GPUs per node) -> (per-GPU batch, step time, sync time) sorted by batch
        self._placements = {k: tuple(np.array(x) for x in zip(*sorted(v))) for k, v in by_place.items()}
        # (nodes, replicas) -> the same, from both files (means where a pair repeats)
        grid: dict[tuple[int, int], dict[float, list[tuple[float, float]]]] = {}
        for k, (b, t, y) in self._placements.items():
            g = grid.setdefault((len(k), sum(k)), {})
            for bi, ti, yi in zip(b, t, y):
                g.setdefault(float(bi), []).append((ti, yi))
        if scalability is not None and Path(scalability).exists():
            s = Path(scalability)
            c2 = _read(s, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
            n2, r2, b2, t2, y2 = (_floats(s, c2, k) for k in ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
            for n, r, b, t, y in zip(n2, r2, b2, t2, y2):
                grid.setdefault((int(n), int(r)), {}).setdefault(float(b), []).append((t, y))
        self._grid = {
            k: (np.array(sorted(v)), np.array([np.mean([a for a, _ in v[b]]) for b in sorted(v)]),
                np.array([np.mean([y for _, y in v[b]]) for b in sorted(v)]))
            for k, v in grid.items()
        }
        self._grid_nodes = sorted({n for n, _ in self._grid})
        self._cache: dict[tuple, tuple[float, float]] = {}
        lo = int(min(int(b.min()) for b, _, _ in self._placements.values()))
        hi = int(max(int(b.max()) for b, _, _ in self._placements.values()))
        if max_local_bsz is not None:  # the GPU's memory cap wins over a larger measured floor
            hi = min(hi, max_local_bsz)
            lo = min(lo, hi)
        #: the per-GPU batch range on this type (smallest measured, largest that fits)
        self.local_range = (lo, hi)

    def measured(self, placement: tuple[int, ...]) -> tuple[int, ...] | None:
        """The measured placement equal to ``placement`` up to rotation and order, or None."""
        key = tuple(x for x in placement if x)
        if key in self._placements:
            return key
        for k in range(1, len(key)):
            rot = key[k:] + key[:k]
            if rot in self._placements:
                return rot
        srt = tuple(sorted(key))
        for cand in (srt, srt[::-1]):
            if cand in self._placements:
                return cand
        for cand in self._placements:
            if len(cand) == len(key) and sorted(cand) == list(srt):
                return cand
        return None

    def step_time(self, placement: tuple[int, ...], atomic_bsz: float) -> tuple[float, float]:
        """(step time, sync time) in seconds of ``placement`` (GPUs per node) at
        ``atomic_bsz`` samples per GPU: the measured row (linear in the batch), else
        linear over the measured node and GPU counts."""
        key = (tuple(placement), float(atomic_bsz))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        m = self.measured(placement)
        if m is not None:
            b, t, y = self._placements[m]
            out = (float(np.interp(atomic_bsz, b, t)), float(np.interp(atomic_bsz, b, y)))
        else:
            nodes = len([x for x in placement if x])
            out = self._interpolate(nodes, int(sum(placement)), float(atomic_bsz))
        self._cache[key] = out
        return out

    def _at(self, nodes: int, replicas: float, bsz: float) -> np.ndarray:
        """Step/sync at a measured node count, linear over the GPU counts measured there
        (clamped at the ends) and over the per-GPU batch."""
        reps = sorted(r for n, r in self._grid if n == nodes)
        def one(r: int) -> np.ndarray:
            b, t, y = self._grid[(nodes, r)]
            return np.array([np.interp(bsz, b, t), np.interp(bsz, b, y)])
        if replicas <= reps[0]:
            return one(reps[0])
        if replicas >= reps[-1]:
            return one(reps[-1])
        hi = next(r for r in reps if r >= replicas)
        lo = max(r for r in reps if r <= replicas)
        if hi == lo:
            return one(lo)
        w = (replicas - lo) / (hi - lo)
        return (1 - w) * one(lo) + w * one(hi)

    def _interpolate(self, nodes: int, replicas: int, bsz: float) -> tuple[float, float]:
        ns = self._grid_nodes
        nodes = min(max(nodes, ns[0]), ns[-1])
        if nodes in ns:
            v = self._at(nodes, replicas, bsz)
        else:
            hi = next(n for n in ns if n >= nodes)
            lo = max(n for n in ns if n <= nodes)
            w = (nodes - lo) / (hi - lo)
            v = (1 - w) * self._at(lo, replicas, bsz) + w * self._at(hi, replicas, bsz)
        return float(v[0]), float(v[1])


class Application:
    """One application's measured profile (see the module docstring): its convergence
    (the same on every GPU type) and its step times on each GPU type of ``gpu_types``.

    ``gpu_types`` None: the Pollux layout, ``placements.csv`` and ``scalability.csv``,
    as type :data:`DEFAULT_GPU_TYPE`; else ``placements-<type>.csv`` and
    ``scalability-<type>.csv`` per type (the Sia layout). ``max_local_bsz``: per-GPU
    batch cap by type. The first type is the default of the type-less methods."""

    def __init__(self, folder: Path, *, max_local_bsz: Mapping[str, int] | int | None = None,
                 gpu_types: tuple[str, ...] | None = None) -> None:
        folder = Path(folder)
        self.name = folder.name
        caps = max_local_bsz if isinstance(max_local_bsz, Mapping) else None
        # ---- throughput, per GPU type
        self.profiles: dict[str, StepProfile] = {}
        if gpu_types is None:
            cap = max_local_bsz if isinstance(max_local_bsz, int) else (caps or {}).get(DEFAULT_GPU_TYPE)
            self.profiles[DEFAULT_GPU_TYPE] = StepProfile(folder / "placements.csv", folder / "scalability.csv",
                                                          gpu_type=DEFAULT_GPU_TYPE, max_local_bsz=cap)
        else:
            if not gpu_types:
                raise ProfileError(f"{folder}: no GPU types asked")
            for t in gpu_types:
                cap = max_local_bsz if isinstance(max_local_bsz, int) else (caps or {}).get(t)
                self.profiles[t] = StepProfile(folder / f"placements-{t}.csv", folder / f"scalability-{t}.csv",
                                               gpu_type=t, max_local_bsz=cap)
        #: the GPU types it has step times for, the default first
        self.gpu_types = tuple(self.profiles)
        # ---- convergence
        runs: dict[int, dict[str, np.ndarray]] = {}
        for v in folder.glob("validation-*.csv"):
            try:
                b = int(v.stem.split("-", 1)[1])
            except ValueError:
                raise ProfileError(f"{v}: file name must be validation-<batch size>.csv") from None
            cv = _read(v, ("progress", "iteration", "metric", "grad_sqr", "grad_var"))
            runs[b] = {k: _floats(v, cv, k) for k in ("progress", "iteration", "metric", "grad_sqr", "grad_var")}
        if not runs:
            raise ProfileError(f"{folder}: no validation-<batch size>.csv")
        self._runs = dict(sorted(runs.items()))
        self._bsizes = np.array(list(self._runs), dtype=float)
        #: epochs of the schedule: the shortest measured run
        self.max_epochs = min(len(r["progress"]) for r in self._runs.values())
        prog = np.array([r["progress"][: self.max_epochs] for r in self._runs.values()])
        #: progress at the end of each epoch e = 1..max_epochs (smallest over the runs)
        self.epoch_progress = prog.min(axis=0)
        first = next(iter(self._runs.values()))["metric"]
        #: the metric improves upwards (accuracy, F1) or downwards (WER, loss)
        self.higher_is_better = bool(first[0] < first[-1])
        self._bounds = {t: BatchBounds(int(min(self._runs)), int(max(self._runs)), *p.local_range)
                        for t, p in self.profiles.items()}

    # ------------------------------------------------------------------ throughput
    @property
    def bounds(self) -> BatchBounds:
        """Its batch limits on its default GPU type (:meth:`bounds_on`)."""
        return self._bounds[self.gpu_types[0]]

    def bounds_on(self, gpu_type: str | None = None) -> BatchBounds:
        """Its batch limits on ``gpu_type`` (None: the default type): the global batch
        sizes of the measured runs, the per-GPU batch range measured on that type."""
        return self._bounds[self._type(gpu_type)]

    def _type(self, gpu_type: str | None) -> str:
        if gpu_type is None:
            return self.gpu_types[0]
        if gpu_type not in self.profiles:
            raise ProfileError(f"{self.name}: no step times on GPU type {gpu_type!r} (measured: {', '.join(self.gpu_types)})")
        return gpu_type

    def profile(self, gpu_type: str | None = None) -> StepProfile:
        """Its step times on ``gpu_type`` (None: the default type)."""
        return self.profiles[self._type(gpu_type)]

    @property
    def target_progress(self) -> float:
        """Progress at which a job completes: the end of the measured schedule."""
        return float(self.epoch_progress[-1])

    def measured(self, placement: tuple[int, ...], gpu_type: str | None = None) -> tuple[int, ...] | None:
        """The measured placement equal to ``placement`` up to rotation and order on
        ``gpu_type``, or None."""
        return self.profile(gpu_type).measured(placement)

    def step_time(self, placement: tuple[int, ...], atomic_bsz: float, gpu_type: str | None = None) -> tuple[float, float]:
        """(step time, sync time) in seconds of ``placement`` (GPUs per node) at
        ``atomic_bsz`` samples per GPU on ``gpu_type`` (:meth:`StepProfile.step_time`)."""
        return self.profile(gpu_type).step_time(placement, atomic_bsz)

    def update_time(self, placement: tuple[int, ...], atomic_bsz: float, accum_steps: int,
                    gpu_type: str | None = None) -> tuple[float, float, float]:
        """(seconds per update, step time, sync time) with ``accum_steps`` accumulation
        steps on ``gpu_type``."""
        step, sync = self.step_time(placement, atomic_bsz, gpu_type)
        return step + accum_steps * (step - sync), step, sync

    # ------------------------------------------------------------------ convergence
    def _bracket(self, batch_size: float) -> tuple[int, int, float]:
        bs = self._bsizes
        b = min(max(float(batch_size), bs[0]), bs[-1])
        hi = int(np.searchsorted(bs, b, side="left"))
        if bs[hi] == b:
            return hi, hi, 0.0
        lo = hi - 1
        return lo, hi, (b - bs[lo]) / (bs[hi] - bs[lo])

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during epoch ``epoch`` (0-based) of a run at ``batch_size``."""
        e = min(max(int(epoch), 0), self.max_epochs - 1)
        lo, hi, w = self._bracket(batch_size)
        runs = list(self._runs.values())
        sq = (1 - w) * runs[lo]["grad_sqr"][e] + w * runs[hi]["grad_sqr"][e]
        va = (1 - w) * runs[lo]["grad_var"][e] + w * runs[hi]["grad_var"][e]
        return float(sq), float(va)

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress (steps at the initial batch size) one update at ``batch_size`` makes."""
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.bounds.init_batch
        return (var + sqr) / (var / scale + sqr)

    def metric(self, batch_size: float, epochs: int) -> float:
        """Best validation metric within the first ``epochs`` epochs of a run at
        ``batch_size`` (nan before the first)."""
        if epochs <= 0:
            return math.nan
        e = min(epochs, self.max_epochs)
        lo, hi, w = self._bracket(batch_size)
        runs = list(self._runs.values())
        pick = np.max if self.higher_is_better else np.min
        return float((1 - w) * pick(runs[lo]["metric"][:e]) + w * pick(runs[hi]["metric"][:e]))

    def metric_at(self, batch_size: float, epoch: int) -> float:
        """The validation metric reported after epoch ``epoch`` (1-based) of a run at
        ``batch_size`` (interpolated between the measured batch sizes around it)."""
        e = min(max(int(epoch), 1), self.max_epochs) - 1
        lo, hi, w = self._bracket(batch_size)
        runs = list(self._runs.values())
        return float((1 - w) * runs[lo]["metric"][e] + w * runs[hi]["metric"][e])

    def epoch_of(self, progress: float) -> int:
        """Epochs completed at ``progress``."""
        return int(np.searchsorted(self.epoch_progress, progress, side="right"))


def load_applications(root: str | Path, names: tuple[str, ...] | None = None,
                      gpu_types: tuple[str, ...] | None = None) -> dict[str, Application]:
    """The applications under ``root``, by name: ``<data>/pollux-osdi21/traces`` (one
    GPU type, ``gpu_types`` None) or ``<data>/sia-sosp23/traces`` with the step times
    of each of ``gpu_types`` (:class:`Application`)."""
    root = Path(root)
    if not root.is_dir():
        raise ProfileError(f"{root}: no such folder (measured profiles)")
    first = "placements.csv" if gpu_types is None else f"placements-{gpu_types[0]}.csv" if gpu_types else ""
    names = names or tuple(sorted(p.name for p in root.iterdir() if first and (p / first).exists()
                                  and p.name not in UNMODELLED))
    if not names:
        raise ProfileError(f"{root}: no application folders with {first or 'step times'}")
    out = {}
    for n in names:
        if n in UNMODELLED:
            raise ProfileError(f"{root / n}: {n} is {UNMODELLED[n]}, not modelled by this engine")
        if not (root / n).is_dir():
            raise ProfileError(f"{root / n}: no such application profile")
        out[n] = Application(root / n, max_local_bsz=MAX_LOCAL_BSZ.get(n), gpu_types=gpu_types)
    return out


def load_seed_profile(path: str | Path, gpu_types: tuple[str, ...] | None = None) -> tuple[ProfileSample, ...]:
    """The one-GPU seed profile of an application (``<data>/sia-sosp23/seed/<app>.csv``,
    read by header name) as profile samples on the step-time files' GPU types
    (:data:`SEED_TYPES`), only ``gpu_types`` where given: what a job that names this
    model declares before it runs (Sia's bootstrap)."""
    path = Path(path)
    c = _read(path, ("gpu_type", "local_bsz", "placement", "step_time", "sync_time"))
    bsz, step, sync = (_floats(path, c, k) for k in ("local_bsz", "step_time", "sync_time"))
    out = []
    for name, place, b, t, y in zip(c["gpu_type"], c["placement"], bsz, step, sync):
        gpu_type = SEED_TYPES.get(name.strip())
        if gpu_type is None:
            raise ProfileError(f"{path}: unknown seed GPU {name!r} (known: {', '.join(SEED_TYPES)})")
        if place.strip() != "1":
            raise ProfileError(f"{path}: seed placement {place!r} is not one GPU")
        if gpu_types is None or gpu_type in gpu_types:
            out.append(ProfileSample(1, 1, int(b), float(t), float(y), gpu_type=gpu_type))
    return tuple(out)
