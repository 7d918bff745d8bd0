"""The operator against the real control plane (etcd, kube-apiserver with RBAC,
kube-controller-manager, kube-scheduler ``rlsched`` profile, kwok GPU nodes).

The default dev topology is 4 kwok nodes x 8 GPUs = 32 GPUs; jobs below are sized in
whole nodes (``gpusPerWorker: 8``) so that who fits is unambiguous.
"""

from __future__ import annotations

import threading
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rlsched.core.contract import GROUP as G
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"
#: and with its scaling: the β rule on each job's own β and recorded state
BETA = "fifo/das/beta+nobackfill"

def delete(kapi, ns, name):
    kapi.custom.delete_namespaced_custom_object(G, V, ns, P, name)


# ---------------------------------------------------------------------------- tests
def test_priority_order_urgent_passes_normal_and_requests_promote(extender, kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO, forecast_interval_s=1.0) as rt:
        tj(ns, "blocker", 4, gpus=8)
        wait_until(lambda: kapi.phase(ns, "blocker") == "Running", 60, "blocker running")
        # every job below needs the whole cluster, so they run one at a time
        tj(ns, "n1", 4, gpus=8)
        tj(ns, "n2", 4, gpus=8)
        tj(ns, "u", 4, gpus=8, klass="urgent")
        wait_until(lambda: all(kapi.status(ns, n).get("queue") for n in ("n1", "n2", "u")), 20, "queued")
        assert [kapi.status(ns, n)["queue"] for n in ("n1", "n2", "u")] == ["normal", "normal", "urgent"]
        # ten user requests at mu = 0.1 lift n2 to priority 1.0: promoted to urgent, and
        # with a higher priority than u it goes first
        kapi.custom.patch_namespaced_custom_object(
            G, V, ns, P, "n2", {"metadata": {"annotations": {"rlsched.dev/priority-requests": "10"}}})
        wait_until(lambda: kapi.status(ns, "n2").get("queue") == "urgent", 20, "n2 promoted")
        assert kapi.status(ns, "n2")["effectivePriority"] == pytest.approx(1.0)
        wait_until(lambda: kapi.events(ns, "n2", "Promoted"), 10, "Promoted event")

        started = []
        for _ in range(3):
            current = [n for n in ("blocker", "n1", "n2", "u") if kapi.phase(ns, n) in ("Starting", "Running")]
            assert len(current) == 1, current
            delete(kapi, ns, current[0])
            nxt = wait_until(lambda: [n for n in ("n1", "n2", "u") if n not in started
                                      and kapi.phase(ns, n) == "Running"], 60, "next job running")
            assert len(nxt) == 1
            started.append(nxt[0])
        assert started == ["n2", "u", "n1"]
        # gang start: all workers at once, scheduled by rlsched, labelled and owned
        ps = kapi.pods(ns, "n1")
        assert sorted(int(p.metadata.labels["rlsched.dev/worker-index"]) for p in ps) == [0, 1, 2, 3]
        assert {p.spec.scheduler_name for p in ps} == {"rlsched"}
        assert {p.metadata.owner_references[0].name for p in ps} == {"n1"}
        assert [p.metadata.labels["rlsched.dev/role"] for p in sorted(ps, key=lambda p: p.metadata.name)][0] == "chief"
        wait_until(lambda: kapi.events(ns, "n1", "Admitted") and kapi.events(ns, "n1", "Started"), 10, "events")

        port = rt.metrics_server[0].server_port
        want = ['rlsched_operator_jobs{phase="Running"} 1.0', "rlsched_operator_admission_wait_seconds_count 4.0",
                "rlsched_operator_workers 4.0", 'rlsched_operator_queue_length{queue="normal"} 0.0']

        def metrics_ok():
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return all(w in text for w in want) or [w for w in want if w not in text]

        assert wait_until(lambda: metrics_ok() is True, 10, "metrics") is True
        cm = wait_until(lambda: _configmap(kapi, ns, "rlsched-forecast"), 20, "forecast ConfigMap")
        assert int(cm.data["recommendedNodes"]) >= 1 and cm.data["usedGru"] == "false"


