"""``rlsched demo up|down``: the live system on this machine.

``up`` starts the local control plane (:class:`rlsched_dev.cluster.LocalCluster`:
etcd, kube-apiserver, kube-controller-manager, the default and the ``rlsched``
kube-scheduler, kwok) with kwok GPU nodes, then the extender, the operator and the
fake trainer (:mod:`rlsched_dev.fake_trainer`) as processes, and a real Prometheus
(``prometheus`` on ``PATH``, e.g. Debian's package) scraping the extender and the
operator with the alert rules of the Helm chart (``--chart``, default
``deploy/helm/rlsched`` under the current directory) loaded. It submits a mix of
TrainingJobs drawn from a trace (Alibaba GPU 2023 when
``RLSCHED_DATA_DIR`` holds it, the synthetic generator otherwise), shows a live view
(jobs, queues, workers, accuracy, scaling, preemptions), and at the end prints a
summary table (the operator's counters as Prometheus has them) and writes
``summary.json`` and plots into ``--out``. Everything it started is stopped on exit;
``down`` cleans up after a run that was killed or started with ``--keep``.

What the run shows (docs/quickstart.md, "The live demo"): the jobs are submitted over
the first ``submit_fraction`` (20 %) of the run, enough work to fill the 32 GPUs at
their gang sizes, so jobs queue; the operator's default policies grow jobs into
spare GPUs, take a worker back from each job whose accuracy has converged (RLPTO's
β rule) and give it to the waiting jobs, and stop converged jobs. One job is of the
``highest`` class (the demo's team queue allows the class, as an admin grants it): the
demo submits it once the cluster cannot start its gang (fewer GPUs free or being
released than it needs; under a goodput allocator, which first shrinks jobs that grew: once the
running jobs' gangs leave no room for it, or as the last jobs arrive, its gang raised
until it does), so it preempts lower-class jobs, which wait in the interrupt queue and
resume first. The summary names every job that did not finish with its waiting reason.

The pure parts (:func:`plan_jobs`, :func:`prometheus_config`, :func:`summarize`,
:func:`gpu_usage`, :func:`render_view`) are unit-tested; the rest is orchestration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import yaml

from rlsched.core.contract import (ANNOTATION_TRACE_JOB, API_VERSION, GROUP, KIND, PLURAL, QUEUE_KIND, QUEUE_PLURAL,
                                     VERSION, pod_gpus)

from rlsched.core.served import SERVED
from rlsched.core.live_allocation import parse_allocator_options

from .nodes import default_topology
from .probe import http_ok
from .proc import ClusterError, Process, free_ports, port_free, started_in, stop_process_group, wait_for
from .tools import find_program, find_tools

__all__ = [
    "DemoJob",
    "DemoOptions",
    "Sample",
    "default_trace",
    "find_chart",
    "plan_jobs",
    "prometheus_config",
    "shipped_rules",
    "gpu_usage",
    "cluster_free",
    "held_gangs",
    "preemptor_due",
    "sized_preemptor",
    "team_queue",
    "summarize",
    "render_view",
    "write_plots",
    "register",
]

NAMESPACE = "rlsched-demo"
STATE_FILE = "demo.json"
TERMINAL = ("Succeeded", "Failed")
DEFAULT_CHART = Path("deploy/helm/rlsched")  # the chart of a source tree, from its root
RELAY = Path("files/metrics-relay.py")  # inside the chart
POLICY = Path("files/policies/trainer-status.yaml")  # inside the chart
PROMETHEUS_HINT = "install it (Debian's package: `make prometheus`, i.e. apt-get install prometheus) or pass --prometheus"
TRAINER_IMAGE = "registry.invalid/rlsched/fake-trainer:demo"  # never pulled: kwok runs no containers


# --------------------------------------------------------------------------- options
@dataclass(frozen=True)
class DemoOptions:
    """What ``rlsched demo up`` runs (all times in wall seconds)."""

    duration_s: float = 180.0
    jobs: int = 30
    trace: str | None = None
    data_dir: str | None = None
    seed: int = 1
    out: Path = Path("out/demo")
    state_dir: Path = Path(".run/demo")
    epoch_s: float = 1.0
    cycle_s: float = 2.0
    scrape_interval_s: float = 2.0
    #: jobs are submitted over this fraction of ``duration_s``: 30 trace jobs of about
    #: one GPU for 25-30 epochs of 1 s in 36 s offer the 32 GPUs about their capacity
    #: at gang size, so jobs queue (0.4 offered half of it: nothing ever waited)
    submit_fraction: float = 0.2
    #: the highest-class job waits at most this long after its time for a busy cluster
    #: (and never past half the run, so that it runs in a short demo too)
    full_wait_s: float = 60.0
    keep: bool = False
    namespace: str = NAMESPACE
    extender_model: str | None = None
    chart: Path = DEFAULT_CHART
    prometheus: str | None = None  # the executable; default: prometheus on PATH
    #: the operator's ``--allocator`` (default: the served policy, core/served.py; a
    #: heuristic as ``ordering/placement[/scaling]``). A goodput allocator's restart delay
    #: is the demo's: one epoch (``epoch_s``), as a demo job lives about 30 epochs of
    #: ``epoch_s`` (a real restart costs ~30 s of a job whose epochs take minutes), unless
    #: the name gives one (``goodput@restart_delay=...``); its other options are kept
    allocator: str = SERVED.allocator

    @property
    def heuristic(self) -> bool:
        """Whether :attr:`allocator` is a heuristic (``ordering/placement[/scaling]``): it
        admits gangs as they fit, where a goodput allocator shrinks grown jobs first."""
        return "/" in self.allocator.split("@")[0]

    def live_allocator(self) -> str:
        """The operator's ``--allocator`` for this demo (see :attr:`allocator`)."""
        a = self.allocator
        if self.heuristic or "restart_delay" in parse_allocator_options(a)[1]:
            return a
        return f"{a}{',' if '@' in a else '@'}restart_delay={self.epoch_s:g}"

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.jobs < 1:
            raise ValueError("duration must be > 0 and jobs >= 1")
        if not 0.0 < self.submit_fraction <= 1.0:
            raise ValueError("submit_fraction must lie in (0, 1]")
        if self.epoch_s <= 0 or self.cycle_s <= 0 or self.scrape_interval_s <= 0:
            raise ValueError("epoch, cycle and scrape intervals must be > 0")
        if self.full_wait_s < 0:
            raise ValueError("full_wait_s must be >= 0")


