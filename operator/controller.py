"""The control loop: one cycle reads the cluster, decides with one call into core's
allocation policy, acts.

State lives in the API server, not in this process (phase, queue, target workers,
priority and RLPTO state in the TrainingJob's status; deterministic pod names), so an
operator killed at any point and restarted picks up where it stopped. Failures are
contained to the object that caused them, and every status field the operator acts on
is checked against the spec or its own record. Details: docs/design-notes.md,
docs/operator.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core import ClusterState, JobView
from rlsched.core.contract import (
    GROUP,
    LABEL_MANAGED_BY,
    MANAGED_BY_OPERATOR,
    PLURAL,
    VERSION,
    ShapeError,
)
from rlsched.core.decision_clock import DecisionClock
from rlsched.core.live_allocation import LiveAllocation, LivePlan, movable_room, observations_from_status
from rlsched.core.planning import DynamicPriority, ElasticState, gang_unfittable
from rlsched.core.queues import QueueBook

from .api import JobRejected, api_error, read_json
from .config import OperatorConfig
from .job import ACTIVE, Job, job_key, with_gpu_models
from .kueue_gate import KueueGate
from .lifecycle import Lifecycle
from .metrics import OperatorMetrics
from .podsecurity import POD_SECURITY_REASON, PodSecurityGate
from .queues import TeamQueues
from .rbac import Rbac
from .snapshot import build_snapshot
from .spec import SpecError, parse_spec
from .status import StatusWriter, get_condition, set_condition
from .workers import Workers, hold_restarting

__all__ = ["OperatorConfig", "Controller", "CyclePlanSummary"]

log = logging.getLogger(__name__)


@dataclass
class CyclePlanSummary:
    """What one decision started (``admit``, in the plan's order) and the waiting gangs
    that can never fit (key -> why): the metrics and the team queues' report."""

    admit: list[str] = field(default_factory=list)
    unfittable: dict[str, str] = field(default_factory=dict)


@dataclass
class _Cycle:
    """What one cycle read (step 1) and observed (step 2)."""

    now: float
    jobs: dict[str, Job]
    by_uid: dict[str, Job]
    snap: Any
    book: QueueBook
    queue_bodies: list[dict]
    waiting: list[Job] = field(default_factory=list)
    #: each running job's scaling record, by key
    running: dict[str, ElasticState] = field(default_factory=dict)


class Controller:
    """Runs the cycle against one API server: read a snapshot, one decision call into
    core, the plan carried out by the collaborators (workers, lifecycle, status)."""

    def __init__(
        self,
        config: OperatorConfig,
        api: client.ApiClient,
        metrics: OperatorMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.api = api
        self.metrics = metrics
        self.clock = clock
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.priority = DynamicPriority(config.mu, config.promote_at, config.demote_at)
        #: the allocation policy: every decision is one call into it
        self.allocation = LiveAllocation.named(config.allocator)
        self.decision_clock = (None if config.decision_interval_s is None
                               else DecisionClock(config.decision_gap_s, config.decision_interval_s))
        #: when the allocation policy last decided, and the jobs it decided for
        self._decided: tuple[float, frozenset[str]] | None = None
        #: when the policy asked to decide again though nothing happens (LivePlan.wake_at)
        self._wake_at: float | None = None
        self.status = StatusWriter(self.custom, self.core, metrics, clock)
        self.rbac = Rbac(self.core, client.RbacAuthorizationV1Api(api), config.namespace)
        self.workers = Workers(self.core, self.status, self.rbac, metrics, config, clock)
        self.kueue = KueueGate(self.custom, self.status, config.namespace, clock)
        self.teams = TeamQueues(self.custom, metrics, min_run_s=config.min_run_s,
                                enforced=self.allocation.enforces_queues)
        self.lifecycle = Lifecycle(config, self.status, self.workers, metrics, self.priority,
                                   self.allocation.name, clock)
        self.pod_security = PodSecurityGate(self.core, read_json, config)
        self.cycles = 0
        #: what the last cycle's decision started and found unfittable (metrics, team queues)
        self.last_plan: CyclePlanSummary | None = None
        #: unreadable objects already logged (each is logged once while it lasts)
        self._reported: set[str] = set()
        #: job uid -> the unexpected error last reported on it by an event
        self._errors: dict[str, str] = {}

    async def list_jobs(self) -> list[dict]:
        ns = self.config.namespace
        if ns:
            call = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _preload_content=False)
        else:
            call = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False)
        return (await read_json(call))["items"]

    async def run(self, stop: asyncio.Event, is_leader: Callable[[], Any] | None = None) -> None:
        """Cycle every ``cycle_s`` until ``stop`` is set; a cycle that fails is logged,
        counted (``rlsched_operator_cycle_errors_total``) and retried."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if is_leader is None or await is_leader():
                    await self.cycle()
                else:
                    self.status.record.clear()  # another replica writes now: its values are not ours
            except ApiException as exc:
                self.metrics.cycle_errors.inc()
                log.error("cycle failed: API %s %s", exc.status, exc.reason)
            except (OSError, asyncio.TimeoutError) as exc:
                self.metrics.cycle_errors.inc()
                log.error("cycle failed: %r", exc)
            except Exception:  # a bug must not stop scheduling for good: log it loudly, retry
                self.metrics.cycle_errors.inc()
                log.exception("cycle failed with an unexpected error")
            wait = max(0.0, self.config.cycle_s - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def cycle(self) -> None:
        """One cycle: 1. list, 2. observe, 3. decide with one call into core and act on
        its plan, 4. upkeep and report."""
        now = self.clock()
        self.cycles += 1
        self.metrics.cycles.inc()
        c = await self._list(now)
        await self._observe(c)
        plan = await self._allocate(c)
        await self._sweep(c.by_uid)
        self._metrics(c.jobs, plan)
        await self.teams.report(c.book, c.queue_bodies, c.jobs, self.lifecycle.target, now, plan.admit)

    # ------------------------------------------------------------------ 1. list
    async def _list(self, now: float) -> _Cycle:
        """The cycle's snapshot: the jobs with their worker pods, the nodes and the
        team queues; Kueue's hold on each job; orphaned worker pods deleted."""
        bodies, others, nodes, mine, queue_bodies = await asyncio.gather(
            self.list_jobs(),
            # everyone else's pods that hold resources, for the snapshot
            read_json(self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL_MANAGED_BY}!={MANAGED_BY_OPERATOR}",
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)),
            read_json(self.core.list_node(_preload_content=False)),
            # the operator's workers in one list, whatever their phase: a worker that exits
            # between two lists (one of running pods, one of exited) would be in neither
            read_json(self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY_OPERATOR}", _preload_content=False)),
            self.teams.list(),
        )
        book = self.teams.book(queue_bodies)
        exited = {"Succeeded", "Failed"}
        # the workers that exited: their exit codes decide success, failure, restart
        ended = [p for p in mine["items"] if (p.get("status") or {}).get("phase") in exited]
        pods = others["items"] + [p for p in mine["items"] if (p.get("status") or {}).get("phase") not in exited]
        snap = build_snapshot(nodes["items"], pods, time=now, levels=self.config.topology_levels,
                              gpu_types=self.config.gpu_types)
        self._report_unreadable(snap.problems)
        jobs = self._read_jobs(bodies, snap.state, book)
        by_uid = {j.uid: j for j in jobs.values()}
        await self.kueue.gate(jobs, by_uid)
        for uid in set(self.status.record) - set(by_uid):
            del self.status.record[uid]
        for uid in set(self._errors) - set(by_uid):
            del self._errors[uid]
        # the operator's pods are those a TrainingJob controls; labels alone mean nothing
        await self.workers.delete_orphans(self.workers.assign(by_uid, pods, ended))
        return _Cycle(now, jobs, by_uid, snap, book, queue_bodies)

    def _read_jobs(self, bodies: list[dict], state: ClusterState, book: QueueBook) -> dict[str, Job]:
        """Each TrainingJob with its parsed spec (or why it is invalid) and its team queue."""
        jobs: dict[str, Job] = {}
        for b in bodies:
            try:
                spec, err = parse_spec(b.get("spec"), scheduler_name=self.config.scheduler_name,
                                       name=b["metadata"]["name"]), None
                spec = with_gpu_models(spec, b["spec"], state.models)
            except (SpecError, ShapeError) as exc:
                spec, err = None, str(exc)
            jobs[job_key(b)] = j = Job(b, spec, err)
            if spec is not None:
                j.team = book.resolve(j.ns, spec.queue_name) or None
        return jobs

    # ------------------------------------------------------------------ 2. observe
    async def _observe(self, c: _Cycle) -> None:
        """Observe every job (concurrently, bounded: they are independent here), then
        put what waits, runs and holds GPUs in the listing's order for the decision."""
        listed = {j.key: len(j.pods) for j in c.jobs.values()}
        await self._each(lambda j: self._observe_job(c, j), c.jobs.values(), c.now)
        hold_restarting(c.jobs.values(), listed, c.snap.state, self.lifecycle.target, c.snap.node_index)
        order = {k: i for i, k in enumerate(c.jobs)}
        c.waiting.sort(key=lambda j: order[j.key])
        c.running = dict(sorted(c.running.items(), key=lambda kv: order[kv[0]]))

    async def _observe_job(self, c: _Cycle, j: Job) -> None:
        """One job: stopped workers released, its status trusted, its holds applied, its
        phase's step taken (workers judged and reconciled); what waits and runs goes
        into ``c``."""
        now = c.now
        await self.workers.release_stopped(j, now)
        if not j.status.get("phase") and j.uid not in self.status.record:
            if j.spec is None:
                await self.lifecycle.fail(j, "InvalidSpec", j.error or "invalid spec", now)
            return  # a valid job: the create handler has not enqueued it yet
        await self.status.trust(j, now, start_timeout_s=self.config.start_timeout_s)
        phase = j.status.get("phase")
        if phase not in ACTIVE or phase == "Queued":
            # a finished or queued job holds no workers: these are left over from a
            # step that recorded the new phase and stopped before its pods were stopped
            await self.workers.stop(j)
            if phase not in ACTIVE:
                return
        if j.spec is None:
            await self.lifecycle.fail(j, "InvalidSpec", j.error or "invalid spec", now)
            return
        refusal = await self.pod_security.check(j.body, self.cycles)
        if refusal is not None and (refusal.final or phase == "Queued"):
            if refusal.final:
                await self.lifecycle.fail(j, POD_SECURITY_REASON, refusal.message, now)
            return  # else its namespace is unreadable: not admitted until it can be checked
        if j.spec.suspend or j.hold is not None:  # held by its owner or by Kueue: no pods, not admitted
            if j.hold is not None and j.hold.reason == "KueueWorkload":
                await self.kueue.create_workload(j)
            await self.lifecycle.suspended(j, now, j.hold)
            return
        cond = get_condition(j.status.get("conditions"), "Suspended")
        if cond and cond.get("status") == "True":
            why = "Kueue admitted its Workload" if j.workload is not None else "spec.suspend is false"
            await self.status.patch(j, {"conditions": set_condition(
                j.status.get("conditions"), "Suspended", "False", "Resumed", why, now)})
            await self.status.event(j.body, "Resumed", f"{why}: the job waits for admission")
        if phase == "Queued":
            await self.lifecycle.queued(j)
            c.waiting.append(j)
        elif phase == "Starting":
            await self.lifecycle.starting(j, now)
        if j.status.get("phase") == "Running":
            record = await self.lifecycle.running(j, now)
            if record is not None:
                c.running[j.key] = record

    # ------------------------------------------------------------------ 3. decide and act
    async def _allocate(self, c: _Cycle) -> CyclePlanSummary:
        """One call into the allocation policy (core/live_allocation.py) and its plan
        carried out. The policy moves only jobs whose current generation runs whole
        (every worker bound); the GPUs of the others stay charged where they are. A gang
        that can never fit is reported (condition, event, gauge)."""
        state, now = c.snap.state, c.now
        unfit = CyclePlanSummary(unfittable={j.key: why for j in c.waiting
                                             if (why := gang_unfittable(j.spec, state)) is not None})
        await self._each(lambda j: self.lifecycle.schedulable(j, unfit.unfittable.get(j.key), now),
                         c.waiting, now)
        live, held = await self._allocation_inputs(c)
        self.last_plan = unfit
        if not self.decision_due(live, now):
            await self._record_elastic(c)
            return unfit
        names = {i: n for n, i in c.snap.node_index.items()}
        models = {i: node.gpu_model for i, node in enumerate(state.topology.nodes)}
        capacity, offers = movable_room(state, held)
        plan = self.allocation.plan(live, capacity, now, names, queues=c.book, models=models, offers=offers,
                                    types=c.snap.types)
        await self._record_elastic(c)  # as the plan left it (the evaluation a scaling policy decided on)
        if plan.error is not None:
            self.metrics.cycle_errors.inc()
            log.error("allocator %s failed; every job keeps its GPUs this cycle: %r", self.allocation.name, plan.error)
            await self._complete(c, plan)
            return unfit
        self._decided, self._wake_at = (now, self._decision_keys(live)), plan.wake_at
        unfit.admit = list(plan.start)  # the metrics count them as started, not queued
        await self._act_on_allocation(c, plan, [c.jobs[lj.id] for lj in live])
        return unfit

    def decision_due(self, live: Sequence[JobView], now: float) -> bool:
        """Whether the allocation policy decides this cycle (core's DecisionClock; every
        cycle without one): a job it decides for that came, went, became movable or
        ended, and the time the policy asked to decide again, are events."""
        if self.decision_clock is None:
            return True
        last, keys = self._decided if self._decided is not None else (None, None)
        woke = self._wake_at is not None and now >= self._wake_at
        changed = keys != self._decision_keys(live) or any(LiveAllocation.ended(lj) for lj in live) or woke
        return self.decision_clock.next_due(last, now, changed) <= now

    @staticmethod
    def _decision_keys(live: Sequence[JobView]) -> frozenset[tuple[str, bool]]:
        return frozenset((lj.id, lj.movable) for lj in live)

    async def _allocation_inputs(self, c: _Cycle) -> tuple[list[JobView], list[tuple[tuple[int, ...], int, int, int]]]:
        """The jobs as the allocator sees them, and what the running ones it may move
        hold. A running job whose generation still starts is not movable: its GPUs stay
        charged where they are and only its end is judged."""
        now = c.now
        held: list[tuple[tuple[int, ...], int, int, int]] = []
        live: list[JobView] = []
        for key, record in c.running.items():
            j = c.jobs[key]
            placement = tuple(c.snap.placement.get(j.key, ()))
            movable = j.status.get("startedGeneration") == j.generation and len(placement) == self.lifecycle.target(j)
            obs = await self.lifecycle.observe_goodput(j, placement, c.snap.types) if movable else None
            if movable:
                held.append((placement, j.spec.gpus_per_worker, j.spec.cpu_milli, j.spec.memory_mib))
            live.append(self.lifecycle.live_job(j, now, placement, obs, record=record, movable=movable,
                                                patience=self.config.patience))
        for j in c.waiting:
            bounds = j.spec.bounds
            obs = observations_from_status(j.status.get("goodput"), bounds)[0] if bounds is not None else None
            live.append(self.lifecycle.live_job(j, now, (), obs))
        return live, held

    async def _record_elastic(self, c: _Cycle) -> None:
        """Each running job's elastic state (``status.rlpto``), where it changed."""
        async def record(j: Job) -> None:
            patch = self.lifecycle.rlpto_patch(j, c.running[j.key])
            if patch:
                await self.status.patch(j, patch)

        await self._each(record, [c.jobs[k] for k in c.running], c.now)

    async def _complete(self, c: _Cycle, plan: LivePlan) -> None:
        """The jobs that ended by themselves (the plan's β stops and ``maxEpochs``)."""
        await self._each(lambda j: self.lifecycle.complete(j, plan.complete[j.key], c.now, record=c.running[j.key]),
                         [c.jobs[k] for k in plan.complete], c.now)

    async def _act_on_allocation(self, c: _Cycle, plan: LivePlan, considered: list[Job]) -> None:
        """Carry out the allocator's plan: team queues recorded, waiting reasons, the
        jobs it stops, resizes, then its starts in its order (one gang after another)."""
        jobs, now = c.jobs, c.now
        await self._complete(c, plan)
        await self._each(lambda j: self.status.patch(j, {"queueName": j.team}),
                         [j for j in considered if j.team != j.status.get("queueName")], now)
        await self._each(lambda j: self.lifecycle.waiting(j, plan.waiting.get(j.key)),
                         [jobs[k] for k in plan.waiting if k not in plan.stop], now)
        back = set(plan.interrupt)
        await self._each(lambda j: self.lifecycle.stop_reallocated(j, now, interrupt=j.key in back),
                         [jobs[k] for k in plan.stop], now)
        await self._each(lambda j: self.lifecycle.resize(j, plan.resize[j.key], now),
                         [jobs[k] for k in plan.resize], now)
        for k, t in plan.start.items():
            await self._contain(jobs[k], lambda j, t=t: self.lifecycle.admit(j, now, target=t.workers,
                                                                        batch=t.batch_size, gpu_type=t.gpu_type), now)

    # ------------------------------------------------------------------ 4. upkeep and report
    async def _sweep(self, by_uid: Mapping[str, Job]) -> None:
        if self.config.sweep_every and self.cycles % self.config.sweep_every == 1:
            try:
                await self.rbac.sweep(set(by_uid))
            except (ApiException, OSError, asyncio.TimeoutError) as exc:
                self.metrics.job_errors.labels(kind="transient").inc()
                log.warning("RBAC sweep failed, retried later: %r", exc)

    def _metrics(self, jobs: Mapping[str, Job], plan: CyclePlanSummary) -> None:
        m = self.metrics
        phases: dict[str, int] = {p: 0 for p in ("Queued", "Starting", "Running", "Succeeded", "Failed")}
        queues = {"interrupt": 0, "urgent": 0, "normal": 0}
        workers = 0
        admitted = set(plan.admit)
        for j in jobs.values():
            ph = j.status.get("phase")
            if ph in phases:
                phases[ph] += 1
            if ph == "Queued" and j.key not in admitted and j.status.get("queue") in queues:
                queues[j.status["queue"]] += 1
            workers += len(j.live_pods())
        for p, n in phases.items():
            m.jobs.labels(phase=p).set(n)
        for q, n in queues.items():
            m.queue_length.labels(queue=q).set(n)
        m.workers.set(workers)
        m.unfittable.set(len(plan.unfittable))

    async def _each(self, fn, jobs, now: float) -> None:
        """Run ``fn(job)`` for every job, at most ``config.parallelism`` at a time; an
        error is contained to its job (:meth:`_contain`)."""
        sem = asyncio.Semaphore(max(1, self.config.parallelism))

        async def one(j: Job) -> None:
            async with sem:
                await self._contain(j, fn, now)

        await asyncio.gather(*(one(j) for j in jobs))

    async def _contain(self, j: Job, fn, now: float) -> None:
        """``await fn(j)``; what goes wrong stays with ``j``: a :class:`JobRejected`
        fails the job, an API or network error is retried next cycle, anything else
        (a bug) is logged with its traceback and reported on the job."""
        try:
            await fn(j)
            return
        except JobRejected as exc:
            self.metrics.job_errors.labels(kind="rejected").inc()
            failure = exc
        except ApiException as exc:
            self.metrics.job_errors.labels(kind="transient").inc()
            reason, message = api_error(exc)
            log.warning("%s: API %s %s: %s; retried next cycle", j.key, exc.status, reason, message)
            return
        except (OSError, asyncio.TimeoutError) as exc:
            self.metrics.job_errors.labels(kind="transient").inc()
            log.warning("%s: %r; retried next cycle", j.key, exc)
            return
        except Exception as exc:
            self.metrics.job_errors.labels(kind="unexpected").inc()
            log.exception("%s: unexpected error; the job is retried next cycle", j.key)
            msg = f"unexpected error, retried every cycle: {exc!r}"
            if self._errors.get(j.uid) != msg:  # one event per distinct error, not one per cycle
                self._errors[j.uid] = msg
                try:
                    await self.status.event(j.body, "ReconcileError", msg, "Warning")
                except Exception:
                    log.exception("%s: could not report the error", j.key)
            return
        try:
            await self.lifecycle.fail(j, failure.reason, failure.message, now, ctype=failure.ctype)
        except Exception:
            log.exception("%s: could not fail the job after %s: %s", j.key, failure.reason, failure.message)

    def _report_unreadable(self, problems: Mapping[str, str]) -> None:
        """Log each object the snapshot could not read once (while it lasts)."""
        for key in sorted(set(problems) - self._reported):
            log.warning("%s: %s", key, problems[key])
        self._reported = set(problems)
