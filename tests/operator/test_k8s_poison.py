"""Poison objects, a hostile status and foreign pods against the real control plane
(issue 12 items 3-6): each bad object stays with itself, the rest of the cluster is
scheduled as before.

The default dev topology is 4 kwok nodes x 8 GPUs = 32 GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rlsched.core.contract import GROUP as G
from rlsched.core.contract import LABEL_INDEX, LABEL_JOB, LABEL_ROLE
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"

IMAGE = "registry.example/rlsched/trainer:test"


def workers(kapi, ns, job):
    """Live pods the job's TrainingJob controls (not merely labelled with its name)."""
    out = []
    for p in kapi.core.list_namespaced_pod(ns).items:
        refs = p.metadata.owner_references or []
        if p.metadata.deletion_timestamp is None and any(r.kind == "TrainingJob" and r.name == job and r.controller
                                                         for r in refs):
            out.append(p)
    return out


def template(*containers, init=()):
    spec = {"containers": list(containers) or [{"name": "train", "image": IMAGE}]}
    if init:
        spec["initContainers"] = list(init)
    return {"spec": spec}


def gpu_container(name, n):
    return {"name": name, "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": str(n)}}}


@contextlib.contextmanager
def stepped_controller(kube_cluster, ns, **kw):
    """A Controller of the test's own whose cycles the test runs one at a time:
    ``step()`` runs one cycle (raising whatever it raises)."""
    from rlsched.operator.controller import Controller, OperatorConfig
    from rlsched.operator.handlers import make_api_client
    from rlsched.operator.metrics import OperatorMetrics

    cfg = OperatorConfig(kubeconfig=str(kube_cluster.kubeconfig), namespace=ns, cycle_s=3600.0, start_timeout_s=60.0,
                         grace_period_s=1, metrics_port=None, forecast_interval_s=0, **{"allocator": FIFO, **kw})
    loop = asyncio.new_event_loop()
    api = loop.run_until_complete(make_api_client(cfg.kubeconfig))
    try:
        ctl = Controller(cfg, api, OperatorMetrics())
        yield ctl, lambda: loop.run_until_complete(ctl.cycle())
    finally:
        loop.run_until_complete(api.close())
        loop.close()


def sample(ctl, name, **labels):
    return ctl.metrics.registry.get_sample_value(name, labels or None) or 0.0


