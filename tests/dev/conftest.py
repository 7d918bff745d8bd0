"""Fixtures of the control-plane tests (as fixtures: tests import no helper module)."""

from __future__ import annotations

import pytest
from kubernetes import client


@pytest.fixture
def make_pod():
    """``make_pod(name, gpus=1, scheduler="rlsched", annotations=None)`` -> V1Pod."""

    def _pod(name: str, gpus: int = 1, scheduler: str = "rlsched", annotations=None):
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, annotations=annotations or {}),
            spec=client.V1PodSpec(
                scheduler_name=scheduler,
                restart_policy="Never",
                termination_grace_period_seconds=0,
                containers=[client.V1Container(
                    name="worker", image="registry.example/rlsched/worker:test",
                    resources=client.V1ResourceRequirements(
                        requests={"cpu": "1", **limits}, limits=limits),
                )],
            ),
        )

    return _pod
