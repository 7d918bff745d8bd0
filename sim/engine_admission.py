"""The event engine's heuristic path: core's admission over an ordering and a placement.

Translation and caching only: who starts is core's :meth:`Admission.walk
<rlsched.core.planning.Admission.walk>` over the ordering's ranking, who is preempted
core's :class:`~rlsched.core.cycle.SchedulingCycle`; this part turns the engine's jobs
into core's entries, applies the decisions, and keeps ranking caches that skip what
cannot change. A part of :class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

import logging
import math

from rlsched.core import JobView, PlacementError
from rlsched.core.cycle import Preemption
from rlsched.core.ordering import reached_threshold

from .engine_jobs import DEMOTE, WAKE, JobState

log = logging.getLogger("rlsched.sim")

#: orderings that rank by a per-job key, so ranking a subset is consistent (DRF is
#: not: its progressive filling depends on the other jobs in the list)
KEY_ORDERINGS = frozenset({"fifo", "sjf", "srtf", "tetris", "tiresias"})
#: ... whose relative order of two pending jobs never changes while they wait
STATIC_ORDERINGS = frozenset({"fifo", "sjf", "srtf", "tiresias"})


class HeuristicPath:
    """Admission passes, preemptions and demotions of ``sim``'s ordering and placement
    (``sim.admission``, ``sim.cycle``), and the state they keep between passes."""

    def __init__(self, sim) -> None:  # the Simulator it is a part of
        self.sim = sim
        ordering, placement, config = sim.ordering, sim.placement, sim.config
        #: the ordering preempts by itself (SRTF, Tiresias), so every pass looks for victims
        self.policy_preempts = sim.admission is not None and config.preemption and sim.admission.preemptive_ordering
        self._demotes_at = ordering.demotes_at if self.policy_preempts and ordering.thresholds else None
        self.highest_pending = 0  # pending ``highest`` jobs (they may preempt)
        self._new: list[JobView] = []  # arrivals since the last policy pass
        self.full_pass_needed = True  # GPUs were released since the last pass
        inc = config.incremental_ranking
        name = ordering.name if ordering is not None else ""  # none: the allocation path decides
        self._incremental = (name in KEY_ORDERINGS) if inc is None else inc
        self._static = self._incremental and name in STATIC_ORDERINGS
        self._order: list[JobView] | None = None  # last full ranking (static orderings)
        self._pos = 0
        self._side: list[JobView] = []  # arrivals since that ranking
        # a ranking that may leave jobs which cannot start unordered among themselves
        # (``rank_for_start``, core.policy): the same jobs start, as the placement
        # cannot start a job whose worker slots fall short and a pass only takes capacity
        rfs = getattr(ordering, "rank_for_start", None)
        self._rank_for_start = (
            rfs if rfs is not None and getattr(placement, "respects_worker_slots", False) else None
        ) if ordering is not None else None

    # ------------------------------------------------------------ the engine's events
    def queued(self, j: JobState) -> None:
        """``j`` arrived and waits."""
        if j.spec.priority_class == "highest":
            self.highest_pending += 1
        self._new.append(j.view)

    def started(self, j: JobState) -> None:
        if j.spec.priority_class == "highest":
            self.highest_pending -= 1

    def requeued(self, j: JobState) -> None:
        """``j`` was suspended and waits again."""
        self._new.append(j.view)
        self._order = None  # the static ranking cache held it as started
        self.full_pass_needed = True
        if j.spec.priority_class == "highest":
            self.highest_pending += 1

    def demote(self, j: JobState, t: float) -> None:
        """A running job's attained service crossed one of the ordering's thresholds."""
        sim = self.sim
        sim.dynamics.sync(j, t)
        v = j.view
        v.attained_service = reached_threshold(v.attained_service, sim.ordering.thresholds)
        if sim.state.pending:
            sim._dirty = True
        self.schedule_demote(j, t)

    def schedule_demote(self, j: JobState, t: float) -> None:
        if self._demotes_at is not None:
            td = self._demotes_at(j.view, t)
            if td is not None:
                self.sim._push(max(td, t), DEMOTE, (j, j.version))

    def wake_for_protected(self) -> None:
        """With a minimum run time, a preemption it refused may be due when the first
        protected job's protection ends: look again then (the operator looks every
        cycle)."""
        sim = self.sim
        min_run = sim.admission.min_run_s
        if min_run <= 0 or not sim.state.pending:
            return
        ends = [float(v.start_time) + min_run for v in sim.state.running.values()
                if v.start_time is not None and sim.now - float(v.start_time) < min_run]
        if not ends:
            return
        # a protection that ends now by the sum may still hold by the difference (rounding):
        # look again just after now, never at now (that would wake at the same time forever)
        end = max(min(ends), math.nextafter(sim.now, math.inf))
        if sim._wake_at is None or end < sim._wake_at:
            sim._wake_at = end
            sim._push(end, WAKE, None)

    def blocked_head(self) -> JobView | None:
        """The job at the head of the waiting queue (core's
        :meth:`SchedulingCycle.head <rlsched.core.cycle.SchedulingCycle.head>`; after a
        policy pass every waiting job is blocked or behind it)."""
        sim = self.sim
        return sim.cycle.head(sim.state.pending, sim.state)

    def apply_preemption(self, d: Preemption) -> bool:
        """Apply core's decision (:meth:`SchedulingCycle.preempt
        <rlsched.core.cycle.SchedulingCycle.preempt>`): suspend its victims (to the
        interrupt queue where it says), then start the head where the placement says.
        Returns False when the head's placement failed (it waits)."""
        sim = self.sim
        head = d.head
        interrupt = set(d.interrupt)
        decisions = sim.recorder.decisions
        for key in d.victims:
            if decisions is not None:
                decisions.append({"kind": "preempt", "job": key, "t": sim.now, "by": head.id})
            sim._suspend(sim._by_id[key], sim.now, interrupt=key in interrupt)
        if self.try_start(head):
            sim.state.pending = [p for p in sim.state.pending if p.start_time is None]
            return True
        log.warning("t=%g: job %s preempted %s but its placement failed; it waits", sim.now, head.id, d.victims)
        return False

    # ------------------------------------------------------------ admission passes
    def schedule_pass(self) -> None:
        """One policy pass: rank the pending jobs and start them in order. With a
        placement that ``respects_worker_slots``, an ordering's ``rank_for_start`` ranks
        (core.policy: jobs that cannot start may stay unordered among themselves; they
        fail to start wherever they stand, so the same jobs start).

        Translation and caching only: who starts is core's :meth:`Admission.walk
        <rlsched.core.planning.Admission.walk>` (head-of-line or backfill) over the
        ordering's ranking; the caches only skip ranking what cannot change."""
        sim = self.sim
        sim._dirty = False
        st = sim.state
        pending = st.pending
        new, self._new = self._new, []
        backfill = sim.config.backfill
        if self._static and not backfill:
            self._absorb(new)
            if st.free_gpus > 0:
                self._schedule_static()
            return
        if not pending or st.free_gpus == 0:
            self.full_pass_needed = self.full_pass_needed or bool(pending)
            return
        if self._incremental and backfill and not self.full_pass_needed:
            # Backfill, and nothing released since the last full pass: every job tried
            # then still does not fit, so only the new arrivals can start. Exact for
            # orderings that sort by a per-job key.
            ranked = sim.ordering.rank(new, st) if len(new) > 1 else new
        elif self._rank_for_start is not None:
            ranked = self._rank_for_start(pending, st)
        else:
            ranked = sim.ordering.rank(pending, st)
        self.full_pass_needed = False
        started, _ = sim.admission.walk((v for v in ranked if v.start_time is None), self.try_start)
        if started:
            st.pending = [p for p in pending if p.start_time is None]

    def try_start(self, v: JobView) -> bool:
        """Start pending job ``v`` where the placement policy says, if it fits now."""
        sim = self.sim
        st = sim.state
        if v.gpus > st.free_gpus:
            return False
        nodes = sim.placement.place(v, st)
        if nodes is None:
            return False
        if len(nodes) != v.workers:
            raise PlacementError(
                f"placement {sim.placement.name!r} gave {len(nodes)} nodes for {v.workers} workers of job {v.id}"
            )
        sim._start(sim._by_id[v.id], nodes, sim.now)
        return True

    def _absorb(self, new: list[JobView]) -> None:
        """Merge new arrivals into the cached ranking (static orderings)."""
        st = self.sim.state
        side = self._side
        rank = self.sim.ordering.rank
        if self._order is None or len(side) + len(new) > max(32, len(st.pending) // 8):
            self._order = rank(st.pending, st)
            self._pos = 0
            side.clear()
            return
        for x in new:  # binary insertion, comparing two jobs at a time
            lo, hi = 0, len(side)
            while lo < hi:
                mid = (lo + hi) // 2
                if rank([side[mid], x], st)[0] is x:
                    hi = mid
                else:
                    lo = mid + 1
            side.insert(lo, x)

    def _schedule_static(self) -> None:
        """Head-of-line pass for orderings whose relative order of pending jobs never
        changes (FIFO, SJF, SRTF, Tiresias without preemption): keep the last full
        ranking plus a side list of later arrivals, and find each next head by ranking
        only (head of the ranking + side list). The side list is folded into a full
        re-ranking when it outgrows an eighth of the queue. A cache over core's
        :meth:`Admission.walk <rlsched.core.planning.Admission.walk>`: it decides
        nothing of its own."""
        started, _ = self.sim.admission.walk(self._static_heads(), self.try_start)  # backfill is off here
        if started:
            st = self.sim.state
            st.pending = [p for p in st.pending if p.start_time is None]

    def _static_heads(self):
        """The successive heads of the cached ranking + side list; resumed only after
        the last head started (a blocked head ends the head-of-line walk)."""
        st = self.sim.state
        side = self._side
        order = self._order
        while True:
            pos = self._pos
            while pos < len(order) and order[pos].start_time is not None:
                pos += 1
            self._pos = pos
            head = order[pos] if pos < len(order) else None
            while side and side[0].start_time is not None:  # started from outside
                del side[0]
            if side:  # side is kept ranked: compare the two heads
                v = side[0] if head is None else self.sim.ordering.rank([head, side[0]], st)[0]
            elif head is not None:
                v = head
            else:
                return
            yield v
            if v is head:
                self._pos += 1
            else:
                del side[0]
