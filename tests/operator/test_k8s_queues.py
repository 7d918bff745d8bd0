"""Teams' queues on the real control plane (issue 26 items 1, 2 and 4): TrainingQueues
with GPU quotas, a team borrowing the idle team's GPUs, the owner reclaiming them by
preemption once the minimum run time is over, a job blocked by its queue's quota and
one blocked by its gang size told why (``status.waiting``, ``rlsched why``), a class the
queue does not allow, and each queue's status.

The cluster: 4 nodes x 8 GPUs = 32. Queue ``a`` and queue ``b`` are guaranteed 16 GPUs
each; ``b`` may not borrow. Every job is a rigid gang of 8-GPU workers.
"""

import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest

from rlsched.core.contract import GROUP, QUEUE_PLURAL, VERSION

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

MIN_RUN_S = 40.0  # long enough that b1 is created well inside it, even on a loaded machine


@pytest.fixture
def queues(kapi):
    """``queues(name=spec, ...)`` creates TrainingQueues (cluster-scoped, unique names);
    deleted at the end."""
    made: list[str] = []

    def _make(**specs):
        names = {}
        for key, spec in specs.items():
            name = f"{key}-{uuid.uuid4().hex[:6]}"
            kapi.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingQueue", "metadata": {"name": name}, "spec": spec})
            made.append(name)
            names[key] = name
        return names

    yield _make
    for name in made:
        kapi.custom.delete_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, name)


def _queue_status(kapi, name):
    return kapi.custom.get_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, name).get("status") or {}


def _why(kube_cluster, ns, job):
    out = subprocess.run([sys.executable, "-m", "rlsched.cli", "why", job, "-n", ns,
                          "--kubeconfig", str(kube_cluster.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_borrow_reclaim_quota_and_gang_reasons(kube_cluster, extender, kapi, ns, tj, queues, run_operator,
                                              wait_until):
    q = queues(a={"nominalGpus": 16, "namespaces": [ns]}, b={"nominalGpus": 16, "borrowingLimitGpus": 0})
    waiting = lambda n: kapi.status(ns, n).get("waiting") or {}  # noqa: E731
    with run_operator(ns, allocator="goodput", min_run_s=MIN_RUN_S) as rt:
        gauge = lambda metric, queue: rt.metrics.registry.get_sample_value(metric, {"queue": queue})  # noqa: E731
        # team a alone: its two 16-GPU jobs run, the second on 16 GPUs borrowed from b
        tj(ns, "a1", 2, gpus=8)  # no queueName: its namespace's queue, a
        time.sleep(1.1)  # FIFO by creation time (one-second resolution)
        tj(ns, "a2", 2, gpus=8, queueName=q["a"])
        wait_until(lambda: kapi.phase(ns, "a1") == kapi.phase(ns, "a2") == "Running", 90, "team a running")
        assert kapi.status(ns, "a1")["queueName"] == q["a"]
        wait_until(lambda: _queue_status(kapi, q["a"]).get("gpusInUse") == 32, 30, "queue a's status")
        assert _queue_status(kapi, q["a"])["borrowedGpus"] == 16
        # the per-queue gauges say the same
        assert (gauge("rlsched_queue_gpus_in_use", q["a"]), gauge("rlsched_queue_borrowed_gpus", q["a"]),
                gauge("rlsched_queue_running_jobs", q["a"]), gauge("rlsched_queue_nominal_gpus", q["b"])) == \
            (32.0, 16.0, 2.0, 16.0)
        admitted = {n: datetime.fromisoformat(kapi.status(ns, n)["admittedTime"].replace("Z", "+00:00")).timestamp()
                    for n in ("a1", "a2")}

        # team b's job is inside b's guarantee: it waits while a2 runs its minimum run time
        tj(ns, "b1", 2, gpus=8, queueName=q["b"])
        wait_until(lambda: waiting("b1").get("reason") == "MinRunTime", 15, "b1 waits for the minimum run time")
        assert kapi.phase(ns, "a2") == "Running"
        # then b takes its GPUs back: the first of a's jobs whose minimum run time is
        # over is preempted (a queue's jobs are not told apart as owned or borrowed), the
        # other keeps running inside a's guarantee
        wait_until(lambda: kapi.phase(ns, "b1") in ("Starting", "Running"), MIN_RUN_S + 60, "b1 reclaims")
        phases = {n: kapi.phase(ns, n) for n in ("a1", "a2")}
        assert sorted(phases.values()) == ["Queued", "Running"], phases
        (gone,) = [n for n, ph in phases.items() if ph == "Queued"]
        assert time.time() - admitted[gone] >= MIN_RUN_S - 1.0  # not before its minimum run time
        wait_until(lambda: _queue_status(kapi, q["b"]).get("gpusInUse") == 16, 30, "queue b's status")
        assert _queue_status(kapi, q["a"])["borrowedGpus"] == 0

        # blocked by its queue's quota: b may not borrow, its 16 GPUs are in use
        tj(ns, "b2", 1, gpus=8, queueName=q["b"])
        # blocked by its gang: 5 x 8 GPUs cannot fit the 32-GPU cluster
        tj(ns, "huge", 5, gpus=8, queueName=q["a"])
        # a class the queue does not allow (highest is granted explicitly)
        tj(ns, "vip", 1, gpus=8, klass="highest", queueName=q["a"])
        wait_until(lambda: all(waiting(n).get("reason") for n in ("b2", "huge", "vip")), 30, "reasons written")
        assert waiting("b2")["reason"] == "Quota"
        assert "uses 16 of its 16 nominal + 0 borrowable GPUs" in waiting("b2")["message"]
        assert waiting("huge")["reason"] == "Unfittable" and "40 GPUs" in waiting("huge")["message"]
        assert waiting("vip")["reason"] == "PriorityNotAllowed"
        wait_until(lambda: gauge("rlsched_queue_pending_jobs", q["b"]) == 1.0, 15, "b's pending gauge")
        assert gauge("rlsched_queue_oldest_pending_seconds", q["a"]) > 0  # huge and vip wait in a
        text = _why(kube_cluster, ns, "b2")
        assert "Quota" in text and f"queue {q['b']}" in text, text
        text = _why(kube_cluster, ns, "huge")
        assert "Unfittable" in text and "40 GPUs" in text, text
        assert kapi.status(ns, "b2")["queueName"] == q["b"]


def test_a_job_naming_a_missing_queue_waits_and_runs_once_it_exists(kube_cluster, extender, kapi, ns, tj, queues,
                                                                   run_operator, wait_until):
    name = f"later-{uuid.uuid4().hex[:6]}"
    with run_operator(ns, allocator="goodput"):
        tj(ns, "early", 1, gpus=8, queueName=name)
        wait_until(lambda: (kapi.status(ns, "early").get("waiting") or {}).get("reason") == "NoSuchQueue", 30,
                   "told its queue is missing")
        assert kapi.phase(ns, "early") == "Queued"
        kapi.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingQueue", "metadata": {"name": name},
            "spec": {"nominalGpus": 8}})
        try:
            wait_until(lambda: kapi.phase(ns, "early") in ("Starting", "Running"), 60, "admitted once it exists")
        finally:
            kapi.custom.delete_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, name)
