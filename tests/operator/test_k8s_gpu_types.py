"""GPU types live: on the real control plane with kwok nodes of two types labelled as
GPU Feature Discovery labels them (the session's A100 nodes and two Tesla-T4 nodes added
here), the served goodput allocator's generation of a job is pinned to one type (its pods
require that type's products and carry RLSCHED_GPU_TYPE), lands there, and the fake
trainer's reports — the step times measured on that type — come back in
``status.goodput`` as rows of that type."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data") / "sia-sosp23" / "traces"

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180),
              pytest.mark.skipif(not SIA.is_dir(), reason=f"measured profiles not found at {SIA} (../shared/data)")]

PRODUCT = "nvidia.com/gpu.product"


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


def test_a_generation_lands_on_one_type_and_its_goodput_rows_carry_it(extender, t4_nodes, fake_trainer, kapi, ns,
                                                                      tj, run_operator, wait_until):
    from rlsched.sim.measured import load_applications

    products = {n.metadata.name: n.metadata.labels.get(PRODUCT) for n in kapi.core.list_node().items}
    (other,) = set(products.values()) - {"Tesla-T4", None}  # the session's nodes: one product
    table = {"Tesla-T4": "aws", other: "dgx-ext"}
    app = load_applications(SIA, ("cifar10",), gpu_types=("aws", "dgx-ext"))["cifar10"]
    lim = app.bounds
    with fake_trainer(ns, application=app, epoch_s=0.5) as th:
        with run_operator(ns, allocator="goodput@restart_delay=1", gpu_types=table):
            tj(ns, "typed", 1, 2, batchSize=lim.init_batch, maxBatchSize=lim.largest,
               localBatchSize={"max": lim.largest_local})
            th.start()
            wait_until(lambda: kapi.phase(ns, "typed") == "Running", 60, "the job running")
            st = kapi.status(ns, "typed")
            gtype = st.get("gpuType")
            assert gtype in ("aws", "dgx-ext"), st
            pods = kapi.pods(ns, "typed")
            assert len(pods) == st["targetWorkers"] and all(p.spec.node_name for p in pods)
            assert {table[products[p.spec.node_name]] for p in pods} == {gtype}  # landed on its type
            for p in pods:
                (term,) = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
                    .node_selector_terms
                (pin,) = [e for e in term.match_expressions if e.key == PRODUCT]
                assert pin.operator == "In" and {table.get(v, v) for v in pin.values} == {gtype}
                env = {e.name: e.value for c in p.spec.containers for e in (c.env or [])}
                assert env["RLSCHED_GPU_TYPE"] == gtype
            rec = wait_until(lambda: (kapi.status(ns, "typed").get("goodput") or {}).get("shapes")
                             and kapi.status(ns, "typed")["goodput"], 40, "the goodput record")
            assert rec["gpuType"] == gtype and {r[6] for r in rec["shapes"]} == {gtype}, rec
            assert kapi.status(ns, "typed")["progress"]["gpuType"] == gtype
            # the step time is the one measured on that type, not on the other
            per_node = {}
            for p in pods:
                per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
            (row,) = [r for r in rec["shapes"] if r[0] == len(pods) and r[1] == len(per_node)]
            workers, _, batch, _, step = row[:5]
            placement = tuple(sorted(per_node.values(), reverse=True))
            share = -(-batch // workers)
            micro = -(-share // app.bounds_on(gtype).largest_local)
            want = {t: app.update_time(placement, -(-share // micro), micro - 1, t)[0] for t in ("aws", "dgx-ext")}
            assert step == pytest.approx(want[gtype], rel=1e-6) and want["aws"] != want["dgx-ext"], (step, want)