@dataclass(frozen=True)
class DemoJob:
    """One TrainingJob to submit ``at_s`` seconds after the demo starts; with
    ``when_full`` not before the cluster cannot start its gang (:func:`cluster_free`
    below :attr:`gang_gpus`), or at most ``DemoOptions.full_wait_s`` later."""

    name: str
    at_s: float
    manifest: dict
    when_full: bool = False

    @property
    def gang_gpus(self) -> int:
        s = self.manifest["spec"]
        return int(s["minWorkers"]) * int(s["gpusPerWorker"])


@dataclass(frozen=True)
class Sample:
    """One observation of the cluster by the live view."""

    t: float
    gpus_used: int
    gpus_total: int
    workers: int
    running: int
    queued: int
    done: int


def default_trace(data_dir: str | None) -> str:
    """``alibaba2023:default`` when ``data_dir`` holds the Alibaba 2023 trace, else the
    small synthetic trace."""
    if data_dir and (Path(data_dir) / "alibaba-gpu-2023").is_dir():
        return "alibaba2023:default"
    return "synthetic:small"


def find_chart(chart: str | os.PathLike = DEFAULT_CHART) -> Path:
    """The Helm chart directory whose alert rules and metrics relay the demo uses
    (relative paths from the current directory); :class:`ClusterError` when it holds no
    chart."""
    path = Path(chart).resolve()
    if not (path / "Chart.yaml").is_file():
        raise ClusterError(f"no Helm chart at {path}: run from the repository root or pass --chart DIR "
                           f"(the rlsched chart, {DEFAULT_CHART} in a source tree)")
    return path


# --------------------------------------------------------------------------- job plan
_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_name(prefix: str, index: int, job_id: str) -> str:
    tail = _DNS.sub("-", str(job_id).lower()).strip("-")[:24].strip("-")
    return f"{prefix}-{index:03d}" + (f"-{tail}" if tail else "")


def plan_jobs(
    specs: Sequence[Any],
    n: int,
    rng: np.random.Generator,
    *,
    node_gpus: int,
    cluster_gpus: int,
    window_s: float,
    namespace: str = NAMESPACE,
    max_epochs: int = 40,
    p_urgent: float = 0.2,
    p_highest: float = 0.0,
    preemptor_at: float | None = 0.3,
    preemptor_gpus: int = 2,
    max_worker_gpus: int | None = None,
) -> list[DemoJob]:
    """Draw ``n`` jobs from a trace's :class:`rlsched.sim.JobSpec` list and turn them
    into TrainingJob manifests submitted over ``window_s`` seconds.

    Jobs that cannot fit (a worker wider than a node, a gang above half the cluster)
    are left out, and so are workers wider than ``max_worker_gpus`` (default half a
    node): in the small demo cluster a whole-node worker waits for one node to drain
    completely while the placement spreads one-GPU workers over all nodes, and in
    strict queue order (no backfill, the default) every job behind it waits too
    (measured: 16 jobs queued behind one 8-GPU worker with 22 of 32 GPUs idle). Submit times keep the trace's order and relative spacing, rescaled
    into the window. Every job is made elastic (``maxWorkers`` up to twice its gang,
    within the cluster) so that RLPTO scaling has room to act; jobs whose trace queue
    is ``normal`` become ``urgent`` with probability ``p_urgent`` and ``highest``
    (preempting) with ``p_highest``.

    ``preemptor_at`` (a fraction of the submission order, None: none) makes one job
    the demo's preemptor: the first job from that position on whose gang takes at
    most half a node becomes ``highest`` with ``when_full`` set, its gang raised to
    at least ``preemptor_gpus`` GPUs. A highest-class job preempts only when it cannot
    start on the GPUs free or being released; in a cluster whose elastic jobs keep
    giving workers back one GPU is nearly always on its way, so a one-GPU preemptor
    would just wait for it (the demo then showed 0 preemptions).
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if window_s < 0 or node_gpus < 1 or cluster_gpus < node_gpus:
        raise ValueError("need window_s >= 0 and 1 <= node_gpus <= cluster_gpus")
    if preemptor_at is not None and not 0.0 <= preemptor_at <= 1.0:
        raise ValueError("preemptor_at must lie in [0, 1]")
    widest = max(1, node_gpus // 2) if max_worker_gpus is None else min(int(max_worker_gpus), node_gpus)
    fits = [
        s for s in specs
        if s.gpus_per_worker <= widest and s.min_workers * s.gpus_per_worker <= cluster_gpus // 2
    ]
    if not fits:
        raise ValueError(f"no job of the trace fits a cluster of {cluster_gpus} GPUs ({node_gpus} per node)")
    take = np.sort(rng.choice(len(fits), size=min(n, len(fits)), replace=False))
    chosen = sorted((fits[int(i)] for i in take), key=lambda s: (s.submit_time, s.id))
    t = np.array([s.submit_time for s in chosen], dtype=float)
    span = float(t[-1] - t[0])
    at = (t - t[0]) / span * window_s if span > 0 else np.linspace(0.0, window_s, len(chosen))
    classes = rng.choice(["normal", "urgent", "highest"], size=len(chosen),
                         p=[1.0 - p_urgent - p_highest, p_urgent, p_highest])
    preemptor = None
    if preemptor_at is not None:
        first = int(round(preemptor_at * (len(chosen) - 1)))
        small = [i for i in range(first, len(chosen))
                 if chosen[i].min_workers * chosen[i].gpus_per_worker <= max(1, node_gpus // 2)]
        preemptor = small[0] if small else None
        if preemptor is not None:
            classes[preemptor] = "highest"
    if preemptor_gpus < 1:
        raise ValueError("preemptor_gpus must be >= 1")
    out = []
    for i, (spec, when, cls) in enumerate(zip(chosen, at, classes)):
        gpw = int(spec.gpus_per_worker)
        lo = int(spec.min_workers)
        if i == preemptor:
            lo = max(lo, -(-preemptor_gpus // gpw))
        cap = max(lo, (cluster_gpus // 2) // gpw)
        hi = int(min(max(int(spec.max_workers), 2 * lo), cap))
        queue = spec.queue if spec.queue in ("urgent", "highest") else str(cls)
        name = _dns_name("tj", i, spec.id)
        beta = float(min(max(spec.beta, 1e-6), 0.5))
        manifest = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "rlsched-demo"},
                "annotations": {ANNOTATION_TRACE_JOB: str(spec.id)},
            },
            "spec": {
                "minWorkers": lo,
                "maxWorkers": hi,
                "gpusPerWorker": gpw,
                "priority": {"class": queue, "value": float(np.clip(spec.priority, -1000, 1000))},
                "beta": beta,
                "maxEpochs": int(min(spec.max_epochs, max_epochs)),
                "dataSize": int(spec.samples_per_epoch),
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/part-of": "rlsched-demo"}},
                    "spec": {
                        "containers": [{"name": "trainer", "image": TRAINER_IMAGE,
                                        "args": ["train", "--job", name]}],
                    },
                },
            },
        }
        out.append(DemoJob(name, float(when), manifest, when_full=i == preemptor))
    return out


# --------------------------------------------------------------------------- prometheus
def prometheus_config(
    targets: Mapping[str, str],
    *,
    scrape_interval_s: float = 2.0,
    rule_files: Iterable[str] = (),
) -> dict:
    """A Prometheus configuration scraping ``targets`` (job name -> host:port).

    Job names are the ones the chart's alerts and dashboard select on
    (``rlsched-extender``, ``rlsched-operator``).
    """
    if not targets:
        raise ValueError("no scrape targets")
    for job, addr in targets.items():
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target of {job!r} must be host:port, got {addr!r}")
    interval = f"{scrape_interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": f"{min(scrape_interval_s, 10.0):g}s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": [addr]}]}
            for job, addr in sorted(targets.items())
        ],
    }


def shipped_rules(helm: str | os.PathLike, chart: str | os.PathLike = DEFAULT_CHART,
                  values: Mapping[str, Any] | None = None) -> dict:
    """The Prometheus rule groups the chart ships (its PrometheusRule's spec), rendered
    by ``helm template`` with ``values`` (``--set`` pairs); ``chart`` as for
    :func:`find_chart`."""
    argv = [str(helm), "template", "rlsched", str(find_chart(chart)), "--namespace", "rlsched-system",
            "--set", "metrics.prometheusRule.enabled=true",
            "--show-only", "templates/prometheusrule.yaml"]
    for k, v in (values or {}).items():
        argv += ["--set", f"{k}={v}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed: {out.stderr.strip()}")
    doc = yaml.safe_load(out.stdout)
    if not isinstance(doc, dict) or "groups" not in (doc.get("spec") or {}):
        raise RuntimeError("helm template gave no PrometheusRule with spec.groups")
    return {"groups": doc["spec"]["groups"]}


def prom_query(base: str, query: str, timeout: float = 5.0) -> list[dict]:
    """Instant query against Prometheus ``base`` URL; the result vector."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"query {query!r} failed: {body.get('error')}")
    return body["data"]["result"]


def _scalar(base: str, query: str) -> float | None:
    try:
        res = prom_query(base, query)
    except (OSError, RuntimeError, ValueError):
        return None
    vals = [float(r["value"][1]) for r in res]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) if vals else None


