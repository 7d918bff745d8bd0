from rlsched.core.contract import LABEL_INDEX, LABEL_JOB, LABEL_ROLE, PLURAL, pod_gpus
from rlsched.operator.resources import trainer_rbac, worker_pod
from rlsched.operator.snapshot import build_snapshot


def node(name, gpus, ready="True", unschedulable=False, labels=None):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": ready}]}}


def pod(name, gpus, node=None, phase="Running", job=None, deleting=False, ns="ns"):
    md = {"name": name, "namespace": ns, "labels": {LABEL_JOB: job} if job else {}}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": md, "spec": spec, "status": {"phase": phase}}


def test_free_gpus_allocatable_minus_live_pods():
    nodes = [node("a", 8), node("b", 4), node("down", 8, ready="False"), node("cordoned", 8, unschedulable=True), node("cpu", 0)]
    pods = [
        pod("p1", 2, "a", job="j1"), pod("p2", 2, "a", job="j1"), pod("p3", 1, "b"),
        pod("done", 4, "a", phase="Succeeded"), pod("gone", 3, "b", job="j2", deleting=True),
        pod("unbound", 2, None, phase="Pending", job="j3"),
    ]
    snap = build_snapshot(nodes, pods)
    assert list(snap.node_index) == ["a", "b"]
    # a: 8-4 = 4, b: 4-1-3 = 0; the unbound pod's 2 GPUs are charged to the freest node
    assert snap.state.free.tolist() == [2, 0]
    assert snap.placement == {"ns/j1": [0, 0]}
    assert snap.releasing.tolist() == [0, 3]


def test_pod_gpus_sums_containers_and_takes_init_max():
    p = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}},
                                 {"resources": {"limits": {"nvidia.com/gpu": 2}}}],
                  "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    assert pod_gpus(p) == 4


JOB = {
    "metadata": {"name": "tj1", "namespace": "ns", "uid": "u-1"},
    "spec": {"minWorkers": 2, "maxWorkers": 3, "gpusPerWorker": 2,
             "template": {"metadata": {"labels": {"team": "x"}},
                          "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}]}}},
}


def test_worker_pod_labels_owner_scheduler_gpus_env():
    p = worker_pod(JOB, 1, 2, scheduler_name="rlsched", grace_period_s=45)
    md, spec = p["metadata"], p["spec"]
    assert md["name"] == "tj1-worker-1"
    assert md["labels"] == {"team": "x", LABEL_JOB: "tj1", LABEL_ROLE: "worker",
                            LABEL_INDEX: "1", "app.kubernetes.io/managed-by": "rlsched-operator"}
    assert md["ownerReferences"][0]["uid"] == "u-1" and md["ownerReferences"][0]["controller"] is True
    assert spec["schedulerName"] == "rlsched" and spec["terminationGracePeriodSeconds"] == 45
    assert spec["serviceAccountName"] == "tj1-trainer"
    c = spec["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" and c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e for e in c["env"]}
    assert env["A"]["value"] == "1" and env["RLSCHED_JOB_NAME"]["value"] == "tj1"
    assert env["RLSCHED_JOB_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert worker_pod(JOB, 0, 2)["metadata"]["labels"]["rlsched.dev/role"] == "chief"
    # the template itself is not modified
    assert "schedulerName" not in JOB["spec"]["template"]["spec"]


def test_trainer_rbac_limited_to_own_job():
    sa, role, rb = trainer_rbac(JOB)
    assert sa["metadata"]["name"] == role["metadata"]["name"] == rb["metadata"]["name"] == "tj1-trainer"
    for rule in role["rules"]:
        assert rule["resourceNames"] == ["tj1"] and "create" not in rule["verbs"] and "delete" not in rule["verbs"]
    assert {tuple(r["resources"]) for r in role["rules"]} == {(PLURAL,), (f"{PLURAL}/status",)}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "tj1-trainer", "namespace": "ns"}]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u-1" for o in (sa, role, rb))
