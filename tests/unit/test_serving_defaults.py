"""The live components serve the committed trained models by default (issue 6)."""

from rlsched.core import make_scaling
from rlsched.core.das import DASPlacement, DASParams
from rlsched.extender.cli import resolve_model
from rlsched.operator.cli import resolve_scaling_model


def test_extender_serves_the_trained_das_weights_by_default():
    path = resolve_model("das", None)
    placement = DASPlacement(model=path)
    assert placement.fallback_reason is None
    assert placement.params.mean_weights is not None  # the learned linear mean, not the defaults
    assert placement.params != DASParams()
    assert resolve_model("das", "none") is None
    assert resolve_model("firstfit", None) is None
    assert resolve_model("das", "/x/y.safetensors") == "/x/y.safetensors"


def test_operator_scales_with_the_trained_rlpto_weights_by_default():
    path = resolve_scaling_model("auto", None)
    policy = make_scaling("rlpto", path=path)
    assert getattr(policy, "fallback_reason", None) is None
    assert resolve_scaling_model("auto", "none") is None
    assert resolve_scaling_model("beta", None) is None
