"""What the live probes found, held without a cluster: where a job between two
generations holds its GPUs, an admission adopted after a restart, attained service at
completion, the allocator named in events, and the bounds on ``spec.batchSize``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlsched.core import ClusterState, NodeSpec, Topology
from rlsched.core.contract import MAX_BATCH_SIZE
from rlsched.operator.controller import Controller
from rlsched.operator.job import Job
from rlsched.operator.status import format_time, guard_status
from rlsched.operator.snapshot import build_snapshot, charge_packed
from rlsched.operator.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "registry.example/t:1"}]}}


def _state(*gpus: int, models: tuple[str, ...] = ()) -> ClusterState:
    return ClusterState(Topology([NodeSpec(name=f"n{i}", gpus=g, rack="r0", block="b0",
                                           **({"gpu_model": models[i]} if models else {}))
                                  for i, g in enumerate(gpus)]))


def test_a_restarting_job_is_held_where_it_ran_then_packed_never_on_the_freest_node():
    st = _state(8, 8, 8, 8)
    st.allocate(3, 1)  # another pod on the last node
    charge_packed(st, 1, 1, prefer=[3])  # a 1-GPU job that last ran there
    assert st.free.tolist() == [8, 8, 8, 6]  # three whole nodes stay for a gang
    st = _state(8, 8, 8, 8)
    st.allocate(2, 5)
    charge_packed(st, 2, 1)  # nowhere known: best fit, the fullest node with room
    assert st.free.tolist() == [8, 8, 1, 8]
    st = _state(8, 8, 8, models=("A100", "H100", "H100"))
    st.allocate(2, 4)
    charge_packed(st, 2, 4, models=frozenset({"H100"}))  # only nodes of its GPU model, whole workers
    assert st.free.tolist() == [8, 4, 0]


def test_unbound_pods_are_charged_best_fit():
    nodes = [{"metadata": {"name": f"n{i}", "labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
             for i in range(3)]
    pods = [{"metadata": {"name": "bound", "namespace": "ns"}, "status": {"phase": "Running"},
             "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "6"}}}]}},
            {"metadata": {"name": "pending", "namespace": "ns"}, "status": {"phase": "Pending"},
             "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}]
    assert build_snapshot(nodes, pods).state.free.tolist() == [8, 1, 8]


SPEC = parse_spec({"minWorkers": 2, "maxWorkers": 4, "gpusPerWorker": 1, "template": TEMPLATE})


@pytest.mark.parametrize("admitted_ago, phase", [(10.0, "Starting"), (200.0, "Queued"), (-1000.0, "Queued")])
def test_an_admission_recorded_before_a_crash_is_adopted_within_the_start_timeout(admitted_ago, phase):
    """No record (a restarted operator), no pod yet: ``Starting`` admitted 10 s ago is
    the operator's own unfinished admission (finished); 200 s ago (past the 120 s start
    timeout) or in the future it is queued again."""
    status = {"phase": "Starting", "targetWorkers": 2, "admittedTime": format_time(NOW - admitted_ago)}
    trusted, _ = guard_status(status, None, SPEC, created=NOW - 3600, now=NOW, live_workers=0,
                              start_timeout_s=120.0)
    assert trusted["phase"] == phase
    running = {**status, "phase": "Running"}  # a Running job without any pod is never adopted
    assert guard_status(running, None, SPEC, created=NOW - 3600, now=NOW, live_workers=0,
                        start_timeout_s=120.0)[0]["phase"] == "Queued"


@pytest.fixture
def controller(offline_controller):
    """``controller(**config)``: a Controller whose status writes, events and pod
    deletions are recorded in ``ctl.calls`` (no API server)."""

    def make(**kw) -> Controller:
        ctl = offline_controller(**kw)
        ctl.calls = []

        async def patch_status(job, patch, **k):
            ctl.calls.append(("patch", patch))

        async def event(body, reason, message, type_="Normal"):
            ctl.calls.append(("event", reason, message))

        async def delete_pod(*a, **k):
            ctl.calls.append(("delete", a))

        ctl.status.patch, ctl.status.event, ctl.workers.delete_pod = patch_status, event, delete_pod
        return ctl

    return make


def _job(status: dict) -> Job:
    body = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "creationTimestamp": format_time(NOW - 600)},
            "spec": {}, "status": status}
    return Job(body, SPEC, None)


def test_completion_brings_attained_service_up_to_date(controller):
    """3 workers x 1 GPU held for the 100 s since attainedSince, on top of 50 GPU-s: 350."""
    ctl = controller(allocator="goodput")
    j = _job({"phase": "Running", "targetWorkers": 3, "attainedGpuSeconds": 50.0,
              "attainedSince": format_time(NOW - 100)})
    ctl.run(ctl.lifecycle.complete(j, "MaxEpochs", NOW))
    patch = next(c[1] for c in ctl.calls if c[0] == "patch")
    assert patch["phase"] == "Succeeded"
    assert patch["attainedGpuSeconds"] == pytest.approx(350.0) and patch["attainedSince"] is None


def test_the_plans_end_of_a_job_completes_it(controller):
    """Under an allocator the β stop comes in the plan (``LivePlan.complete``): the job
    Succeeds with the plan's reason and its elastic state recorded."""
    from rlsched.core.live_allocation import LivePlan
    from rlsched.core.planning import ElasticState
    from rlsched.core.queues import QueueBook
    from rlsched.operator.controller import _Cycle

    ctl = controller(allocator="goodput-rlpto")
    j = _job({"phase": "Running", "targetWorkers": 1})
    c = _Cycle(NOW, {j.key: j}, {j.uid: j}, None, QueueBook(), [], running={j.key: ElasticState(streak=5)})
    ctl.run(ctl._complete(c, LivePlan(complete={j.key: "Converged"})))
    patch = next(call[1] for call in ctl.calls if call[0] == "patch")
    assert (patch["phase"], patch["reason"], patch["rlpto"]["streak"]) == ("Succeeded", "Converged", 5)
    assert [call[1] for call in ctl.calls if call[0] == "event"] == ["Completed"]


