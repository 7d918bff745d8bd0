"""The operator's admission checks room with the extender's placement, and a placement
that fails does not stop admission (best fit decides instead)."""

from __future__ import annotations

import logging

import pytest

from rlsched.core import ClusterState, JobView, NodeSpec, Topology
from rlsched.operator.controller import build_placement


@pytest.fixture
def controller(offline_controller):
    """``controller(**config)``: a Controller (the room check needs no API server)."""
    return offline_controller


def _cluster() -> ClusterState:
    return ClusterState(Topology([NodeSpec(name=f"n{i}", gpus=8, rack="r0", block="b0") for i in range(3)]))


def test_default_is_the_extenders_placement(controller):
    ctl = controller()
    assert ctl.placement.name == "das" and ctl.placement.fallback_reason is None
    assert type(build_placement("topology", None)).__name__ == "TopologyPacking"


class _Broken:
    name = "broken"
    fallback_reason = None

    def place(self, job, state, workers=None):
        raise RuntimeError("policy bug")


def test_a_failing_placement_falls_back_to_bestfit(controller, caplog):
    ctl = controller(placement="firstfit")
    st = _cluster()
    st.allocate(1, 6)
    job = JobView(id="j", submit_time=0.0, gpus_per_worker=2, workers=2, min_workers=2, max_workers=2)
    assert ctl._place(job, st) == [0, 0]  # firstfit, as configured
    ctl.placement = _Broken()
    with caplog.at_level(logging.ERROR, logger="rlsched.operator"):
        assert ctl._place(job, st) == [1, 0]  # best fit: the fullest node with room first
    assert any("policy bug" in (r.exc_text or "") or r.exc_info for r in caplog.records)
    assert st.free.tolist() == [8, 2, 8]  # nothing left allocated