def test_poison_objects_fail_alone_and_the_others_are_admitted_within_two_cycles(kube_cluster, kapi, ns, tj,
                                                                                 run_operator, wait_until):
    """A job whose pods the API server refuses (403: unknown PriorityClass; 422: an
    invalid container name), a job whose worker names are too long, and a pod
    elsewhere whose GPU count cannot be read: the cycle goes on, each bad job fails
    with the API server's message, the valid jobs behind them are admitted within two
    cycles."""
    # the operator's kopf handlers enqueue new jobs; its own loop cycles once at start
    # and then sleeps: the test runs the cycles itself
    with run_operator(ns, allocator=FIFO, cycle_s=3600.0) as rt:
        wait_until(lambda: rt.controller is not None and rt.controller.cycles >= 1, 30, "operator started")
        # a pod the operator does not own, with a GPU count the parser refuses (2M > MAX_GPUS)
        node = kube_cluster.node_names[0]
        kapi.core.create_namespaced_pod(ns, {
            "metadata": {"name": "absurd-gpus"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": IMAGE, "resources": {
                "limits": {"nvidia.com/gpu": "2M"}, "requests": {"nvidia.com/gpu": "2M"}}}]},
        })
        # urgent: served before the valid jobs, and together they take 24 GPUs
        tj(ns, "forbidden", 2, gpus=8, klass="urgent",
           template={"spec": {"priorityClassName": "no-such-class", "containers": [{"name": "t", "image": IMAGE}]}})
        tj(ns, "invalid", 1, gpus=8, klass="urgent", template=template({"name": "Bad_Name", "image": IMAGE}))
        long_name = "poison-" + "x" * 53  # 60 characters: "-worker-0" makes 69
        tj(ns, long_name, 1, gpus=1, klass="urgent")
        tj(ns, "good-1", 1, gpus=1)
        tj(ns, "good-2", 2, gpus=8)
        names = ["forbidden", "invalid", long_name, "good-1", "good-2"]
        wait_until(lambda: all(kapi.phase(ns, n) for n in names), 30, "all jobs seen by the create handler")
        # the long name is refused up front, before it holds any GPU
        assert kapi.phase(ns, long_name) == "Failed"
        cond = kapi.condition(ns, long_name, "Valid")
        assert cond["status"] == "False" and cond["reason"] == "InvalidSpec" and "more than 63" in cond["message"]

        with stepped_controller(kube_cluster, ns) as (ctl, step):
            step()  # cycle 1: never raises
            assert set(ctl.last_plan.admit) == {f"{ns}/forbidden", f"{ns}/invalid"}  # the valid jobs wait
            assert kapi.phase(ns, "forbidden") == kapi.phase(ns, "invalid") == "Failed"
            step()  # cycle 2
            assert kapi.phase(ns, "good-1") in ("Starting", "Running")
            assert kapi.phase(ns, "good-2") in ("Starting", "Running")
            assert sample(ctl, "rlsched_operator_job_errors_total", kind="rejected") == 2
            assert sample(ctl, "rlsched_operator_cycles_total") == 2

        cond = kapi.condition(ns, "forbidden", "PodsCreated")
        assert cond["status"] == "False" and cond["reason"] == "Forbidden"
        assert "no PriorityClass with name no-such-class was found" in cond["message"]
        assert kapi.status(ns, "forbidden")["reason"] == "Forbidden"
        cond = kapi.condition(ns, "invalid", "PodsCreated")
        assert cond["status"] == "False" and cond["reason"] == "Invalid" and "Bad_Name" in cond["message"]
        for n, reason in (("forbidden", "Forbidden"), ("invalid", "Invalid")):
            assert [e.type for e in kapi.events(ns, n, reason)] == ["Warning"]
            assert workers(kapi, ns, n) == []
        # the foreign pod is left alone
        assert kapi.core.read_namespaced_pod("absurd-gpus", ns).metadata.deletion_timestamp is None
        wait_until(lambda: len(workers(kapi, ns, "good-2")) == 2 and len(workers(kapi, ns, "good-1")) == 1, 30,
                   "the valid jobs' workers")


def test_status_patch_cannot_grow_a_job_nor_admit_one(kapi, ns, tj, run_operator, wait_until):
    """``{"status": {"targetWorkers": 40}}`` on a maxWorkers-2 job (as admin, so no
    admission policy stops it): never more than 2 pods; a queued job flipped to
    Running with a top priority gets no pods and is put back."""
    hostile_queued = {"phase": "Running", "targetWorkers": 4, "effectivePriority": 1000.0, "queue": "interrupt"}

    def bounded():
        n = len(workers(kapi, ns, "capped"))
        assert n <= 2, f"{n} workers on a maxWorkers-2 job"
        assert workers(kapi, ns, "hog") == [], "pods for a job that was never admitted"
        return n

    with run_operator(ns, allocator=FIFO) as rt:
        tj(ns, "capped", 1, 2, gpus=1)
        wait_until(lambda: kapi.phase(ns, "capped") == "Running", 60, "capped running")
        tj(ns, "hog", 4, gpus=8)  # all 32 GPUs: blocked behind capped
        wait_until(lambda: kapi.status(ns, "hog").get("queue") == "normal", 20, "hog queued")
        seen = rt.controller.cycles
        wait_until(lambda: rt.controller.cycles >= seen + 2, 20, "the operator has seen hog")
        kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "capped", {"status": {"targetWorkers": 40}})
        kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "hog", {"status": hostile_queued})
        start = rt.controller.cycles
        wait_until(lambda: bounded() is not None and rt.controller.cycles >= start + 6, 60, "six cycles")
        assert kapi.status(ns, "capped")["targetWorkers"] == 1 and bounded() == 1
        st = kapi.status(ns, "hog")
        assert (st["phase"], st["queue"], st["effectivePriority"]) == ("Queued", "normal", 0)
        assert st.get("targetWorkers", 0) == 0
        assert kapi.events(ns, "capped", "StatusReset") and kapi.events(ns, "hog", "StatusReset")
    # the operator restarts with no record of its own: the status is adopted within the spec
    kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "capped", {"status": {"targetWorkers": 40}})
    with run_operator(ns, allocator=FIFO) as rt:
        wait_until(lambda: bounded() == 2 and kapi.status(ns, "capped").get("targetWorkers") == 2, 60,
                   "capped clamped to maxWorkers")
        start = rt.controller.cycles
        wait_until(lambda: bounded() == 2 and rt.controller.cycles >= start + 4, 60, "four more cycles")
        assert kapi.phase(ns, "hog") == "Queued"


