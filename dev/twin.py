"""The twin check: the same seeded TrainingJobs live and simulated, decisions compared.

One seeded job set (:func:`twin_jobs`) runs twice:

* **simulated** (:func:`simulate`): :class:`rlsched.sim.Simulator` on the topology of
  the kwok nodes with the operator's allocator (``TwinConfig.allocator``, by default
  ``fifo/das/fcfs+nobackfill``: FIFO, DAS, grow while there is room, give back when
  converging) deciding, new
  workers placed by DAS with the committed weights as the extender serves it,
  recording its decisions (``SimConfig.record_decisions``). The engine makes the same
  call into core (``LiveAllocation.plan``) the operator makes, so nothing of the
  operator is re-implemented here;
* **live** (:func:`run_live`): the operator and the extender as processes, the real
  kube-scheduler and kwok of the local control plane, and :class:`ReplayTrainer`
  standing in for every job's chief: it advances each job whose gang runs exactly as
  the simulator's job model does (``sim.job.throughput`` at its worker count and the
  level its pods span, the engine's restart cost on every resume and resize, the
  per-epoch accuracy of the *same* seeded ``ConvergenceModel`` the engine draws) and
  reports through :class:`rlsched.trainer.Reporter`. The live log is read back from
  the operator's Events (``Admitted``, ``Preempted``, ``ScaledUp``/``ScaledDown``,
  ``Completed``, each stamped to the microsecond) and the pods the trainer saw.

Time: the live run is compressed, one wall second is ``time_scale`` simulated
seconds; every live time is converted to simulated seconds from the moment the first
job was submitted. The simulator's ``scaling_interval`` is the operator's cycle in
simulated seconds, so both sides look at new evaluations at the same rate.

:func:`compare` holds the two logs against each other (admissions and their order,
preemption victims, each job's sequence of worker changes, the global batch of each run
of a job with an adaptive batch — live, what its pods' worker contract carried —,
per-job JCT) under the
tolerances of :class:`Tolerances` (see its docstring for why they are what they
are) and :func:`render_markdown` writes the report. ``python -m rlsched_dev.twin``
runs the whole check on a fresh local control plane (``bench/twin.py`` is the
benchmark entry point).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from rlsched.core import Topology, make_placement
from rlsched.core.contract import gpu_type_of
from rlsched.core.live_allocation import LiveAllocation, make_live_allocator, parse_allocator_options
from rlsched.core.planning import CONVERGENCE_WINDOW, convergence_gain
from rlsched.sim import JobSpec
from rlsched.sim.engine import SimConfig, Simulator
from rlsched.sim.job import throughput

__all__ = [
    "TwinConfig",
    "Tolerances",
    "twin_jobs",
    "allocator_scenario",
    "batch_scenario",
    "mixed_scenario",
    "t4_nodes",
    "batch_sequences",
    "manifest",
    "sim_placement",
    "simulate",
    "ReplayTrainer",
    "run_live",
    "compare",
    "render_markdown",
]

log = logging.getLogger(__name__)

TRAINER_IMAGE = "registry.invalid/rlsched/twin-trainer:replay"  # never pulled: kwok runs no containers
DECISION_EVENTS = ("Admitted", "Preempted", "ScaledUp", "ScaledDown", "Completed")
#: operator events that mean something went wrong (reported, never expected in a twin run)
ANOMALY_EVENTS = ("GangTimeout", "StatusReset", "ReconcileError", "PodsNotCreated", "Unfittable", "InvalidSpec")


# --------------------------------------------------------------------------- options
@dataclass(frozen=True)
class TwinConfig:
    """How both runs are set up. Times are wall seconds unless named ``*_sim``.

    ``time_scale``: simulated seconds per wall second of the live run.
    ``cycle_s``: the operator's cycle; the simulator's ``scaling_interval`` is
    ``cycle_s * time_scale`` (both sides look at new evaluations this often).
    ``tick_s``: how often the replay trainer advances jobs and reads pods.
    ``restart_cost_sim``: the engine's restart cost, paid live by the trainer on every
    resume and resize.
    ``patience``: the operator's β-stop patience; every job's ``JobSpec.patience``.
    ``allocator``: the allocation policy deciding on both sides (the operator's
    ``--allocator``; the engine's ``allocation``): by default FIFO admission without
    backfill, the extender's DAS placement, and scaling that grows every job while a
    node has room and takes a worker back from each converging one (``fcfs`` under
    core's planner: what RLPTO's committed actor did on the operator's old admission +
    scaling path, where it ranked every job first; ranked among the running jobs, it
    shrinks the one with the most work left, a near-tie the live clock decides,
    docs/twin.md); else e.g. ``goodput``. A goodput
    allocator's time constants are in simulated seconds; the live operator gets them
    divided by ``time_scale`` (:meth:`live_allocator`), as its clock is the wall clock.
    ``placement``: where the engine puts new workers (the extender's policy).
    """

    jobs: int = 8
    seed: int = 1
    time_scale: float = 10.0
    cycle_s: float = 0.25
    tick_s: float = 0.1
    restart_cost_sim: float = 30.0
    patience: int = 5
    placement: str = "das"
    allocator: str = "fifo/das/fcfs+nobackfill"
    grace_period_s: int = 0
    max_wall_s: float = 600.0
    #: kwok nodes of 4 ``Tesla-T4`` added beside the cluster's for the check (and deleted
    #: after it): a cluster of two GPU types, each node's type its GPU Feature
    #: Discovery product (the engine's ``SimConfig.gpu_types``, the operator's empty
    #: ``--gpu-types``); 0: the cluster as it is, no types in the engine
    t4_nodes: int = 0

    def __post_init__(self) -> None:
        if self.time_scale <= 0 or self.cycle_s <= 0 or self.tick_s <= 0:
            raise ValueError("time_scale, cycle_s and tick_s must be > 0")
        if self.jobs < 2:
            raise ValueError("the twin check needs at least 2 jobs")
        if self.t4_nodes < 0:
            raise ValueError(f"t4_nodes must be >= 0, got {self.t4_nodes}")

    @property
    def gpu_types(self) -> dict[str, str] | None:
        """The engine's ``SimConfig.gpu_types``: every product its own type on a cluster
        of two types, None (no types) on the cluster as it is."""
        return {} if self.t4_nodes else None

    def sim_allocator(self):
        """The engine's allocation policy."""
        return LiveAllocation(make_live_allocator(self.allocator))

    def live_allocator(self) -> str:
        """``--allocator`` of the live operator: the same policy with its time constants
        (a goodput allocator's restart delay, attained-service threshold, a learned
        weight's units of service and age) in wall seconds; a heuristic has none."""
        if "/" in self.allocator.split("@")[0]:  # ordering/placement[/scaling]: no time constants
            return self.allocator
        a = self.sim_allocator().allocator
        name, options = parse_allocator_options(self.allocator)
        k = self.time_scale
        options.update(restart_delay=a.restart_delay / k, threshold=a.threshold / k,
                       service_scale=a.service_scale / k, p=a.p)  # counts and quantiles are kept as given
        if a.idle_horizon:
            options["idle_horizon"] = a.idle_horizon / k
        if a.growth is not None:  # a learned weight's unit of age (core/growth_weight.py)
            options["hour"] = a.growth.hour / k
        return f"{name}@" + ",".join(f"{key}={'none' if v is None else format(v, 'g')}" for key, v in options.items())

    @property
    def scaling_interval_sim(self) -> float:
        return self.cycle_s * self.time_scale

    @property
    def latency_sim(self) -> float:
        """One decision latency of the live system in simulated seconds: the operator
        sees a change at its next cycle (up to ``cycle_s``), kube-scheduler binds and
        kwok starts the pods (:data:`BIND_S`), the trainer notices at its next tick."""
        return (self.cycle_s + BIND_S + self.tick_s) * self.time_scale


#: allowance for kube-scheduler + extender binding a pod and kwok marking it Running
#: (wall seconds; measured well below this on the local control plane, see docs/twin.md)
BIND_S = 0.25


@dataclass(frozen=True)
class Tolerances:
    """What the comparison forgives, and why.

    The live clock adds latency the simulator does not have: a decision waits for the
    operator's next cycle, a new pod for kube-scheduler, the extender and kwok, a
    report for the trainer's next tick (``TwinConfig.latency_sim``, one *latency*
    ``L``). Everything else — who is admitted, who is preempted by whom, which way a
    job is scaled — is a decision of the same planning code on the same state, and
    must match.

    * admissions: the same (job, n-th admission) set; the order may differ only
      between admissions less than ``order_latencies * L`` apart in either log
      (admissions of one cycle are posted concurrently);
    * preemptions: the same (victim, preemptor) multiset, exactly;
    * scaling: each job's sequence of worker changes, each with the evaluation (epoch)
      it acted on (the operator's Event names the accuracy gain it saw, which picks
      the epoch among the trainer's reports); two steps match when their directions
      are the same and their epochs differ by at most ``scale_epoch_slack``
      evaluations, and at most ``scale_edits`` insertions/deletions/substitutions of
      unmatched steps are allowed per job. Both forgive the live clock: a step decided
      within one latency of another job's finish or admission sees the GPUs one
      evaluation earlier or later in one run than in the other (and the job's later
      steps shift with it), or not at all;
    * JCT: ``|live - sim| <= L * (jct_base + jct_per_decision * d) + jct_rel * sim``
      where ``d`` counts the decisions on the job's path: its own admissions, resizes
      and preemptions and the completions it waited for in the queue (each hand-off
      adds up to one ``L``); ``jct_rel`` covers the trainer's sampling of the clock;
    * global batch sizes (jobs with an adaptive batch): each job's sequence of global
      batches, one per run (admission or resize; live, what its pods' worker contract
      carried). Two batches match when they differ by at most ``batch_rel``
      (relative); a job may have as many unmatched entries as its scaling check
      forgave it (a resize one run took and the other did not adds or drops a batch),
      none when its steps matched. The batch is the allocator's pure function of what
      the job reported — the same step times and gradient statistics on both sides —
      and of the new allocation, so it must be the same number: ``batch_rel`` is 0 by
      default.
    """

    order_latencies: float = 2.0
    scale_edits: int = 1
    scale_epoch_slack: int = 1
    batch_rel: float = 0.0
    jct_base: float = 3.0
    jct_per_decision: float = 1.5
    jct_rel: float = 0.03

    def jct(self, latency: float, decisions: int, sim_jct: float) -> float:
        return latency * (self.jct_base + self.jct_per_decision * decisions) + self.jct_rel * sim_jct


# --------------------------------------------------------------------------- job set
#: worker shapes (gpus_per_worker, min_workers, max_workers): the jobs that fill the
#: cluster first, and the ones that come later
_FILL_SHAPES = ((4, 1, 2), (2, 2, 4), (4, 2, 3), (2, 3, 4), (8, 1, 1), (2, 2, 3))
_SHAPES = ((1, 1, 2), (1, 2, 4), (2, 1, 2), (2, 2, 3), (4, 1, 2), (1, 2, 2), (2, 2, 2), (4, 1, 1))


def twin_jobs(n: int = 20, seed: int = 1, *, cluster_gpus: int = 32, epoch_sim: float = 50.0) -> list[JobSpec]:
    """A seeded set of ``n`` training jobs for a cluster of ``cluster_gpus`` GPUs
    (nodes of at least 8), submit times in simulated seconds.

    The first jobs arrive 40-60 s apart with large gangs until their gangs ask for the
    whole cluster; the next job is the one ``highest``-class job (2 workers x 4 GPUs),
    so it finds the cluster full and preempts; the rest arrive 60-200 s apart. Classes
    are otherwise about a quarter ``urgent`` and the rest ``normal``; half the jobs
    converge early (small ``tau``, large ``beta``, room to spare in ``max_epochs``: the
    β stop ends them), the others run to ``max_epochs``; most are elastic (``min <
    max`` workers). An epoch takes about ``epoch_sim`` simulated seconds at the gang
    size.

    Submissions are at least 40 simulated seconds apart: live, FIFO ranks by the
    TrainingJob's creation timestamp, which has one-second resolution."""
    if n < 2:
        raise ValueError("need n >= 2")
    rng = np.random.default_rng(seed)
    t = 0.0
    asked = 0
    highest_at = None
    jobs: list[JobSpec] = []
    for i in range(n):
        filling = asked < cluster_gpus and highest_at is None
        if i:
            t += float(rng.uniform(40.0, 60.0) if filling or highest_at == i - 1 else rng.uniform(60.0, 200.0))
        shapes = _FILL_SHAPES if filling else _SHAPES
        gpw, lo, hi = shapes[int(rng.integers(len(shapes)))]
        klass = "urgent" if rng.random() < 0.25 else "normal"
        if highest_at is None and (asked >= cluster_gpus or i == n - 1):
            highest_at, klass = i, "highest"
            gpw, lo, hi = 4, 2, 2  # one node's worth: someone must give way
        early = bool(rng.random() < 0.5)
        acc_max = float(rng.uniform(0.7, 0.9))
        if early:
            for _ in range(100):  # a curve with a β clear of its gains (nearly always the first)
                conv = {"tau": float(rng.uniform(1.5, 2.5)), "noise": 0.0, "acc_max": acc_max}
                max_epochs = int(rng.integers(18, 24))
                beta = _clear_beta(rng, conv, lo, hi, max_epochs)
                if beta is not None:
                    break
            else:
                raise ValueError(f"no β clear of the convergence gains for a {lo}..{hi}-worker job")
        else:
            conv = {"tau": float(rng.uniform(5.0, 8.0)), "noise": 0.002, "acc_max": acc_max}
            beta, max_epochs = 0.001, int(rng.integers(9, 13))
        compute = float(rng.uniform(0.2, 0.3))
        batch = 32
        spe = int(round(epoch_sim * lo * batch / compute / 100.0)) * 100  # epoch_sim s at the gang size
        jobs.append(JobSpec(
            id=f"tw-{i:02d}", submit_time=round(t, 3), workers=lo, gpus_per_worker=gpw,
            min_workers=lo, max_workers=hi, priority_class=klass,
            queue="urgent" if klass in ("urgent", "highest") else "normal",
            compute_time=compute, grad_gb=float(rng.choice([0.05, 0.1, 0.2])), batch_per_worker=batch,
            samples_per_epoch=spe, max_epochs=max_epochs, beta=beta, patience=5, convergence=conv,
        ))
        asked += lo * gpw
    return jobs


def allocator_scenario() -> list[JobSpec]:
    """Three jobs for an allocation policy on the 32-GPU twin cluster: a wide elastic
    job alone (the policy starts it on every GPU at once), a second whose gang does not
    fit beside it (shrink-to-admit, several workers at once) and that ends first (the
    first grows back), a third that takes another shrink. Arrivals fall between the
    engine's cycles (no race with a decision)."""
    conv = {"tau": 6.0, "noise": 0.002, "acc_max": 0.9}

    def job(jid: str, t: float, gpw: int, lo: int, hi: int, spe: int, epochs: int) -> JobSpec:
        return JobSpec(id=jid, submit_time=t, workers=lo, gpus_per_worker=gpw, min_workers=lo, max_workers=hi,
                       compute_time=0.25, grad_gb=0.05, batch_per_worker=32, samples_per_epoch=spe,
                       max_epochs=epochs, beta=0.001, patience=5, convergence=conv)

    return [job("al-a", 0.0, 2, 1, 16, 60_000, 12), job("al-b", 121.3, 2, 5, 8, 12_000, 6),
            job("al-c", 331.7, 4, 2, 2, 6_000, 5)]


def batch_scenario() -> list[JobSpec]:
    """Two jobs for an allocation policy that sets global batch sizes: ``bs-a`` (1–16
    workers × 2 GPUs) asks for global batch 64 (``batchSize``) and lets the scheduler
    go up to 2,048 (``maxBatchSize``); its trainer reports step times at the batch it
    runs and a gradient noise scale of 1,000 samples (:meth:`JobSpec.grad_stats`,
    statistical efficiency ``(φ + 64)/(φ + M)``). ``bs-b`` (15 × 2 GPUs, a fixed
    per-worker batch) needs 30 of the 32 GPUs.

    What the goodput allocator does with them (the same in the engine and live): it
    starts ``bs-a`` alone at batch 64 — no gradient statistics yet, so a larger batch
    buys nothing on faith — on one node; ``bs-b`` arrives mid-epoch after ``bs-a``'s
    first reports and ``bs-a`` shrinks to one worker to admit it, now at the
    goodput-optimal batch for 2 GPUs with the noise scale it reported (larger than
    64); it reports an epoch at that batch, and when ``bs-b`` ends it grows back to 4
    workers at the batch its model, fitted now to the step times at both batches,
    finds best there (another one again). Two resizes, each changing the global batch,
    the second decided from a step time reported at a batch the allocator chose."""
    conv = {"tau": 6.0, "noise": 0.002, "acc_max": 0.9}
    common = dict(compute_time=0.25, grad_gb=0.05, batch_per_worker=32, beta=0.001, patience=5, convergence=conv)
    return [
        JobSpec(id="bs-a", submit_time=0.0, workers=1, gpus_per_worker=2, min_workers=1, max_workers=16,
                samples_per_epoch=30_000, max_epochs=10, batch_size=64, max_batch_size=2048,
                grad_noise_scale=1000.0, **common),
        JobSpec(id="bs-b", submit_time=151.3, workers=15, gpus_per_worker=2, min_workers=15, max_workers=15,
                samples_per_epoch=60_000, max_epochs=6, **common),
    ]


def mixed_scenario() -> list[JobSpec]:
    """Two jobs for a type-aware allocation policy on the 32 A100s of the twin cluster
    and two nodes of 4 T4s (``TwinConfig.t4_nodes``): ``mx-a`` (8 workers × 4 GPUs, its
    gang, 3 times faster on an A100) holds every A100; ``mx-b`` (1–2 workers × 4 GPUs,
    1.2 times faster on an A100) arrives and lands on the T4s; after ``mx-a`` ends it
    moves to the A100s (a new generation of the same size there) once the gain pays
    for the restart (the allocator's restart factor grows with its age). Each declares
    its seed profile on both types (``JobSpec.seed_profile``)."""
    conv = {"tau": 6.0, "noise": 0.002, "acc_max": 0.9}

    def job(jid: str, t: float, lo: int, hi: int, spe: int, epochs: int, a100: float) -> JobSpec:
        return JobSpec(id=jid, submit_time=t, workers=lo, gpus_per_worker=4, min_workers=lo, max_workers=hi,
                       compute_time=0.25, grad_gb=0.05, batch_per_worker=32, samples_per_epoch=spe,
                       max_epochs=epochs, beta=0.001, patience=5, convergence=conv, gpu_speed={"A100": a100})

    return [job("mx-a", 0.0, 8, 8, 60_000, 8, 3.0), job("mx-b", 121.3, 1, 2, 12_000, 4, 1.2)]


def separate_arrivals(jobs: Sequence[JobSpec], topology: Topology, cfg: TwinConfig, window: float,
                      *, max_rounds: int = 200) -> list[JobSpec]:
    """``jobs`` with submit times moved later until no job arrives within ``window``
    simulated seconds of another job's decision in the simulated run (the victims its
    own admission preempted aside).

    An arrival that close to another decision is a race the live clock decides: a
    scale-up one cycle before or after the arrival takes the GPUs the new gang needs
    or leaves them. Both outcomes are right, so the twin check keeps its arrivals out
    of that window (``window`` is a couple of live latencies) instead of forgiving
    whatever follows. Later arrivals move by the same amount (gaps are kept)."""
    jobs = sorted(jobs, key=lambda s: (s.submit_time, s.id))
    for _ in range(max_rounds):
        decisions = simulate(jobs, topology, cfg).decisions
        for k, s in enumerate(jobs[1:], 1):
            t = s.submit_time
            # its own victims: stopped by the decision that started it (the allocator's plan)
            started = {d["t"] for d in decisions if d["kind"] == "admit" and d["job"] == s.id}
            near = [d["t"] for d in decisions if d["job"] != s.id and abs(d["t"] - t) < window
                    and not (d["kind"] == "preempt" and d["t"] in started)]
            if near:
                shift = max(near) + window - t + 0.01  # past the window, whatever the rounding
                jobs = jobs[:k] + [j.with_(submit_time=round(j.submit_time + shift, 3)) for j in jobs[k:]]
                break
        else:
            return jobs
    log.warning("separate_arrivals: arrivals still near other decisions after %d rounds", max_rounds)
    return jobs


#: the range a converging twin job's β is drawn from, and how far (relative) it stays
#: from every convergence gain the job can report
BETA_RANGE = (0.005, 0.008)
BETA_MARGIN = 0.05


def windowed_gain_bounds(conv: Mapping[str, float], lo: int, hi: int, epochs: int,
                         window: int = CONVERGENCE_WINDOW) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(e, g_min, g_max)``: for every evaluation ``e = 2..epochs``, the least and the
    largest convergence gain (:func:`rlsched.core.planning.convergence_gain`, the mean
    gain over the last ``k = min(window, e - 1)`` evaluations) a job with the
    noise-free curve ``conv`` can report after epoch ``e``, whatever mix of ``lo``..``hi``
    workers it trained each epoch at.

    The curve is ``acc(E) = acc_max - span * exp(-E / tau)`` in effective epochs ``E``,
    the sum of each epoch's statistical efficiency (between ``efficiency(hi)`` and
    ``efficiency(lo)``), so the gain is
    ``span * exp(-E(e-k) / tau) * (1 - exp(-(E(e) - E(e-k)) / tau)) / k``, decreasing
    in ``E(e-k)`` and increasing in ``E(e) - E(e-k)``, with ``E(e-k)`` within
    ``(e-k) * [eff_min, eff_max]`` and ``E(e) - E(e-k)`` within ``k * [eff_min, eff_max]``."""
    from rlsched.sim.convergence import ConvergenceModel

    m = ConvergenceModel(1, **{k: v for k, v in conv.items() if k != "noise"})
    span = m.acc_max - m.acc0
    eff_max, eff_min = m.efficiency(lo), m.efficiency(hi)
    e = np.arange(2, epochs + 1)
    k = np.minimum(window, e - 1)
    before = e - k
    g_max = span * np.exp(-before * eff_min / m.tau) * (1 - np.exp(-k * eff_max / m.tau)) / k
    g_min = span * np.exp(-before * eff_max / m.tau) * (1 - np.exp(-k * eff_min / m.tau)) / k
    return e, g_min, g_max


def _clear_beta(rng: np.random.Generator, conv: Mapping[str, float], lo: int, hi: int, epochs: int,
                patience: int = 5) -> float | None:
    """A β in :data:`BETA_RANGE` at least :data:`BETA_MARGIN` away from every
    convergence gain the job can report (:func:`windowed_gain_bounds`: the windowed
    gain RLPTO's β rule compares, at any mix of ``lo``..``hi`` workers, no noise), drawn
    uniformly from what is left; None if nothing is left, or if the β stop would not
    end the job at least two epochs before ``epochs`` (``patience`` evaluations below
    β from the first one surely below).

    Clear of every gain, the β rule's verdict after each evaluation is the same
    whatever the worker mix, so the give-backs and the β stop fall on the same epochs
    live and simulated. A gain a hair from β would let the live clock's slightly
    different split of an epoch between two worker counts move them by epochs (seen in
    the first twin runs)."""
    e, g_min, g_max = windowed_gain_bounds(conv, lo, hi, epochs)
    lo_b, hi_b = BETA_RANGE
    banned = sorted((float(a), float(b)) for a, b in zip((1 - BETA_MARGIN) * g_min, (1 + BETA_MARGIN) * g_max)
                    if b >= lo_b and a <= hi_b)
    free, x = [], lo_b
    for a, b in banned:
        if a > x:
            free.append((x, a))
        x = max(x, b)
    if x < hi_b:
        free.append((x, hi_b))
    total = sum(b - a for a, b in free)
    if total <= 0:
        return None
    u = float(rng.uniform(0.0, total))
    for a, b in free:
        if u <= b - a:
            beta = a + u
            break
        u -= b - a
    else:  # rounding at the very end
        beta = free[-1][1]
    below = np.flatnonzero(g_max < beta)
    if not below.size or int(e[below[0]]) + patience - 1 > epochs - 2:
        return None
    return float(beta)


def manifest(spec: JobSpec, namespace: str, gpu_types: Iterable[str] = ()) -> dict:
    """The TrainingJob of a twin job (what the live run submits); on a cluster of
    ``gpu_types``, with the seed profile it declares there (``JobSpec.seed_profile``)."""
    from rlsched.core.contract import API_VERSION, KIND

    body = {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": spec.id, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "rlsched-twin"}},
        "spec": {
            "minWorkers": spec.min_workers, "maxWorkers": spec.max_workers, "gpusPerWorker": spec.gpus_per_worker,
            "priority": {"class": spec.priority_class, "value": float(spec.priority)},
            "beta": spec.beta, "maxEpochs": spec.max_epochs, "dataSize": spec.samples_per_epoch,
            "template": {"spec": {"containers": [{"name": "trainer", "image": TRAINER_IMAGE}]}},
        },
    }
    if spec.batch_size is not None:  # an adaptive global batch: the scheduler chooses within these
        body["spec"]["batchSize"] = spec.batch_size
        if spec.max_batch_size is not None:
            body["spec"]["maxBatchSize"] = spec.max_batch_size
    seed = spec.seed_profile(gpu_types)
    if seed:
        body["spec"]["seedProfile"] = [{"gpuType": t, "localBatchSize": m, "stepTimeSeconds": x} for t, m, x in seed]
    return body


# --------------------------------------------------------------------------- simulated
def sim_placement(cfg: TwinConfig):
    """Where the engine puts new workers: the extender's placement as ``rlsched extender
    serve`` builds it (DAS with its committed weights)."""
    from rlsched.core.das import DEFAULT_MODEL

    return make_placement(cfg.placement, model=DEFAULT_MODEL) if cfg.placement == "das" else make_placement(cfg.placement)


@dataclass
class SimRun:
    """The simulated side: its decision log and per-job records."""

    decisions: list[dict]
    jct: dict[str, float]
    unfinished: list[str]
    simulator: Simulator


def make_simulator(jobs: Sequence[JobSpec], topology: Topology, cfg: TwinConfig) -> Simulator:
    """The simulator of the twin check (also the source of the convergence models the
    live trainer replays)."""
    # the operator decides every cycle: so does the engine, each interval of one cycle
    conf = SimConfig(scaling_interval=cfg.scaling_interval_sim, restart_cost=cfg.restart_cost_sim,
                     record_series=False, record_decisions=True, allocate_on_events=False, gpu_types=cfg.gpu_types)
    # the policy decides alone; new workers go where the extender puts them
    return Simulator(jobs, topology, placement=sim_placement(cfg), allocation=cfg.sim_allocator(), seed=cfg.seed,
                     config=conf)


def simulate(jobs: Sequence[JobSpec], topology: Topology, cfg: TwinConfig) -> SimRun:
    """Run the job set through the simulator; the decision log in simulated seconds."""
    sim = make_simulator(jobs, topology, cfg)
    res = sim.run()
    names = [n.name for n in topology.nodes]
    decisions = []
    for d in res.decisions:
        d = dict(d)
        if "by" in d:  # the allocator that preempted, named as the operator's event reads
            d["by"] = str(d["by"]).rsplit("/", 1)[-1]
        if "nodes" in d:
            d["nodes"] = sorted(names[i] for i in d["nodes"])
        decisions.append(d)
    return SimRun(decisions, {r.id: r.jct for r in res.records}, list(res.unfinished), sim)


# --------------------------------------------------------------------------- live
@dataclass
class _Replay:
    """What the replay trainer keeps of one job (the engine's ``JobState`` counterpart)."""

    spec: JobSpec
    conv: Any
    work_done: float = 0.0  # samples processed
    eff: float = 0.0  # effective epochs (statistical efficiency applied)
    epoch: int = 0  # last epoch reported
    workers: int = 0  # running workers at the last tick (0: not running)
    nodes: tuple[int, ...] = ()
    rate: float = 0.0  # samples per simulated second at the last tick
    resume_at: float = 0.0  # wall time the current restart ends
    paused_at: float | None = None  # wall time its generation stopped for a restart (still Running)
    last: float = 0.0  # wall time of the last advance
    started: bool = False
    reporter: Any = None
    #: (wall time, sorted node names) each time its gang started running
    runs: list[tuple[float, list[str]]] = field(default_factory=list)
    #: (wall time, workers) each time its running worker count changed
    sizes: list[tuple[float, int]] = field(default_factory=list)
    #: (wall time, epoch, accuracy) of every report written
    reports: list[tuple[float, int, float]] = field(default_factory=list)
    #: the global batch of the running generation, from its pods' worker contract
    #: (``RLSCHED_GLOBAL_BATCH_SIZE``; None: the pods carry none)
    batch: int | None = None
    #: (wall time, workers, global batch) of every generation it ran: a gang start, or
    #: a new worker count or batch
    generations: list[tuple[float, int, int | None]] = field(default_factory=list)


class ReplayTrainer:
    """Every job's chief on a kwok cluster, replaying the simulator's job model.

    Each tick it reads the namespace's TrainingJobs and worker pods. A job whose gang
    (``minWorkers`` pods or more) is Running on nodes advances by ``time_scale`` x the
    wall time since the last tick at the engine's rate for its current workers and the
    level their nodes span (:func:`rlsched.sim.job.throughput` on ``topology``),
    except during a restart: ``restart_cost_sim / time_scale`` wall seconds without
    progress after each resume (a gang starting again after a preemption) and each
    resize, as the engine charges. Every epoch boundary crossed is reported
    (:class:`rlsched.trainer.Reporter`) with the accuracy of the job's own seeded
    :class:`~rlsched.sim.convergence.ConvergenceModel` at the effective epochs reached
    at that boundary, and the loss of the same model: the numbers the engine reports.
    Progress stops at ``maxEpochs``; the operator decides completion (β stop).

    A job with an adaptive batch (``JobSpec.batch_size``) trains at the global batch
    its pods' worker contract carries (``RLSCHED_GLOBAL_BATCH_SIZE``, what the operator
    wrote into that generation): the engine's throughput at that batch and its
    statistical efficiency ``JobSpec.batch_efficiency``; each report also carries its
    gradient statistics (``JobSpec.grad_stats``), as ``rlsched.trainer`` reports them."""

    def __init__(self, api_client, namespace: str, jobs: Sequence[JobSpec], models: Mapping[str, Any],
                 topology: Topology, *, time_scale: float, restart_cost_sim: float, tick_s: float = 0.1,
                 clock: Callable[[], float] = time.time, gpu_types: Mapping[str, str] | None = None) -> None:
        from kubernetes import client

        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.topology = topology
        self.time_scale = float(time_scale)
        self.restart_wall = float(restart_cost_sim) / self.time_scale
        self.tick_s = tick_s
        self.clock = clock
        self.jobs = {s.id: _Replay(s, models.get(s.id)) for s in jobs}
        self.errors: list[str] = []
        self.types = (None if gpu_types is None
                      else [gpu_type_of(n.gpu_model, gpu_types) for n in topology.nodes])

    #: each node's GPU type as the engine reads them (``SimConfig.gpu_types``); None: no types
    types: list[str] | None = None

    def _rate(self, spec: JobSpec, nodes: Sequence[int], level, batch: int | None) -> float:
        """The engine's throughput of ``spec`` on ``nodes`` spanning ``level``: at the
        speed of the slowest GPU type among them (``JobSpec.gpu_speed``)."""
        if self.types is not None and spec.gpu_speed:
            spec = max((spec.on_gpu(self.types[i]) for i in set(nodes)), key=lambda s: s.compute_time)
        return throughput(spec, len(nodes), level, self.topology.bandwidth, batch)

    # ---- pure parts (tested without a cluster)
    def advance(self, r: _Replay, now: float) -> list[tuple[int, float, float]]:
        """Progress of ``r`` from its last advance to wall time ``now`` at its current
        rate; returns ``(epoch, accuracy, loss)`` for each epoch boundary crossed."""
        out: list[tuple[int, float, float]] = []
        spec, conv = r.spec, r.conv
        if r.workers and r.rate > 0:
            active = now - max(r.last, r.resume_at)
            if active > 0:
                spe = spec.samples_per_epoch
                cap = spec.max_epochs * spe
                if spec.batch_size is not None:  # an adaptive batch: the efficiency of the batch it runs at
                    w_eff = spec.batch_efficiency(r.batch)
                else:
                    w_eff = conv.efficiency(r.workers) if conv is not None else 1.0
                delta = min(r.rate * active * self.time_scale, cap - r.work_done)
                before, eff_before = r.work_done, r.eff
                r.work_done += delta
                r.eff += delta / spe * w_eff
                k = int((r.work_done + 1e-6) // spe)
                while r.epoch < min(k, spec.max_epochs):
                    r.epoch += 1
                    eff_k = eff_before + (r.epoch * spe - before) / spe * w_eff
                    if conv is not None:
                        acc = float(conv.evaluate([r.epoch], [eff_k])[0])
                        loss = float(conv.loss_at(eff_k))
                    else:
                        acc, loss = 0.0, 0.0
                    out.append((r.epoch, acc, loss))
        r.last = now
        return out

    def pause(self, r: _Replay, now: float) -> None:
        """The job is still Running but its generation is restarting (a resize or a
        failure: the old workers stopped, the new ones not all running yet): no
        progress, and the time until they run counts towards the restart cost."""
        if r.paused_at is None and r.nodes:
            r.paused_at = now
            r.rate = 0.0

    def reconfigure(self, r: _Replay, nodes: Sequence[int], now: float, batch: int | None = None) -> None:
        """The job now runs ``nodes`` (one per running worker; empty: not running) at
        global batch ``batch`` (its pods' worker contract; None: none): start, resume
        (restart cost), resize (restart cost) or stop. After a :meth:`pause` the new
        generation resumes ``restart_cost`` after the old one stopped (the engine
        charges a restart once, however long the pods take)."""
        nodes = tuple(sorted(nodes)) if len(nodes) >= r.spec.min_workers else ()
        batch = batch if nodes else None
        paused, r.paused_at = r.paused_at, None
        if paused is not None and nodes:
            if len(nodes) != len(r.nodes):
                r.sizes.append((now, len(nodes)))
            if len(nodes) != len(r.nodes) or batch != r.batch:
                r.generations.append((now, len(nodes), batch))
            counts: dict[int, int] = {}
            for i in nodes:
                counts[i] = counts.get(i, 0) + r.spec.gpus_per_worker
            r.workers, r.batch = len(nodes), batch
            r.rate = self._rate(r.spec, nodes, self.topology.span_level(counts), batch)
            r.resume_at = max(now, paused + self.restart_wall) if r.started else now
            r.nodes = nodes
            return
        if nodes == r.nodes and batch == r.batch:
            return
        names = [self.topology.nodes[i].name for i in nodes]
        if not nodes:
            r.workers, r.rate = 0, 0.0
        else:
            if not r.nodes:  # (re)start of the gang
                r.runs.append((now, sorted(names)))
                r.resume_at = now + self.restart_wall if r.started else now
                r.started = True
                r.generations.append((now, len(nodes), batch))
            elif len(nodes) != len(r.nodes) or batch != r.batch:  # a new generation
                r.resume_at = now + self.restart_wall
                r.generations.append((now, len(nodes), batch))
            counts: dict[int, int] = {}
            for i in nodes:
                counts[i] = counts.get(i, 0) + r.spec.gpus_per_worker
            level = self.topology.span_level(counts)
            r.workers = len(nodes)
            r.rate = self._rate(r.spec, nodes, level, batch)
        if len(nodes) != len(r.nodes):
            r.sizes.append((now, len(nodes)))
        r.nodes, r.batch = nodes, batch

    @staticmethod
    def speed(r: _Replay, generation: int) -> dict:
        """What the chief reports of its speed with each evaluation, as the engine
        records it for an allocation policy (``JobDynamics.report``): seconds per step
        (simulated) of its workers at their fixed batch, the worker count and the
        generation; with an adaptive batch the step time at the global batch its pods
        carry, that batch and its gradient statistics (``JobSpec.grad_stats``);
        nothing while it does not run or restarts."""
        if not r.workers or r.rate <= 0:
            return {}
        spec = r.spec
        if spec.batch_size is not None:
            batch = spec.global_batch(r.workers, r.batch)
            out = {"step_time_seconds": batch / r.rate, "workers": r.workers, "global_batch_size": batch,
                   "generation": int(generation)}
            stats = spec.grad_stats()
            if stats is not None:
                out["grad_sqr"], out["grad_var"] = stats
            return out
        return {"step_time_seconds": r.workers * r.spec.batch_per_worker / r.rate, "workers": r.workers,
                "global_batch_size": r.workers * r.spec.gpus_per_worker, "generation": int(generation)}

    # ---- the cluster side
    def tick(self) -> None:
        from rlsched.core.contract import (ENV_BATCH_SIZE, GROUP, LABEL_GENERATION, LABEL_JOB, PLURAL, VERSION,
                                           controlling_job)
        from rlsched.trainer import Reporter

        now = self.clock()
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=LABEL_JOB, _preload_content=False)
        pods = json.loads(pods.data)["items"]
        bodies = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        status = {b["metadata"]["name"]: (b.get("status") or {}) for b in bodies}
        phase = {name: st.get("phase") for name, st in status.items()}
        running: dict[str, list[int]] = {}
        batches: dict[str, set[int | None]] = {}  # the global batch each running worker's contract carries
        for p in pods:
            owner = controlling_job(p)
            st, md = p.get("status") or {}, p["metadata"]
            node = (p.get("spec") or {}).get("nodeName")
            if owner is None or md.get("deletionTimestamp") or st.get("phase") != "Running" or not node:
                continue
            gen = (md.get("labels") or {}).get(LABEL_GENERATION, "0")
            if gen != str((status.get(owner.name) or {}).get("restartGeneration") or 0):
                continue  # a worker of an older generation, on its way out
            i = self.topology.index.get(node)
            if i is not None:
                running.setdefault(owner.name, []).append(i)
                batches.setdefault(owner.name, set()).add(_pod_batch(p, ENV_BATCH_SIZE))
        for name, r in self.jobs.items():
            if name not in phase:
                continue
            reports = self.advance(r, now)
            if phase[name] in ("Succeeded", "Failed"):
                self.reconfigure(r, [], now)
                continue
            nodes = running.get(name, [])
            target = status[name].get("targetWorkers")
            if phase[name] == "Starting" and isinstance(target, int) and len(nodes) < target:
                nodes = []  # the gang trains once all its workers run (an allocator starts it above minWorkers)
            seen = batches.get(name) or {None}
            if len(seen) > 1:  # the workers of one generation disagree: a broken worker contract
                self._error(f"{name}: workers of one generation carry different global batches {sorted(seen, key=str)}")
            batch = max(seen, key=lambda b: -1 if b is None else b)
            if phase[name] == "Running" and r.nodes and isinstance(target, int) and len(nodes) < target:
                self.pause(r, now)  # its generation is restarting: every worker starts again
            else:
                self.reconfigure(r, nodes, now, batch)
            speed = self.speed(r, status[name].get("restartGeneration") or 0)
            for epoch, acc, loss in reports:
                try:
                    if r.reporter is None:
                        r.reporter = Reporter(name, self.namespace, api=self.api)
                    r.reporter.report(epoch=epoch, loss=loss, accuracy=acc, **speed)
                    r.reports.append((self.clock(), epoch, acc))
                except Exception as exc:  # a lost report is a twin error: recorded, the run goes on
                    self.errors.append(f"{name}: report of epoch {epoch} failed: {exc!r}")
                    log.warning("replay trainer: %s", self.errors[-1])

    def _error(self, msg: str) -> None:
        if msg not in self.errors:
            self.errors.append(msg)
            log.warning("replay trainer: %s", msg)

    def run_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.tick()
            except Exception as exc:
                self.errors.append(f"tick failed: {exc!r}")
                log.warning("replay trainer: tick failed: %r", exc)
            stop.wait(max(0.0, self.tick_s - (time.monotonic() - t0)))


def _pod_batch(pod: Mapping, name: str) -> int | None:
    """The global batch a worker pod's contract carries (env ``name`` of its first
    container that has it); None without one. A value that is not a whole number is
    returned as -1 (it cannot match any batch)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == name:
                try:
                    return int(e.get("value"))
                except (TypeError, ValueError):
                    return -1
    return None


@dataclass
class LiveRun:
    """The live side: its decision log in simulated seconds, per-job JCTs, what went wrong."""

    decisions: list[dict]
    jct: dict[str, float]
    unfinished: list[str]
    anomalies: list[str]
    wall_s: float
    t0: float
    #: wall seconds from an operator decision (Admitted/ScaledUp/ScaledDown event) to
    #: the trainer seeing the change in the running pods: binding, kwok, the tick
    latency: dict[str, list[float]] = field(default_factory=dict)
    #: per job, the global batch of each generation the trainer ran (from its pods'
    #: worker contract), in order; only jobs whose pods carried one
    batches: dict[str, list[int]] = field(default_factory=dict)


def decided_epoch(reports: Sequence[tuple[float, int, float]], t: float, gain: str) -> int | None:
    """The evaluation a scaling decision at wall time ``t`` acted on: the latest epoch
    reported before ``t`` whose convergence gain prints as the event's ``gain`` (the
    operator's ``{gain:.4g}`` of :func:`rlsched.core.planning.convergence_gain`, the
    mean gain over the last evaluations; ``inf`` before two evaluations), else the
    latest epoch reported before ``t``."""
    before = [(e, a) for ts, e, a in reports if ts <= t]
    if not before:
        return None
    acc = {e: a for e, a in before}
    for e, _ in reversed(before):
        hist = [acc[i] for i in range(1, e + 1) if i in acc]
        g = convergence_gain(hist) if len(hist) == e else float("inf")
        if f"{g:.4g}" == gain:
            return e
    return before[-1][0]


def live_log(events: Iterable[Mapping], created: Mapping[str, float], runs: Mapping[str, Sequence[tuple[float, list[str]]]],
             t0: float, time_scale: float,
             reports: Mapping[str, Sequence[tuple[float, int, float]]] | None = None) -> tuple[list[dict], dict[str, float], list[str]]:
    """The live decision log from the operator's Events on the TrainingJobs (dicts with
    ``job``, ``reason``, ``message``, ``time``: wall seconds), the wall time each job
    was created, the gang starts the trainer saw and the reports it wrote; times in
    simulated seconds since ``t0``. Returns ``(decisions, jct, anomalies)``."""
    import re

    def sim_t(t: float) -> float:
        return (t - t0) * time_scale

    out: list[dict] = []
    jct: dict[str, float] = {}
    anomalies: list[str] = []
    admits: dict[str, int] = {}
    for ev in sorted(events, key=lambda e: e["time"]):
        job, reason, msg, t = ev["job"], ev["reason"], ev.get("message") or "", float(ev["time"])
        if reason == "Admitted":
            n = admits.get(job, 0)
            admits[job] = n + 1
            seen = runs.get(job) or []
            nodes = seen[n][1] if n < len(seen) else []
            m = re.search(r"gang of (\d+) workers", msg)
            out.append({"kind": "admit", "job": job, "t": sim_t(t), "nodes": nodes,
                        "workers": int(m.group(1)) if m else len(nodes), "resume": n > 0})
        elif reason == "Preempted":
            m = re.search(r"preempted by (?:highest-priority job )?(\S+?)[;:]", msg)
            by = m.group(1).rsplit("/", 1)[-1] if m else ""
            out.append({"kind": "preempt", "job": job, "t": sim_t(t), "by": by})
        elif reason in ("ScaledUp", "ScaledDown"):
            m = re.search(r"workers (\d+) -> (\d+)", msg)
            g = re.search(r"accuracy gain (\S+?),", msg)
            at = re.search(r"at epoch (\d+)\)", msg)  # an allocator names the epoch it saw
            epoch = (int(at.group(1)) if at else
                     decided_epoch((reports or {}).get(job) or [], t, g.group(1)) if g else None)
            delta = int(m.group(2)) - int(m.group(1)) if m else (1 if reason == "ScaledUp" else -1)
            d = {"kind": "scale", "job": job, "t": sim_t(t), "delta": delta,
                 "workers": int(m.group(2)) if m else None, "epoch": epoch}
            b = re.search(r"global batch \S+ -> (\d+)", msg)  # an allocator's new batch (adaptive-batch jobs)
            if b:
                d["batch"] = int(b.group(1))
            out.append(d)
        elif reason == "Completed":
            out.append({"kind": "finish", "job": job, "t": sim_t(t)})
            if job in created:
                jct[job] = (t - created[job]) * time_scale
        elif reason in ANOMALY_EVENTS:
            anomalies.append(f"{job}: {reason}: {msg}")
    return out, jct, anomalies


def _latencies(decisions: Sequence[Mapping], trainer: ReplayTrainer, t0: float, k: float) -> dict[str, list[float]]:
    """Wall seconds from each admission and each resize the operator decided to the
    trainer seeing it in the running pods."""
    start, resize = [], []
    count: dict[str, int] = {}
    for d in decisions:
        r = trainer.jobs.get(d["job"])
        if r is None:
            continue
        t = t0 + d["t"] / k
        if d["kind"] == "admit":
            n = count.get(d["job"], 0)
            count[d["job"]] = n + 1
            if n < len(r.runs):
                start.append(r.runs[n][0] - t)
        elif d["kind"] == "scale":
            later = [ts for ts, w in r.sizes if ts >= t and w == d.get("workers")]
            if later:
                resize.append(later[0] - t)
    return {"start": start, "resize": resize}


def _job_events(core, namespace: str) -> list[dict]:
    from rlsched.core.contract import ANNOTATION_EVENT_TIME, KIND

    out = []
    for e in core.list_namespaced_event(namespace).items:
        if e.involved_object.kind != KIND:
            continue
        stamp = (e.metadata.annotations or {}).get(ANNOTATION_EVENT_TIME)
        if stamp is None:
            continue
        out.append({"job": e.involved_object.name, "reason": e.reason, "message": e.message, "time": float(stamp)})
    return out


def run_live(jobs: Sequence[JobSpec], env, cfg: TwinConfig, workdir: Path, *,
             extender: bool = True, progress: Callable[[str], None] | None = None) -> LiveRun:
    """Run ``jobs`` on the cluster of ``env`` (a :class:`rlsched_dev.cluster.KubeEnv`):
    the operator as its own process with its defaults except the cycle, the grace
    period and no forecast; the extender on the port the ``rlsched`` scheduler profile
    calls (unless ``extender=False``: one already serves there); the replay trainer in
    a thread; each job submitted at ``submit_time / time_scale`` wall seconds. Returns
    once every job has finished or failed, or after ``cfg.max_wall_s``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from rlsched.core.contract import GROUP, PLURAL, VERSION
    from rlsched.operator.main import install_crd, install_trainer_policy

    from .probe import http_ok
    from .proc import ClusterError, Process, free_ports, wait_for

    say = progress or (lambda m: None)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    api = env.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    install_crd(api)
    install_trainer_policy(api)
    ns = f"twin-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    procs: list[Process] = []
    stop = threading.Event()
    thread = None
    kc = str(env.kubeconfig)
    pyenv = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        if extender:
            port = env.extender_port
            if port is None:
                raise ClusterError("the rlsched scheduler profile calls a remote extender; cannot serve it here")
            ext = Process("extender", [sys.executable, "-m", "rlsched.cli", "extender", "serve", "--port", str(port),
                                       "--kubeconfig", kc, "--log-level", "WARNING"], workdir / "extender.log")
            ext.start(workdir, pyenv)
            procs.append(ext)
            wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "extender /readyz", ext, every=0.2)
        mport = free_ports(1)[0]
        op = Process("operator", [
            sys.executable, "-m", "rlsched.cli", "operator", "run", "--kubeconfig", kc, "--namespace", ns,
            "--cycle", f"{cfg.cycle_s:g}", "--start-timeout", "60", "--grace-period", str(cfg.grace_period_s),
            "--metrics-port", str(mport), "--forecast-interval", "0", "--patience", str(cfg.patience),
            "--allocator", cfg.live_allocator()], workdir / "operator.log")
        op.start(workdir, pyenv)
        procs.append(op)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{mport}/metrics"), 60, "operator /metrics", op, every=0.2)
        sim = make_simulator(jobs, env.topology, cfg)
        models = {s.id: sim.training_curve(s.id)[0] for s in jobs}
        trainer = ReplayTrainer(api, ns, jobs, models, env.topology, time_scale=cfg.time_scale,
                                restart_cost_sim=cfg.restart_cost_sim, tick_s=cfg.tick_s, gpu_types=cfg.gpu_types)
        types = set(trainer.types or ())
        thread = threading.Thread(target=trainer.run_until, args=(stop,), name="twin-trainer", daemon=True)
        thread.start()
        say(f"live: {len(jobs)} jobs in {ns}, 1 wall s = {cfg.time_scale:g} simulated s")
        t0 = time.time() + 0.5
        created: dict[str, float] = {}
        pending = sorted(jobs, key=lambda s: (s.submit_time, s.id))
        names = {s.id for s in jobs}
        deadline = time.monotonic() + cfg.max_wall_s
        terminal: set[str] = set()
        last_check = 0.0
        while time.monotonic() < deadline:
            now = time.time()
            while pending and t0 + pending[0].submit_time / cfg.time_scale <= now:
                s = pending.pop(0)
                created[s.id] = time.time()
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest(s, ns, types))
            for p in procs:
                p.check()
            if now - last_check > 1.0:
                last_check = now
                items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                terminal = {b["metadata"]["name"] for b in items
                            if (b.get("status") or {}).get("phase") in ("Succeeded", "Failed")}
                if not pending and terminal >= names:
                    break
            nxt = t0 + pending[0].submit_time / cfg.time_scale - time.time() if pending else 0.2
            time.sleep(min(0.2, max(0.01, nxt)))
        wall = time.time() - t0
        stop.set()
        thread.join(10)
        # the operator records a job's end in its status before it posts the event: wait for the events
        events = _job_events(core, ns)
        settle = time.monotonic() + 10.0
        while (time.monotonic() < settle and
               terminal - {e["job"] for e in events if e["reason"] in ("Completed", "Failed")}):
            time.sleep(0.2)
            events = _job_events(core, ns)
        decisions, jct, anomalies = live_log(events, created,
                                             {k: r.runs for k, r in trainer.jobs.items()}, t0, cfg.time_scale,
                                             {k: r.reports for k, r in trainer.jobs.items()})
        anomalies += trainer.errors
        unfinished = sorted(names - set(jct))
        say(f"live: done in {wall:.0f} s wall, {len(unfinished)} unfinished")
        batches = {k: [b for _, _, b in r.generations if b is not None] for k, r in trainer.jobs.items()}
        return LiveRun(decisions, jct, unfinished, anomalies, wall, t0, _latencies(decisions, trainer, t0, cfg.time_scale),
                       {k: v for k, v in batches.items() if v})
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
        try:
            for b in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, b["metadata"]["name"])
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            core.delete_namespace(ns)
        except ApiException as exc:
            log.warning("twin: cleaning up namespace %s: %s %s", ns, exc.status, exc.reason)
        for p in reversed(procs):
            p.stop()
        api.close()


