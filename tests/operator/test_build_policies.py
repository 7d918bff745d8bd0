"""The operator's ``--allocator``: core's live allocation policies, nothing else."""

import pytest


def test_the_operator_cli_serves_the_served_allocator():
    import argparse

    from rlsched.core.served import SERVED
    from rlsched.operator.cli import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    assert p.parse_args(["operator", "run"]).allocator == SERVED.allocator == "goodput-rlpto@adaptive=0.8,room_rounds=30"
    assert p.parse_args(["operator", "run", "--allocator", "fifo/das/rlpto+nobackfill"]).allocator == \
        "fifo/das/rlpto+nobackfill"


@pytest.mark.parametrize("name", ["none", "", "nosuch", "fifo", "goodput@p"])
def test_the_operator_cli_refuses_a_name_that_is_no_allocator(name, capsys):
    import argparse

    from rlsched.operator.cli import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    with pytest.raises(SystemExit):
        p.parse_args(["operator", "run", "--allocator", name])
    err = capsys.readouterr().err
    assert "--allocator" in err and "goodput-rlpto" in err and "ordering/placement[/scaling]" in err, err
