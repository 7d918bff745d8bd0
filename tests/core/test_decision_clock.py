"""The one rule for when an allocation policy decides (core/decision_clock.py)."""

from __future__ import annotations

import pytest

from rlsched.core.decision_clock import DecisionClock


def test_first_decision_is_now_events_wait_out_the_gap_and_quiet_waits_the_interval():
    c = DecisionClock(gap=30.0, interval=300.0)
    assert c.next_due(None, 12.0, changed=False) == 12.0
    assert c.next_due(100.0, 110.0, changed=True) == 130.0  # within the gap: at its end
    assert c.next_due(100.0, 150.0, changed=True) == 150.0  # past it: now
    assert c.next_due(100.0, 150.0, changed=False) == 400.0  # nothing happened: the interval
    assert DecisionClock(gap=0.0).next_due(100.0, 100.0, changed=True) == 100.0


@pytest.mark.parametrize("gap,interval", [(-1.0, 300.0), (5.0, 0.0), (5.0, float("nan"))])
def test_a_clock_that_cannot_tick_is_refused(gap, interval):
    with pytest.raises(ValueError, match="decision clock"):
        DecisionClock(gap=gap, interval=interval)