# --------------------------------------------------------------------------- comparison
def _same_step(x: tuple, y: tuple, slack: int) -> bool:
    """Two (delta, epoch) steps match: the same direction, epochs at most ``slack``
    apart (an unknown epoch matches only an unknown one)."""
    if x[0] != y[0]:
        return False
    if x[1] is None or y[1] is None:
        return x[1] is None and y[1] is None
    return abs(x[1] - y[1]) <= slack


def _edits(a: Sequence, b: Sequence, slack: int = 0) -> int:
    """Levenshtein distance of two short sequences of (delta, epoch) steps, two steps
    being equal when :func:`_same_step` with ``slack`` says so."""
    return _edits_by(a, b, lambda x, y: _same_step(x, y, slack))


def _edits_by(a: Sequence, b: Sequence, same: Callable[[Any, Any], bool]) -> int:
    """Levenshtein distance of two short sequences, two entries being equal when
    ``same`` says so."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (not same(x, y))))
        prev = cur
    return prev[-1]


def _same_batch(x: int, y: int, rel: float) -> bool:
    return abs(x - y) <= rel * max(abs(x), abs(y))


def batch_sequences(decisions: Sequence[Mapping]) -> dict[str, list[int]]:
    """Per job, the global batch of each of its runs in a decision log: the ``batch``
    of its admissions and resizes in time order (jobs whose log names none are left
    out: they have no adaptive batch)."""
    out: dict[str, list[int]] = {}
    for d in sorted(decisions, key=lambda d: d["t"]):
        if d["kind"] in ("admit", "scale") and d.get("batch") is not None:
            out.setdefault(d["job"], []).append(int(d["batch"]))
    return out


def _admissions(decisions: Sequence[Mapping]) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = {}
    count: dict[str, int] = {}
    for d in sorted((d for d in decisions if d["kind"] == "admit"), key=lambda d: d["t"]):
        n = count.get(d["job"], 0)
        count[d["job"]] = n + 1
        out[(d["job"], n)] = d
    return out


def _path_decisions(job: str, decisions: Sequence[Mapping], submit: float) -> int:
    """Decisions on ``job``'s path in a log: its own admissions, worker changes and
    preemptions, and the hand-offs it waited for in the queue: other jobs' completions,
    give-backs and preemptions (live, each frees GPUs only once the old pods have
    stopped, one more cycle before the waiting job is admitted)."""
    own = [d for d in decisions if d["job"] == job and d["kind"] in ("admit", "scale", "preempt")]
    waits, start = [], submit
    for d in sorted((d for d in decisions if d["job"] == job and d["kind"] in ("admit", "preempt")), key=lambda d: d["t"]):
        if d["kind"] == "admit" and start is not None:
            waits.append((start, d["t"]))
            start = None
        elif d["kind"] == "preempt":
            start = d["t"]
    def frees(d: Mapping) -> bool:
        return d["kind"] in ("finish", "preempt") or (d["kind"] == "scale" and d.get("delta", 0) < 0)

    handoffs = sum(1 for d in decisions if d["job"] != job and frees(d)
                   and any(a <= d["t"] <= b for a, b in waits))
    return len(own) + handoffs


def compare(sim: Mapping, live: Mapping, *, latency: float, tol: Tolerances = Tolerances()) -> dict:
    """Hold the live log against the simulated one.

    ``sim`` and ``live``: ``{"decisions": [...], "jct": {job: s}, "unfinished": [...],
    "submit": {job: s}}`` (``live`` may add ``"anomalies"``), all times in simulated
    seconds; either may add ``"batches"`` (``{job: [global batch of each run]}``, live:
    what the pods carried), else they are read from its decisions
    (:func:`batch_sequences`); ``latency``: one live decision latency in simulated
    seconds (:attr:`TwinConfig.latency_sim`). Returns the report: per check its
    verdict and the evidence, and ``ok``."""
    sd, ld = list(sim["decisions"]), list(live["decisions"])
    submit = dict(sim.get("submit") or {})
    report: dict[str, Any] = {"latency_sim": latency, "tolerances": asdict(tol)}

    # admissions: same set, same order beyond the latency window
    sa, la = _admissions(sd), _admissions(ld)
    common = sorted(set(sa) & set(la), key=lambda k: sa[k]["t"])
    window = tol.order_latencies * latency
    swaps = []
    for i, a in enumerate(common):
        for b in common[i + 1:]:
            ds, dl = sa[b]["t"] - sa[a]["t"], la[b]["t"] - la[a]["t"]
            if (ds > 0) != (dl > 0) and ds != 0 and abs(ds) > window and abs(dl) > window:
                swaps.append({"first": f"{a[0]}#{a[1]}", "second": f"{b[0]}#{b[1]}", "sim_gap": ds, "live_gap": dl})
    delays = {f"{k[0]}#{k[1]}": la[k]["t"] - sa[k]["t"] for k in common}
    same_level = 0
    for k in common:
        same_level += int(len(set(sa[k].get("nodes") or [])) == len(set(la[k].get("nodes") or [])))
    report["admissions"] = {
        "sim": len(sa), "live": len(la), "matched": len(common),
        "missing_live": sorted(f"{j}#{n}" for j, n in set(sa) - set(la)),
        "extra_live": sorted(f"{j}#{n}" for j, n in set(la) - set(sa)),
        "order_sim": [f"{k[0]}#{k[1]}" for k in sorted(sa, key=lambda k: sa[k]["t"])],
        "order_live": [f"{k[0]}#{k[1]}" for k in sorted(la, key=lambda k: la[k]["t"])],
        "swaps_beyond_window": swaps, "order_window_sim": window,
        "delay_sim": delays,
        "delay_mean_sim": float(np.mean(list(delays.values()))) if delays else 0.0,
        "delay_max_sim": float(max(delays.values(), key=abs)) if delays else 0.0,
        "same_node_count": same_level,
        "ok": len(common) == len(sa) == len(la) and not swaps,
    }

    # preemptions: the same victims of the same preemptors
    def pre(log_):
        return sorted((d["job"], d.get("by", "")) for d in log_ if d["kind"] == "preempt")

    sp, lp = pre(sd), pre(ld)
    report["preemptions"] = {"sim": [list(x) for x in sp], "live": [list(x) for x in lp], "ok": sp == lp}

    # scaling: each job's sequence of worker changes
    jobs = sorted(set(submit) | {d["job"] for d in sd} | {d["job"] for d in ld})
    per_job = {}
    bad = []
    for j in jobs:
        s_seq = [(d["delta"], d.get("epoch")) for d in sorted(sd, key=lambda d: d["t"]) if d["job"] == j and d["kind"] == "scale"]
        l_seq = [(d["delta"], d.get("epoch")) for d in sorted(ld, key=lambda d: d["t"]) if d["job"] == j and d["kind"] == "scale"]
        exact = _edits(s_seq, l_seq)
        e = _edits(s_seq, l_seq, tol.scale_epoch_slack)
        per_job[j] = {"sim": s_seq, "live": l_seq, "edits": e, "exact_edits": exact}
        if e > tol.scale_edits:
            bad.append(j)
    n_s = sum(len(v["sim"]) for v in per_job.values())
    report_same_direction = sum(1 for v in per_job.values() if [x[0] for x in v["sim"]] == [x[0] for x in v["live"]])
    n_l = sum(len(v["live"]) for v in per_job.values())
    def updown(side: str) -> list[int]:
        deltas = [d for v in per_job.values() for d, _ in v[side]]
        return [sum(1 for d in deltas if d > 0), sum(1 for d in deltas if d < 0)]

    report["scaling"] = {"jobs": per_job, "sim_steps": n_s, "live_steps": n_l,
                         "sim_up_down": updown("sim"), "live_up_down": updown("live"),
                         "identical_jobs": sum(1 for v in per_job.values() if v["exact_edits"] == 0),
                         "same_directions_jobs": report_same_direction,
                         "beyond_tolerance": bad, "ok": not bad}

    # global batch sizes: each adaptive-batch job's batch per run
    sb = dict(sim["batches"]) if "batches" in sim else batch_sequences(sd)
    lb = dict(live["batches"]) if "batches" in live else batch_sequences(ld)
    per_batch, bad_batch = {}, []
    for j in sorted(set(sb) | set(lb)):
        s_seq, l_seq = list(sb.get(j) or []), list(lb.get(j) or [])
        e = _edits_by(s_seq, l_seq, lambda x, y: _same_batch(x, y, tol.batch_rel))
        allowed = min(per_job.get(j, {}).get("edits", 0), tol.scale_edits)  # what its steps were forgiven
        per_batch[j] = {"sim": s_seq, "live": l_seq, "edits": e, "allowed": allowed}
        if e > allowed:
            bad_batch.append(j)

    def changed(seqs: Mapping[str, Sequence[int]]) -> list[str]:
        return sorted(j for j, v in seqs.items() if len(set(v)) > 1)

    report["batch"] = {"jobs": per_batch, "changed_sim": changed(sb), "changed_live": changed(lb),
                       "identical_jobs": sum(1 for v in per_batch.values() if v["sim"] == v["live"]),
                       "beyond_tolerance": bad_batch, "ok": not bad_batch}

    # JCT
    rows = {}
    bad_jct = []
    for j in jobs:
        s, l = sim["jct"].get(j), live["jct"].get(j)
        if s is None or l is None:
            rows[j] = {"sim": s, "live": l, "ok": False}
            bad_jct.append(j)
            continue
        d = _path_decisions(j, sd, submit.get(j, 0.0))
        allowed = tol.jct(latency, d, s)
        ok = abs(l - s) <= allowed
        rows[j] = {"sim": s, "live": l, "diff": l - s, "rel": (l - s) / s if s else 0.0, "decisions": d,
                   "tolerance": allowed, "ok": ok}
        if not ok:
            bad_jct.append(j)
    diffs = np.array([r["diff"] for r in rows.values() if "diff" in r], dtype=float)
    rels = np.array([r["rel"] for r in rows.values() if "rel" in r], dtype=float)
    report["jct"] = {
        "jobs": rows, "beyond_tolerance": bad_jct,
        "mean_abs_diff_sim": float(np.mean(np.abs(diffs))) if diffs.size else None,
        "max_abs_diff_sim": float(np.max(np.abs(diffs))) if diffs.size else None,
        "mean_diff_sim": float(np.mean(diffs)) if diffs.size else None,
        "mean_abs_rel": float(np.mean(np.abs(rels))) if rels.size else None,
        "max_abs_rel": float(np.max(np.abs(rels))) if rels.size else None,
        "ok": not bad_jct,
    }
    unfinished = sorted(set(sim.get("unfinished") or []) | set(live.get("unfinished") or []))
    anomalies = list(live.get("anomalies") or [])
    report["unfinished"] = unfinished
    report["anomalies"] = anomalies
    report["ok"] = bool(report["admissions"]["ok"] and report["preemptions"]["ok"] and report["scaling"]["ok"]
                        and report["batch"]["ok"] and report["jct"]["ok"] and not unfinished and not anomalies)
    return report


def render_markdown(report: Mapping, *, title: str = "Twin check") -> str:
    """The comparison as a short markdown report."""
    a, p, s, j = report["admissions"], report["preemptions"], report["scaling"], report["jct"]

    def v(ok: bool) -> str:
        return "pass" if ok else "**FAIL**"

    lines = [f"## {title}: {'pass' if report['ok'] else 'FAIL'}", "",
             f"One live decision latency L = {report['latency_sim']:.0f} simulated s.", "",
             "| check | simulated | live | verdict |", "|---|---|---|---|",
             f"| admissions (incl. resumes) | {a['sim']} | {a['live']} (matched {a['matched']}, "
             f"order swaps beyond {a['order_window_sim']:.0f} s: {len(a['swaps_beyond_window'])}) | {v(a['ok'])} |",
             f"| preemptions (victim <- preemptor) | {', '.join(f'{x} <- {y}' for x, y in p['sim']) or '-'} | "
             f"{', '.join(f'{x} <- {y}' for x, y in p['live']) or '-'} | {v(p['ok'])} |",
             f"| scaling steps (up/down) | {s['sim_steps']} ({_ud(s.get('sim_up_down'))}) | {s['live_steps']} "
             f"({_ud(s.get('live_up_down'))}; identical sequences: {s['identical_jobs']}/{len(s['jobs'])} jobs) "
             f"| {v(s['ok'])} |",
             *_batch_row(report.get("batch"), v),
             f"| JCT | | mean abs diff {_f(j['mean_abs_diff_sim'])} s ({_f(j['mean_abs_rel'], 100)}%), max "
             f"{_f(j['max_abs_diff_sim'])} s | {v(j['ok'])} |", ""]
    if report["unfinished"]:
        lines += [f"Unfinished: {', '.join(report['unfinished'])}", ""]
    if report["anomalies"]:
        lines += ["Anomalies (live):", *[f"- {x}" for x in report["anomalies"]], ""]
    lines += ["| job | sim JCT | live JCT | diff | tolerance | scaling sim | scaling live |", "|---|---|---|---|---|---|---|"]
    for name, row in j["jobs"].items():
        sc = s["jobs"].get(name, {"sim": [], "live": []})
        lines.append(f"| {name} | {_f(row.get('sim'))} | {_f(row.get('live'))} | {_f(row.get('diff'))} | "
                     f"{_f(row.get('tolerance'))}{'' if row['ok'] else ' **!**'} | {_seq(sc['sim'])} | {_seq(sc['live'])} |")
    b = report.get("batch") or {}
    if b.get("jobs"):
        lines += ["", "| job | global batch per run, sim | live (pods' worker contract) | edits |", "|---|---|---|---|"]
        for name, row in b["jobs"].items():
            mark = " **!**" if name in b["beyond_tolerance"] else ""
            lines.append(f"| {name} | {_bseq(row['sim'])} | {_bseq(row['live'])} | {row['edits']} "
                         f"(allowed {row.get('allowed', 0)}){mark} |")
    return "\n".join(lines) + "\n"


def _batch_row(b: Mapping | None, v: Callable[[bool], str]) -> list[str]:
    """The summary row of the batch check (none when no job has an adaptive batch)."""
    if not b or not b.get("jobs"):
        return []
    return [f"| global batch per run (jobs changing it) | {', '.join(b['changed_sim']) or '-'} | "
            f"{', '.join(b['changed_live']) or '-'} (identical sequences: {b['identical_jobs']}/{len(b['jobs'])} jobs) "
            f"| {v(b['ok'])} |"]


def _bseq(seq: Sequence[int]) -> str:
    return " -> ".join(str(x) for x in seq) or "-"


def _f(x, scale: float = 1.0) -> str:
    return "-" if x is None else f"{x * scale:.0f}" if abs(x * scale) >= 10 else f"{x * scale:.1f}"


def _ud(x) -> str:
    return "-" if not x else f"+{x[0]}/-{x[1]}"


def _seq(seq: Sequence) -> str:
    """``+1@3 -1@7 0@9``: each worker change (``0``: a new generation at the same size,
    a move to another GPU type) and the epoch it acted on."""
    return " ".join(("+1" if d > 0 else "-1" if d < 0 else "0") + ("" if e is None else f"@{e}")
                    for d, e in seq) or "-"


# --------------------------------------------------------------------------- the whole check
def sim_side(jobs: Sequence[JobSpec], topology: Topology, cfg: TwinConfig) -> dict:
    run = simulate(jobs, topology, cfg)
    return {"decisions": run.decisions, "jct": run.jct, "unfinished": run.unfinished,
            "submit": {s.id: s.submit_time for s in jobs}}


def twin_workload(cfg: TwinConfig, topology: Topology) -> list[JobSpec]:
    """The job set of the check: :func:`twin_jobs`, arrivals kept 1.5 latencies away
    from other decisions (:func:`separate_arrivals`) in the simulated run."""
    jobs = twin_jobs(cfg.jobs, cfg.seed, cluster_gpus=topology.total_gpus)
    return separate_arrivals(jobs, topology, cfg, 1.5 * cfg.latency_sim)


def twin_check(cfg: TwinConfig, env, workdir: Path, *, extender: bool = True, tol: Tolerances = Tolerances(),
               progress: Callable[[str], None] | None = None, jobs: Sequence[JobSpec] | None = None) -> dict:
    """Both runs of ``cfg.jobs`` seeded jobs (or of ``jobs``, a scenario) on ``env``
    and their comparison (the report of :func:`compare` plus the configuration, the job
    set, both logs, the live latencies and the wall time)."""
    with t4_nodes(env, cfg.t4_nodes) as env:
        return _twin_check(cfg, env, workdir, extender=extender, tol=tol, progress=progress, jobs=jobs)


@contextlib.contextmanager
def t4_nodes(env, n: int):
    """``env`` with ``n`` kwok nodes of 4 ``Tesla-T4`` added (in their own rack, ready),
    its topology theirs too; deleted on exit. ``n = 0``: ``env`` as it is."""
    if not n:
        yield env
        return
    from rlsched.core.topology import NodeSpec

    from .nodes import create_gpu_nodes, delete_gpu_nodes, wait_nodes_ready

    specs = [NodeSpec(f"twin-t4-{i}", 4, gpu_model="Tesla-T4", rack="rack-t4", block=env.topology.nodes[0].block,
                      nvlink_domain_size=4) for i in range(n)]
    from kubernetes import client

    api = env.api_client()
    core = client.CoreV1Api(api)
    names: list[str] = []
    try:
        names = create_gpu_nodes(core, Topology(specs))
        wait_nodes_ready(core, names, timeout=60)
        yield replace(env, topology=Topology(list(env.topology.nodes) + specs, env.topology.bandwidth),
                      node_names=list(env.node_names) + names)
    finally:
        if names:
            delete_gpu_nodes(core, names)
            deadline = time.monotonic() + 60
            while {x.metadata.name for x in core.list_node().items} & set(names) and time.monotonic() < deadline:
                time.sleep(0.2)
        api.close()


def _twin_check(cfg: TwinConfig, env, workdir: Path, *, extender: bool, tol: Tolerances,
                progress: Callable[[str], None] | None, jobs: Sequence[JobSpec] | None) -> dict:
    say = progress or (lambda m: None)
    _check_topology(env)
    jobs = list(jobs) if jobs is not None else twin_workload(cfg, env.topology)
    sim = sim_side(jobs, env.topology, cfg)
    say(f"simulated: {len(sim['decisions'])} decisions")
    live = run_live(jobs, env, cfg, workdir, extender=extender, progress=progress)
    lv = {"decisions": live.decisions, "jct": live.jct, "unfinished": live.unfinished, "anomalies": live.anomalies,
          "batches": live.batches}
    report = compare(sim, lv, latency=cfg.latency_sim, tol=tol)
    lat = {k: {"n": len(v), "mean_s": float(np.mean(v)) if v else None, "max_s": float(np.max(v)) if v else None,
               "p95_s": float(np.percentile(v, 95)) if v else None} for k, v in live.latency.items()}
    report.update(config=asdict(cfg), wall_s=live.wall_s, live_latency=lat, jobs=[s.to_dict() for s in jobs],
                  sim_log=sim["decisions"], live_log=live.decisions)
    return report


def _check_topology(env) -> None:
    """The kwok nodes, read back through the API server, are the topology the
    simulator runs on (names, GPUs, racks, NVLink domains)."""
    from rlsched.core.contract import node_shape

    from kubernetes import client

    api = env.api_client()
    try:
        nodes = client.CoreV1Api(api).list_node(_preload_content=False)
        items = json.loads(nodes.data)["items"]
    finally:
        api.close()
    shapes = [node_shape(n) for n in items]
    live = Topology.from_labels([(s.name, s.labels, s.gpus) for s in shapes if s.gpus > 0])
    want = {(n.name, n.gpus, n.rack, n.block, n.nvlink_domain_size) for n in env.topology.nodes}
    got = {(n.name, n.gpus, n.rack, n.block, n.nvlink_domain_size) for n in live.nodes}
    if not want <= got:
        raise ValueError(f"the kwok nodes are not the simulated topology: missing {sorted(want - got)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlsched_dev.twin``: the twin check on a fresh local control plane."""
    ap = argparse.ArgumentParser(prog="python -m rlsched_dev.twin", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=TwinConfig.time_scale)
    ap.add_argument("--cycle", type=float, default=TwinConfig.cycle_s)
    ap.add_argument("--t4-nodes", type=int, default=0,
                    help="kwok nodes of 4 Tesla-T4 added for the check: a cluster of two GPU types")
    ap.add_argument("--out", default="out/twin", help="directory for report.json, report.md and logs")
    args = ap.parse_args(argv)
    from .cluster import kube_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = TwinConfig(jobs=args.jobs, seed=args.seed, time_scale=args.time_scale, cycle_s=args.cycle,
                     t4_nodes=args.t4_nodes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with kube_env(progress=lambda m: log.info("%s", m)) as env:
        report = twin_check(cfg, env, out / "logs", progress=lambda m: log.info("%s", m))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(render_markdown(report))
    print(render_markdown(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
