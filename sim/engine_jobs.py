"""The event engine's job model: the engine-side state of one job and its dynamics.

:class:`JobDynamics` turns a job's placement into its speed, fee and progress, and its
progress into the accuracy curve, stop epoch and reports a live trainer would give
(convergence model: :mod:`.convergence`; throughput: :mod:`.job`). A part of
:class:`~rlsched.sim.engine.Simulator`, which owns the clock and the jobs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from rlsched.core import ClusterState, JobView, Level, Topology
from rlsched.core.batch import UNIT_BATCH
from rlsched.core.contract import gpu_type_of
from rlsched.core.estimate import estimate_remaining
from rlsched.core.goodput import JobObservations
from rlsched.core.live_allocation import one_type
from rlsched.core.planning import ElasticState, convergence_gains

from .convergence import ConvergenceModel, stop_epoch
from .job import JobSpec, batch_rate, comm_time, ideal_level, throughput, topology_limits

#: event kinds on the engine's heap, in the order processed at one time
FINISH, ARRIVAL, SCALE, WAKE = 0, 1, 2, 3
#: a job's status
PENDING, RUNNING, DONE, DROPPED, FUTURE = 0, 1, 2, 3, 4


def curve_grad_stats(gamma: float, batch_per_worker: int) -> tuple[float, float]:
    """``(gradSqr, gradVar)`` (per-sample) a trainer of a job on ``ConvergenceModel``'s
    curve reports: the curve's efficiency at ``w`` workers of ``b`` samples each,
    ``1 / (1 + γ(w − 1))``, is Pollux's ``(φ + b)/(φ + w·b)`` with the noise scale
    ``φ = b(1 − γ)/γ`` samples (all noise, ``φ = ∞``, at ``γ = 0``)."""
    if gamma <= 0:
        return 0.0, 1.0
    return 1.0, batch_per_worker * (1.0 - gamma) / gamma


def grown(v: JobView, delta: int) -> JobView:
    """``v`` as the placement sees it while adding ``delta`` workers: the job at its new
    size with its current placement, as every worker of a gang is placed (``workers``
    the gang, ``placement`` the workers placed so far) and as the extender scores an
    added worker pod (its ``rlsched.dev/gang-size`` is the new count). Placing it as a
    job of its old size counted the gang's GPUs one worker short in DAS's room and
    learned terms (found by the twin check)."""
    return dataclasses.replace(v, workers=v.workers + delta, max_workers=max(v.max_workers, v.workers + delta),
                               placement=list(v.placement))


class JobState:
    """Engine-side mutable state of one job (not part of the public API)."""

    __slots__ = (
        "spec", "view", "conv", "status", "work_total", "work_done", "rate", "seg_start",
        "resume_at", "eff", "fee", "fee_rate", "version", "accs", "acc_first", "ideal",
        "level0", "rescales", "w0", "first_start", "preemptions", "elastic", "ran", "obs", "reported", "batch",
        "gpu_type", "alloc_at", "restart_s",
    )

    def __init__(self, spec: JobSpec, conv: ConvergenceModel | None) -> None:
        self.spec = spec
        self.view = spec.view()
        self.conv = conv
        self.status = FUTURE
        self.work_total = 0.0
        self.work_done = 0.0
        self.rate = 0.0
        self.seg_start = 0.0
        self.resume_at = 0.0
        #: when it was last given new GPUs that it pays a restart for (:meth:`stall`)
        self.alloc_at: float | None = None
        #: the last such stall over before that
        self.restart_s: float | None = None
        self.eff = 0.0
        self.fee = 0.0
        self.fee_rate = 0.0
        self.version = 0
        self.accs: np.ndarray | None = None
        self.acc_first = 1
        self.ideal = 0.0
        self.level0 = -1
        self.rescales = 0
        self.w0 = spec.workers
        self.first_start: float | None = None
        self.preemptions = 0
        #: what core's ScalingPlanner remembers of the job (the operator's status.rlpto)
        self.elastic = ElasticState()
        self.ran = 0.0  # seconds it held its workers (what a live operator measures)
        #: the step times it "reported" (an allocation policy's input: status.goodput live)
        self.obs = JobObservations(spec.bounds or UNIT_BATCH)
        self.reported = 0  # the epoch of its last report
        #: the global batch a scheduler set for its current run (an adaptive batch while
        #: it runs under an allocation policy; None: ``spec.batch_size``, or none)
        self.batch: int | None = None
        #: the GPU type of its nodes while it runs on one type (``""``: none, or no types)
        self.gpu_type = ""

    def restarted(self, t: float, resume_at: float) -> None:
        """New GPUs at ``t``, stepping again from ``resume_at``."""
        self.restart_s = self.stall(t)
        self.alloc_at, self.resume_at = t, resume_at

    def stall(self, now: float) -> float | None:
        """Its last restart stall over by ``now``, as the operator's
        ``status.restartStall`` shows it (:attr:`AllocJob.restart_s`); None: none yet."""
        if self.alloc_at is not None and now >= self.resume_at:
            return self.resume_at - self.alloc_at
        return self.restart_s


def build_jobs(specs, rng: np.random.Generator) -> tuple[list[JobState], np.ndarray, list[int]]:
    """The jobs in submission order, with the standard-normal evaluation noise of the
    training jobs and where each one's starts: per-job convergence seeds and noise are
    drawn from ``rng`` in job-list order."""
    order = sorted(range(len(specs)), key=lambda k: (specs[k].submit_time, k))
    seeds = rng.integers(0, 2**63 - 1, size=len(specs)).tolist()
    lengths = np.array([0 if j.fixed else j.max_epochs for j in specs], dtype=np.int64)
    noise = rng.standard_normal(int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    jobs: list[JobState] = []
    noise_off: list[int] = []
    for k in order:
        spec = specs[k]
        conv = None
        if not spec.fixed:
            conv = spec.convergence_model(seeds[k], noise[offsets[k] : offsets[k + 1]])
            noise_off.append(offsets[k])
        jobs.append(JobState(spec, conv))
    return jobs, noise, noise_off


class JobDynamics:
    """A job's speed, fee and progress on the cluster: its ideal run time and accuracy
    curve, its rate at its placement, its progress up to a time, where it stops, and
    what its trainer reports. ``clairvoyant``: the views carry true remaining times."""

    def __init__(self, topology: Topology, state: ClusterState, clairvoyant: bool,
                 gpu_types: Mapping[str, str] | None = None) -> None:
        self.state = state
        self.clairvoyant = clairvoyant
        #: each node's GPU type (``SimConfig.gpu_types``); None: no types
        self.types: dict[int, str] | None = (None if gpu_types is None else
                                             {i: gpu_type_of(n.gpu_model, gpu_types) for i, n in enumerate(topology.nodes)})
        self._bw = topology.bandwidth
        self._limits = topology_limits(topology)
        self._domain = [max(n.nvlink_domain_size, 1) for n in topology.nodes]
        self._price = np.array([n.price_per_gpu_hour for n in topology.nodes]) / 3600.0
        self._best_bw: dict[int, float] = {}
        self._fit_cache: dict[tuple, int] = {}

    def prepare(self, j: JobState) -> None:
        """Ideal run time and (training jobs) the accuracy curve at the requested workers."""
        spec = j.spec
        w = spec.workers
        if spec.fixed:
            j.ideal = float(spec.duration)
            j.work_total = j.ideal
            return
        best = self.best_step(spec, w)
        conv = j.conv
        spe = spec.samples_per_epoch
        epochs = np.arange(1, spec.max_epochs + 1)
        accs = conv.evaluate(epochs, epochs * self.efficiency(j, w))
        e_stop = stop_epoch(accs, 1, (), 0, spec.beta, spec.patience, spec.max_epochs)
        j.accs, j.acc_first = accs, 1
        j.work_total = float(e_stop * spe)
        j.ideal = j.work_total / self.ideal_throughput(spec, w, best)

    @staticmethod
    def efficiency(j: JobState, workers: int | None = None) -> float:
        """Statistical efficiency of one sample of ``j`` now: at its global batch with an
        adaptive batch (:meth:`JobSpec.batch_efficiency`), else the convergence model's
        at ``workers`` (default its current workers)."""
        if j.spec.batch_size is not None:
            return j.spec.batch_efficiency(j.batch)
        return j.conv.efficiency(j.view.workers if workers is None else workers)

    @staticmethod
    def ideal_throughput(spec: JobSpec, workers: int, best: float) -> float:
        """Samples per second at ``workers`` at the best step time ``best`` (at
        ``batch_size`` with an adaptive batch)."""
        if spec.batch_size is None:
            return workers * spec.batch_per_worker / best
        return batch_rate(spec, workers, spec.batch_size, best - spec.compute_time)

    def best_step(self, spec: JobSpec, workers: int) -> float:
        """Step time at the fastest level any placement of ``workers`` can reach."""
        n = workers * spec.gpus_per_worker
        bw = self._best_bw.get(n)
        if bw is None:
            lvl = int(ideal_level(n, self._limits))
            bw = self._best_bw[n] = max(self._bw.at(Level(v)) for v in range(lvl, int(Level.CLUSTER) + 1))
        return spec.compute_time + comm_time(spec.grad_gb, n, bw)

    def prepare_all(self, jobs: list[JobState], noise: np.ndarray, noise_off: list[int], chunk: int = 8192) -> None:
        """:meth:`prepare` for every job at once, vectorised over jobs: the same
        formulas as :meth:`ConvergenceModel.evaluate` and :func:`stop_epoch`, with
        ``noise[noise_off[k] + e - 1]`` the standard-normal noise of training job k
        after epoch e."""
        train = [j for j in jobs if j.conv is not None and j.spec.batch_size is None]
        for j in jobs:
            if j.conv is None or j.spec.batch_size is not None:  # an adaptive batch: its own efficiency
                self.prepare(j)
        for lo in range(0, len(train), chunk):
            part = train[lo : lo + chunk]
            specs = [j.spec for j in part]
            accs, stop = _curves(specs, [j.conv for j in part], noise, noise_off[lo : lo + len(part)])
            for r, j in enumerate(part):
                spec = specs[r]
                j.accs, j.acc_first = accs[r, : spec.max_epochs], 1
                j.work_total = float(stop[r] * spec.samples_per_epoch)
                j.ideal = j.work_total / (spec.workers * spec.batch_per_worker / self.best_step(spec, spec.workers))

    def fit_slots(self, v: JobView) -> int:
        """Workers of ``v`` the empty cluster could host (GPUs, GPU model, CPU, memory)."""
        key = (v.gpus_per_worker, v.gpu_models, v.cpu_milli, v.memory_mib)
        slots = self._fit_cache.get(key)
        if slots is None:
            st = self.state
            c = st.candidates_total(v.gpus_per_worker, v.gpu_models)
            per = st.total[c] // v.gpus_per_worker
            if v.cpu_milli > 0:
                per = np.minimum(per, st.cpu_total[c] // v.cpu_milli)
            if v.memory_mib > 0:
                per = np.minimum(per, st.mem_total[c] // v.memory_mib)
            slots = int(per.sum())
            self._fit_cache[key] = slots
        return slots

    def level(self, v: JobView) -> Level:
        p = v.placement
        first = p[0]
        if len(p) == 1 or all(i == first for i in p):  # one node: Topology.span_level's rule, inlined
            dom = self._domain[first]
            return Level.NVLINK if v.gpus <= dom else Level.NODE
        return self.state.span_level(p, v.gpus_per_worker)

    def set_rate(self, j: JobState) -> int:
        """Rate, fee rate and throughput at the job's placement; returns its level."""
        v, spec = j.view, j.spec
        lvl = self.level(v)
        if self.types is not None:
            j.gpu_type = one_type(v.placement, self.types) or ""
            if spec.gpu_speed:  # on nodes of several types, at the slowest one's speed
                spec = max((spec.on_gpu(self.types[i]) for i in set(v.placement)), key=lambda s: s.compute_time,
                           default=spec)
        thr = throughput(spec, v.workers, lvl, self._bw, j.batch)
        if spec.fixed:
            ideal_thr = spec.workers * spec.batch_per_worker / self.best_step(spec, spec.workers)
            j.rate = thr / ideal_thr
        else:
            j.rate = thr
        price = self._price
        j.fee_rate = v.gpus_per_worker * float(sum(price[i] for i in v.placement))
        v.throughput = thr / max(v.workers, 1)
        return int(lvl)

    def retarget(self, j: JobState) -> None:
        """Recompute when a training job stops, from its history and current workers."""
        spec, conv, v = j.spec, j.conv, j.view
        spe = spec.samples_per_epoch
        k = v.progress.epoch
        if k >= spec.max_epochs:
            j.work_total = j.work_done
            j.accs, j.acc_first = np.empty(0), k + 1
            return
        hist = v.progress.history
        small = convergence_gains(np.asarray(hist, dtype=float)) < spec.beta if hist else np.zeros(0, dtype=bool)
        streak = len(small) - int(np.flatnonzero(~small)[-1]) - 1 if (~small).any() else len(small)
        if hist and streak >= spec.patience:
            j.work_total = j.work_done
            return
        epochs = np.arange(k + 1, spec.max_epochs + 1)
        eff = j.eff + (epochs * spe - j.work_done) / spe * self.efficiency(j)
        accs = conv.evaluate(epochs, eff)
        e_stop = stop_epoch(accs, k + 1, hist, streak, spec.beta, spec.patience, spec.max_epochs)
        j.accs, j.acc_first = accs, k + 1
        j.work_total = max(float(e_stop * spe), j.work_done)

    def sync(self, j: JobState, t: float, final: bool = False) -> None:
        """Bring a running job's progress, fee and reported accuracy up to time ``t``."""
        v, spec = j.view, j.spec
        dt = t - j.seg_start
        if dt > 0:
            active = t - max(j.seg_start, j.resume_at)
            if active > 0:
                delta = min(j.rate * active, j.work_total - j.work_done)
                j.work_done += delta
                if j.conv is not None:
                    j.eff += delta / spec.samples_per_epoch * self.efficiency(j)
            j.fee += j.fee_rate * dt
            v.attained_service += v.gpus * dt
            j.ran += dt
            j.seg_start = t
        if final:
            j.work_done = j.work_total
        if j.rate > 0 and self.clairvoyant:
            v.remaining = (j.work_total - j.work_done) / j.rate
        if j.conv is not None and j.accs is not None:
            self._epochs(j, final)
        if not self.clairvoyant:  # from the estimate, time run and reported epochs only
            v.remaining = estimate_remaining(v.est_runtime, j.ran, v.progress.epoch, 0 if spec.fixed else spec.max_epochs)

    def _epochs(self, j: JobState, final: bool) -> None:
        """The evaluations of the epochs a training job completed since its last sync."""
        v, spec = j.view, j.spec
        spe = spec.samples_per_epoch
        k_old = v.progress.epoch
        k_new = int(j.work_total // spe) if final else int((j.work_done + 1e-6) // spe)
        k_new = min(k_new, j.acc_first + len(j.accs) - 1)
        if k_new > k_old:
            p = v.progress
            new = j.accs[k_old + 1 - j.acc_first : k_new + 1 - j.acc_first]
            p.history.extend(new.tolist())
            p.epoch = k_new
            p.accuracy = p.history[-1]
            conv = j.conv
            eff_k = j.eff - (j.work_done - k_new * spe) / spe * self.efficiency(j)
            p.loss = conv.loss_min + (conv.loss0 - conv.loss_min) * math.exp(-eff_k / conv.tau)
            p.max_loss = conv.loss0

    @staticmethod
    def report(j: JobState) -> None:
        """The step time the job's chief reported with its evaluations since the last
        cycle (a report comes with each completed epoch, as ``rlsched.trainer``'s at an
        epoch's end; the twin's replay trainer reports the same), folded into what the
        policy may read as the operator folds ``status.progress``: seconds per step on its
        workers and nodes at its global batch (a fixed per-worker batch in sample-units
        of one per GPU), and its gradient statistics."""
        v = j.view
        if j.rate <= 0 or j.spec.fixed or v.progress.epoch <= j.reported:
            return
        j.reported = v.progress.epoch
        spec = j.spec
        if spec.batch_size is not None:
            batch = spec.global_batch(v.workers, j.batch)
            step, stats = batch / j.rate, spec.grad_stats()
        else:  # a fixed batch per worker
            batch = v.workers * v.gpus_per_worker
            step = v.workers * spec.batch_per_worker / j.rate
            stats = curve_grad_stats(j.conv.gamma, spec.batch_per_worker) if j.conv is not None else None
        report = {"workers": v.workers, "globalBatchSize": batch, "stepTimeSeconds": step}
        if stats is not None:
            report["gradSqr"], report["gradVar"] = stats
        j.obs = j.obs.update(report, len(set(v.placement)), j.gpu_type)


def _curves(specs: list[JobSpec], c: list[ConvergenceModel], noise: np.ndarray,
            noise_off: list[int]) -> tuple[np.ndarray, list[int]]:
    """The accuracy after each epoch (one row per job, padded to the longest) and the
    stop epoch of each of the training jobs ``specs`` at their requested workers."""
    emax = max(s.max_epochs for s in specs)
    idx = np.arange(emax)
    epochs = idx + 1
    max_e = np.array([s.max_epochs for s in specs])
    inside = idx < max_e[:, None]
    pos = np.minimum(np.array(noise_off)[:, None] + idx, max(len(noise) - 1, 0))
    sigma = np.array([m.noise for m in c])[:, None]
    eps = np.where(inside, noise[pos] if len(noise) else 0.0, 0.0) * sigma
    gamma = np.array([m.gamma for m in c])
    w = np.array([s.workers for s in specs])
    eff = (1.0 / (1.0 + gamma * (w - 1)))[:, None]
    acc_max = np.array([m.acc_max for m in c])[:, None]
    acc0 = np.array([m.acc0 for m in c])[:, None]
    tau = np.array([m.tau for m in c])[:, None]
    accs = np.clip(acc_max - (acc_max - acc0) * np.exp(-(epochs * eff) / tau) + eps, 0.0, 1.0)
    gains = convergence_gains(accs)  # the planner's β-rule gain after each epoch
    beta = np.array([s.beta for s in specs])[:, None]
    patience = np.array([s.patience for s in specs])[:, None]
    small = gains < beta
    last_big = np.maximum.accumulate(np.where(small, -1, idx), axis=1)
    hit = ((idx - last_big) >= patience) & inside
    stop = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, max_e).tolist()
    return accs, stop
