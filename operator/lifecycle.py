"""What happens to one job: its phase transitions (admitted, started, resized,
preempted, suspended, restarted, completed, failed), each recorded in its status
before its workers are touched, and the job as core sees it
(:class:`~rlsched.core.cluster.JobView`, with the scaling record of a running one,
:class:`~rlsched.core.planning.ElasticState`). Its workers' exits are judged by
:func:`rlsched.core.lifecycle.judge`; nothing here decides who runs."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from rlsched.core.allocation import ProfileSample
from rlsched.core.contract import gpu_type_of, judge_batch
from rlsched.core.lifecycle import FAIL, RESTART, SUCCEED, Verdict, judge
from rlsched.core.estimate import estimate_remaining
from rlsched.core.batch import UNIT_BATCH
from rlsched.core.cluster import JobView
from rlsched.core.live_allocation import (
    LiveTarget,
    attained_service,
    observations_from_status,
    observations_to_status,
    one_type,
)
from rlsched.core.planning import DynamicPriority, ElasticState, TrainingSpec, WaitReason

from .job import Job, checkpoint_path, pod_generation, progress_of, requests_count
from .status import (StatusWriter, format_time, get_condition, merge_diff, parse_time, restart_stall, set_condition,
                     short, stall_seconds, stored)
from .workers import Workers

log = logging.getLogger(__name__)

#: why a job with ``spec.suspend`` waits
SUSPENDED = WaitReason(0, "Suspended", "spec.suspend is true: rlsched does not admit it until it is cleared")


class Lifecycle:
    """Carries out one job's transitions; ``allocator``: the name of the allocation
    policy that sizes jobs (named in events)."""

    def __init__(self, config: Any, status: StatusWriter, workers: Workers, metrics: Any, priority: DynamicPriority,
                 allocator: str, clock: Callable[[], float] = time.time) -> None:
        if not config.start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, got {config.start_timeout_s}")
        self.config, self.status, self.workers, self.metrics = config, status, workers, metrics
        self.priority, self.allocator, self.clock = priority, allocator, clock

    def target(self, j: Job) -> int:
        """The worker count of the job's current generation (the allocator starts a job
        at the size it chose)."""
        return j.spec.clamp_workers(j.status.get("targetWorkers"))

    def service(self, j: Job, now: float) -> float:
        """GPU-seconds the job attained (its GPUs held since ``attainedSince``)."""
        held = self.target(j) * j.spec.gpus_per_worker if j.status.get("phase") in ("Starting", "Running") else 0
        return attained_service(j.status.get("attainedGpuSeconds"), parse_time(j.status.get("attainedSince")),
                                held, now)

    def priority_of(self, j: Job) -> float:
        """The job's dynamic priority from its spec and request counter (never its status)."""
        return self.priority.expected(j.spec.priority_value, requests_count(j.body))

    async def queued(self, j: Job) -> None:
        """A waiting job's service queue and dynamic priority in its status (events when
        it is promoted or demoted), as :meth:`service_queue` reads them."""
        st = j.status
        total = requests_count(j.body)
        pr = self.priority_of(j)
        interrupted = st.get("queue") == "interrupt"
        queue = self.priority.queue(j.spec.priority_class, pr, interrupted)
        old_pr, seen = st.get("effectivePriority"), st.get("priorityRequestsSeen")
        same_pr = isinstance(old_pr, (int, float)) and not isinstance(old_pr, bool) and abs(old_pr - pr) <= 1e-9 * max(1.0, abs(pr))
        if queue != st.get("queue") or not same_pr or seen != total:
            old = st.get("queue")
            await self.status.patch(j, {"queue": queue, "effectivePriority": pr, "priorityRequestsSeen": total})
            if old_pr is not None and not same_pr and seen == total:
                # no new request, yet another priority: not one DynamicPriority gives
                self.metrics.status_resets.inc()
                await self.status.event(j.body, "StatusReset",
                                 f"effectivePriority {short(old_pr)} is not what spec.priority.value "
                                 f"{j.spec.priority_value:g} and {total} requests give; reset to {pr:g}", "Warning")
            if old and queue != old:
                await self.status.event(j.body, "Promoted" if queue == "urgent" else "Demoted",
                                 f"priority {pr:.3g}: queue {old} -> {queue}")

    async def judge(self, j: Job, now: float) -> str:
        """Judge the current generation's workers (:func:`rlsched.core.lifecycle.judge`)
        and carry the verdict out; returns its action (``none`` when the job goes on
        as it is). Each verdict is written to the status before any pod is touched."""
        gen = j.generation
        v = judge(j.workers(), generation=gen, target=self.target(j),
                  running=j.status.get("phase") == "Running" and j.status.get("startedGeneration") == gen,
                  success_policy=j.spec.success_policy, failures=j.failures, backoff_limit=j.spec.backoff_limit,
                  checkpoint=checkpoint_path(j.body))
        if v.action == SUCCEED:
            await self.complete(j, v.reason, now, message=v.message)
        elif v.action == FAIL:
            await self.fail(j, v.reason, v.message, now, ctype="Failed", cstatus="True",
                            extra={"failures": v.failures, "lastFailure": self.failure_record(v, gen, now)})
        elif v.action == RESTART:
            await self.restart(j, v, now)
        return v.action

    @staticmethod
    def failure_record(v: Verdict, gen: int, now: float) -> dict:
        return {"worker": v.worker or "", "exitCode": v.exit_code, "generation": gen, "reason": v.reason,
                "time": format_time(now)}

    async def restart(self, j: Job, v: Verdict, now: float) -> None:
        """End the current generation and start the next after the backoff: the new
        generation (and the failure count) are recorded first, then the old workers
        get SIGTERM with the grace period."""
        gen = j.generation
        patch: dict[str, Any] = {
            "restartGeneration": gen + 1,
            "conditions": set_condition(j.status.get("conditions"), "Restarting", "True", v.reason, v.message, now),
        }
        if v.count:
            patch["failures"] = v.failures
            patch["lastFailure"] = self.failure_record(v, gen, now)
            patch["restartAfter"] = format_time(now + v.backoff_s)
        await self.status.patch(j, patch)
        self.metrics.restarts.labels(reason=v.reason).inc()
        await self.status.event(j.body, v.reason, v.message, "Warning")
        await self.workers.reconcile(j, self.target(j))

    async def starting(self, j: Job, now: float) -> None:
        if await self.judge(j, now) in (SUCCEED, FAIL):
            return
        target = self.target(j)
        await self.workers.reconcile(j, target)
        gen = j.generation
        live = [p for p in j.live_pods() if pod_generation(p) == gen]
        running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
        if len(running) >= target:
            created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
            queued = parse_time(j.status.get("queuedTime")) or created
            wait = max(0.0, (parse_time(j.status.get("admittedTime")) or now) - queued)
            await self.status.patch(j, {
                "phase": "Running", "startTime": format_time(now), "workers": len(live),
                "readyWorkers": len(running), "admissionWaitSeconds": wait, "startedGeneration": gen,
                "conditions": set_condition(j.status.get("conditions"), "Running", "True", "GangStarted",
                                            f"all {target} workers running", now),
            })
            await self.status.event(j.body, "Started", f"gang of {target} workers running after {wait:.1f}s in the queue")
            return
        admitted = max(parse_time(j.status.get("admittedTime")) or now,
                       parse_time(j.status.get("restartAfter")) or 0.0)
        if now - admitted > self.config.start_timeout_s:  # the gang goes back to its queue
            await self.status.patch(j, {
                "phase": "Queued", "workers": 0, "readyWorkers": 0, "targetWorkers": 0,
                "restartGeneration": gen + 1,
                "conditions": set_condition(j.status.get("conditions"), "Running", "False", "GangTimeout",
                                            f"{target - len(running)} of {target} workers still not running after "
                                            f"{self.config.start_timeout_s:.0f}s; requeued", now),
            })
            await self.workers.stop(j, 0)
            j.pods = []
            await self.status.event(j.body, "GangTimeout", f"only {len(running)}/{target} workers running; pods deleted, requeued", "Warning")

    async def running(self, j: Job, now: float) -> ElasticState | None:
        """The running job's scaling record (``status.rlpto`` with its latest report
        folded in), after its workers' exits were judged; None when that ended the job
        or restarted its generation."""
        if await self.judge(j, now) != "none":
            return None
        await self.check_batch(j, now)
        target = j.spec.clamp_workers(j.status.get("targetWorkers"))
        gen = j.generation
        sizes = {w.gang_size for w in j.workers() if w.generation == gen and not w.stopping and w.gang_size}
        if sizes and sizes != {target}:
            # the target moved without a new generation (a status adopted after a
            # restart of the operator): the workers' WORLD_SIZE is wrong, start anew
            await self.restart(j, Verdict(RESTART, "Rescaled", f"workers {max(sizes)} -> {target}: "
                                          f"generation {gen + 1} starts at the new size"), now)
            return None
        complete = await self.workers.reconcile(j, target)
        live = [p for p in j.live_pods() if pod_generation(p) == gen]
        ready = sum(1 for p in live if any(c.get("type") == "Ready" and c.get("status") == "True"
                                          for c in (p.get("status") or {}).get("conditions") or []))
        patch: dict[str, Any] = {}
        if j.status.get("workers") != len(live) or j.status.get("readyWorkers") != ready:
            patch.update({"workers": len(live), "readyWorkers": ready})
        if complete and j.status.get("startedGeneration") != gen:
            patch["startedGeneration"] = gen  # every worker of the generation exists: a loss is now a restart
        stall = restart_stall(j.status, gen, now)
        if stall is not None:
            patch["restartStall"] = stall
        if patch:
            await self.status.patch(j, patch)
        prog = progress_of(j.status)
        state = ElasticState.from_status(j.status.get("rlpto"))
        start = parse_time(j.status.get("startTime")) or now
        state.observe(prog, target, now - start, j.spec.beta, j.spec.data_size)
        return state

    @staticmethod
    def local_batch(j: Job) -> float | None:
        """Samples per GPU of a job's fixed per-worker batch, from its chief's last
        report (``globalBatchSize`` over its GPUs); None when it reported none."""
        prog = j.status.get("progress")
        if not isinstance(prog, Mapping):
            return None
        batch, workers = prog.get("globalBatchSize"), prog.get("workers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (batch, workers)):
            return None
        return float(batch) / (float(workers) * j.spec.gpus_per_worker)

    async def check_batch(self, j: Job, now: float) -> None:
        """Condition ``BatchSizeIgnored`` (and an Event when it changes): whether the
        chief's report of the running generation shows the global batch the operator
        set (:func:`~rlsched.core.contract.judge_batch`)."""
        check = judge_batch(j.batch_size, j.status.get("progress"), j.generation)
        if check is None:
            return
        old = get_condition(j.status.get("conditions"), "BatchSizeIgnored")
        status = "False" if check.followed else "True"
        if (old is None and check.followed) or (old is not None and old.get("status") == status
                                                 and old.get("message") == check.message):
            return
        await self.status.patch(j, {"conditions": set_condition(
            j.status.get("conditions"), "BatchSizeIgnored", status,
            "BatchSizeFollowed" if check.followed else "BatchSizeIgnored", check.message, now)})
        if check.followed:
            await self.status.event(j.body, "BatchSizeFollowed", check.message)
        else:
            await self.status.event(j.body, "BatchSizeIgnored", check.message, "Warning")

    async def observe_goodput(self, j: Job, placement: Sequence[int], types: Mapping[int, str] | None = None):
        """Fold the chief's latest report into ``status.goodput`` (a report of the
        current generation at its size; the nodes its workers run on are known here)
        and return the record. The GPU type of its step time: the report's ``gpuType``
        (read through ``--gpu-types``, so a product name the trainer read from CUDA maps
        as the node label does), else that of its workers' nodes when they are of one
        type (``types``: node index -> type), else none."""
        bounds = j.spec.bounds
        obs, last = observations_from_status(j.status.get("goodput"), bounds or UNIT_BATCH)
        prog = j.status.get("progress")
        if not isinstance(prog, Mapping) or not prog.get("updateTime") or prog.get("updateTime") == last:
            return obs
        gen, workers = prog.get("generation"), prog.get("workers")
        if (gen is not None and gen != j.generation) or workers != len(placement):
            return obs  # a report of another generation or size: its shape is not known
        report = dict(prog)
        if bounds is None:  # a fixed local batch: one unit per GPU
            report["globalBatchSize"] = len(placement) * j.spec.gpus_per_worker
        reported = prog.get("gpuType")
        gtype = (gpu_type_of(reported, self.config.gpu_types) if isinstance(reported, str) and reported
                 else one_type(placement, types or {}) or "")
        try:
            obs = obs.update(report, len(set(placement)), gtype)
        except ValueError as exc:
            log.warning("%s: progress report not used for the goodput model: %s", j.key, exc)
            return obs
        await self.status.patch(j, {"goodput": observations_to_status(obs, str(prog["updateTime"]))})
        return obs

    @staticmethod
    def rlpto_patch(j: Job, record: ElasticState) -> dict[str, Any]:
        """The status patch that records the job's elastic state (``status.rlpto``), if it changed."""
        rl = stored(record.to_status())
        if rl == stored(j.status.get("rlpto")):
            return {}
        old = j.status.get("rlpto")
        return {"rlpto": merge_diff(old, rl) if isinstance(old, Mapping) else rl}

    def service_queue(self, j: Job) -> tuple[str, float]:
        """The service queue the job is ranked in and its dynamic priority: a queued
        job's ``status.queue`` (written by :meth:`queued` this cycle), else the one
        :class:`~rlsched.core.planning.DynamicPriority` gives its class and priority."""
        pr = self.priority_of(j)
        queue = j.status.get("queue")
        if j.status.get("phase") != "Queued" or queue not in ("interrupt", "urgent", "normal"):
            queue = self.priority.queue(j.spec.priority_class, pr)
        return queue, pr

    def live_job(self, j: Job, now: float, placement: tuple[int, ...], obs, *, record: ElasticState | None = None,
                 movable: bool = True, patience: int | None = None) -> JobView:
        """The job as the allocation policy sees it; ``record``: a running job's scaling
        record this cycle (its end is judged on it, with the β stop's ``patience``, and a
        scaling policy decides on it), with the seed profile it declared
        (:meth:`seed_profile`)."""
        s = j.spec
        created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        prog = progress_of(j.status)
        queue, pr = self.service_queue(j)
        end = {} if record is None else dict(max_epochs=s.max_epochs, patience=patience, record=record,
                                             local_batch=self.local_batch(j))
        service = self.service(j, now)
        # seconds run, at the size it runs at (its gang's while it waits): what SRTF's
        # remaining time counts down from the user's estimate
        ran = service / (s.gpus_per_worker * max(len(placement), s.min_workers, 1))
        return JobView(id=j.key, submit_time=created, min_workers=s.min_workers, max_workers=s.max_workers,
                       gpus_per_worker=s.gpus_per_worker, workers=len(placement) or s.min_workers,
                       placement=list(placement), batch_size=j.batch_size if placement else s.batch_size,
                       pinned_workers=s.pinned_workers, bounds=s.bounds, observations=obs, attained_service=service,
                       restarts=j.generation, priority_class=s.priority_class, team=j.team, queue=queue, priority=pr,
                       start_time=parse_time(j.status.get("admittedTime")) if placement else None,
                       gpu_models=s.gpu_models, cpu_milli=s.cpu_milli, memory_mib=s.memory_mib, beta=s.beta,
                       progress=prog, movable=movable, seed_profile=self.seed_profile(s),
                       restart_s=stall_seconds(j.status.get("restartStall")), est_runtime=s.estimated_runtime,
                       remaining=estimate_remaining(s.estimated_runtime, ran, prog.epochs_done, s.max_epochs), **end)

    def seed_profile(self, s: TrainingSpec) -> tuple[ProfileSample, ...]:
        """``spec.seedProfile`` as one-GPU profile samples, each row's type read through
        ``--gpu-types`` (a product maps as the node label does, a type key to itself)."""
        return tuple(ProfileSample(1, 1, m, t, 0.0, gpu_type=gpu_type_of(name, self.config.gpu_types))
                     for name, m, t in s.seed_profile)

    async def schedulable(self, j: Job, why: str | None, now: float) -> None:
        """Condition ``Schedulable``: False (reason ``Unfittable``) while the gang cannot
        fit the whole cluster; back to True once it can."""
        old = get_condition(j.status.get("conditions"), "Schedulable")
        if why:
            s = j.spec
            msg = f"the gang of {s.min_workers} workers x {s.gpus_per_worker} GPUs cannot fit this cluster: {why}; " \
                  f"it waits in the queue without blocking it"
            if old and old.get("status") == "False" and old.get("message") == msg:
                return
            await self.status.patch(j, {"conditions": set_condition(
                j.status.get("conditions"), "Schedulable", "False", "Unfittable", msg, now)})
            await self.status.event(j.body, "Unfittable", msg, "Warning")
        elif old and old.get("status") != "True":
            await self.status.patch(j, {"conditions": set_condition(
                j.status.get("conditions"), "Schedulable", "True", "Fits", "the gang fits the cluster", now)})

    async def waiting(self, j: Job, why: WaitReason | None) -> None:
        """``status.waiting``: the job's place in the service order and why it is not
        running (what ``rlsched why`` prints), written when it changes."""
        if why is None:
            return
        new = why.to_status()
        if j.status.get("waiting") != new:
            await self.status.patch(j, {"waiting": new})

    async def suspended(self, j: Job, now: float, hold: WaitReason | None = None) -> None:
        """``spec.suspend`` (or ``hold``: Kueue has not admitted the job): a job holding
        workers goes back to the queue (recorded first, then its workers get the grace
        period to checkpoint, as a preemption); a queued one stays there. Condition
        ``Suspended=True`` (reason: the hold's) while it lasts and ``status.waiting``
        saying why, refreshed as the reason changes; the job is admitted as any other once
        ``spec.suspend`` is cleared (Kueue admits it)."""
        if j.spec.suspend or hold is None:
            hold = SUSPENDED
        old = get_condition(j.status.get("conditions"), "Suspended")
        patch: dict[str, Any] = {}
        if j.status.get("phase") in ("Starting", "Running"):
            patch.update({"phase": "Queued", "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
                          "restartGeneration": j.generation + 1, "queuedTime": format_time(now)})
            patch.update({"attainedGpuSeconds": self.service(j, now), "attainedSince": None, "batchSize": None})
        if not old or old.get("status") != "True" or old.get("reason") != hold.reason:
            patch["conditions"] = set_condition(j.status.get("conditions"), "Suspended", "True", hold.reason,
                                                hold.message, now)
        if j.status.get("waiting") != hold.to_status():
            patch["waiting"] = hold.to_status()
        if patch:
            await self.status.patch(j, patch)
            if "phase" in patch or "conditions" in patch:
                await self.status.event(j.body, "Suspended", f"{hold.message}; workers stopped" if "phase" in patch
                                 else hold.message)
        await self.workers.stop(j)

    async def admit(self, j: Job, now: float, *, target: int | None = None, batch: int | None = None,
                    gpu_type: str | None = None) -> None:
        """Start the job's gang: ``target`` workers (default ``minWorkers``) at global
        batch ``batch`` on nodes of ``gpu_type`` (None: any)."""
        target = j.spec.min_workers if target is None else target
        queued = parse_time(j.status.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp")) or now
        self.metrics.admission_wait.observe(max(0.0, now - queued))
        resumed = j.status.get("queue") == "interrupt"
        patch: dict[str, Any] = {
            "phase": "Starting", "targetWorkers": target, "admittedTime": format_time(now),
            "allocatedGeneration": j.generation,
            "waiting": None, "batchSize": batch, "attainedSince": format_time(now), "gpuType": gpu_type,
            "conditions": set_condition(j.status.get("conditions"), "Admitted", "True", "GangFits",
                                        f"{target} x {j.spec.gpus_per_worker} GPUs free", now),
        }
        await self.status.patch(j, patch)
        if resumed:  # a preempted job back from the interrupt queue (counted once the status says so)
            self.metrics.resumes.inc()
        await self.status.event(j.body, "Admitted",
                         f"starting gang of {target} workers x {j.spec.gpus_per_worker} GPUs from queue {j.status.get('queue')}"
                         + (" (resuming after a preemption)" if resumed else ""))
        await self.workers.reconcile(j, target)

    async def resize(self, j: Job, t: LiveTarget, now: float) -> None:
        """A new generation at the allocator's size and batch: recorded first (with the
        GPU-seconds attained so far), then the old workers are stopped."""
        old, old_batch = self.target(j), j.batch_size
        await self.status.patch(j, {
            "targetWorkers": t.workers, "restartGeneration": j.generation + 1, "batchSize": t.batch_size,
            "gpuType": t.gpu_type, "allocatedGeneration": j.generation + 1,
            "attainedGpuSeconds": self.service(j, now), "attainedSince": format_time(now),
        })
        up = t.workers > old
        self.metrics.scaling_decisions.labels(direction="up" if up else "down").inc()
        self.metrics.restarts.labels(reason="Rescaled").inc()
        batch = f", global batch {old_batch} -> {t.batch_size}" if t.batch_size is not None else ""
        await self.status.event(j.body, "ScaledUp" if up else "ScaledDown",
                         f"workers {old} -> {t.workers}{batch} (generation {j.generation}, {self.allocator}, "
                         f"at epoch {progress_of(j.status).epoch})")
        await self.workers.reconcile(j, t.workers)

    async def stop_reallocated(self, j: Job, now: float, interrupt: bool = True) -> None:
        """The allocator gave the job no GPUs (others rank before it): back to the
        interrupt queue (``interrupt``, the plan's word) or its own, recorded first, then
        its workers get the grace period to checkpoint."""
        self.metrics.preemptions.inc()
        before = j.status.get("preemptions")
        count = before if isinstance(before, int) and not isinstance(before, bool) and before >= 0 else 0
        queue = "interrupt" if interrupt else self.service_queue(j)[0]
        await self.status.patch(j, {
            "phase": "Queued", "queue": queue, "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "preemptions": count + 1, "restartGeneration": j.generation + 1, "batchSize": None,
            "attainedGpuSeconds": self.service(j, now), "attainedSince": None,
            "conditions": set_condition(j.status.get("conditions"), "Running", "False", "Reallocated",
                                        f"{self.allocator} gave its GPUs to jobs ranked before it", now),
        })
        await self.workers.stop(j)
        await self.status.event(j.body, "Preempted", f"preempted by {self.allocator}: its GPUs go to jobs ranked "
                                              f"before it; workers get {self.config.grace_period_s}s to checkpoint",
                         "Warning")

    async def complete(self, j: Job, why: str, now: float, *, message: str = "",
                       record: ElasticState | None = None) -> None:
        """The job Succeeded: recorded first, then the workers still running get SIGTERM
        with the grace period (so a script stopped by the beta stop or maxEpochs saves
        its model); a crash in between leaves a finished job whose pods the next cycle
        stops, never a job run again."""
        created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        prog = progress_of(j.status)
        what = message or f"epoch {prog.epoch}, accuracy {prog.accuracy:.4f}"
        patch: dict[str, Any] = {
            "phase": "Succeeded", "reason": why, "completionTime": format_time(now), "jctSeconds": now - created,
            "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "conditions": set_condition(j.status.get("conditions"), "Complete", "True", why, what, now),
        }
        if record is not None:
            patch["rlpto"] = record.to_status()
        if j.status.get("attainedSince") is not None:  # the service attained up to the end
            patch.update({"attainedGpuSeconds": self.service(j, now), "attainedSince": None})
        await self.status.patch(j, patch)
        await self.workers.stop(j)
        self.metrics.completions.labels(reason=why).inc()
        await self.status.event(j.body, "Completed", f"{why}: {what}, JCT {now - created:.1f}s")

    async def fail(self, j: Job, reason: str, message: str, now: float, *, ctype: str = "Valid",
                   cstatus: str = "False", extra: Mapping[str, Any] | None = None) -> None:
        """Fail the job for good: phase ``Failed`` with condition ``ctype=cstatus``
        (``reason``, ``message``) recorded first, then its pods are deleted at once
        (their GPUs freed), and a Warning Event."""
        await self.status.patch(j, {
            "phase": "Failed", "reason": reason, "message": message, "queue": "", "targetWorkers": 0,
            "workers": 0, "readyWorkers": 0, **(extra or {}),
            "conditions": set_condition(j.status.get("conditions"), ctype, cstatus, reason, message, now),
        })
        await self.workers.stop(j, 0)
        self.metrics.failures.labels(reason=reason).inc()
        await self.status.event(j.body, reason, message, "Warning")
