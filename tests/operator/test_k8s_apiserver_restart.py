"""kube-apiserver killed while jobs complete: every job completes exactly once (issue 24).

Its own small :class:`~rlsched_dev.cluster.LocalCluster` (the session cluster must not
lose its API server under other tests): two 8-GPU kwok nodes, the real operator
(kopf, in-process). Eight jobs whose workers exit 0 a few seconds after they start
(``rlsched.dev/duration-seconds``) are running when kube-apiserver is stopped and
started again; the exits land during the outage. Afterwards every job is Succeeded by
its chief's exit, its workers are the very pods it started with (nothing ran again),
and the local cluster has brought back any scheduler that exited, so a job submitted
after the restart is scheduled and completes.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest

from rlsched.core.contract import (ANNOTATION_DURATION, API_VERSION, GROUP, KIND, LABEL_GENERATION, LABEL_JOB,
                                   PLURAL, VERSION)

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(400), pytest.mark.runner_side(
    "restarts the kube-apiserver of its own LocalCluster")]


@pytest.fixture(scope="module")
def small():
    from rlsched.core import Topology
    from rlsched.operator.main import install_crd, install_trainer_policy
    from rlsched_dev.cluster import LocalCluster
    from rlsched_dev.nodes import create_gpu_nodes, wait_nodes_ready

    topo = Topology.uniform(2, gpus_per_node=8, racks=1, blocks=1, prefix="ar-gpu")
    with LocalCluster() as c:
        wait_nodes_ready(c.kubeconfig, create_gpu_nodes(c.kubeconfig, topo))
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(c.kubeconfig))
        install_crd(api)
        install_trainer_policy(api)
        time.sleep(1.0)
        yield c, api
        api.close()


@contextlib.contextmanager
def operator(kubeconfig, ns):
    from kopf.testing import KopfRunner

    from rlsched.operator.controller import OperatorConfig
    from rlsched.operator.handlers import OperatorRuntime, build_registry

    cfg = OperatorConfig(kubeconfig=str(kubeconfig), namespace=ns, cycle_s=0.5, start_timeout_s=60.0,
                         grace_period_s=1, metrics_port=0, forecast_interval_s=0, patience=1000,
                         allocator="fifo/das+nobackfill")  # the old admission defaults as one allocator
    rt = OperatorRuntime(cfg)
    with KopfRunner(["run", "--standalone", "--namespace", ns], registry=build_registry(cfg, rt), timeout=120) as r:
        yield rt
    assert r.exception is None, r.exception


def poll(fn, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as exc:  # the API server is coming back
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def test_apiserver_restart_during_completions_completes_every_job_once(small):
    from kubernetes import client

    cluster, api = small
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = f"ar-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})

    def job(name, seconds):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": {"minWorkers": 1, "maxWorkers": 1, "gpusPerWorker": 2, "maxEpochs": 1000,
                     "template": {"metadata": {"annotations": {ANNOTATION_DURATION: str(seconds)}},
                                  "spec": {"containers": [{"name": "t", "image": "registry.example/t:1"}]}}}})

    def status(name):
        return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}

    def pods(name):
        return core.list_namespaced_pod(ns, label_selector=f"{LABEL_JOB}={name}").items

    names = [f"j{i}" for i in range(8)]
    with operator(cluster.kubeconfig, ns):
        for i, n in enumerate(names):
            job(n, 4 + i % 3)  # 16 GPUs: all eight run at once; they exit 4-6 s after starting
        poll(lambda: all(status(n).get("phase") == "Running" for n in names), 90, "every job running")
        started = {n: {p.metadata.uid for p in pods(n)} for n in names}
        assert all(len(u) == 1 for u in started.values())
        cluster.restart_apiserver(grace=3.0)  # the workers exit during and after the outage
        poll(lambda: all(status(n).get("phase") == "Succeeded" for n in names), 180, "every job completed")
        # the schedulers are back (the local cluster restarts what exited): a new job runs
        job("after", 2)
        poll(lambda: status("after").get("phase") == "Succeeded", 90, "a job submitted after the restart")
        time.sleep(3.0)  # a few more cycles: nothing finished may run again
        for n in names:
            st = status(n)
            assert (st["phase"], st["reason"]) == ("Succeeded", "ChiefSucceeded"), (n, st)
            now = pods(n)
            assert {p.metadata.uid for p in now} == started[n], f"{n} ran again"
            assert {p.metadata.labels[LABEL_GENERATION] for p in now} == {"0"}
            assert st.get("failures", 0) == 0 and st.get("restartGeneration", 0) == 0
    with contextlib.suppress(Exception):
        core.delete_namespace(ns)
