"""A job's epochs of work as the scheduler judges them: the scale-invariant figure the
trainer reports (AdaScale's base-batch epochs) when present, else completed epochs."""

import pytest

from rlsched.core import Progress, progress_from_report
from rlsched.core.planning import ElasticState, ScalingPlanner
from rlsched.core import make_scaling


def test_the_reader_takes_the_scale_invariant_epochs():
    p = progress_from_report({"epoch": 5, "loss": 0.5, "maxLoss": 2.0, "accuracy": 0.9, "history": [0.8, 0.9],
                              "scaleInvariantEpochs": 3.25})
    assert (p.epoch, p.loss, p.max_loss, p.accuracy, p.history) == (5, 0.5, 2.0, 0.9, [0.8, 0.9])
    assert p.scale_invariant_epochs == 3.25 and p.epochs_done == 3.25
    plain = progress_from_report({"epoch": 5})
    assert plain.scale_invariant_epochs is None and plain.epochs_done == 5.0
    assert plain.loss != plain.loss  # NaN: no loss reported
    for bad in ("lots", -1.0, float("inf"), None):  # not a finite number >= 0: not reported
        assert progress_from_report({"epoch": 2, "scaleInvariantEpochs": bad}).epochs_done == 2.0


def test_max_epochs_and_the_remaining_time_judge_scale_invariant_epochs(make_spec):
    """Five passes over the data at a large batch made three base-batch epochs of
    progress: a job capped at 4 epochs is not finished, and its remaining time is
    (4 - 3) x ran / 3."""
    spec = make_spec(mn=1, mx=4, max_epochs=4)
    prog = Progress(epoch=5, loss=1.0, max_loss=2.0, accuracy=0.9, history=[0.9] * 5, scale_invariant_epochs=3.0)
    planner = ScalingPlanner(make_scaling("beta"), patience=100)
    job = spec.view("j", submit_time=0.0, workers=2, priority=0.0, progress=prog, record=ElasticState())
    assert planner.finished(job) is None
    prog.scale_invariant_epochs = 4.0
    assert planner.finished(job) == "MaxEpochs"
    prog.scale_invariant_epochs = None  # without the figure: the five passes count
    assert planner.finished(job) == "MaxEpochs"
    view = spec.view("j", submit_time=0.0, workers=2, priority=0.0, ran=300.0,
                     progress=Progress(epoch=5, scale_invariant_epochs=3.0))
    assert view.remaining == pytest.approx(100.0)
