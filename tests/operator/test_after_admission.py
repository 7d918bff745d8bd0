"""The scaling planner decides on the cluster as it is after this cycle's admissions.

Found by the twin check (docs/twin.md): the operator handed ``ScalingPlanner`` the
snapshot read at the start of the cycle, where a gang admitted in this very cycle
has no pods yet, so its GPUs looked free and a scale-up could take them (the gang
then waits in ``Starting`` until its start timeout); and the snapshot had no pending
jobs, so RLPTO's "jobs waiting" feature was always 0 live. The simulator admits
before it scales, on one state."""

from __future__ import annotations

from rlsched.core import ClusterState, Progress, Topology, make_scaling
from rlsched.core.planning import Admission, ElasticState, ScalingPlanner, TrainingSpec
from rlsched.core.policy import make_ordering
from rlsched.core.cycle import after_admission


def _setup():
    topo = Topology.uniform(2, gpus_per_node=8, racks=1)
    state = ClusterState(topo)
    # node 0 full with the running elastic job, node 1 empty
    state.allocate(0, 8)
    elastic = TrainingSpec(min_workers=2, max_workers=4, gpus_per_worker=4, beta=0.01)
    running = elastic.view("ns/run", submit_time=0.0, workers=2, priority=0.0, start_time=0.0, record=ElasticState(),
                           progress=Progress(epoch=1, accuracy=0.5, history=[0.5]), placement=[0, 0])
    gang = TrainingSpec(min_workers=2, max_workers=2, gpus_per_worker=4)
    later = TrainingSpec(min_workers=1, max_workers=1, gpus_per_worker=8)
    waiting = [gang.view("ns/new", submit_time=1.0, workers=gang.min_workers, priority=0.0),
               later.view("ns/later", submit_time=2.0, workers=1, priority=0.0)]
    holders = [elastic.view("ns/run", submit_time=0.0, workers=2, priority=0.0, start_time=0.0, placement=[0, 0])]
    return state, running, waiting, holders


def test_admitted_gang_holds_its_gpus_and_waiting_jobs_are_pending():
    state, _, waiting, holders = _setup()
    plan = Admission(make_ordering("fifo")).plan(waiting, holders, state)
    assert plan.admit == ["ns/new"] and plan.blocked == "ns/later"
    assert state.free_gpus == 8
    after = after_admission(state, waiting, plan)
    assert after.free_gpus == 0
    assert [v.id for v in after.pending] == ["ns/later"]


def test_no_scale_up_on_the_gpus_of_a_gang_admitted_this_cycle():
    state, running, waiting, holders = _setup()
    waiting = waiting[:1]  # nobody blocked: no reservation would hide the bug
    plan = Admission(make_ordering("fifo")).plan(waiting, holders, state)
    assert plan.admit == ["ns/new"] and plan.blocked is None
    planner = ScalingPlanner(make_scaling("beta"), patience=5)
    # on the cycle's first snapshot the planner would hand node 1 to the running job too
    before = planner.plan([running], _clone(state))
    assert before.deltas == {"ns/run": 1}
    running.record = ElasticState()
    after = planner.plan([running], after_admission(state, waiting, plan))
    assert after.deltas == {}


def _clone(state: ClusterState) -> ClusterState:
    c = ClusterState(state.topology, time=state.time)
    for i, used in enumerate((state.total - state.free).tolist()):
        if used:
            c.allocate(i, int(used))
    return c
