"""The fake trainer's speed and gradient reports follow the measured profile it replays
(what the goodput allocator reads live): the step time of the generation's placement
and per-GPU share of its batch, the application's gradient statistics at that batch."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data") / "pollux-osdi21" / "traces"


@pytest.fixture(scope="module")
def cifar10():
    from rlsched.sim.measured import load_applications

    return load_applications(TRACES, ("cifar10",))["cifar10"]


def trainer(app, nodes, batch):
    from rlsched_dev.fake_trainer import FakeTrainer

    t = object.__new__(FakeTrainer)  # no API server: only the report's arithmetic is tested
    t.application, t._nodes, t._batch = app, {("u", 3): nodes}, ({("u", 3): batch} if batch else {})
    return t


@pytest.mark.parametrize("nodes, gpw, batch, placement", [
    (["a", "a", "b"], 1, 384, (2, 1)),
    (["a", "a", "a", "a"], 2, None, (8,)),
    (["a"], 1, 100_000, (1,)),  # a share beyond a GPU's micro-batch: accumulation
])
def test_reports_follow_the_measured_profile(cifar10, nodes, gpw, batch, placement):
    lim = cifar10.bounds
    t = trainer(cifar10, nodes, batch)
    body = {"spec": {"gpusPerWorker": gpw}}
    r = t._throughput(body, "u", 3, len(nodes), epoch=5)
    b = batch or lim.init_batch
    gpus = sum(placement)
    micro = -(-(-(-b // gpus)) // lim.largest_local)
    atomic = -(-(-(-b // gpus)) // micro)
    assert r["step_time_seconds"] == cifar10.update_time(placement, atomic, micro - 1)[0]
    assert (r["workers"], r["global_batch_size"], r["generation"]) == (len(nodes), b, 3)
    sqr, var = cifar10.grad_stats(b, 5)
    assert (r["grad_sqr"], r["grad_var"]) == (sqr, var * lim.init_batch)
    if batch == 100_000:
        assert micro > 1
