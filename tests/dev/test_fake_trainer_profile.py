"""The fake trainer's speed and gradient reports follow the measured profile it replays
(what the goodput allocator reads live): the step time of the generation's placement
and per-GPU share of its batch, the application's gradient statistics at that batch."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data")
TRACES = DATA / "pollux-osdi21" / "traces"


@pytest.fixture(scope="module")
def cifar10():
    from rlsched.sim.measured import load_applications

    return load_applications(TRACES, ("cifar10",))["cifar10"]


def trainer(app, nodes, batch, gpu_type=None):
    from rlsched_dev.fake_trainer import FakeTrainer

    t = object.__new__(FakeTrainer)  # no API server: only the report's arithmetic is tested
    t.application, t._nodes, t._batch = app, {("u", 3): nodes}, ({("u", 3): batch} if batch else {})
    t._type = {("u", 3): gpu_type} if gpu_type else {}
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


def test_on_several_gpu_types_it_replays_the_type_its_generation_is_pinned_to():
    """RLSCHED_GPU_TYPE in the chief's environment (the operator's pin) picks the
    measured type, whose step times and per-GPU batch limit it replays and whose name
    it reports; unpinned, the application's first type and no name."""
    from rlsched.sim.measured import load_applications

    app = load_applications(DATA / "sia-sosp23" / "traces", ("cifar10",), gpu_types=("aws", "dgx-ext"))["cifar10"]
    body = {"spec": {"gpusPerWorker": 1}}
    seen = {}
    for gtype in ("aws", "dgx-ext"):
        r = trainer(app, ["a", "a"], 256, gtype)._throughput(body, "u", 3, 2, epoch=1)
        lim = app.bounds_on(gtype)
        micro = -(-128 // lim.largest_local)
        assert r["step_time_seconds"] == app.update_time((2,), -(-128 // micro), micro - 1, gtype)[0]
        assert r["gpu_type"] == gtype
        seen[gtype] = r["step_time_seconds"]
    assert seen["aws"] != seen["dgx-ext"]
    plain = trainer(app, ["a", "a"], 256)._throughput(body, "u", 3, 2, epoch=1)
    assert plain["gpu_type"] is None and plain["step_time_seconds"] == seen["aws"]


def test_the_mixed_dev_cluster_has_two_types_labelled_as_gfd_labels_them():
    from rlsched.core.contract import gpu_type_of, parse_gpu_types
    from rlsched.sim.measured import TYPE_GPUS_PER_NODE
    from rlsched_dev.nodes import MIXED_GPU_TYPES, kwok_node, load_topology

    table = parse_gpu_types(MIXED_GPU_TYPES)
    nodes = [kwok_node(n) for n in load_topology("mixed").nodes]
    kinds = {(gpu_type_of(n["metadata"]["labels"]["nvidia.com/gpu.product"], table),
              int(n["status"]["allocatable"]["nvidia.com/gpu"])) for n in nodes}
    assert kinds == {("aws", TYPE_GPUS_PER_NODE["aws"]), ("dgx-ext", TYPE_GPUS_PER_NODE["dgx-ext"])}