def test_a_stopped_job_waits_in_the_queue_the_plan_names(controller):
    """The plan's ``interrupt`` (RLPTO's class rule, core's word): that job resumes
    first; another stopped job waits in its own queue, as in the engine."""
    from rlsched.core.live_allocation import LivePlan
    from rlsched.core.queues import QueueBook
    from rlsched.operator.controller import _Cycle

    ctl = controller(allocator="tiresias/das+nobackfill")
    a, b = (Job({**_job({"phase": "Running", "targetWorkers": 2}).body, "metadata": {
        "name": n, "namespace": "ns", "uid": n, "creationTimestamp": format_time(NOW - 600)}}, SPEC, None)
        for n in ("a", "b"))
    c = _Cycle(NOW, {a.key: a, b.key: b}, {a.uid: a, b.uid: b}, None, QueueBook(), [])
    ctl.run(ctl._act_on_allocation(c, LivePlan(stop=[a.key, b.key], interrupt=[a.key]), [a, b]))
    queues = [call[1]["queue"] for call in ctl.calls if call[0] == "patch" and call[1].get("phase") == "Queued"]
    assert sorted(queues) == ["interrupt", "normal"]


def test_events_name_the_allocator_that_runs(controller):
    ctl = controller(allocator="goodput-rlpto@restart_delay=30")
    assert ctl.allocation.name == "goodput-rlpto"
    ctl.run(ctl.lifecycle.stop_reallocated(_job({"phase": "Running", "targetWorkers": 2}), NOW))
    (_, reason, message), = [c for c in ctl.calls if c[0] == "event"]
    assert reason == "Preempted" and message.startswith("preempted by goodput-rlpto:")


@pytest.mark.parametrize("key, value", [("batchSize", 1e15), ("batchSize", MAX_BATCH_SIZE + 1),
                                        ("maxBatchSize", 2**40), ("batchSize", float("inf"))])