# Headline figures shown live and in the summary; all from the demo's Prometheus.
HEADLINE_QUERIES = {
    "extender_requests": "sum(rlsched_extender_request_duration_seconds_count)",
    "extender_p99_ms": "1000 * histogram_quantile(0.99, sum by (le) "
                       "(rate(rlsched_extender_request_duration_seconds_bucket[1m])))",
    "extender_errors": "sum(rlsched_extender_errors_total) or vector(0)",
    "scaling_up": 'sum(rlsched_operator_scaling_decisions_total{direction="up"}) or vector(0)',
    "scaling_down": 'sum(rlsched_operator_scaling_decisions_total{direction="down"}) or vector(0)',
    "preemptions": "sum(rlsched_operator_preemptions_total) or vector(0)",
    "resumes": "sum(rlsched_operator_resumes_total) or vector(0)",
    "converged": 'sum(rlsched_operator_completions_total{reason="Converged"}) or vector(0)',
    "max_epochs": 'sum(rlsched_operator_completions_total{reason="MaxEpochs"}) or vector(0)',
    "admission_wait_p90_s": "histogram_quantile(0.9, sum by (le) "
                            "(rate(rlsched_operator_admission_wait_seconds_bucket[10m])))",
}


# --------------------------------------------------------------------------- observation
def gpu_usage(pods: Iterable[Mapping]) -> tuple[int, int]:
    """(GPUs held, worker pods) by pods bound to a node and not finished."""
    gpus = workers = 0
    for p in pods:
        if not (p.get("spec") or {}).get("nodeName"):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            continue
        gpus += pod_gpus(p)
        workers += 1
    return gpus, workers


def cluster_free(pods: Iterable[Mapping], gpus_total: int) -> int:
    """GPUs free or being released: ``gpus_total`` minus the GPUs of live pods (bound
    or still pending, not finished, not being deleted)."""
    held = 0
    for p in pods:
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            continue
        held += pod_gpus(p)
    return max(0, gpus_total - held)


def _st(job: Mapping) -> Mapping:
    return job.get("status") or {}


def held_gangs(jobs: Iterable[Mapping]) -> int:
    """GPUs of the gangs (``minWorkers`` x ``gpusPerWorker``) of the Starting and Running jobs."""
    held = 0
    for j in jobs:
        if _st(j).get("phase") in ("Starting", "Running"):
            spec = j.get("spec") or {}
            held += int(spec.get("minWorkers", 1)) * int(spec.get("gpusPerWorker", 1))
    return held


