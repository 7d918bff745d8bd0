"""What every trace source shares: the :class:`Trace` it returns, :class:`TraceError`,
the data folder, number parsing, the bad-row policy and the rack grouping of traces
that carry no network topology."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from rlsched.core import Bandwidth, NodeSpec, Topology

from ..job import JobSpec

ENV_DATA_DIR = "RLSCHED_DATA_DIR"
#: nodes per rack when a trace gives no rack (the Alibaba/PAI node lists): an
#: assumption, documented, since those traces carry no network topology
NODES_PER_RACK = 16


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


def need_dir(ddir: Path | None, sub: str) -> Path:
    """``<data folder>/<sub>``, which must exist."""
    if ddir is None:
        raise TraceError(f"no data folder: pass --data-dir or set {ENV_DATA_DIR} (looking for {sub}/)")
    p = ddir / sub
    if not p.is_dir():
        raise TraceError(f"{p}: no such folder (data folder {ddir})")
    return p


def resolve(arg: str, ddir: Path | None) -> Path:
    """The file or folder ``arg`` of a spec: as given, else under the data folder."""
    if not arg:
        raise TraceError("trace spec needs a path after ':'")
    p = Path(arg)
    if not p.is_absolute() and not p.exists() and ddir is not None:
        p = ddir / arg
    if not p.exists():
        raise TraceError(f"{p}: no such file or folder")
    return p


def bad_row(trace: Trace, path: Path, line: int, exc: Exception, skip_bad: bool) -> None:
    """The bad-row policy: raise :class:`TraceError` naming file and line, or with
    ``skip_bad`` count the row in ``trace.skipped["malformed"]``."""
    if not skip_bad:
        why = f"missing column {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise TraceError(f"{path}:{line}: {why}") from exc
    trace.skip("malformed")


class Rows:
    """Iterate CSV rows with line numbers; bad rows raise or are counted (:func:`bad_row`)."""

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
                    bad_row(self.trace, self.path, line, exc, self.skip_bad)


def parse_int(s: str | None, what: str) -> int:
    """A whole number (``"8"``, ``"8.0"``); ValueError naming ``what`` otherwise."""
    v = parse_float(s, what)
    if v != int(v):
        raise ValueError(f"{what} is not an integer: {s!r}")
    return int(v)


def parse_float(s: str | None, what: str) -> float:
    """A finite number; ValueError naming ``what`` otherwise."""
    if s is None or s == "":
        raise ValueError(f"missing {what}")
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{what} is not a number: {s!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{what} is not finite: {s!r}")
    return v


def racked(nodes: list[dict]) -> list[NodeSpec]:
    """NodeSpecs in file order, NODES_PER_RACK to a rack (the traces give no racks)."""
    return [
        NodeSpec(rack=f"rack-{k // NODES_PER_RACK}", block="block-0", nvlink_domain_size=n["gpus"], **n)
        for k, n in enumerate(nodes)
    ]


def shift_to_zero(trace: Trace) -> None:
    """Shift submit times so the first is 0."""
    if trace.jobs:
        t0 = min(j.submit_time for j in trace.jobs)
        if t0 != 0:
            trace.jobs = [j.with_(submit_time=j.submit_time - t0) for j in trace.jobs]


#: default log-normal shape (σ of the log) of simulated users' estimate errors
ESTIMATE_ERROR = 0.5


def with_estimates(jobs: list[JobSpec], fraction: float, sigma: float, rng: np.random.Generator) -> list[JobSpec]:
    """Simulated users' run-time estimates: each job without one gets, with probability
    ``fraction``, an ``estimate_factor`` ``exp(sigma · N(0, 1))`` (log-normal, median 1:
    as often over as under, ``sigma`` the spread of the log), which the engine applies
    to the job's true ideal run time (:meth:`JobSpec.user_estimate`). Two draws per job
    whatever ``fraction``, so the same seed gives the same factors at any fraction."""
    if not 0 <= fraction <= 1 or not sigma >= 0:
        raise TraceError(f"estimates must be in [0, 1] and estimate_error >= 0, got {fraction}, {sigma}")
    has = rng.random(len(jobs)) < fraction
    err = np.exp(sigma * rng.standard_normal(len(jobs)))
    return [
        j.with_(estimate_factor=float(e)) if h and not j.has_estimate else j
        for j, h, e in zip(jobs, has.tolist(), err.tolist())
    ]


def default_topology(jobs: list[JobSpec]) -> Topology:
    """A cluster for traces that carry none: 64 nodes × 8 GPUs in 8 racks, grown so
    the largest job fits."""
    need = max((j.workers * j.gpus_per_worker for j in jobs), default=8)
    nodes = max(64, math.ceil(need / 8))
    return Topology.uniform(nodes, 8, racks=8, bandwidth=Bandwidth())
