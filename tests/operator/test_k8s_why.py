"""Why a job is pending (issue 26 item 4), on the real control plane: each waiting
job's ``status.waiting`` holds its place in the service order and the reason with the
cycle's numbers — a gang that cannot fit the cluster, one that does not fit the free
GPUs, one behind the head of the queue — and ``rlsched why JOB`` prints it; with the
goodput allocator, the jobs ranked before it."""

import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"


def _why(kube_cluster, ns, job):
    out = subprocess.run([sys.executable, "-m", "rlsched.cli", "why", job, "-n", ns,
                          "--kubeconfig", str(kube_cluster.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_waiting_jobs_say_where_they_stand_and_why(kube_cluster, extender, kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO):
        tj(ns, "holder", 4, gpus=8)  # the whole 32-GPU cluster
        wait_until(lambda: kapi.phase(ns, "holder") == "Running", 60, "holder running")
        for name, workers, gpus in (("next", 1, 8), ("small", 1, 1), ("huge", 5, 8)):
            tj(ns, name, workers, gpus=gpus)
            time.sleep(1.1)  # FIFO by creation time, which has one-second resolution
        waiting = lambda n: kapi.status(ns, n).get("waiting") or {}  # noqa: E731
        wait_until(lambda: all(waiting(n).get("reason") for n in ("next", "small", "huge")), 30, "reasons written")
        assert (waiting("next")["position"], waiting("next")["reason"]) == (1, "NoRoom")
        assert "1 x 8 GPUs" in waiting("next")["message"] and "0 free GPUs" in waiting("next")["message"]
        assert (waiting("small")["position"], waiting("small")["reason"]) == (2, "BehindHead")
        assert "behind" in waiting("small")["message"] and "next" in waiting("small")["message"]
        assert (waiting("huge")["position"], waiting("huge")["reason"]) == (0, "Unfittable")
        text = _why(kube_cluster, ns, "small")
        assert "position 2 in the service order" in text and "BehindHead" in text, text
        assert "Unfittable" in _why(kube_cluster, ns, "huge")
        assert "Running" in _why(kube_cluster, ns, "holder")
        kapi.custom.delete_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs", "holder")
        wait_until(lambda: kapi.phase(ns, "next") == "Running", 60, "next admitted once the holder is gone")
        assert "waiting" not in kapi.status(ns, "next")


def test_with_the_allocator_a_waiting_job_is_told_who_ranks_before_it(kube_cluster, extender, kapi, ns, tj,
                                                                     run_operator, wait_until):
    with run_operator(ns, allocator="goodput"):
        tj(ns, "first", 4, gpus=8)
        wait_until(lambda: kapi.phase(ns, "first") == "Running", 60, "first running")
        tj(ns, "second", 4, gpus=8)
        wait_until(lambda: (kapi.status(ns, "second").get("waiting") or {}).get("reason") == "Ranked", 30,
                   "second told why")
        w = kapi.status(ns, "second")["waiting"]
        assert w["position"] == 1 and "1 job(s) ranked before it" in w["message"] and "32 GPUs" in w["message"]
        assert "Ranked" in _why(kube_cluster, ns, "second")
