"""The pure guards of the control loop (issue 12 items 3-5): what a refused pod means,
which status values the operator acts on, which pods are its own."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import API_VERSION, ShapeError, controlling_job, dns_label
from rlsched.core.planning import TrainingSpec
from rlsched.operator.api import api_error, permanent_rejection
from rlsched.operator.status import (OWNED_FIELDS, format_time, guard_status, merge_diff, merge_patch, restart_stall,
                                     set_condition, stall_seconds)

SPEC = TrainingSpec(min_workers=1, max_workers=2)
NOW = 1_800_000_000.0
CREATED = NOW - 3600


def exc(status, message, reason=None):
    e = ApiException(status=status, reason="Unprocessable Entity")
    e.body = json.dumps({"kind": "Status", "status": "Failure", "message": message,
                         **({"reason": reason} if reason else {}), "code": status}).encode()
    return e


# ------------------------------------------------------------------ refused pods
def test_api_error_carries_the_api_servers_reason_and_message():
    e = exc(403, 'pods "j-worker-0" is forbidden: no PriorityClass with name no-such-class was found', "Forbidden")
    assert api_error(e) == ("Forbidden", 'pods "j-worker-0" is forbidden: no PriorityClass with name no-such-class was found')
    # no Status body: the reason follows the HTTP status
    bare = ApiException(status=503, reason="Service Unavailable")
    assert api_error(bare) == ("ServiceUnavailable", "Service Unavailable")
    text = ApiException(status=500, reason="x")
    text.body = b"<html>oops</html>"
    assert api_error(text) == ("InternalError", "<html>oops</html>")


@pytest.mark.parametrize("status, message, permanent", [
    (422, 'Pod "x" is invalid: metadata.labels: Invalid value', True),
    (400, "bad request", True),
    (403, "no PriorityClass with name no-such-class was found", True),
    (403, 'pods "x" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1', False),
    (403, 'pods is forbidden: User "system:serviceaccount:rlsched:op" cannot create resource "pods"', False),
    (500, "etcdserver: request timed out", False),
    (503, "unavailable", False),
    (429, "too many requests", False),
    (404, 'namespaces "x" not found', False),
])
def test_refusals_that_would_repeat_are_permanent(status, message, permanent):
    assert permanent_rejection(status, message) is permanent


# ------------------------------------------------------------------ merge patches
def test_merge_patch_and_diff_round_trip():
    cur = {"a": 1, "b": {"x": 1, "y": 2, "junk": 3}, "gone": True}
    want = {"a": 1, "b": {"x": 1, "y": 5}}
    d = merge_diff(cur, want)
    assert d == {"gone": None, "b": {"junk": None, "y": 5}}
    assert merge_patch(cur, d) == want
    assert merge_patch({"k": {"g": 1}}, {"k": {"g": None, "h": 2}}) == {"k": {"h": 2}}


# ------------------------------------------------------------------ the status a chief may have written
def status(**kw):
    return {"phase": "Running", "targetWorkers": 1, "queue": "normal", "startTime": format_time(NOW - 60),
            "admittedTime": format_time(NOW - 70), "queuedTime": format_time(NOW - 100), **kw}


def record(st):
    return {k: st.get(k) for k in OWNED_FIELDS}


def test_target_workers_is_clamped_to_the_spec_without_a_record():
    """Issue 12 item 4: {"status": {"targetWorkers": 40}} on a maxWorkers-2 job."""
    trusted, changed = guard_status(status(targetWorkers=40), None, SPEC, created=CREATED, now=NOW)
    assert trusted["targetWorkers"] == 2 and changed == {"targetWorkers": (40, 2)}
    trusted, changed = guard_status(status(phase="Starting", targetWorkers=40), None, SPEC, created=CREATED, now=NOW)
    assert trusted["targetWorkers"] == 2 and changed == {"targetWorkers": (40, 2)}
    trusted, changed = guard_status(status(targetWorkers=-3), None, SPEC, created=CREATED, now=NOW)
    assert trusted["targetWorkers"] == 1


def test_allocator_fields_are_bounded_without_a_record():
    """An allocator starts a job at any size within the spec; a chief cannot give
    itself a batch the allocator did not choose, nor erase its attained service."""
    trusted, _ = guard_status(status(phase="Starting", targetWorkers=2), None, SPEC, created=CREATED, now=NOW)
    assert trusted["targetWorkers"] == 2
    trusted, _ = guard_status(status(phase="Starting", targetWorkers=40), None, SPEC, created=CREATED, now=NOW)
    assert trusted["targetWorkers"] == 2
    trusted, changed = guard_status(status(batchSize=0, attainedGpuSeconds=-1e9, goodput="x"), None, SPEC,
                                    created=CREATED, now=NOW)
    assert "batchSize" not in trusted and trusted["attainedGpuSeconds"] == 0.0 and "goodput" not in trusted
    assert set(changed) == {"batchSize", "attainedGpuSeconds", "goodput"}
    mine = status(batchSize=256, attainedGpuSeconds=10.0, goodput={"shapes": []})
    trusted, changed = guard_status(status(batchSize=4096, attainedGpuSeconds=0.0, goodput={}), record(mine), SPEC,
                                    created=CREATED, now=NOW)
    assert (trusted["batchSize"], trusted["attainedGpuSeconds"], trusted["goodput"]) == (256, 10.0, {"shapes": []})


def test_the_restart_stall_is_measured_once_per_new_allocation_from_the_first_report():
    """From the last new allocation (``attainedSince``) to the first report of the
    generation it started, taken at most when the operator saw it."""
    since = NOW - 50
    st = status(allocatedGeneration=3, restartGeneration=3, attainedSince=format_time(since),
                progress={"generation": 3, "epoch": 0, "updateTime": format_time(since + 21)})
    assert restart_stall(st, 3, NOW) == {"generation": 3, "seconds": 21.0}
    assert restart_stall(st, 3, since + 10) == {"generation": 3, "seconds": 10.0}  # a report dated later than seen
    assert restart_stall({**st, "restartStall": {"generation": 3, "seconds": 21.0}}, 3, NOW) is None  # once
    assert restart_stall({**st, "progress": {**st["progress"], "generation": 2}}, 3, NOW) is None  # an old report
    # a restart after a failure is no new allocation: nothing measured from the old one
    assert restart_stall({**st, "restartGeneration": 4}, 4, NOW) is None
    assert restart_stall({**st, "attainedSince": None}, 3, NOW) is None
    assert restart_stall({**st, "progress": {"generation": 3, "updateTime": format_time(since - 5)}}, 3, NOW) == \
        {"generation": 3, "seconds": 0.0}  # a trainer clock behind: no negative stall


@pytest.mark.parametrize("bad", ["x", {"generation": -1, "seconds": 3.0}, {"generation": 1, "seconds": -2.0},
                                 {"generation": 1, "seconds": float("nan")}, {"generation": True, "seconds": 1.0},
                                 {"seconds": 1.0}])
def test_a_malformed_restart_stall_is_dropped(bad):
    assert stall_seconds(bad) is None
    trusted, changed = guard_status(status(restartStall=bad), None, SPEC, created=CREATED, now=NOW)
    assert "restartStall" not in trusted and "restartStall" in changed
    assert stall_seconds({"generation": 2, "seconds": 7}) == 7.0


def test_recorded_fields_are_restored_whoever_changed_them():
    mine = status()
    hostile = status(targetWorkers=2, phase="Running", queue="interrupt",
                     queuedTime=format_time(CREATED - 10 * 86400), rlpto={"decidedEpoch": 0, "streak": -100})
    trusted, changed = guard_status(hostile, record(mine), SPEC, created=CREATED, now=NOW)
    assert {k: trusted.get(k) for k in OWNED_FIELDS} == record(mine) | {"rlpto": None}
    assert set(changed) == {"targetWorkers", "queue", "queuedTime", "rlpto"}
    # a queued (preempted) job whose chief flips it to Running gets no pods
    queued = status(phase="Queued", targetWorkers=0, queue="interrupt")
    trusted, changed = guard_status(status(phase="Running", targetWorkers=2), record(queued), SPEC,
                                    created=CREATED, now=NOW)
    assert trusted["phase"] == "Queued" and trusted["targetWorkers"] == 0 and "phase" in changed
    # nothing changed: nothing to write
    assert guard_status(mine, record(mine), SPEC, created=CREATED, now=NOW)[1] == {}


def test_times_are_bounded_by_creation_and_now():
    st = status(queuedTime=format_time(CREATED - 86400), admittedTime=format_time(NOW + 86400), startTime="yesterday")
    trusted, changed = guard_status(st, None, SPEC, created=CREATED, now=NOW)
    assert trusted["queuedTime"] == format_time(CREATED) and trusted["admittedTime"] == format_time(NOW)
    assert "startTime" not in trusted and set(changed) == {"queuedTime", "admittedTime", "startTime"}
    # a few seconds of clock skew is no tampering
    ok = status(queuedTime=format_time(CREATED - 2))
    assert guard_status(ok, None, SPEC, created=CREATED, now=NOW)[1] == {}


def test_null_members_are_no_change():
    """The operator writes ``rlpto.gain: null`` (merge patch: deleted): the record and
    the stored status must compare equal."""
    rl = {"epoch": 3, "gain": None, "streak": 1}
    mine = status(rlpto=rl)
    stored = status(rlpto={"epoch": 3, "streak": 1})
    assert guard_status(stored, record(mine), SPEC, created=CREATED, now=NOW)[1] == {}


def test_garbage_conditions_do_not_break_set_condition():
    out = set_condition(["junk", {"type": "Valid", "status": "True"}], "Schedulable", "False", "Unfittable", "m", NOW)
    assert [c["type"] for c in out] == ["Valid", "Schedulable"]
    assert set_condition("junk", "Valid", "True", "r", "m", NOW)[0]["type"] == "Valid"


# ------------------------------------------------------------------ whose pods
def owned(**ref):
    return {"metadata": {"ownerReferences": [{"apiVersion": API_VERSION, "kind": "TrainingJob", "name": "j",
                                              "uid": "u1", "controller": True, **ref}]}}


def test_controlling_job_only_for_a_trainingjob_controller_reference():
    assert controlling_job(owned()).uid == "u1" and controlling_job(owned()).name == "j"
    assert controlling_job(owned(controller=False)) is None
    assert controlling_job(owned(kind="Job")) is None
    assert controlling_job(owned(apiVersion="rlsched.example/v1")) is None
    assert controlling_job(owned(uid="")) is None
    assert controlling_job({"metadata": {"labels": {"rlsched.dev/job": "j"}}}) is None
    assert controlling_job({"metadata": {"ownerReferences": "junk"}}) is None


def test_dns_label_names_what_is_wrong():
    assert dns_label("job-worker-3") == "job-worker-3" and dns_label("a" * 63) == "a" * 63
    for bad, why in (("a" * 64, "64 characters, more than 63"), ("Job_1", "not a valid DNS-1123 label"),
                     ("-a", "not a valid DNS-1123 label"), ("", "not a valid"), (None, "expected a string")):
        with pytest.raises(ShapeError, match=why):
            dns_label(bad)


def test_running_without_a_live_worker_is_not_adopted():
    """A chief whose pods are being deleted (preempted) flips its job to Running while
    the operator restarts: with no record and no live worker, the job is queued."""
    st = status(phase="Running", targetWorkers=2)
    trusted, changed = guard_status(st, None, SPEC, created=CREATED, now=NOW, live_workers=0)
    assert (trusted["phase"], trusted["targetWorkers"]) == ("Queued", 0)
    assert set(changed) == {"phase", "targetWorkers"}
    trusted, changed = guard_status(st, None, SPEC, created=CREATED, now=NOW, live_workers=1)
    assert (trusted["phase"], trusted["targetWorkers"], changed) == ("Running", 2, {})


def test_admission_checks_room_only_on_the_gpu_models_the_template_allows():
    """Issue 25 item 1: the operator's admission read no GPU model, so a gang that
    asks for a model the cluster lacks was admitted and timed out; now its room is
    checked on the nodes the template allows (the extender's reading of the template)."""
    import dataclasses

    from rlsched.core import ClusterState, Topology, make_ordering, make_placement
    from rlsched.core.planning import Admission
    from rlsched.operator.job import with_gpu_models

    tmpl = {"template": {"spec": {"containers": [{"name": "t"}], "nodeSelector": {"nvidia.com/gpu.product": "H100"}}}}
    spec = with_gpu_models(SPEC, tmpl, ["A100", "H100"])
    assert spec.gpu_models == frozenset({"H100"})
    assert with_gpu_models(SPEC, {"template": {"spec": {}}}, ["A100"]) is SPEC  # no constraint: unchanged
    aff = {"template": {"metadata": {"annotations": {"rlsched.dev/gpu-models": "A100,V100"}}, "spec": {}}}
    assert with_gpu_models(SPEC, aff, ["A100", "H100"]).gpu_models == frozenset({"A100"})

    state = ClusterState(Topology.uniform(2, gpus_per_node=8, racks=1, blocks=1, gpu_model="A100"))
    adm = Admission(make_ordering("fifo"))
    place = make_placement("bestfit")
    for models, admitted in ((frozenset({"H100"}), False), (frozenset({"A100"}), True), (None, True)):
        s = dataclasses.replace(SPEC, gpu_models=models)
        plan = adm.plan([s.view("ns/j", submit_time=0.0, workers=s.min_workers, priority=0.0)], [], state,
                        place=place.place)
        assert (plan.admit == ["ns/j"]) == admitted and (("ns/j" in plan.unfittable) != admitted)
