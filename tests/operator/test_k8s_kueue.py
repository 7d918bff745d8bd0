"""Kueue admits, rlsched places and scales (issue 26 item 3), on the local control plane
with Kueue's own controller manager built from its Go module (``tools/build.sh``, part
``kueue``; ``rlsched_dev.kueue``).

A ClusterQueue guarantees 24 GPUs (three 8-GPU workers) to a LocalQueue. TrainingJobs
labelled ``kueue.x-k8s.io/queue-name`` get a Workload from the operator and wait until
Kueue admits it: a 2-worker job is admitted whole, an elastic 1..2-worker job only in
part (Kueue's partial admission: one worker, the quota left) and rlsched runs it within
that, a third job waits (its status says Kueue has not admitted it) until the first is
deleted and Kueue admits it; when the partly admitted job ends, the operator marks its
Workload Finished (Kueue releases its quota).
"""

from __future__ import annotations

import uuid

import pytest

from rlsched.core.contract import ANNOTATION_DURATION, KUEUE_GROUP, KUEUE_LABEL_QUEUE_NAME, KUEUE_VERSION
from rlsched.operator.kueue import WORKLOAD_PLURAL as KUEUE_WORKLOAD_PLURAL

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(420)]

GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def kueue(kube_cluster, kapi, crd, tmp_path_factory):
    """Kueue's manager running against the cluster (its CRDs installed)."""
    from rlsched_dev.kueue import KueueManager
    from rlsched_dev.tools import find_tools

    mgr = KueueManager(find_tools(), str(kube_cluster.kubeconfig), tmp_path_factory.mktemp("kueue"))
    mgr.start(kapi.client)
    try:
        yield mgr
    finally:
        mgr.stop()


@pytest.fixture
def cluster_queue(kapi, kueue, ns):
    """A ResourceFlavor, a ClusterQueue of 24 GPUs and the LocalQueue ``lq`` in ``ns``."""
    name = f"cq-{uuid.uuid4().hex[:6]}"
    api = kapi.custom
    api.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": {}})
    api.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": [GPU],
            "flavors": [{"name": name, "resources": [{"name": GPU, "nominalQuota": 24}]}]}]}})
    api.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, "localqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue", "metadata": {"name": "lq"},
        "spec": {"clusterQueue": name}})
    yield name
    for plural in ("clusterqueues", "resourceflavors"):
        try:
            api.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
        except Exception:  # noqa: BLE001 - cleanup of a test object; the namespace goes anyway
            pass


def _workload(kapi, ns, job):
    items = kapi.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, ns, KUEUE_WORKLOAD_PLURAL)["items"]
    for wl in items:
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def _admitted(wl) -> bool:
    return wl is not None and any(c["type"] == "Admitted" and c["status"] == "True"
                                  for c in (wl.get("status") or {}).get("conditions") or [])


def test_kueue_admits_and_rlsched_places_within_the_admission(kube_cluster, extender, kapi, ns, cluster_queue,
                                                              run_operator, wait_until):
    label = {"labels": {KUEUE_LABEL_QUEUE_NAME: "lq"}}

    with run_operator(ns, allocator="goodput"):
        for name, mn, mx in (("whole", 2, 2), ("part", 1, 2), ("later", 2, 2)):
            # part's workers exit 0 after 30 s (kwok): it succeeds, its Workload is Finished
            meta = {"annotations": {ANNOTATION_DURATION: "30"}} if name == "part" else {}
            kapi.custom.create_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs", {
                "apiVersion": "rlsched.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name, **label},
                "spec": {"minWorkers": mn, "maxWorkers": mx, "gpusPerWorker": 8,
                         "template": {"metadata": meta,
                                      "spec": {"containers": [{"name": "train", "image": "registry.example/t:1"}]}}}})
            # one at a time: Kueue orders Workloads by creation time (one-second
            # resolution), so each is admitted (or found pending) before the next exists
            wait_until(lambda name=name: _workload(kapi, ns, name) is not None, 30, f"{name}'s Workload")
            if name != "later":
                wait_until(lambda name=name: _admitted(_workload(kapi, ns, name)), 60, f"Kueue admits {name}")
        wait_until(lambda: _admitted(_workload(kapi, ns, "whole")), 60, "Kueue admits whole")
        wait_until(lambda: kapi.phase(ns, "whole") == "Running", 60, "rlsched runs whole")
        assert len(kapi.pods(ns, "whole")) == 2
        # part: Kueue admits one of its two workers (8 GPUs left); rlsched runs it at one
        wait_until(lambda: _admitted(_workload(kapi, ns, "part")), 60, "Kueue admits part, partially")
        assigned = _workload(kapi, ns, "part")["status"]["admission"]["podSetAssignments"][0]
        assert assigned.get("count") == 1, assigned
        wait_until(lambda: kapi.phase(ns, "part") == "Running", 60, "rlsched runs part")
        assert kapi.status(ns, "part").get("workers") == 1
        # later: no quota left; it waits, held, told why
        wait_until(lambda: (kapi.status(ns, "later").get("waiting") or {}).get("reason") == "KueueAdmission", 30,
                   "later told Kueue has not admitted it")
        assert kapi.phase(ns, "later") == "Queued" and not _admitted(_workload(kapi, ns, "later"))
        assert not kapi.pods(ns, "later")
        # whole goes (its Workload with it): Kueue admits later, rlsched runs it
        kapi.custom.delete_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs", "whole")
        wait_until(lambda: _admitted(_workload(kapi, ns, "later")), 90, "Kueue admits later")
        wait_until(lambda: kapi.phase(ns, "later") == "Running", 60, "rlsched runs later")
        # part ends: the operator marks its Workload Finished, and Kueue releases the quota
        wait_until(lambda: kapi.phase(ns, "part") == "Succeeded", 90, "part succeeds")
        wait_until(lambda: any(c["type"] == "Finished" and c["status"] == "True" for c in
                               (_workload(kapi, ns, "part").get("status") or {}).get("conditions") or []),
                   30, "part's Workload Finished")