def test_pods_the_operator_does_not_own_are_never_touched(kapi, ns, tj, run_operator, wait_until):
    """A plain gang pod labelled ``rlsched.dev/job`` (as docs/extender.md suggests), one
    labelled like a worker of an existing job, and one that refers to that job without
    being controlled by it: none is deleted, none counts as a worker."""
    with run_operator(ns, allocator=FIFO) as rt:
        body = tj(ns, "real", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "real") == "Running", 60, "real running")

        def plain(name, labels, owner=None):
            md = {"name": name, "labels": labels}
            if owner:
                md["ownerReferences"] = [owner]
            return kapi.core.create_namespaced_pod(ns, {"metadata": md, "spec": {
                "containers": [{"name": "c", "image": IMAGE}]}}).metadata.uid

        ref = {"apiVersion": f"{G}/{V}", "kind": "TrainingJob", "name": "real", "uid": body["metadata"]["uid"],
               "controller": False}
        uids = {
            "gang-a": plain("gang-a", {LABEL_JOB: "gang-x"}),
            "imposter": plain("imposter", {LABEL_JOB: "real", LABEL_INDEX: "0", LABEL_ROLE: "chief"}),
            "referrer": plain("referrer", {LABEL_JOB: "real", LABEL_INDEX: "1"}, ref),
        }
        start = rt.controller.cycles
        wait_until(lambda: rt.controller.cycles >= start + 8, 60, "eight cycles")
        for name, uid in uids.items():
            p = kapi.core.read_namespaced_pod(name, ns)
            assert p.metadata.uid == uid and p.metadata.deletion_timestamp is None, name
        assert [p.metadata.name for p in workers(kapi, ns, "real")] == ["real-worker-0"]
        assert kapi.status(ns, "real")["workers"] == 1 and kapi.phase(ns, "real") == "Running"


def test_unfittable_gang_waits_with_a_condition_and_blocks_nobody(kube_cluster, kapi, ns, tj, run_operator, wait_until):
    """A gang that can never fit (1024 x 64 GPUs; 5 x 8 GPUs on 32) stays Queued with
    Schedulable=False and the numbers; the 1-GPU job behind it runs. Templates whose
    GPU totals differ from gpusPerWorker are refused."""
    total = sum(n.gpus for n in kube_cluster.topology.nodes)
    largest = max(n.gpus for n in kube_cluster.topology.nodes)
    wide = total // largest + 1  # one worker more than the nodes can host
    with run_operator(ns, allocator=FIFO):
        tj(ns, "huge", 1024, gpus=64)
        tj(ns, "wide", wide, gpus=largest)
        tj(ns, "two-containers", 1, gpus=1, template=template(gpu_container("a", 1), gpu_container("b", 1)))
        tj(ns, "init-8", 1, gpus=1, template=template(init=[gpu_container("warm-up", 8)]))
        tj(ns, "tiny", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "tiny") == "Running", 60, "tiny running behind the unfittable gangs")
        for name, needle in (("huge", f"a worker needs 64 GPUs, the largest node has {largest}"),
                             ("wide", f"the gang needs {wide} x {largest} = {wide * largest} GPUs, the cluster has {total}")):
            cond = wait_until(lambda: kapi.condition(ns, name, "Schedulable"), 20, f"{name} condition")
            assert cond["status"] == "False" and cond["reason"] == "Unfittable" and needle in cond["message"]
            assert kapi.phase(ns, name) == "Queued" and workers(kapi, ns, name) == []
            assert [e.type for e in wait_until(lambda: kapi.events(ns, name, "Unfittable"), 10, "event")] == ["Warning"]
        for name, got in (("two-containers", 2), ("init-8", 8)):
            wait_until(lambda: kapi.phase(ns, name) == "Failed", 20, f"{name} refused")
            cond = kapi.condition(ns, name, "Valid")
            assert cond["reason"] == "InvalidSpec"
            assert f"asks for {got} nvidia.com/gpu but spec.gpusPerWorker is 1" in cond["message"]
            assert workers(kapi, ns, name) == []
