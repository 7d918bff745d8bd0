"""Fixtures shared by every test folder.

``kube_cluster`` (session scope) is the real Kubernetes control plane of the
integration tests: a :class:`rlsched_dev.cluster.LocalCluster` built from Go modules
(``make tools``), or the cluster of ``$RLSCHED_KUBECONFIG`` (kind in CI) with a local
kwok controller. Either way it carries the kwok GPU nodes of the default topology.
A cluster that cannot start makes the tests using it fail, never skip.

Against ``$RLSCHED_KUBECONFIG`` (kind mode) the ``rlsched`` profile is the Helm release's
kube-scheduler, which calls the extender sidecar in its own pod: ``launch_extender``
then starts no extender but reaches that one through ``kubectl port-forward``, and the
tests marked ``runner_side(reason)`` (a process or local control-plane internals the
kind cluster cannot host) are skipped by :func:`pytest_collection_modifyitems`, the
only place that skips them. Without ``$RLSCHED_KUBECONFIG`` nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run unless a developer asks to explore
# (HYPOTHESIS_PROFILE=explore): CI must not pass or fail by the luck of the draw.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


#: environment variable naming the cluster of kind mode (see :func:`kube_cluster`)
KIND_ENV = "RLSCHED_KUBECONFIG"
#: ``namespace/release`` of the Helm release whose scheduler serves the ``rlsched``
#: profile in kind mode (the e2e workflow's ``helm install``)
RELEASE_ENV = "RLSCHED_RELEASE"
DEFAULT_RELEASE = "rlsched-system/rlsched"


def pytest_collection_modifyitems(config, items):
    """Kind mode (``$RLSCHED_KUBECONFIG`` set): skip every test marked
    ``runner_side(reason)``, saying why. Otherwise (the local control plane) nothing."""
    if not os.environ.get(KIND_ENV):
        return
    for item in items:
        mark = item.get_closest_marker("runner_side")
        if mark is None:
            continue
        why = (mark.args[0] if mark.args else mark.kwargs.get("reason")) or "no reason given"
        item.add_marker(pytest.mark.skip(
            reason=f"runner_side, not run against ${KIND_ENV}'s cluster: {why}"))


def _poll(fn, timeout: float = 30.0, what: str = "condition", every: float = 0.2):
    """Call ``fn()`` every ``every`` s until it returns a truthy value (returned);
    AssertionError naming ``what`` and the last value after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


@pytest.fixture
def wait_until():
    """``wait_until(fn, timeout, what, every)``: :func:`_poll`."""
    return _poll


@pytest.fixture(scope="session")
def kube_cluster():
    """A :class:`rlsched_dev.cluster.KubeEnv`: ``.kubeconfig``, ``.server``, ``.topology``,
    ``.node_names``, ``.extender_url``/``.extender_port``, ``.api_client()``."""
    from rlsched_dev.cluster import kube_env

    with kube_env(
        kubeconfig=os.environ.get("RLSCHED_KUBECONFIG") or None,
        extender_url=os.environ.get("RLSCHED_EXTENDER_URL") or None,
    ) as env:
        yield env


@pytest.fixture(scope="session")
def core_api(kube_cluster):
    from kubernetes import client

    return client.CoreV1Api(kube_cluster.api_client())


@pytest.fixture
def namespace(core_api):
    """A fresh namespace per test, deleted afterwards."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core_api.delete_namespace(name)


@pytest.fixture(scope="session")
def launch_extender():
    """``launch_extender(kube_cluster, log_path, log_level)``: a context manager yielding
    the base URL of the extender the ``rlsched`` scheduler profile calls: a runner-side
    one it starts, or in kind mode the release's own (see :func:`_serve_extender`)."""
    return _serve_extender