def test_batch_sizes_beyond_the_bound_are_refused_clearly(key, value):
    spec = {"minWorkers": 1, "maxWorkers": 1, "gpusPerWorker": 1, "template": TEMPLATE, "batchSize": 32, key: value}
    with pytest.raises(SpecError, match=rf"spec\.{key} must be"):
        parse_spec(spec)
    assert parse_spec({**spec, key: MAX_BATCH_SIZE}).batch_size in (32, MAX_BATCH_SIZE)


def test_the_crd_schemas_bound_the_batch_sizes_as_the_operator_does():
    for path in (ROOT / "operator" / "crd" / "trainingjob.yaml",
                 ROOT / "deploy" / "helm" / "rlsched" / "files" / "crds" / "trainingjob.yaml"):
        props = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
            "properties"]["spec"]["properties"]
        assert props["batchSize"]["maximum"] == props["maxBatchSize"]["maximum"] == MAX_BATCH_SIZE
        assert {props["localBatchSize"]["properties"][k]["maximum"] for k in ("min", "max")} == {MAX_BATCH_SIZE}


def test_the_allocator_decides_on_a_change_of_its_jobs_and_else_on_its_interval(controller):
    """core's DecisionClock, as in both engines: every cycle without one; with one, a
    change of the jobs it decides for (one came, went, became movable or ended by
    itself) is decided at least ``decision_gap_s`` after the last decision, and no
    change waits the interval."""
    from rlsched.core.cluster import JobView, Progress

    def jobs(*keys, **kw):
        return [JobView(id=k, submit_time=0.0, min_workers=1, max_workers=1, **kw) for k in keys]

    assert controller(allocator="goodput").decision_due(jobs("a"), NOW)
    ctl = controller(allocator="goodput", decision_gap_s=30.0, decision_interval_s=300.0)
    assert ctl.decision_due(jobs("a"), NOW)  # nothing decided yet
    ctl._decided = (NOW, ctl._decision_keys(jobs("a")))
    assert not ctl.decision_due(jobs("a"), NOW + 5)  # nothing changed
    assert not ctl.decision_due(jobs("a", "b"), NOW + 5)  # b came, within the gap
    assert ctl.decision_due(jobs("a", "b"), NOW + 30)
    assert ctl.decision_due(jobs(), NOW + 30)  # a went
    assert ctl.decision_due(jobs("a", movable=False), NOW + 30)  # a restarts its generation
    three, ten = Progress(scale_invariant_epochs=3), Progress(scale_invariant_epochs=10)
    assert not ctl.decision_due(jobs("a", placement=(0,), progress=three, max_epochs=10), NOW + 30)
    assert ctl.decision_due(jobs("a", placement=(0,), progress=ten, max_epochs=10), NOW + 30)  # a ended
    ctl._wake_at = NOW + 100  # the policy asked (a Tiresias demotion)
    assert not ctl.decision_due(jobs("a"), NOW + 99) and ctl.decision_due(jobs("a"), NOW + 100)
    assert ctl.decision_due(jobs("a"), NOW + 300)  # the interval


def test_a_heuristic_allocator_sees_the_users_estimate_less_the_time_run(controller):
    """``spec.estimatedRuntime`` reaches the allocator (SJF and SRTF sort on it): a job
    of 2 x 1 GPU that attained 200 GPU-s has run 100 s of its 1,000 s estimate, 900 s
    left; with no estimate nothing is known."""
    told = parse_spec({"minWorkers": 2, "maxWorkers": 4, "gpusPerWorker": 1, "template": TEMPLATE,
                       "estimatedRuntime": 1000})
    ctl = controller(allocator="srtf/firstfit")
    body = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "creationTimestamp": format_time(NOW - 600)},
            "spec": {}, "status": {"phase": "Queued", "attainedGpuSeconds": 200.0}}
    live = ctl.lifecycle.live_job(Job(body, told, None), NOW, (), None)
    assert (live.est_runtime, live.remaining) == (1000.0, pytest.approx(900.0))
    unknown = ctl.lifecycle.live_job(_job({"phase": "Queued"}), NOW, (), None)
    assert (unknown.est_runtime, unknown.remaining) == (0.0, 0.0)
