"""GPU types live: on the real control plane with kwok nodes of two types labelled as
GPU Feature Discovery labels them (the session's A100 nodes and two Tesla-T4 nodes added
here), the served goodput allocator's generation of a job is pinned to one type (its pods
require that type's products and carry RLSCHED_GPU_TYPE) and lands there; the fake
trainer's reports — the step times measured on that type — come back in
``status.goodput`` as rows of that type. A job that lands on the T4s because another job
holds every A100 (and can run nowhere else) moves to the A100s, 5.9 times faster for it by
the seed profile it declared (``spec.seedProfile``), once that job is gone, and its record
then holds both types."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data") / "sia-sosp23"

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180),
              pytest.mark.skipif(not SIA.is_dir(), reason=f"measured profiles not found at {SIA} (../shared/data)")]

PRODUCT = "nvidia.com/gpu.product"
IMAGE = "registry.example/rlsched/trainer:test"


@pytest.fixture
def t4_nodes(kapi, wait_until):
    """Two kwok nodes of 4 Tesla-T4 beside the session's nodes, deleted afterwards."""
    from rlsched.core.topology import NodeSpec, Topology
    from rlsched_dev.nodes import create_gpu_nodes, delete_gpu_nodes, wait_nodes_ready

    topo = Topology([NodeSpec(f"types-t4-{i}", 4, gpu_model="Tesla-T4", rack="rack-t4", nvlink_domain_size=4)
                     for i in range(2)])
    names = create_gpu_nodes(kapi.core, topo)
    try:
        wait_nodes_ready(kapi.core, names, timeout=60)
        yield names
    finally:
        delete_gpu_nodes(kapi.core, names)
        wait_until(lambda: not {n.metadata.name for n in kapi.core.list_node().items} & set(names), 60,
                   "the T4 nodes deleted")


def test_a_generation_lands_on_one_type_and_moves_to_the_faster_type_when_it_frees_up(
        extender, t4_nodes, fake_trainer, kapi, ns, tj, run_operator, wait_until):
    from rlsched.core.contract import GROUP, LABEL_GENERATION, PLURAL, VERSION
    from rlsched.sim.measured import load_applications, load_seed_profile

    products = {n.metadata.name: n.metadata.labels.get(PRODUCT) for n in kapi.core.list_node().items}
    (other,) = set(products.values()) - {"Tesla-T4", None}  # the session's nodes: one product
    table = {"Tesla-T4": "aws", other: "dgx-ext"}
    app = load_applications(SIA / "traces", ("cifar10",), gpu_types=("aws", "dgx-ext"))["cifar10"]
    seed = [{"gpuType": s.gpu_type, "localBatchSize": s.atomic_bsz, "stepTimeSeconds": s.step_time}
            for s in load_seed_profile(SIA / "seed" / "cifar10.csv", ("aws", "dgx-ext"))]
    lim = app.bounds

    def generation(want):
        """The job's pods once it runs on ``want`` (every pod bound there), and its status."""
        def ready():
            st, pods = kapi.status(ns, "typed"), kapi.pods(ns, "typed")
            return (st.get("phase") == "Running" and st.get("gpuType") == want and len(pods) == st["targetWorkers"]
                    and all(p.spec.node_name for p in pods)
                    and {str(p.metadata.labels.get(LABEL_GENERATION)) for p in pods}
                    <= {str(st.get("restartGeneration", 0))}) and (st, pods)
        st, pods = wait_until(ready, 60, f"the job running on {want}")
        assert {table[products[p.spec.node_name]] for p in pods} == {want}  # landed on its type
        for p in pods:
            (term,) = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
                .node_selector_terms
            (pin,) = [e for e in term.match_expressions if e.key == PRODUCT]
            assert pin.operator == "In" and {table.get(v, v) for v in pin.values} == {want}
            env = {e.name: e.value for c in p.spec.containers for e in (c.env or [])}
            assert env["RLSCHED_GPU_TYPE"] == want
        return st, pods

    def step_time_row(want, pods):
        """The record once it holds a report of ``want``; that row's step time is the one
        measured on that type, not on the other."""
        rec = wait_until(lambda: want in {r[6] for r in (kapi.status(ns, "typed").get("goodput") or {})
                                          .get("shapes") or [] if len(r) > 6}
                         and kapi.status(ns, "typed")["goodput"], 40, f"a goodput row of {want}")
        per_node = {}
        for p in pods:
            per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
        (row,) = [r for r in rec["shapes"] if r[6] == want and r[0] == len(pods) and r[1] == len(per_node)]
        workers, _, batch, _, step = row[:5]
        share = -(-batch // workers)
        micro = -(-share // app.bounds_on(want).largest_local)
        placement = tuple(sorted(per_node.values(), reverse=True))
        measured = {t: app.update_time(placement, -(-share // micro), micro - 1, t)[0] for t in ("aws", "dgx-ext")}
        assert step == pytest.approx(measured[want], rel=1e-6) and measured["aws"] > measured["dgx-ext"], \
            (step, measured)
        return rec

    with fake_trainer(ns, application=app, epoch_s=0.5) as th:
        with run_operator(ns, allocator="goodput@restart_delay=1", gpu_types=table):
            # another job holds every A100 and can run nowhere else (its workers select
            # the A100 product); β tiny for both: no β stop ends them within the test
            tj(ns, "holder", 4, 4, gpus=8, beta=1e-6, template={"spec": {
                "nodeSelector": {PRODUCT: other}, "containers": [{"name": "train", "image": IMAGE}]}})
            th.start()
            wait_until(lambda: kapi.phase(ns, "holder") == "Running" and len(kapi.pods(ns, "holder")) == 4
                       and all(p.spec.node_name for p in kapi.pods(ns, "holder")), 60, "the holder on the A100s")
            tj(ns, "typed", 1, 2, batchSize=lim.init_batch, maxBatchSize=lim.largest,
               localBatchSize={"max": lim.largest_local}, seedProfile=seed, beta=1e-6)
            # the job lands on the T4s; the holder keeps its GPUs
            st, pods = generation("aws")
            assert len(kapi.pods(ns, "holder")) == 4 and kapi.phase(ns, "holder") == "Running"
            rec = step_time_row("aws", pods)
            assert rec["gpuType"] == "aws" and {r[6] for r in rec["shapes"]} == {"aws"}, rec
            assert kapi.status(ns, "typed")["progress"]["gpuType"] == "aws"
            # the holder goes, the A100s free up: a later decision moves it there, a new generation
            kapi.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "holder")
            moved, pods = generation("dgx-ext")
            assert moved["restartGeneration"] > st.get("restartGeneration", 0), moved
            rec = step_time_row("dgx-ext", pods)
            assert rec["gpuType"] == "dgx-ext" and {r[6] for r in rec["shapes"]} == {"aws", "dgx-ext"}, rec
            # the move's stall, from the decision to the first report of the new generation
            gen = moved["restartGeneration"]
            stall = wait_until(lambda: (kapi.status(ns, "typed").get("restartStall") or {}).get("generation") == gen
                               and kapi.status(ns, "typed")["restartStall"], 30, "the move's stall measured")
            assert kapi.status(ns, "typed")["allocatedGeneration"] == gen and 0.0 <= stall["seconds"] < 120.0, stall
