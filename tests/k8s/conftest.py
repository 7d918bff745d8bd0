"""Fixtures of the control-plane tests (as fixtures: tests import no helper module)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client


@pytest.fixture
def wait_for():
    """``wait_for(fn, timeout, what)``: poll ``fn()`` until it returns a truthy value."""

    def _wait(fn, timeout: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = fn()
            if last:
                return last
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")

    return _wait


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
