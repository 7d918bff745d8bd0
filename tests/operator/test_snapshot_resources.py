import pytest

from rlsched.core.contract import API_VERSION, LABEL_INDEX, LABEL_JOB, LABEL_ROLE, PLURAL, pod_gpus
from rlsched.operator.resources import WorkerGPUError, trainer_rbac, worker_pod
from rlsched.operator.snapshot import build_snapshot


def node(name, gpus, ready="True", unschedulable=False, labels=None):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": ready}]}}


def pod(name, gpus, node=None, phase="Running", job=None, deleting=False, ns="ns", owned=True):
    """A pod; with ``job`` it carries the job label and (``owned``) the TrainingJob's
    controller ownerReference, as the operator's workers do."""
    md = {"name": name, "namespace": ns, "labels": {LABEL_JOB: job} if job else {}}
    if job and owned:
        md["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "TrainingJob", "name": job,
                                  "uid": f"uid-{job}", "controller": True}]
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


def test_only_pods_a_trainingjob_controls_are_its_workers():
    nodes = [node("a", 8)]
    plain = pod("gang-0", 1, "a", job="j1", owned=False)  # label only: a plain gang pod
    other_kind = pod("other", 1, "a", job="j1")
    other_kind["metadata"]["ownerReferences"][0]["kind"] = "Job"
    not_controller = pod("ref", 1, "a", job="j1")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    foreign_group = pod("grp", 1, "a", job="j1")
    foreign_group["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    mine = pod("j1-worker-0", 1, "a", job="j1")
    snap = build_snapshot(nodes, [plain, other_kind, not_controller, foreign_group, mine])
    assert snap.placement == {"ns/j1": [0]}
    assert snap.state.free.tolist() == [3]  # every pod still holds its GPUs


@pytest.mark.parametrize("quantity", ["2M", "1e7", "0.5", "banana", "-1"])
def test_unreadable_gpu_quantity_never_fails_the_snapshot(quantity):
    """A pod anywhere whose GPU request cannot be read: bound, it holds its whole node;
    unbound, it is ignored; both are reported."""
    nodes = [node("a", 8), node("b", 8)]
    bad_bound = pod("bad", 1, "a")
    bad_bound["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    bad_unbound = pod("bad2", 1, None, phase="Pending")
    bad_unbound["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    ok = pod("ok", 2, "b", job="j1")
    snap = build_snapshot(nodes, [bad_bound, bad_unbound, ok])
    assert snap.state.free.tolist() == [0, 6]
    assert set(snap.problems) == {"Pod/ns/bad", "Pod/ns/bad2"}
    assert "every GPU of node a" in snap.problems["Pod/ns/bad"]
    assert "not counted" in snap.problems["Pod/ns/bad2"]


def test_huge_but_valid_quantity_fills_the_node():
    snap = build_snapshot([node("a", 8), node("b", 8)], [pod("kilo", "1Ki", "a")])
    assert snap.state.free.tolist() == [0, 8] and snap.problems == {}


def test_unreadable_node_is_left_out():
    bad = node("bad", 8)
    bad["status"]["allocatable"]["nvidia.com/gpu"] = "lots"
    snap = build_snapshot([bad, node("a", 8)], [])
    assert list(snap.node_index) == ["a"] and "Node/bad" in snap.problems


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
    assert md["labels"] == {"team": "x", LABEL_JOB: "tj1", LABEL_ROLE: "worker", LABEL_INDEX: "1",
                            "app.kubernetes.io/managed-by": "rlsched-operator", "rlsched.dev/generation": "0"}
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


def test_worker_pod_carries_the_worker_contract_and_checkpoint_volume():
    job = {**JOB, "spec": {**JOB["spec"], "batchSize": 96, "masterPort": 23456,
                           "checkpoint": {"path": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "c"}}}}}
    job["spec"]["template"] = {"spec": {"containers": [{"name": "c", "image": "i"}, {"name": "side", "image": "s"}],
                                        "restartPolicy": "OnFailure"}}
    p = worker_pod(job, 2, 2, gang_size=3, generation=5)
    spec = p["spec"]
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("tj1-worker-2", "tj1", "Never")
    assert p["metadata"]["labels"]["rlsched.dev/generation"] == "5"
    assert {"name": "rlsched-checkpoint", "persistentVolumeClaim": {"claimName": "c"}} in spec["volumes"]
    for c in spec["containers"]:  # every container sees the contract and the checkpoint
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                                    "PET_MASTER_ADDR", "PET_NNODES", "PET_NODE_RANK", "RLSCHED_GENERATION",
                                    "RLSCHED_GLOBAL_BATCH_SIZE", "RLSCHED_CHECKPOINT_DIR")} == {
            "MASTER_ADDR": "tj1-worker-0.tj1", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
            "LOCAL_RANK": "0", "PET_MASTER_ADDR": "tj1-worker-0.tj1", "PET_NNODES": "3", "PET_NODE_RANK": "2",
            "RLSCHED_GENERATION": "5", "RLSCHED_GLOBAL_BATCH_SIZE": "96", "RLSCHED_CHECKPOINT_DIR": "/ckpt"}
        assert {"name": "rlsched-checkpoint", "mountPath": "/ckpt"} in c["volumeMounts"]
    # what the trainer reads back is what the operator meant
    from rlsched.core.contract import WorkerContract
    env = {e["name"]: e.get("value") or "ns" for e in spec["containers"][0]["env"]}
    wc = WorkerContract.from_env(env)
    assert (wc.job, wc.rank, wc.world_size, wc.generation, wc.batch_size, wc.checkpoint_dir, wc.master_port) == \
        ("tj1", 2, 3, 5, 96, "/ckpt", 23456)


