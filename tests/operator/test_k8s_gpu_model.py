"""Admission reads the GPU model a worker template asks for (issue 25 item 1): on the
real control plane with the kwok A100 nodes, a gang whose template selects a model no
node has is reported unfittable and gets no pods, instead of being admitted, its pods
pending at the extender's filter until the start timeout; the same gang selecting the
nodes' model starts."""

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"


def _template(model: str) -> dict:
    return {"spec": {"containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test"}],
                     "nodeSelector": {"nvidia.com/gpu.product": model}}}


def test_a_gang_of_a_model_the_cluster_lacks_waits_unfittable(extender, kapi, ns, tj, run_operator, wait_until):
    model = {n.metadata.labels.get("nvidia.com/gpu.product") for n in kapi.core.list_node().items} - {None}
    assert len(model) == 1, model  # the default kwok topology: one model
    (have,) = model
    with run_operator(ns, allocator=FIFO):
        tj(ns, "elsewhere", 1, 2, template=_template("NVIDIA-H100-SXM5-80GB"))
        tj(ns, "here", 1, 2, template=_template(have))
        wait_until(lambda: kapi.phase(ns, "here") == "Running", 60, "the job of the nodes' model running")
        cond = wait_until(lambda: (kapi.condition(ns, "elsewhere", "Schedulable") or {}).get("reason") == "Unfittable"
                          and kapi.condition(ns, "elsewhere", "Schedulable"), 30, "elsewhere unfittable")
        assert "GPU model" in cond["message"], cond
        assert kapi.phase(ns, "elsewhere") == "Queued" and not kapi.pods(ns, "elsewhere")


def test_with_the_allocator_a_gang_of_a_model_the_cluster_lacks_gets_no_gpus(extender, kapi, ns, tj, run_operator,
                                                                             wait_until):
    """The served default (the goodput allocator) reads the same constraint: the job of
    the missing model is given no GPUs and says why (``status.waiting``), while the one
    of the nodes' model starts; before, the allocator counted every node's GPUs for it
    and started workers the extender could never place."""
    (have,) = {n.metadata.labels.get("nvidia.com/gpu.product") for n in kapi.core.list_node().items} - {None}
    with run_operator(ns, allocator="goodput"):
        tj(ns, "elsewhere", 1, 2, template=_template("NVIDIA-H100-SXM5-80GB"))
        tj(ns, "here", 1, 2, template=_template(have))
        wait_until(lambda: kapi.phase(ns, "here") == "Running", 60, "the job of the nodes' model running")
        w = wait_until(lambda: (kapi.status(ns, "elsewhere").get("waiting") or {}).get("reason") == "Unfittable"
                       and kapi.status(ns, "elsewhere")["waiting"], 30, "elsewhere unfittable")
        assert "0 are the allocator's on nodes of a GPU model its workers allow" in w["message"], w
        assert kapi.phase(ns, "elsewhere") == "Queued" and not kapi.pods(ns, "elsewhere")
