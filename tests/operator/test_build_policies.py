"""The operator builds its policies from core's registry (no rule of its own)."""

import pytest

from rlsched.operator.controller import build_scaling


def test_beta_scaling_is_cores():
    pol = build_scaling("beta", None)
    assert type(pol).__module__.startswith("rlsched.core")
    with pytest.raises(ValueError, match="unknown scaling policy"):
        build_scaling("no-such-policy", None)


def test_auto_scaling_is_learned_with_a_model_else_beta(tmp_path, caplog):
    assert build_scaling("auto", None).name == "beta"
    with caplog.at_level("WARNING"):
        pol = build_scaling("auto", str(tmp_path / "missing.safetensors"))
    assert pol.name == "rlpto" and "missing.safetensors" in caplog.text


def test_the_operator_cli_serves_the_served_allocator():
    import argparse

    from rlsched.core.served import SERVED
    from rlsched.operator.cli import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    assert p.parse_args(["operator", "run"]).allocator == SERVED.allocator == "goodput-rlpto"
    assert p.parse_args(["operator", "run", "--allocator", "none"]).allocator == "none"
