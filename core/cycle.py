"""The scheduling cycle: admission, preemption and elastic scaling as one pure call.

:class:`SchedulingCycle` strings core's planners together (admission, the cluster as
scaling sees it after admission, scaling with the blocked head's gang reserved), so the
sequence lives here once and the adapters only translate; the result is one
:class:`CyclePlan`; ``settle=True`` settles preemptions within the one call (the gang
allocator, behind every caller's one decision). Pure: no Kubernetes, no clock.
Design notes: docs/design-notes.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

import numpy as np

from .cluster import ClusterState, JobView
from .planning import (
    Admission,
    AdmissionPlan,
    ScalingPlan,
    ScalingPlanner,
    reserved_gpus,
    take_gang,
)

__all__ = ["SchedulingCycle", "CyclePlan", "SettleRound", "after_admission", "best_fit_gang", "interrupts"]

log = logging.getLogger(__name__)

#: admission's room check and the settle mode's placement: a gang's node per worker, or None
PlaceGang = Callable[[JobView, ClusterState], Union[Sequence[int], None]]
#: the scaling step's room check: a node for one more worker of a running job, or None
PlaceOne = Callable[[JobView, ClusterState], Union[int, None]]
#: the elastic jobs, or a callable building them once admission is decided: it gets the
#: keys preempted for good this cycle (the gang allocator folds each job's reported curve
#: into the live view that admission reads too, so it builds them only afterwards)
Elastic = Union[Sequence[JobView], Callable[[set], Sequence[JobView]]]


def after_admission(state: ClusterState, waiting: Sequence[JobView], plan: AdmissionPlan) -> ClusterState:
    """``state`` as the scaling planner must see it after this cycle's admissions: the
    gangs admitted hold their GPUs (where :meth:`Admission.plan` counted them, best fit;
    their pods do not exist yet, so the snapshot still shows the GPUs free) and the jobs
    still waiting are its pending jobs (the RLPTO policy reads how many wait). Without
    it a scale-up could take the GPUs a gang was just admitted to, leaving that gang
    Starting until its start timeout; the simulator admits before it scales, on one
    state. Mutates and returns ``state``."""
    admitted = set(plan.admit)
    by_key = {v.id: v for v in waiting}
    for key in plan.admit:  # in the order the plan took their GPUs
        v = by_key[key]
        free = np.maximum(state.free.astype(np.int64), 0)
        after = free.copy()
        try:
            take_gang(after, v.gpus_per_worker, v.workers)
        except ValueError:  # it fitted when planned; a snapshot cannot shrink in between
            log.warning("%s: admitted gang no longer fits the snapshot; scaling sees its GPUs free", key)
            continue
        for i in np.flatnonzero(free - after):
            state.allocate(int(i), int(free[i] - after[i]))
    state.pending = [v for v in waiting if v.id not in admitted]
    return state


def best_fit_gang(job: JobView, state: ClusterState) -> list[int] | None:
    """The settle mode's default placement: ``job.workers`` workers on the fullest nodes
    that fit them (:func:`~rlsched.core.planning.take_gang`'s order), one node per
    worker, or None when the gang does not fit."""
    free = np.maximum(state.free.astype(np.int64), 0)
    g, left = job.gpus_per_worker, job.workers
    nodes: list[int] = []
    for i in np.argsort(free, kind="stable"):
        if left == 0:
            break
        k = min(left, int(free[i]) // g)
        nodes.extend([int(i)] * k)
        left -= k
    return None if left else nodes


@dataclass(slots=True)
class SettleRound:
    """One admission round of the settle mode: the plan, the gangs placed (key -> node
    per worker, in the order they were placed), the victims released afterwards and
    those of them that wait in the interrupt queue (:func:`interrupts`)."""

    admission: AdmissionPlan
    placed: dict[str, list[int]] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    interrupt: list[str] = field(default_factory=list)


def interrupts(head_class: str, victim_class: str) -> bool:
    """Whether a victim of class ``victim_class`` preempted by a head of ``head_class``
    waits in the interrupt queue and resumes first: RLPTO's class rule, a ``highest``
    head's lower-class victims. A victim of a preemptive ordering goes back to its own
    queue, where the ordering ranks it (from the interrupt queue it would resume ahead
    of its preemptor's peers only to be preempted again)."""
    return head_class == "highest" and victim_class != "highest"


@dataclass(slots=True)
class CyclePlan:
    """What one cycle decides.

    ``admission``: whom to start (``admit``, in order), whom to preempt (``preempt``), the
    blocked head (``blocked``) and the gangs that can never fit (``unfittable``); in the
    settle mode the rounds merged (``admit`` the gangs placed, ``preempt`` every victim,
    in order; the rest as the last round left it). ``scaling``: per elastic job its
    worker change (``deltas``), the node of each scale-up (``nodes``) and the finished
    jobs (``finished``). ``state``: the cluster after admission, as scaling saw it (the
    caller's object, mutated). ``running``: the elastic jobs the scaling step decided
    on (victims dropped; empty without a planner). ``rounds``: the settle mode's rounds
    (empty otherwise). ``blocked``: the live view of the blocked head, if any.

    ``scaling_error``: what the scaling step raised, if anything (then ``scaling`` is
    empty). Admission stands on its own: a caller acts on it, then raises this where it
    would have scaled, so a broken scaling policy never holds admissions back.
    """

    admission: AdmissionPlan
    scaling: ScalingPlan
    state: ClusterState
    running: list[JobView] = field(default_factory=list)
    blocked: JobView | None = None
    rounds: list[SettleRound] = field(default_factory=list)
    scaling_error: Exception | None = None

    @property
    def preempted(self) -> list[str]:
        """The jobs that lose their GPUs this cycle, in order (in the settle mode the
        victims not started again in a later round)."""
        if not self.rounds:
            return list(self.admission.preempt)
        out: list[str] = []
        for r in self.rounds:  # a round places its gangs, then releases its victims
            out = [k for k in out if k not in r.placed] + list(r.released)
        return out


class SchedulingCycle:
    """Admission, preemption and elastic scaling, in one call (see the module docstring).

    ``admission``: core's :class:`~rlsched.core.planning.Admission` (queues, gang fit,
    backfill, preemption); ``planner``: core's
    :class:`~rlsched.core.planning.ScalingPlanner`, or None for no elastic step.
    """

    def __init__(self, admission: Admission, planner: ScalingPlanner | None = None) -> None:
        self.admission = admission
        self.planner = planner

    def plan(
        self,
        waiting: Sequence[JobView],
        holders: Sequence[JobView],
        state: ClusterState,
        *,
        running: Elastic = (),
        releasing: np.ndarray | None = None,
        place: PlaceGang | None = None,
        place_one: PlaceOne | None = None,
        settle: bool = False,
        rounds: int | None = None,
        scale: bool = True,
    ) -> CyclePlan:
        """One cycle over ``state`` (mutated: the admissions stay on it, see
        :class:`CyclePlan`).

        ``waiting``: the queued jobs' live views (a gang of their ``workers``);
        ``holders``: the live view of every job holding GPUs that may be preempted (its
        ``placement``, its dynamic ``priority`` and its ``start_time`` order the victims,
        :meth:`~rlsched.core.planning.Admission.choose_victims`); ``running``: the
        elastic jobs the scaling step decides on (or a callable building them,
        :data:`Elastic`); ``releasing``: per-node GPUs of pods already being deleted (a
        blocked head waits for them rather than preempting again); ``place(job,
        state)``: admission's room check (the placement that follows), and the settle
        mode's placement (default :func:`best_fit_gang`);
        ``place_one(job, state)``: the scaling step's room check for one more worker
        (default best fit). ``settle``: release the victims and plan admission again in
        this call, at most ``rounds`` rounds (default ``2 x (waiting + holders) + 2``).
        ``scale``: run the scaling step (False: admission only, as between two of the
        gang allocator's scaling steps).
        """
        if settle:
            admission, blocked, settled = self._settle(waiting, holders, state, releasing, place, rounds)
        else:
            admission = self.admission.plan(waiting, holders, state, releasing, place=place)
            by_key = {v.id: v for v in waiting}
            blocked = by_key[admission.blocked] if admission.blocked else None
            settled = []
            state = after_admission(state, waiting, admission)
        out = CyclePlan(admission=admission, scaling=ScalingPlan(), state=state, blocked=blocked, rounds=settled)
        if self.planner is None or not scale:
            return out
        gone = set(out.preempted)
        jobs = running(gone) if callable(running) else running
        out.running = [r for r in jobs if r.id not in gone]
        try:
            out.scaling = self._scale(out.running, state, blocked, place_one)
        except Exception as exc:  # noqa: BLE001 - handed to the caller, who raises it after admitting
            out.scaling_error = exc
        return out

    def _settle(
        self,
        waiting: Sequence[JobView],
        holders: Sequence[JobView],
        state: ClusterState,
        releasing: np.ndarray | None,
        place: PlaceGang | None,
        rounds: int | None,
    ) -> tuple[AdmissionPlan, JobView | None, list[SettleRound]]:
        """Admission rounds until nobody is preempted (or ``rounds`` ran): each round's
        gangs are placed on ``state`` and hold GPUs in the next round, its victims are
        released and wait again; the jobs left waiting are ``state.pending``."""
        place = place or best_fit_gang
        waiting, holders = list(waiting), list(holders)
        limit = 2 * (len(waiting) + len(holders)) + 2 if rounds is None else int(rounds)
        done: list[SettleRound] = []
        plan: AdmissionPlan | None = None
        blocked: JobView | None = None
        nominated: set[str] = set()
        for _ in range(limit):
            plan = self.admission.plan(waiting, holders, state, releasing, place=place, nominated=nominated)
            by_key = {v.id: v for v in waiting}
            rnd = SettleRound(plan)
            admit = plan.admit
            if plan.preempt:  # the head goes first onto what its victims free, as the event engine starts
                # it: the jobs behind it wait for the next round (backfilled now, they took
                # those GPUs and the head evicted them in turn, round after round)
                ahead = set(plan.order[:plan.order.index(plan.blocked)])
                admit = [k for k in admit if k in ahead]
            for key in admit:
                v = by_key[key]
                where = place(v, state)
                if where is None:  # the room check said it fits: a placement that disagrees waits
                    continue
                state.allocate_job(v, where)
                v.placement = list(where)
                v.start_time = state.time
                state.running[v.id] = v
                rnd.placed[key] = [int(i) for i in where]
                holders.append(v)
            waiting = [v for v in waiting if v.id not in rnd.placed]
            blocked = by_key.get(plan.blocked) if plan.blocked else None
            done.append(rnd)
            if not plan.preempt:
                break
            evict = set(plan.preempt)
            victims = {r.id: r for r in holders if r.id in evict}
            for key in plan.preempt:
                v = victims[key]
                state.running.pop(key, None)
                state.release_job(v, v.placement)
                v.placement = []
                rnd.released.append(key)
                if blocked is not None and interrupts(blocked.priority_class, v.priority_class):
                    rnd.interrupt.append(key)
                waiting.append(v)  # it waits again
            holders = [r for r in holders if r.id not in victims]
            if blocked is not None:
                # the preemptor is served before every queue until it starts, as the
                # operator nominates it: else the victims, resuming first, would take
                # their GPUs back and it would preempt them again
                nominated.add(blocked.id)
        # the jobs still waiting are its pending jobs, as after_admission leaves them
        state.pending = list(waiting)
        if plan is None:  # rounds=0: nothing planned
            return AdmissionPlan(), None, done
        merged = AdmissionPlan(
            admit=[k for r in done for k in r.placed],
            preempt=[k for r in done for k in r.released],
            order=list(plan.order),
            blocked=plan.blocked,
            waiting_gpus=plan.waiting_gpus,
            unfittable=dict(plan.unfittable),
        )
        return merged, blocked, done

    def _scale(
        self,
        running: Sequence[JobView],
        state: ClusterState,
        blocked: JobView | None = None,
        place_one: PlaceOne | None = None,
    ) -> ScalingPlan:
        """The scaling step: :meth:`ScalingPlanner.plan
        <rlsched.core.planning.ScalingPlanner.plan>` over the elastic jobs ``running``
        on ``state``, the gang of the blocked head of line ``blocked`` reserved
        (:func:`~rlsched.core.planning.reserved_gpus`: scale-ups never take the GPUs it
        waits for), room checked with ``place_one`` (default best fit). Raises what the
        policy raises; ValueError without a planner."""
        if self.planner is None:
            raise ValueError("no scaling planner in this cycle")
        return self.planner.plan(running, state, reserved_gpus=reserved_gpus(blocked), place=place_one)
