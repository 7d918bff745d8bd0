"""operator/kueue.py: the Workload of a TrainingJob Kueue admits, and Kueue's decision read
back from the Workload's status, exactly."""

from rlsched.core.contract import RESOURCE_GPU
from rlsched.operator.kueue import admission_of, finished_condition, queue_name, workload_for, workload_name
from rlsched.operator.spec import parse_spec


def _job(min_w=1, max_w=4, gpus=8, queue="lq", **spec):
    return {
        "apiVersion": "rlsched.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "0f1e2d3c-aaaa", "labels": {
            "kueue.x-k8s.io/queue-name": queue} if queue else {}},
        "spec": {"minWorkers": min_w, "maxWorkers": max_w, "gpusPerWorker": gpus,
                 "template": {"metadata": {"labels": {"app": "x"}},
                              "spec": {"containers": [{"name": "train", "image": "img"}]}}, **spec},
    }


def test_the_workload_asks_for_the_elastic_range_of_gpu_workers():
    body = _job()
    wl = workload_for(body, parse_spec(body["spec"]))
    assert queue_name(body) == "lq" and queue_name(_job(queue=None)) is None
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == workload_name(body) and wl["metadata"]["name"].startswith("trainingjob-train-")
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "0f1e2d3c-aaaa"
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    assert wl["spec"]["queueName"] == "lq"
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"], ps["minCount"]) == ("workers", 4, 1)
    res = ps["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"][RESOURCE_GPU] == res["limits"][RESOURCE_GPU] == "8"
    assert "resources" not in body["spec"]["template"]["spec"]["containers"][0]  # the job is not changed
    rigid = _job(2, 2)
    assert "minCount" not in workload_for(rigid, parse_spec(rigid["spec"]))["spec"]["podSets"][0]
    pinned = _job(1, 8, workers=3)
    assert workload_for(pinned, parse_spec(pinned["spec"]))["spec"]["podSets"][0]["count"] == 3


def _wl(conditions=(), admitted=None, count=None):
    st = {"conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}
    if admitted:
        a = {"name": "workers"}
        if count is not None:
            a["count"] = count
        st["admission"] = {"clusterQueue": "cq", "podSetAssignments": [a]}
    return {"metadata": {"name": "trainingjob-train-abcde"},
            "spec": {"queueName": "lq", "podSets": [{"name": "workers", "count": 4}]}, "status": st}


def test_kueues_decision_read_from_the_workload():
    assert admission_of(None).reason == "KueueWorkload" and not admission_of(None).admitted
    pending = admission_of(_wl([("QuotaReserved", "False", "Pending", "insufficient unused quota for nvidia.com/gpu")]))
    assert (pending.admitted, pending.reason) == (False, "KueueAdmission")
    assert "insufficient unused quota" in pending.message and "LocalQueue lq" in pending.message
    full = admission_of(_wl([("QuotaReserved", "True", "", ""), ("Admitted", "True", "", "")], admitted=True))
    assert (full.admitted, full.workers) == (True, 4)  # no count: the pod set's own
    part = admission_of(_wl([("Admitted", "True", "", "")], admitted=True, count=2))
    assert (part.admitted, part.workers) == (True, 2)
    evicted = admission_of(_wl([("Admitted", "False", "", ""), ("Evicted", "True", "Preempted", "by cq")]))
    assert (evicted.admitted, evicted.reason) == (False, "KueueEvicted") and "Preempted" in evicted.message
    again = admission_of(_wl([("Admitted", "True", "", ""), ("Evicted", "True", "Preempted", "by cq")],
                             admitted=True, count=2))
    assert (again.admitted, again.workers) == (True, 2)  # admitted again after an eviction
    done = admission_of(_wl([("Admitted", "True", "", ""), ("Finished", "True", "Succeeded", "")],
                            admitted=True, count=2))
    assert (done.admitted, done.reason) == (False, "KueueFinished")
    assert not admission_of(_wl([("Admitted", "False", "", "")], admitted=True, count=2)).admitted
    cond = finished_condition(True, "converged", "2026-01-01T00:00:00Z")
    assert (cond["type"], cond["status"], cond["reason"]) == ("Finished", "True", "Succeeded")
    assert finished_condition(False, "boom", "2026-01-01T00:00:00Z")["reason"] == "Failed"
