"""Fixtures shared by every test folder.

``kube_cluster`` (session scope) is the real Kubernetes control plane of the
integration tests: a :class:`rlsched.devcluster.LocalCluster` built from Go modules
(``make tools``), or the cluster of ``$RLSCHED_KUBECONFIG`` (kind in CI) with a local
kwok controller. Either way it carries the kwok GPU nodes of the default topology.
A cluster that cannot start makes the tests using it fail, never skip.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def kube_cluster():
    """A :class:`rlsched.devcluster.KubeEnv`: ``.kubeconfig``, ``.server``, ``.topology``,
    ``.node_names``, ``.extender_url``/``.extender_port``, ``.api_client()``."""
    from rlsched.devcluster import kube_env

    with kube_env(
        kubeconfig=os.environ.get("RLSCHED_KUBECONFIG") or None,
        extender_url=os.environ.get("RLSCHED_EXTENDER_URL") or None,
    ) as env:
        yield env
