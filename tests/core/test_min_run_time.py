"""A minimum run time before preemption (issue 26 item 2): a job that started less than
``min_run_s`` ago is no victim, in the operator's admission plan and in the event
engine alike; once it has run that long it is. Times computed by hand."""

import pytest

from rlsched.core import ClusterState, Topology, make_ordering, make_placement
from rlsched.core.planning import HIGHEST_BONUS, Admission, TrainingSpec
from rlsched.sim import JobSpec, SimConfig, Simulator


def test_admission_spares_a_job_younger_than_the_minimum_run_time():
    state = ClusterState(Topology.uniform(1, gpus_per_node=8, racks=1, blocks=1))
    state.allocate(0, 8)
    boss = TrainingSpec(1, 1, gpus_per_worker=8, priority_class="highest").view(
        "boss", submit_time=140.0, workers=1, priority=HIGHEST_BONUS, queue="urgent")
    low = TrainingSpec(1, 1, gpus_per_worker=8).view("low", submit_time=0.0, workers=1, priority=0.0,
                                                     start_time=100.0, placement=[0])
    adm = Admission(make_ordering("fifo"), min_run_s=60.0)
    for now, victims in ((150.0, []), (159.9, []), (160.0, ["low"])):
        state.time = now
        assert adm.plan([boss], [low], state).preempt == victims, now
    assert Admission(make_ordering("fifo")).plan([boss], [low], state).preempt == ["low"]
    with pytest.raises(ValueError, match="min_run_s"):
        Admission(make_ordering("fifo"), min_run_s=-1.0)


@pytest.mark.parametrize("min_run, preempted_at", [(0.0, 50.0), (120.0, 120.0)])
def test_the_engine_preempts_only_after_the_minimum_run_time(min_run, preempted_at):
    jobs = [JobSpec("low", 0.0, workers=1, gpus_per_worker=8, duration=10_000.0),
            JobSpec("boss", 50.0, workers=1, gpus_per_worker=8, duration=100.0, priority_class="highest")]
    sim = Simulator(jobs, Topology.uniform(1, gpus_per_node=8, racks=1, blocks=1), ordering=make_ordering("fifo"),
                    placement=make_placement("bestfit"),
                    config=SimConfig(record_decisions=True, min_run_s=min_run, scaling_interval=10.0))
    res = sim.run()
    pre = [d for d in res.decisions if d["kind"] == "preempt"]
    assert [(d["job"], d["t"]) for d in pre] == [("low", preempted_at)]


@pytest.mark.timeout(120)
def test_a_protection_that_ends_now_only_by_rounding_does_not_wake_the_engine_forever():
    """A job started at 32402.74530246822 with a 600 s minimum run time is protected
    until 33002.74530246822 by the sum, but at that time ``now - start`` is
    599.9999999999964: the engine looks again just after, not at the same time forever
    (this run never ended before)."""
    import numpy as np

    from rlsched.sim.traces import default_topology, load_trace

    trace = load_trace("synthetic:small,jobs=200", seed=3)
    so, sp, _ = np.random.SeedSequence(3).spawn(3)
    topology = trace.topology or default_topology(trace.jobs)
    sim = Simulator(trace.jobs, topology, seed=3, config=SimConfig(min_run_s=600.0),
                    ordering=make_ordering("tiresias", rng=np.random.default_rng(so)),
                    placement=make_placement("topology", rng=np.random.default_rng(sp)))
    res = sim.run()
    assert len(res.records) == 200 and not res.unfinished
