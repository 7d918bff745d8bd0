"""The live components serve the committed trained models by default (issue 6)."""

from rlsched.core.das import DASPlacement, DASParams
from rlsched.core.live_allocation import make_live_allocator
from rlsched.extender.cli import resolve_model


def test_extender_serves_the_trained_das_weights_by_default():
    path = resolve_model("das", None)
    placement = DASPlacement(model=path)
    assert placement.fallback_reason is None
    assert placement.params.mean_weights is not None  # the learned linear mean, not the defaults
    assert placement.params != DASParams()
    assert resolve_model("das", "none") is None
    assert resolve_model("firstfit", None) is None
    assert resolve_model("das", "/x/y.safetensors") == "/x/y.safetensors"


def test_an_allocator_naming_rlpto_scales_with_the_trained_weights():
    policy = make_live_allocator("fifo/das/rlpto+nobackfill").planner.policy
    assert policy.name == "rlpto" and policy.fallback_reason is None