def allocator_arg(text: str) -> str:
    """``--allocator``: a name core's live allocation builds, else a usage error naming
    the choices."""
    from rlsched.core.live_allocation import check_live_allocator

    try:
        return check_live_allocator(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def preemptor_due(jobs: Iterable[Mapping], free: int, gang: int, total: int, shrinks_first: bool) -> bool:
    """Whether the demo's preemptor (a gang of ``gang`` GPUs) can start only by taking
    GPUs from running jobs. A heuristic (``shrinks_first`` False) preempts when the gang
    does not fit the ``free`` GPUs (free or being released); a goodput allocator
    shrinks grown jobs first and stops a job only when the gangs of the jobs holding
    GPUs (:func:`held_gangs`) leave no room for it in the ``total`` GPUs."""
    if not shrinks_first:
        return free < gang
    return held_gangs(jobs) + gang > total


def sized_preemptor(job: DemoJob, jobs: Iterable[Mapping], total: int) -> DemoJob:
    """Under an allocator, the preemptor as submitted: its gang raised (whole workers, at
    most half the cluster) until it needs GPUs of the running jobs' gangs
    (:func:`held_gangs`), so that it stops one of them (a preemption the demo shows)
    rather than only shrinking jobs that grew."""
    s = job.manifest["spec"]
    g = int(s["gpusPerWorker"])
    need = -(-(total - held_gangs(jobs) + 1) // g)
    workers = max(int(s["minWorkers"]), min(need, max(1, (total // 2) // g)))
    if workers == int(s["minWorkers"]):
        return job
    spec = {**s, "minWorkers": workers, "maxWorkers": max(int(s["maxWorkers"]), workers)}
    return DemoJob(job.name, job.at_s, {**job.manifest, "spec": spec}, job.when_full)


def team_queue(namespace: str, gpus: int) -> dict:
    """The demo namespace's TrainingQueue: every GPU of the demo cluster guaranteed, and
    every service class allowed — the demo's preemptor is ``highest``, which a queue
    bars unless it names it (an admin grants it so)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": QUEUE_KIND, "metadata": {"name": namespace},
            "spec": {"nominalGpus": int(gpus), "namespaces": [namespace],
                     "priorityClasses": ["highest", "urgent", "normal"]}}


def summarize(jobs: Sequence[Mapping], planned: int | None = None) -> dict:
    """Per-job rows and aggregate figures from the final TrainingJob objects."""
    rows = []
    for j in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        st, spec = _st(j), j.get("spec") or {}
        prog = st.get("progress") or {}
        rows.append({
            "name": j["metadata"]["name"],
            "class": (spec.get("priority") or {}).get("class", "normal"),
            "phase": st.get("phase", "Pending"),
            "min_workers": spec.get("minWorkers"),
            "max_workers": spec.get("maxWorkers"),
            "workers": st.get("workers", 0),
            "gpus_per_worker": spec.get("gpusPerWorker", 1),
            "epoch": prog.get("epoch"),
            "accuracy": prog.get("accuracy"),
            "wait_s": st.get("admissionWaitSeconds"),
            "jct_s": st.get("jctSeconds"),
            "preemptions": st.get("preemptions", 0),
            "waiting": (st.get("waiting") or {}).get("reason") or (
                "" if st.get("phase") in TERMINAL + ("Running",) else "Unknown"),
            "waiting_message": (st.get("waiting") or {}).get("message") or "",
        })
    done = [r for r in rows if r["phase"] == "Succeeded" and r["jct_s"] is not None]
    jct = np.array([r["jct_s"] for r in done], dtype=float)
    waits = np.array([r["wait_s"] for r in rows if r["wait_s"] is not None], dtype=float)
    acc = np.array([r["accuracy"] for r in done if r["accuracy"] is not None], dtype=float)

    def stat(a: np.ndarray, f) -> float | None:
        return float(f(a)) if a.size else None

    phases: dict[str, int] = {}
    for r in rows:
        phases[r["phase"]] = phases.get(r["phase"], 0) + 1
    return {
        "jobs": rows,
        "planned": len(rows) if planned is None else planned,
        "submitted": len(rows),
        "phases": phases,
        "succeeded": len(done),
        "jct_mean_s": stat(jct, np.mean),
        "jct_p50_s": stat(jct, np.median),
        "jct_p95_s": stat(jct, lambda a: np.percentile(a, 95)),
        "wait_mean_s": stat(waits, np.mean),
        "accuracy_mean": stat(acc, np.mean),
        "preemptions": int(sum(r["preemptions"] or 0 for r in rows)),
        #: every job that did not finish, with why it waits (its ``status.waiting``)
        "unfinished": [{"name": r["name"], "class": r["class"], "phase": r["phase"], "reason": r["waiting"],
                        "message": r["waiting_message"]} for r in rows if r["phase"] not in TERMINAL],
    }


def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _gain(status: Mapping, spec: Mapping) -> str:
    """The operator's convergence gain (``status.rlpto.gain``, accuracy per epoch over
    the last evaluations), red once below the job's β (it gives workers back)."""
    g = (status.get("rlpto") or {}).get("gain")
    if not isinstance(g, (int, float)) or isinstance(g, bool):
        return "-"
    beta = spec.get("beta", 0.001)
    text = f"{g:.4f}"
    return f"[red]{text}[/red]" if isinstance(beta, (int, float)) and g < beta else text


def render_view(jobs: Sequence[Mapping], sample: Sample | None, headline: Mapping[str, float | None],
                *, elapsed_s: float, duration_s: float, prometheus_url: str = "", max_rows: int = 18):
    """The live view: cluster line, queues, and the most recent jobs (a rich renderable)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    queues = {"interrupt": 0, "urgent": 0, "normal": 0}
    for j in jobs:
        st = _st(j)
        if st.get("phase") in (None, "Queued") and st.get("queue") in queues:
            queues[st["queue"]] += 1
    s = sample
    util = f"{s.gpus_used}/{s.gpus_total} GPUs ({100.0 * s.gpus_used / max(1, s.gpus_total):.0f}%)" if s else "-"
    head = Table.grid(padding=(0, 3))
    head.add_row(
        f"[b]t[/b] {elapsed_s:5.0f}/{duration_s:.0f}s",
        f"[b]cluster[/b] {util}",
        f"[b]workers[/b] {s.workers if s else '-'}",
        f"[b]running[/b] {s.running if s else '-'}",
        f"[b]done[/b] {s.done if s else '-'}",
    )
    head.add_row(
        "[b]queues[/b] " + " ".join(f"{k}={v}" for k, v in queues.items()),
        f"[b]extender[/b] {_fmt(headline.get('extender_requests'), '.0f')} req, "
        f"p99 {_fmt(headline.get('extender_p99_ms'), '.2f')} ms",
        f"[b]scaling[/b] +{_fmt(headline.get('scaling_up'), '.0f')}/-{_fmt(headline.get('scaling_down'), '.0f')}",
        f"[b]preempted[/b] {_fmt(headline.get('preemptions'), '.0f')} "
        f"[b]resumed[/b] {_fmt(headline.get('resumes'), '.0f')}",
        f"[b]converged[/b] {_fmt(headline.get('converged'), '.0f')} "
        f"[b]max epochs[/b] {_fmt(headline.get('max_epochs'), '.0f')}",
    )
    if prometheus_url:
        head.add_row(f"[dim]{prometheus_url}[/dim]", "", "", "", "")
    table = Table(expand=True, pad_edge=False)
    for col, just in (("job", "left"), ("class", "left"), ("phase", "left"), ("queue", "left"),
                      ("workers", "right"), ("GPUs/w", "right"), ("epoch", "right"),
                      ("accuracy", "right"), ("gain", "right"), ("preempted", "right"), ("wait s", "right"),
                      ("JCT s", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    colour = {"Running": "green", "Starting": "cyan", "Queued": "yellow", "Succeeded": "blue", "Failed": "red"}

    def order(j: Mapping) -> tuple:
        ph = _st(j).get("phase")
        return (ph in TERMINAL, j["metadata"]["name"])

    shown = sorted(jobs, key=order)[:max_rows]
    for j in shown:
        st, spec = _st(j), j.get("spec") or {}
        prog = st.get("progress") or {}
        ph = st.get("phase", "Pending")
        table.add_row(
            j["metadata"]["name"], (spec.get("priority") or {}).get("class", "normal"),
            f"[{colour.get(ph, 'white')}]{ph}[/]", st.get("queue") or "-",
            f"{st.get('workers', 0)} [{spec.get('minWorkers')}..{spec.get('maxWorkers')}]",
            str(spec.get("gpusPerWorker", 1)), _fmt(prog.get("epoch")), _fmt(prog.get("accuracy"), ".3f"),
            _gain(st, spec), _fmt(st.get("preemptions") or None), _fmt(st.get("admissionWaitSeconds")),
            _fmt(st.get("jctSeconds")),
        )
    more = len(jobs) - len(shown)
    title = f"TrainingJobs ({len(jobs)} submitted" + (f", {more} not shown" if more > 0 else "") + ")"
    return Group(Panel(head, title="rlsched demo", border_style="blue"), Panel(table, title=title))


def write_plots(summary: Mapping, samples: Sequence[Sample], jobs: Sequence[Mapping], out: Path) -> list[Path]:
    """JCT distribution, cluster utilization over time and accuracy curves (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    jct = np.sort([r["jct_s"] for r in summary["jobs"] if r["phase"] == "Succeeded" and r["jct_s"] is not None])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if jct.size:
        ax1.hist(jct, bins=min(20, max(5, jct.size)), color="tab:blue", alpha=0.8)
        ax2.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post")
    else:
        ax1.text(0.5, 0.5, "no job completed", ha="center", transform=ax1.transAxes)
    ax1.set(xlabel="JCT (s)", ylabel="jobs", title="JCT distribution")
    ax2.set(xlabel="JCT (s)", ylabel="fraction of jobs", title="JCT CDF", ylim=(0, 1.02))
    fig.tight_layout()
    paths.append(out / "jct.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    if samples:
        t = np.array([s.t for s in samples])
        util = np.array([100.0 * s.gpus_used / max(1, s.gpus_total) for s in samples])
        ax.plot(t, util, label="GPU allocation (%)", color="tab:green")
        ax.set_ylim(0, 105)
        ax2 = ax.twinx()
        ax2.plot(t, [s.queued for s in samples], label="queued jobs", color="tab:orange")
        ax2.plot(t, [s.running for s in samples], label="running jobs", color="tab:purple")
        ax2.set_ylabel("jobs")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    ax.set(xlabel="time since first submission (s)", ylabel="GPUs allocated (%)", title="Cluster utilization")
    fig.tight_layout()
    paths.append(out / "utilization.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    for j in jobs:
        hist = ((_st(j).get("progress") or {}).get("history")) or []
        if hist:
            ax.plot(np.arange(1, len(hist) + 1), hist, lw=1, alpha=0.7)
    ax.set(xlabel="epoch", ylabel="accuracy", title="Accuracy per TrainingJob (fake trainer, convergence model)")
    fig.tight_layout()
    paths.append(out / "accuracy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# --------------------------------------------------------------------------- processes
def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlsched.cli", *args]


class Demo:
    """One run of the live demo (see the module docstring)."""

    def __init__(self, opts: DemoOptions, console=None) -> None:
        from rich.console import Console

        self.opts = opts
        self.console = console or Console()
        self.state_dir = opts.state_dir.resolve()
        self.children: list[Process] = []
        self.cluster = None  # the LocalCluster this demo started (None on an existing one)
        self.kubeconfig = ""
        self.topology = None
        self.extender_url = ""
        self.relay_url = ""
        self.operator_url = ""
        self.prom_url = ""
        self.samples: list[Sample] = []
        self.headline: dict[str, float | None] = {}
        #: the highest-class job: name, when it was submitted, whether the cluster was full
        self.preemptor: dict | None = None
        self.rng = np.random.default_rng(opts.seed)

    # ---- state for `demo down`
    def _write_state(self) -> None:
        state = {
            "pids": {c.name: c.popen.pid for c in self.children if c.popen is not None},
            "cluster_dir": str(self.state_dir / "cluster"),
            "prometheus_url": self.prom_url,
        }
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / STATE_FILE)

    def _spawn(self, name: str, argv: list[str]) -> Process:
        # detached: with --keep they outlive this process (then `demo down` stops them)
        child = Process(name, argv, self.state_dir / "logs" / f"{name}.log", detach=True)
        child.start(self.state_dir)
        self.children.append(child)
        self._write_state()
        return child

    # ---- lifecycle
    def start(self, env=None) -> None:
        """Start everything. ``env`` (a :class:`rlsched_dev.cluster.KubeEnv`: kubeconfig,
        topology, extender_port) runs the demo on an existing cluster with its GPU nodes
        instead of starting a :class:`~rlsched_dev.cluster.LocalCluster`."""
        from .cluster import LocalCluster
        from .nodes import create_gpu_nodes, wait_nodes_ready

        if (self.state_dir / STATE_FILE).exists():
            raise ClusterError(f"a demo is already running from {self.state_dir} "
                               "(stop it with `rlsched demo down`)")
        prometheus = find_program("prometheus", PROMETHEUS_HINT, self.opts.prometheus)
        chart = find_chart(self.opts.chart)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tools = find_tools()
        self._write_state()
        con = self.console
        with con.status("starting the local control plane") as status:
            if env is None:
                self.cluster = LocalCluster(self.state_dir / "cluster", keep_workdir=False,
                                            progress=lambda m: status.update(f"control plane: {m}"))
                self.cluster.start()
                kc = str(self.cluster.kubeconfig)
                topo = default_topology()
                status.update(f"creating {len(topo)} kwok GPU nodes")
                wait_nodes_ready(kc, create_gpu_nodes(kc, topo))
                port = self.cluster.extender_port
            else:
                kc, topo, port = str(env.kubeconfig), env.topology, env.extender_port
            self.kubeconfig, self.topology = kc, topo
            if port is None or not port_free(port):
                port = free_ports(1)[0]  # kube-scheduler cannot reach it then (ignorable: placement without it)
                con.print(f"[yellow]the cluster's extender port is not available here; extender on {port}[/yellow]")
            status.update("installing the TrainingJob CRD and the trainer-status policy")
            self._apply_crds(kc)
            self._apply_trainer_policy(kc, chart)

            status.update("starting the extender and its metrics relay")
            model = ["--model", self.opts.extender_model] if self.opts.extender_model else []
            ext = self._spawn("extender", _cli("extender", "serve", "--host", "127.0.0.1",
                                               "--port", str(port), "--kubeconfig", kc, *model))
            self.extender_url = f"http://127.0.0.1:{port}"
            wait_for(lambda: http_ok(f"{self.extender_url}/readyz"), 60, "extender /readyz", ext, every=0.3)
            # Prometheus scrapes the extender through the chart's relay, as in a cluster
            scrape_ext = f"127.0.0.1:{port}"
            if (chart / RELAY).is_file():
                relay_port = free_ports(1)[0]
                relay = self._spawn("metrics-relay", [sys.executable, str(chart / RELAY),
                                                      f"--listen=127.0.0.1:{relay_port}",
                                                      f"--upstream={self.extender_url}"])
                wait_for(lambda: http_ok(f"http://127.0.0.1:{relay_port}/metrics"), 30, "metrics relay", relay,
                         every=0.3)
                scrape_ext = f"127.0.0.1:{relay_port}"
                self.relay_url = f"http://{scrape_ext}"

            status.update("starting the operator and the fake trainer")
            op_port = free_ports(1)[0]
            ns = self.opts.namespace
            op = self._spawn("operator", _cli(
                "operator", "run", "--kubeconfig", kc, "--namespace", ns,
                "--metrics-port", str(op_port), "--cycle", f"{self.opts.cycle_s:g}",
                "--start-timeout", "60", "--grace-period", "2", "--forecast-interval", "30",
                "--allocator", self.opts.live_allocator()))
            self.operator_url = f"http://127.0.0.1:{op_port}"
            wait_for(lambda: http_ok(f"{self.operator_url}/metrics"), 60, "operator /metrics", op, every=0.3)
            self._spawn("fake-trainer", _cli(
                "fake-trainer", "--kubeconfig", kc, "--namespace", ns,
                "--epoch-seconds", f"{self.opts.epoch_s:g}", "--seed", str(self.opts.seed)))

            status.update("starting Prometheus")
            self._start_prometheus(prometheus, tools / "helm", chart,
                                   {"rlsched-extender": scrape_ext, "rlsched-operator": f"127.0.0.1:{op_port}"})
        con.print(f"[green]up[/green]: {len(topo)} GPU nodes ({topo.total_gpus} GPUs), "
                  f"Prometheus {self.prom_url}, KUBECONFIG={kc}")

    def _apply_trainer_policy(self, kubeconfig: str, chart: Path) -> None:
        """The chart's trainer-status admission policy, as a cluster with the chart has
        it: a job's trainer may write only its progress (docs/deploy.md)."""
        from kubernetes import config

        from rlsched.operator.main import install_trainer_policy

        install_trainer_policy(config.new_client_from_config(config_file=kubeconfig), chart / POLICY)

    def _apply_crds(self, kubeconfig: str) -> None:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException

        text = subprocess.run(_cli("operator", "crd"), capture_output=True, text=True, check=True).stdout
        api = client.ApiextensionsV1Api(config.new_client_from_config(config_file=kubeconfig))
        names = []
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            try:
                api.create_custom_resource_definition(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            names.append(doc["metadata"]["name"])

        def established() -> bool:
            for n in names:
                conds = api.read_custom_resource_definition(n).status.conditions or []
                if not any(c.type == "Established" and c.status == "True" for c in conds):
                    return False
            return True

        wait_for(established, 30, "the CRDs to be established", every=0.3)
        core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        try:
            core.create_namespace({"metadata": {"name": self.opts.namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        # the API server serves the new resource a moment after Established
        custom = client.CustomObjectsApi(api.api_client)

        def listable() -> bool:
            try:
                custom.list_namespaced_custom_object(GROUP, VERSION, self.opts.namespace, PLURAL)
                return True
            except ApiException:
                return False

        wait_for(listable, 30, "TrainingJobs to be served", every=0.3)
        self._apply_team_queue(custom)

    def _apply_team_queue(self, custom) -> None:
        """The demo namespace's team queue (a TrainingQueue named after it, guaranteed
        every GPU of the demo cluster): its jobs are charged to it, its status and the
        per-queue metrics show the team's use."""
        from kubernetes.client.exceptions import ApiException

        total = self.topology.total_gpus if self.topology is not None else 0
        body = team_queue(self.opts.namespace, total)
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # left by an earlier run: made as this run needs it
            custom.patch_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, body["metadata"]["name"],
                                               {"spec": body["spec"]})

    def _start_prometheus(self, prometheus: str, helm: Path, chart: Path, targets: Mapping[str, str]) -> None:
        pdir = self.state_dir / "prometheus"
        pdir.mkdir(parents=True, exist_ok=True)
        rule_files = []
        if helm.is_file():
            (pdir / "rules.yaml").write_text(yaml.safe_dump(shipped_rules(helm, chart), sort_keys=False))
            rule_files.append("rules.yaml")
        else:
            self.console.print("[yellow]helm not found: Prometheus runs without the alert rules[/yellow]")
        cfg = prometheus_config(targets, scrape_interval_s=self.opts.scrape_interval_s, rule_files=rule_files)
        (pdir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        port = free_ports(1)[0]
        self.prom_url = f"http://127.0.0.1:{port}"
        prom = self._spawn("prometheus", [
            prometheus, f"--config.file={pdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={pdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d", "--log.level=warn"])
        wait_for(lambda: http_ok(f"{self.prom_url}/-/ready"), 60, "Prometheus /-/ready", prom, every=0.3)

    def _delete_jobs(self) -> None:
        """On a cluster the demo did not start: remove its TrainingJobs (while the
        operator still runs) and its namespace."""
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException

        api = config.new_client_from_config(config_file=self.kubeconfig)
        custom, ns = client.CustomObjectsApi(api), self.opts.namespace
        try:
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                time.sleep(0.5)
            for body in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body["metadata"]["name"],
                                                      {"metadata": {"finalizers": None}})
            client.CoreV1Api(api).delete_namespace(ns)
            custom.delete_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, ns)  # its team queue
        except ApiException as exc:
            if exc.status != 404:
                self.console.print(f"[yellow]demo cleanup in {ns}: {exc.status} {exc.reason}[/yellow]")

    def stop(self) -> None:
        if self.cluster is None and self.kubeconfig:
            self._delete_jobs()
        for c in reversed(self.children):
            if c.popen is not None and c.popen.poll() is None:
                c.stop()
            if c.popen is not None:
                c.popen.wait()
        self.children.clear()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        shutil.rmtree(self.state_dir / "prometheus", ignore_errors=True)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    # ---- the run
    def run(self) -> dict:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from rich.live import Live

        opts = self.opts
        trace = opts.trace or default_trace(opts.data_dir)
        specs = _load_specs(trace, opts.data_dir, opts.seed)
        topo = self.topology
        node_gpus = max(n.gpus for n in topo.nodes)
        plan = plan_jobs(specs, opts.jobs, self.rng, node_gpus=node_gpus, cluster_gpus=topo.total_gpus,
                         window_s=opts.duration_s * opts.submit_fraction, namespace=opts.namespace)
        self.console.print(f"trace [b]{trace}[/b]: {len(specs)} jobs, submitting {len(plan)} over "
                           f"{opts.duration_s * opts.submit_fraction:.0f}s; run time limit {opts.duration_s:.0f}s")
        api = config.new_client_from_config(config_file=self.kubeconfig)
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        t0 = time.monotonic()
        pending = list(plan)
        jobs: list[dict] = []
        last_prom = -1e9
        interactive = self.console.is_terminal
        last_line = 0.0
        free = topo.total_gpus  # GPUs free or being released, as last seen
        with Live(console=self.console, refresh_per_second=4, transient=False, auto_refresh=interactive) as live:
            while True:
                now = time.monotonic() - t0
                shrinks_first = not opts.heuristic
                for job in [j for j in pending if j.at_s <= now]:
                    busy = preemptor_due(jobs, free, job.gang_gpus, topo.total_gpus, shrinks_first)
                    deadline = min(job.at_s + opts.full_wait_s, opts.duration_s / 2)
                    if shrinks_first:  # the cluster is busiest as the last jobs arrive
                        deadline = min(deadline, max(job.at_s, opts.duration_s * opts.submit_fraction))
                    if job.when_full and not busy and now < deadline:
                        continue  # the preemptor waits until the cluster cannot start it
                    pending.remove(job)
                    if job.when_full and shrinks_first:
                        job = sized_preemptor(job, jobs, topo.total_gpus)
                    try:
                        custom.create_namespaced_custom_object(GROUP, VERSION, opts.namespace, PLURAL, job.manifest)
                    except ApiException as exc:
                        self.console.print(f"[red]could not submit {job.name}: {exc.status} {exc.reason}[/red]")
                        continue
                    if job.when_full:
                        self.preemptor = {"name": job.name, "submitted_s": round(now, 1), "gang_gpus": job.gang_gpus,
                                          "free_gpus": free, "cluster_busy": busy}
                        self.console.print(f"t={now:.0f}s: submitted the highest-class job {job.name} "
                                           f"({job.gang_gpus} GPUs; {free} free or being released)"
                                           + ("" if busy else ": the cluster was not busy in time, "
                                                              "no preemption needed"))
                for c in self.children:
                    c.check()
                jobs = custom.list_namespaced_custom_object(GROUP, VERSION, opts.namespace, PLURAL)["items"]
                pods = api.sanitize_for_serialization(core.list_namespaced_pod(opts.namespace).items)
                gpus, workers = gpu_usage(pods)
                free = cluster_free(pods, topo.total_gpus)
                phases = [_st(j).get("phase") for j in jobs]
                sample = Sample(now, gpus, topo.total_gpus, workers, phases.count("Running"),
                                sum(p in (None, "Queued") for p in phases), sum(p in TERMINAL for p in phases))
                self.samples.append(sample)
                if now - last_prom >= 5.0:
                    self.headline = {k: _scalar(self.prom_url, q) for k, q in HEADLINE_QUERIES.items()}
                    last_prom = now
                view = render_view(jobs, sample, self.headline, elapsed_s=now, duration_s=opts.duration_s,
                                   prometheus_url=self.prom_url)
                live.update(view, refresh=interactive)
                if not interactive and now - last_line >= 15.0:
                    last_line = now
                    print(f"[demo] t={now:.0f}s gpus={gpus}/{sample.gpus_total} running={sample.running} "
                          f"queued={sample.queued} done={sample.done}/{len(plan)}", flush=True)
                if not pending and jobs and all(p in TERMINAL for p in phases):
                    break
                if now >= opts.duration_s:
                    break
                time.sleep(1.0)
            live.update(view, refresh=True)
        time.sleep(opts.scrape_interval_s * 1.5)  # one more scrape of the final counters
        self.headline = {k: _scalar(self.prom_url, q) for k, q in HEADLINE_QUERIES.items()}
        summary = summarize(jobs, planned=len(plan))
        summary.update({"trace": trace, "seed": opts.seed, "duration_s": opts.duration_s,
                        "elapsed_s": time.monotonic() - t0, "cluster_gpus": topo.total_gpus,
                        "prometheus": self.headline, "preemptor": self.preemptor,
                        "allocator": opts.live_allocator(),
                        "gpu_allocation_mean": float(np.mean([s.gpus_used / max(1, s.gpus_total)
                                                              for s in self.samples])) if self.samples else None})
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "summary.json").write_text(json.dumps(summary, indent=2))
        (opts.out / "jobs.json").write_text(json.dumps(jobs, indent=2, default=str))
        summary["plots"] = [str(p) for p in write_plots(summary, self.samples, jobs, opts.out)]
        self._print_summary(summary)
        return summary

    def _print_summary(self, s: Mapping) -> None:
        from rich.table import Table

        t = Table(title=f"rlsched demo: {s['succeeded']}/{s['planned']} jobs completed "
                        f"({s['trace']}, seed {s['seed']})")
        t.add_column("figure")
        t.add_column("value", justify="right")
        p = s.get("prometheus") or {}
        for label, val in (
            ("operator's --allocator", str(s.get("allocator") or "-")),
            ("JCT mean / p50 / p95 (s)", f"{_fmt(s['jct_mean_s'])} / {_fmt(s['jct_p50_s'])} / {_fmt(s['jct_p95_s'])}"),
            ("admission wait mean (s)", _fmt(s["wait_mean_s"])),
            ("final accuracy mean", _fmt(s["accuracy_mean"], ".3f")),
            ("GPU allocation mean", _fmt(None if s["gpu_allocation_mean"] is None else 100 * s["gpu_allocation_mean"]) + " %"),
            ("phases", ", ".join(f"{k} {v}" for k, v in sorted(s["phases"].items()))),
            ("scaling decisions up / down", f"{_fmt(p.get('scaling_up'), '.0f')} / {_fmt(p.get('scaling_down'), '.0f')}"),
            ("preemptions / resumes", f"{_fmt(p.get('preemptions'), '.0f')} / {_fmt(p.get('resumes'), '.0f')}"),
            ("completions converged / max epochs", f"{_fmt(p.get('converged'), '.0f')} / {_fmt(p.get('max_epochs'), '.0f')}"),
            ("extender requests / errors", f"{_fmt(p.get('extender_requests'), '.0f')} / {_fmt(p.get('extender_errors'), '.0f')}"),
            ("extender p99 latency (ms, last minute)", _fmt(p.get("extender_p99_ms"), ".2f")),
        ):
            t.add_row(label, val)
        self.console.print(t)
        for u in s.get("unfinished") or []:
            self.console.print(f"not finished: {u['name']} ({u['class']}) {u['phase']}, "
                               f"waiting {u['reason'] or '-'}: {u['message'] or '-'}")
        self.console.print("counters: the operator's metrics as the demo's Prometheus scraped them "
                           "(rlsched_operator_scaling_decisions_total, _preemptions_total, _resumes_total, "
                           "_completions_total)")
        self.console.print(f"wrote {self.opts.out / 'summary.json'} and plots: "
                           + ", ".join(Path(x).name for x in s.get("plots", [])))


def _load_specs(trace: str, data_dir: str | None, seed: int) -> list:
    """JobSpecs of ``trace`` through the simulator's trace loaders."""
    from rlsched.sim.traces import load_trace

    return list(load_trace(trace, data_dir=data_dir, seed=seed).jobs)


# --------------------------------------------------------------------------- down
def down(state_dir: Path, console=None) -> int:
    """Stop what a demo started from ``state_dir`` (processes it recorded, verified by
    their working directory, and its control plane). Safe to run twice."""
    from .cluster import LocalCluster

    d = state_dir.resolve()
    state_path = d / STATE_FILE
    stopped = []
    if state_path.exists():
        state = json.loads(state_path.read_text())
        for name, pid in (state.get("pids") or {}).items():
            if started_in(int(pid), d):
                stop_process_group(int(pid))
                stopped.append(name)
    cluster_dir = d / "cluster"
    if cluster_dir.is_dir():
        try:
            LocalCluster.attach(cluster_dir).stop()
            stopped.append("control plane")
        except ClusterError:
            pass
        shutil.rmtree(cluster_dir, ignore_errors=True)
    shutil.rmtree(d / "prometheus", ignore_errors=True)
    state_path.unlink(missing_ok=True)
    msg = f"stopped {', '.join(stopped)}" if stopped else "nothing was running"
    if console is not None:
        console.print(f"demo down: {msg} ({d})")
    return 0


# --------------------------------------------------------------------------- CLI
def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _up(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=150)
    try:
        opts = DemoOptions(
            duration_s=args.duration, jobs=args.jobs, trace=args.trace,
            data_dir=args.data_dir or os.environ.get("RLSCHED_DATA_DIR") or None, seed=args.seed,
            out=Path(args.out), state_dir=Path(args.state_dir), epoch_s=args.epoch_seconds, keep=args.keep,
            extender_model=args.extender_model, chart=Path(args.chart), prometheus=args.prometheus,
            allocator=args.allocator,
        )
    except ValueError as exc:
        console.print(f"[red]demo: {exc}[/red]")
        return 2
    demo = Demo(opts, console)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    rc = 0
    try:
        demo.start()
        demo.run()
        if opts.keep:
            console.print(f"--keep: still running. KUBECONFIG={demo.kubeconfig}, Prometheus "
                          f"{demo.prom_url}. Stop with `rlsched demo down` (or `make demo-down`).")
            demo.children.clear()  # leave them to `demo down`
            demo.cluster = None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        rc = 130
    except Exception as exc:  # report, then clean up below
        if not isinstance(exc, (RuntimeError, OSError)):
            console.print_exception(max_frames=4)
        console.print(f"[red]demo failed:[/red] {exc}")
        console.print(f"logs: {opts.state_dir / 'logs'}")
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not (opts.keep and rc == 0):
            with console.status("stopping the demo"):
                demo.stop()
    return rc


def _down(args: argparse.Namespace) -> int:
    from rich.console import Console

    return down(Path(args.state_dir), Console())


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rlsched demo up|down``."""
    p = subparsers.add_parser("demo", help="the live system: control plane, extender, operator, Prometheus")
    sub = p.add_subparsers(dest="demo_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="run the live demo and stop it at the end")
    up.add_argument("--duration", type=float, default=180.0, help="seconds of the run after start-up (default 180)")
    up.add_argument("--jobs", type=int, default=30, help="TrainingJobs to submit (default 30)")
    up.add_argument("--trace", default=None,
                    help="trace SPEC (default: alibaba2023:default with a data dir, else synthetic:small)")
    up.add_argument("--data-dir", default=None, help="trace data folder (default $RLSCHED_DATA_DIR)")
    up.add_argument("--seed", type=int, default=1)
    up.add_argument("--epoch-seconds", type=float, default=1.0, help="wall seconds per training epoch (default 1)")
    up.add_argument("--out", default="out/demo", help="summary and plots folder (default out/demo)")
    up.add_argument("--state-dir", default=".run/demo", help="working folder of the running demo")
    up.add_argument("--keep", action="store_true", help="leave everything running at the end (then `demo down`)")
    up.add_argument("--extender-model", default=None, help="DAS model file for the extender (default: the shipped one)")
    up.add_argument("--chart", default=str(DEFAULT_CHART),
                    help=f"the rlsched Helm chart (alert rules, metrics relay; default {DEFAULT_CHART})")
    up.add_argument("--prometheus", default=None, help="Prometheus executable (default: prometheus on PATH)")
    up.add_argument("--allocator", default=SERVED.allocator, type=allocator_arg,
                    help="the operator's allocation policy (default: the served one; a heuristic as "
                    "ordering/placement[/scaling][+backfill|+nobackfill])")
    up.set_defaults(func=_up)
    dn = sub.add_parser("down", help="stop everything a demo started")
    dn.add_argument("--state-dir", default=".run/demo")
    dn.set_defaults(func=_down)
