"""Builders shared by the planning tests (as fixtures: tests import no helper module)."""

from __future__ import annotations

import pytest

from rlsched.core import ClusterState, NodeSpec, Topology
from rlsched.core.planning import TrainingSpec


def _cluster(*gpus: int) -> ClusterState:
    nodes = [NodeSpec(name=f"n{i}", gpus=g, rack="r0", block="b0") for i, g in enumerate(gpus)]
    return ClusterState(Topology(nodes))


def _spec(mn: int = 1, mx: int | None = None, gpw: int = 1, klass: str = "normal", value: float = 0.0, **kw) -> TrainingSpec:
    return TrainingSpec(min_workers=mn, max_workers=mn if mx is None else mx, gpus_per_worker=gpw,
                        priority_class=klass, priority_value=value, **kw)


@pytest.fixture
def make_cluster():
    """``make_cluster(8, 8)``: a ClusterState with one node per argument, all GPUs free."""
    return _cluster


@pytest.fixture
def make_spec():
    """``make_spec(min, max=min, gpus_per_worker, class, value, **kw)`` -> TrainingSpec."""
    return _spec