def _configmap(kapi, ns, name):
    try:
        return kapi.core.read_namespaced_config_map(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_highest_preempts_lowest_and_preempted_job_resumes_first(extender, kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO, grace_period_s=7):
        tj(ns, "low", 2, gpus=8, value=0)
        tj(ns, "high", 2, gpus=8, value=0.5)  # below the promotion threshold: stays normal
        wait_until(lambda: kapi.phase(ns, "low") == kapi.phase(ns, "high") == "Running", 60, "both running")
        tj(ns, "waiter", 1, gpus=8)  # normal, queued before the preemption
        wait_until(lambda: kapi.status(ns, "waiter").get("queue") == "normal", 20, "waiter queued")
        low_pods = kapi.pods(ns, "low")
        assert {p.spec.termination_grace_period_seconds for p in low_pods} == {7}
        tj(ns, "boss", 2, gpus=8, klass="highest")
        wait_until(lambda: kapi.phase(ns, "boss") == "Running", 90, "boss running")
        st = kapi.status(ns, "low")
        assert st["phase"] == "Queued" and st["queue"] == "interrupt" and st["preemptions"] == 1
        assert kapi.phase(ns, "high") == "Running" and kapi.status(ns, "high").get("preemptions") is None
        assert kapi.phase(ns, "waiter") == "Queued"
        wait_until(lambda: kapi.events(ns, "low", "Preempted"), 10, "Preempted event")
        # boss finishes: the interrupted job resumes before the earlier normal one
        delete(kapi, ns, "boss")
        wait_until(lambda: kapi.phase(ns, "low") == "Running", 90, "low resumed")
        assert kapi.phase(ns, "waiter") == "Queued"


def test_converging_job_shrinks_one_per_cycle_and_waiting_job_gets_gpus(extender, fake_trainer, kapi, ns, tj, run_operator, wait_until):
    with fake_trainer(ns, tau=4.0, noise=0.0005) as th:
        with run_operator(ns, allocator=BETA, patience=6):
            tj(ns, "conv", 1, 4, gpus=8, beta=0.02, dataSize=10000)
            th.start()
            wait_until(lambda: kapi.status(ns, "conv").get("targetWorkers") == 4, 90, "conv grown to 4 workers")
            tj(ns, "late", 2, gpus=8)
            wait_until(lambda: kapi.phase(ns, "late") == "Running", 120, "late job running")
            wait_until(lambda: kapi.phase(ns, "conv") == "Succeeded", 120, "conv converged")
            downs = [e.message.split(" (")[0] for e in kapi.events(ns, "conv", "ScaledDown")]
            assert downs == ["workers 4 -> 3", "workers 3 -> 2", "workers 2 -> 1"]
            ups = [e.message.split(" (")[0] for e in kapi.events(ns, "conv", "ScaledUp")]
            assert ups == ["workers 1 -> 2", "workers 2 -> 3", "workers 3 -> 4"]
            st = kapi.status(ns, "conv")
            # the scale-downs happened on distinct evaluations, one per cycle
            assert st["reason"] == "Converged" and st["jctSeconds"] > 0
            assert st["progress"]["epoch"] >= 6 and len(st["progress"]["history"]) == st["progress"]["epoch"]
            assert st["rlpto"]["streak"] >= 6 and st["rlpto"]["workers"] >= 1 and st["rlpto"]["dataSize"] == 10000
            # late was admitted only once conv had given back two nodes
            admitted = float(kapi.events(ns, "late", "Admitted")[0].metadata.annotations["rlsched.dev/event-time"])
            second_down = float(kapi.events(ns, "conv", "ScaledDown")[1].metadata.annotations["rlsched.dev/event-time"])
            assert admitted > second_down
            wait_until(lambda: not kapi.pods(ns, "conv"), 30, "conv pods deleted")


def test_invalid_jobs_rejected_and_no_pods(kapi, ns, tj, run_operator, wait_until):
    with pytest.raises(ApiException) as exc:
        tj(ns, "minmax", 5, 2)
    assert exc.value.status == 422 and "minWorkers must be less than or equal to maxWorkers" in exc.value.body
    with pytest.raises(ApiException) as exc:
        tj(ns, "beta", 1, beta=1.5)
    assert exc.value.status == 422 and "spec.beta" in exc.value.body
    with pytest.raises(ApiException) as exc:
        tj(ns, "klass", 1, klass="vip")
    assert exc.value.status == 422 and "spec.priority.class" in exc.value.body
    with run_operator(ns, allocator=FIFO):
        # passes the schema, but the template asks for GPUs that disagree with gpusPerWorker
        kapi.custom.create_namespaced_custom_object(G, V, ns, P, {
            "apiVersion": f"{G}/{V}", "kind": "TrainingJob", "metadata": {"name": "mismatch"},
            "spec": {"minWorkers": 1, "maxWorkers": 1, "gpusPerWorker": 1, "template": {"spec": {"containers": [
                {"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}},
        })
        wait_until(lambda: kapi.phase(ns, "mismatch") == "Failed", 30, "mismatch Failed")
        st = kapi.status(ns, "mismatch")
        cond = {c["type"]: c for c in st["conditions"]}["Valid"]
        assert cond["status"] == "False" and cond["reason"] == "InvalidSpec"
        assert "asks for 4 nvidia.com/gpu but spec.gpusPerWorker is 1" in cond["message"]
        wait_until(lambda: kapi.events(ns, "mismatch", "InvalidSpec"), 10, "InvalidSpec event")
        tj(ns, "fine", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "fine") == "Running", 60, "valid job running")
        assert kapi.pods(ns, "mismatch") == []


def test_trainer_may_patch_only_its_own_job(kube_cluster, kapi, ns, tj, run_operator, wait_until):
    from rlsched.trainer import Reporter

    with run_operator(ns, allocator=FIFO):
        tj(ns, "mine", 1, gpus=1)
        tj(ns, "other", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "mine") == kapi.phase(ns, "other") == "Running", 60, "both running")
    tok = kapi.core.create_namespaced_service_account_token(
        "mine-trainer", ns, {"spec": {"audiences": [], "expirationSeconds": 600}}).status.token
    conf = client.Configuration()
    adm = kapi.client.configuration
    conf.host, conf.ssl_ca_cert, conf.verify_ssl = adm.host, adm.ssl_ca_cert, adm.verify_ssl
    conf.api_key = {"authorization": f"Bearer {tok}"}
    api = client.ApiClient(conf)
    try:
        Reporter("mine", ns, api=api).report(epoch=1, loss=2.0, accuracy=0.3)
        Reporter("mine", ns, api=api).report(epoch=2, loss=1.0, accuracy=0.5)
        p = kapi.status(ns, "mine")["progress"]
        assert (p["epoch"], p["accuracy"], p["maxLoss"], p["history"]) == (2, 0.5, 2.0, [0.3, 0.5])
        # the operator's own fields are untouched by the trainer
        assert kapi.status(ns, "mine")["phase"] == "Running"
        with pytest.raises(ApiException) as exc:
            Reporter("other", ns, api=api).report(epoch=1, loss=1.0, accuracy=0.9)
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, ns, P, "mine", {"spec": {"maxEpochs": 1}})
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(api).list_namespaced_pod(ns)
        assert exc.value.status == 403
    finally:
        api.close()
    # per-job RBAC objects are owned by the job
    role = kapi.rbac.read_namespaced_role("mine-trainer", ns)
    assert role.metadata.owner_references[0].name == "mine" and role.rules[0].resource_names == ["mine"]


def test_restart_mid_scaling_no_duplicates_no_orphans(kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO):
        tj(ns, "elastic", 1, 4, gpus=8)
        wait_until(lambda: kapi.phase(ns, "elastic") == "Running", 60, "running")
    # the operator is down. Pretend it died right after recording a scale-up to 3 and
    # creating only one of the new workers; meanwhile a job is deleted under its pods.
    kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "elastic", {"status": {"targetWorkers": 3}})
    from rlsched.operator.resources import worker_pod

    body = kapi.get(ns, "elastic")
    kapi.core.create_namespaced_pod(ns, worker_pod(body, 1, 8, grace_period_s=1))
    # a worker whose TrainingJob is gone (its controller ownerReference points nowhere):
    # an orphan of the operator's (the garbage collector may get to it first)
    ghost = worker_pod({**body, "metadata": {**body["metadata"], "name": "ghost", "uid": "00000000-dead-beef-0000-000000000000"}},
                       0, 1, grace_period_s=1)
    del ghost["spec"]["serviceAccountName"]
    kapi.core.create_namespaced_pod(ns, ghost)
    with run_operator(ns, allocator=FIFO):
        wait_until(lambda: len(kapi.pods(ns, "elastic")) == 3 and kapi.status(ns, "elastic").get("workers") == 3,
                   60, "three workers")
        wait_until(lambda: not kapi.pods(ns, "ghost"), 30, "orphan removed")
        names = sorted(p.metadata.name for p in kapi.pods(ns, "elastic"))
        assert names == ["elastic-worker-0", "elastic-worker-1", "elastic-worker-2"]
        # and stays that way over further cycles (no trainer: no new evaluations)
        import time

        time.sleep(2.0)
        assert sorted(p.metadata.name for p in kapi.pods(ns, "elastic")) == names
        # deleting the job leaves nothing behind
        delete(kapi, ns, "elastic")
        wait_until(lambda: not kapi.core.list_namespaced_pod(ns).items, 60, "pods gone")
        wait_until(lambda: not [s for s in kapi.core.list_namespaced_service_account(ns).items
                                if s.metadata.name == "elastic-trainer"], 60, "service account gone")


def test_operator_killed_while_scaling_resumes_cleanly(extender, fake_trainer, kapi, ns, tj, run_operator, wait_until):
    """Stop the operator right after its first scale decision, restart it, and check the
    worker set is always duplicate-free and converges to what status says."""
    def workers_consistent():
        ps = kapi.pods(ns, "grow")
        idx = sorted(int(p.metadata.labels["rlsched.dev/worker-index"]) for p in ps)
        assert len(idx) == len(set(idx)), idx  # never two pods for one worker
        return idx

    with fake_trainer(ns, tau=4.0, noise=0.0005) as th:
        with run_operator(ns, allocator=BETA, patience=6):
            tj(ns, "grow", 1, 4, gpus=8, beta=0.02, dataSize=10000)
            th.start()
            wait_until(lambda: kapi.events(ns, "grow", "ScaledUp"), 60, "first scale-up")
        # operator down while the trainer keeps reporting
        seen = workers_consistent()
        target = kapi.status(ns, "grow")["targetWorkers"]
        assert target >= 2 and len(seen) <= target
        with run_operator(ns, allocator=BETA, patience=6):
            wait_until(lambda: kapi.phase(ns, "grow") == "Succeeded", 120, "grow converged after restart")
            for _ in range(3):
                workers_consistent()
        ups = [e.message.split(" (")[0] for e in kapi.events(ns, "grow", "ScaledUp")]
        downs = [e.message.split(" (")[0] for e in kapi.events(ns, "grow", "ScaledDown")]
        # every step was taken exactly once across the two operator lives
        assert len(ups) == len(set(ups)) and len(downs) == len(set(downs))
        wait_until(lambda: not kapi.pods(ns, "grow"), 30, "pods deleted after completion")


def test_ha_peering_only_the_leader_schedules(kube_cluster, kapi, ns, tj, wait_until):
    """Two replicas with kopf peering: only the higher-priority one cycles; when it
    stops, the other takes over."""
    import asyncio

    import yaml

    from rlsched.operator.controller import OperatorConfig
    from rlsched.operator.handlers import OperatorRuntime
    from rlsched.operator.main import operator, peering_crd_path

    for doc in yaml.safe_load_all(peering_crd_path().read_text()):
        try:
            kapi.ext.create_custom_resource_definition(doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
    wait_until(lambda: all(any(c.type == "Established" and c.status == "True" for c in
                               (kapi.ext.read_custom_resource_definition(n).status.conditions or []))
                           for n in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")), 30, "peering CRDs")
    kapi.custom.create_namespaced_custom_object("kopf.dev", "v1", ns, "kopfpeerings",
                                                {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                                 "metadata": {"name": "rlsched"}})

    def start(priority):
        cfg = OperatorConfig(kubeconfig=str(kube_cluster.kubeconfig), namespace=ns, cycle_s=0.5, metrics_port=None,
                             forecast_interval_s=0, peering="rlsched", priority=priority, allocator=FIFO)
        rt, stop = OperatorRuntime(cfg), threading.Event()
        th = threading.Thread(target=lambda: asyncio.run(operator(cfg, runtime=rt, stop_flag=stop)), daemon=True)
        th.start()
        return rt, stop, th

    high = start(10)
    low = None
    try:
        wait_until(lambda: high[0].controller and high[0].controller.cycles > 0, 30, "leader cycling")
        low = start(0)
        wait_until(lambda: low[0].controller, 30, "second replica started")
        tj(ns, "ha1", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "ha1") == "Running", 60, "ha1 running")
        assert high[0].controller.cycles > 0 and low[0].controller.cycles == 0
        high[1].set()
        high[2].join(30)
        assert not high[2].is_alive()
        tj(ns, "ha2", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "ha2") == "Running", 90, "ha2 running under the other replica")
        assert low[0].controller.cycles > 0
    finally:
        for _, stop, th in (r for r in (high, low) if r):
            stop.set()
            th.join(30)