def _in_cluster_extender(kube_cluster) -> tuple[str, str, int]:
    """``(namespace, pod, port)`` of the extender sidecar of the release named by
    ``$RLSCHED_RELEASE`` (``namespace/release``, default ``rlsched-system/rlsched``): the
    Ready scheduler pod (with several, the one holding a lease: the leader, the only
    one whose kube-scheduler calls its extender) and the extender container's
    ``--port``. Fails the test saying what is missing."""
    from kubernetes import client

    spec = os.environ.get(RELEASE_ENV) or DEFAULT_RELEASE
    ns, _, release = spec.partition("/")
    if not ns or not release:
        pytest.fail(f"${RELEASE_ENV}={spec!r}: expected NAMESPACE/RELEASE")
    api = kube_cluster.api_client()
    try:
        core = client.CoreV1Api(api)
        sel = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=scheduler"
        pods = [p for p in core.list_namespaced_pod(ns, label_selector=sel).items
                if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
                and all(c.ready for c in p.status.container_statuses or [])]
        if len(pods) > 1:
            holders = [ls.spec.holder_identity or "" for ls in
                       client.CoordinationV1Api(api).list_namespaced_lease(ns).items]
            pods = [p for p in pods if any(h.startswith(f"{p.metadata.name}_") for h in holders)]
    finally:
        api.close()
    if len(pods) != 1:
        pytest.fail(f"kind mode: want the one Ready scheduler pod of release {release!r} in namespace "
                    f"{ns!r} ({sel}; set ${RELEASE_ENV}=NAMESPACE/RELEASE), found "
                    f"{[p.metadata.name for p in pods]}")
    pod = pods[0]
    ext = next((c for c in pod.spec.containers if c.name == "extender"), None)
    port = next((int(a.split("=", 1)[1]) for a in (ext.args or []) if a.startswith("--port=")), None) \
        if ext is not None else None
    if port is None:
        pytest.fail(f"pod {ns}/{pod.metadata.name} has no extender container with --port=")
    return ns, pod.metadata.name, port


@contextlib.contextmanager
def _serve_extender(kube_cluster, log_path: Path, log_level: str = "WARNING"):
    """Yield the base URL of the extender the ``rlsched`` scheduler profile calls, once
    its /readyz answers; fail the test with the log if it does not within 30 s.

    * The profile calls a local port (the local control plane): run ``rlsched extender
      serve`` there (its own process, watching the API server, at ``log_level``, its
      log in ``log_path``); stopped afterwards.
    * Kind mode (a cluster given by ``$RLSCHED_KUBECONFIG``): the release's kube-scheduler
      calls the extender sidecar in its own pod, which listens on the pod's loopback
      only. Nothing is started beside it: ``kubectl port-forward`` to that port (its
      output, then the sidecar's log, in ``log_path``) serves all of its endpoints
      (/filter, /debug/..., /metrics) to the test; ``log_level`` is the chart's. A
      reachable ``$RLSCHED_EXTENDER_URL`` that is not local is used as it is."""
    port = kube_cluster.extender_port
    in_cluster = None
    with open(log_path, "w+") as log:
        if port is not None:
            url = f"http://127.0.0.1:{port}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "rlsched.cli", "extender", "serve", "--port", str(port),
                 "--kubeconfig", str(kube_cluster.kubeconfig), "--log-level", log_level],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        elif getattr(kube_cluster, "cluster", kube_cluster) is not None:  # a local control plane
            pytest.fail("the rlsched profile's extender URL is not local; cannot serve it here")
        elif kube_cluster.extender_url:
            url, proc = kube_cluster.extender_url.rstrip("/"), None
        else:
            from rlsched_dev.tools import find_tools

            in_cluster = _in_cluster_extender(kube_cluster)
            ns, pod, pod_port = in_cluster
            kubectl = str(find_tools() / "kubectl")
            url = None  # from kubectl's "Forwarding from 127.0.0.1:N -> P"
            proc = subprocess.Popen(
                [kubectl, f"--kubeconfig={kube_cluster.kubeconfig}", "-n", ns, "port-forward",
                 "--address=127.0.0.1", f"pod/{pod}", f":{pod_port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 30
            while True:
                if url is None:  # read through its own handle: the child shares log's offset
                    m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", Path(log_path).read_text())
                    url = f"http://127.0.0.1:{m.group(1)}" if m else None
                try:
                    if url is not None:
                        with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                            if r.status == 200:
                                break
                except OSError:
                    pass
                if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                    pytest.fail(f"extender did not become ready at {url or 'kubectl port-forward'}:\n"
                                f"{Path(log_path).read_text()}")
                time.sleep(0.2)
            yield url
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if in_cluster is not None:  # the sidecar's log beside the port-forward's
                ns, pod, _ = in_cluster
                out = subprocess.run([kubectl, f"--kubeconfig={kube_cluster.kubeconfig}", "-n", ns, "logs",
                                      pod, "-c", "extender", "--tail=2000"],
                                     capture_output=True, text=True, timeout=60, check=False)
                with open(log_path, "a") as tail:
                    tail.write(f"\n--- kubectl logs {ns}/{pod} -c extender\n{out.stdout}{out.stderr}")