def test_worker_service_is_headless_and_publishes_unready_workers():
    from rlsched.operator.resources import worker_service

    svc = worker_service(JOB)
    assert svc["metadata"]["name"] == "tj1" and svc["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {LABEL_JOB: "tj1"} and svc["spec"]["ports"][0]["port"] == 29500


def test_trainer_rbac_limited_to_own_job():
    sa, role, rb = trainer_rbac(JOB)
    assert sa["metadata"]["name"] == role["metadata"]["name"] == rb["metadata"]["name"] == "tj1-trainer"
    for rule in role["rules"]:
        assert rule["resourceNames"] == ["tj1"] and "create" not in rule["verbs"] and "delete" not in rule["verbs"]
    assert {tuple(r["resources"]) for r in role["rules"]} == {(PLURAL,), (f"{PLURAL}/status",)}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "tj1-trainer", "namespace": "ns"}]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u-1" for o in (sa, role, rb))


@pytest.mark.parametrize("template_spec, got", [
    # a second container asking for a GPU on top of the first container's
    ({"containers": [{"name": "a"}, {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, 3),
    # an init container asking for more than gpusPerWorker
    ({"containers": [{"name": "a"}], "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}, 8),
])
def test_worker_pod_refuses_other_gpu_totals(template_spec, got):
    job = {**JOB, "spec": {**JOB["spec"], "template": {"spec": template_spec}}}
    with pytest.raises(WorkerGPUError, match=f"would ask for {got} nvidia.com/gpu, spec.gpusPerWorker is 2"):
        worker_pod(job, 0, 2)


def test_worker_pod_effective_gpus_equal_gpus_per_worker():
    job = {**JOB, "spec": {**JOB["spec"], "template": {"spec": {
        "containers": [{"name": "a", "resources": {"limits": None}}, {"name": "side"}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}
    assert pod_gpus(worker_pod(job, 0, 2)) == 2


def test_pods_cpu_and_memory_are_charged_to_their_nodes():
    a = node("a", 8)
    a["status"]["allocatable"].update(cpu="16", memory="64Gi")
    p = pod("p", 2, "a", job="j")
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4", "memory": "10Gi"}
    other = pod("daemon", 0, "a")
    other["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "13"}}  # no GPU, still holds CPU
    snap = build_snapshot([a], [p, other])
    st = snap.state
    assert (st.cpu_total[0], st.mem_total[0]) == (16000, 65536)
    assert (st.cpu_free[0], st.mem_free[0]) == (16000 - 4000 - 13000, 65536 - 10240)  # over-committed: below 0
    assert st.free[0] == 6


def test_worker_env_carries_the_micro_batch_limit_and_processes_per_pod():
    """RLSCHED_MICRO_BATCH_LIMIT is spec.localBatchSize.max (absent without it);
    PET_NPROC_PER_NODE is gpusPerWorker (torchrun's one process per GPU); LOCAL_RANK 0."""
    from rlsched.core.contract import WorkerContract

    def env_of(job, gpus):
        return {e["name"]: e.get("value") or "ns" for e in worker_pod(job, 0, gpus)["spec"]["containers"][0]["env"]}

    job = {**JOB, "spec": {**JOB["spec"], "localBatchSize": {"min": 4, "max": 48}}}
    env = env_of(job, 2)
    assert (env["RLSCHED_MICRO_BATCH_LIMIT"], env["PET_NPROC_PER_NODE"], env["LOCAL_RANK"]) == ("48", "2", "0")
    wc = WorkerContract.from_env(env)
    assert (wc.micro_batch_limit, wc.procs_per_worker) == (48, 2)
    env = env_of({**JOB, "spec": {**JOB["spec"], "gpusPerWorker": 1}}, 1)
    assert "RLSCHED_MICRO_BATCH_LIMIT" not in env and env["PET_NPROC_PER_NODE"] == "1"


def test_pods_keep_the_templates_account_and_the_binding_grants_it():
    """The template's serviceAccountName is kept (the deprecated alias dropped); the
    RoleBinding binds the report Role to that account and no ServiceAccount is made;
    without one, <job>-trainer as before. Every worker carries the exit finalizer."""
    from rlsched.core.contract import FINALIZER_WORKER_EXIT

    tmpl = {"spec": {"serviceAccountName": "team-sa", "serviceAccount": "other",
                     "containers": [{"name": "c", "image": "i"}]}}
    job = {**JOB, "spec": {**JOB["spec"], "template": tmpl}}
    p = worker_pod(job, 0, 2)
    assert p["spec"]["serviceAccountName"] == "team-sa" and "serviceAccount" not in p["spec"]
    assert p["metadata"]["finalizers"] == [FINALIZER_WORKER_EXIT]
    sa, role, rb = trainer_rbac(job)
    assert sa is None and role["metadata"]["name"] == rb["metadata"]["name"] == "tj1-trainer"
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "team-sa", "namespace": "ns"}]
    assert all(r["resourceNames"] == ["tj1"] for r in role["rules"])
    assert worker_pod(JOB, 0, 2)["spec"]["serviceAccountName"] == "tj1-trainer"


def test_worker_env_says_whether_an_earlier_generation_ran():
    """RLSCHED_RESUME is 1/0 as the operator passes it (and parses back); unset by default."""
    from rlsched.core.contract import WorkerContract

    def env_of(**kw):
        return {e["name"]: e.get("value") or "ns" for e in worker_pod(JOB, 0, 2, **kw)["spec"]["containers"][0]["env"]}

    assert env_of(resume=True)["RLSCHED_RESUME"] == "1" and WorkerContract.from_env(env_of(resume=True)).resume
    assert env_of(resume=False)["RLSCHED_RESUME"] == "0"
    assert WorkerContract.from_env(env_of(resume=False)).resume is False
    assert "RLSCHED_RESUME" not in env_of()


def test_the_snapshot_gives_each_node_its_gpu_type_from_the_gfd_product_label():
    table = {"Tesla-T4": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext"}
    nodes = [node("t4", 4, labels={"nvidia.com/gpu.product": "Tesla-T4"}),
             node("a100", 8, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
             node("h100", 8, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
             node("bare", 8)]
    snap = build_snapshot(nodes, [], gpu_types=table)
    assert {n: snap.types[i] for n, i in snap.node_index.items()} == \
        {"t4": "aws", "a100": "dgx-ext", "h100": "NVIDIA-H100-80GB-HBM3", "bare": ""}
    plain = build_snapshot(nodes, [])  # no map: each product is its own type
    assert plain.types[plain.node_index["t4"]] == "Tesla-T4" and plain.types[plain.node_index["bare"]] == ""


def test_a_pinned_generations_pods_require_the_types_products_in_every_term_and_say_the_type():
    """The pin is ANDed into each of the template's own required terms (terms are
    ORed: appended as a term of its own it would widen them), the template is not
    changed, and the extender's reading of the pod (gpu_model_rule) admits exactly the
    nodes of the type the template allows."""
    import copy

    from rlsched.core.contract import gpu_model_rule

    body = copy.deepcopy(JOB)
    body["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn",
                                                     "values": ["Tesla-T4-SHARED"]}]}]}}}
    before = copy.deepcopy(body)
    table = {"Tesla-T4": "aws", "Tesla-T4-SHARED": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext"}
    p = worker_pod(body, 0, 2, gpu_type="aws", gpu_types=table)
    assert body == before
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pin = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "Tesla-T4-SHARED", "aws"]}
    assert len(terms) == 2 and all(t["matchExpressions"][-1] == pin for t in terms)
    assert {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}["RLSCHED_GPU_TYPE"] == "aws"
    allows, words = gpu_model_rule(p["spec"], {}, "pod")
    # the first term (zone a, not a product rule) allows both T4 products, the second only one
    assert [m for m in ("Tesla-T4", "Tesla-T4-SHARED", "NVIDIA-A100-SXM4-40GB", "unknown") if allows(m)] == \
        ["Tesla-T4", "Tesla-T4-SHARED"]
    plain = worker_pod(JOB, 0, 2)  # no type: no affinity, no variable
    assert "affinity" not in plain["spec"]
    assert "RLSCHED_GPU_TYPE" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}
    alone = worker_pod(JOB, 0, 2, gpu_type="dgx-ext", gpu_types=table)["spec"]["affinity"]
    assert alone["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                               "values": ["NVIDIA-A100-SXM4-40GB", "dgx-ext"]}]}]


@pytest.mark.parametrize("value, pinned", [("aws", "aws"), ("", None), (7, None), ("not a label!", None)])
def test_a_jobs_pin_is_read_from_its_status_and_garbage_pins_nothing(value, pinned):
    from rlsched.operator.job import Job

    assert Job({"metadata": {}, "status": {"gpuType": value}}, None, None).gpu_type == pinned
