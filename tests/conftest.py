"""Fixtures shared by every test folder.

``kube_cluster`` (session scope) is the real Kubernetes control plane of the
integration tests: a :class:`rlsched_dev.cluster.LocalCluster` built from Go modules
(``make tools``), or the cluster of ``$RLSCHED_KUBECONFIG`` (kind in CI) with a local
kwok controller. Either way it carries the kwok GPU nodes of the default topology.
A cluster that cannot start makes the tests using it fail, never skip.
"""

from __future__ import annotations

import contextlib
import os
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
    """``launch_extender(kube_cluster, log_path, log_level)``: a context manager running
    the real extender for the ``rlsched`` profile (see :func:`_serve_extender`)."""
    return _serve_extender


@contextlib.contextmanager
def _serve_extender(kube_cluster, log_path: Path, log_level: str = "WARNING"):
    """Run ``rlsched extender serve`` (its own process, watching the API server) on the
    port the ``rlsched`` scheduler profile calls; yield its base URL once /readyz
    answers; stop it afterwards. Fails the test with the extender's log if it does
    not become ready in 30 s."""
    port = kube_cluster.extender_port
    if port is None:
        pytest.fail("the rlsched profile's extender URL is not local; cannot serve it here")
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlsched.cli", "extender", "serve", "--port", str(port),
             "--kubeconfig", str(kube_cluster.kubeconfig), "--log-level", log_level],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"extender did not become ready:\n{log.read()}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
