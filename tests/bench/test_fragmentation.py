"""FGD's fragmentation experiment (bench/fragmentation.py): hand-checked choices, trace
loading, the real trace."""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.core.fgd import Workload

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(name: str):
    """bench/ holds scripts, not an installed package: load ``bench/<name>.py`` by path."""
    spec = importlib.util.spec_from_file_location(f"rlsched_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fragmentation = _bench_module("fragmentation")
POLICIES = fragmentation.POLICIES
Nodes = fragmentation.Nodes
Pods = fragmentation.Pods
SharedCluster = fragmentation.SharedCluster
TraceError = fragmentation.TraceError
arrival_order = fragmentation.arrival_order
choose = fragmentation.choose
experiment = fragmentation.experiment
load_openb = fragmentation.load_openb
run = fragmentation.run
subsample = fragmentation.subsample
value_at = fragmentation.value_at


def data_dir() -> Path | None:
    env = os.environ.get("RLSCHED_DATA_DIR")
    # the Makefile's default: ../shared/data beside the repository
    cand = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return cand if (cand / "alibaba-gpu-2023" / "openb_pod_list_default.csv").is_file() else None


def nodes(gpus, cpu=64_000):
    n = len(gpus)
    return Nodes(np.array([f"n{i}" for i in range(n)]), np.array(gpus), np.full(n, cpu), np.full(n, 10**6),
                 np.array(["T4"] * n))


def pods(rows):
    """rows: (cpu, num_gpu, gpu_milli)"""
    a = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return Pods(a[:, 0], np.zeros(len(a), np.int64), a[:, 1], a[:, 2], (None,) * len(a))


def test_policies_choose_by_hand():
    wl = Workload.from_pairs([(0.5, 0.5), (2, 0.5)])
    ps = pods([(1000, 1, 500), (1000, 1, 500), (1000, 2, 1000)])
    rng = np.random.default_rng(0)
    for policy, expected in [("packing", (0, [0])), ("fgd", (0, [0])), ("bestfit", (0, [0]))]:
        c = SharedCluster(nodes([2, 2]), wl)
        c.assign(ps, 0, 0, [0])  # node 0: GPU 0 half used
        assert choose(policy, c, ps, 1, rng) == expected, policy
        # F(node 0) = 0.5 * 0 + 0.5 * 1500 (one idle GPU cannot host a 2-GPU task)
        assert c.frag[0] == pytest.approx(750.0)
    # the 2-GPU pod fits only on node 1
    c = SharedCluster(nodes([2, 2]), wl)
    c.assign(ps, 0, 0, [0])
    for policy in POLICIES:
        assert choose(policy, c, ps, 2, rng) == (1, [0, 1]), policy


def test_fgd_keeps_whole_nodes_for_multi_gpu_tasks():
    # node 0: 2 GPUs, node 1: 4 GPUs. Workload: 1-GPU and 4-GPU tasks. A 1-GPU pod on
    # node 1 would strand its 3 remaining GPUs for 4-GPU tasks; FGD puts it on node 0,
    # best-fit too (least left), load-balancing-like random may not.
    wl = Workload.from_pairs([(1, 0.5), (4, 0.5)])
    c = SharedCluster(nodes([2, 4]), wl)
    ps = pods([(1000, 1, 1000)])
    assert choose("fgd", c, ps, 0, np.random.default_rng(0)) == (0, [0])


def test_cpu_blocks_placement_and_counts_as_fragmentation():
    wl = Workload.from_requests([1000], [8000])
    c = SharedCluster(nodes([2, 2], cpu=10_000), wl)
    ps = pods([(8000, 1, 1000), (8000, 1, 1000)])
    c.assign(ps, 0, 0, [0])
    assert not c.feasible(ps, 1)[0]  # 2000 CPU left on node 0
    assert c.frag[0] == pytest.approx(1000.0)  # its idle GPU is stranded
    assert c.unallocated == pytest.approx(3 / 4)
    assert c.fragmented == pytest.approx(1 / 4)


def test_arrivals_repeat_until_target():
    demand = np.array([1000, 0, 2000])
    order = arrival_order(3, demand, capacity=4000, max_arrived=2.0, rng=None)
    # cumulative demand 1000 1000 3000 | 4000 4000 6000 | 7000 7000 9000: stop at >= 8000
    assert order.tolist() == [0, 1, 2] * 3
    order = arrival_order(3, demand, capacity=4000, max_arrived=1.0, rng=None)
    assert np.cumsum(demand[order])[-1] >= 4000 and np.cumsum(demand[order])[-2] < 4000


def test_run_records_failures():
    c = run(nodes([1]), pods([(1, 1, 1000)]), "bestfit", rng=np.random.default_rng(0), shuffle=False, max_arrived=3.0)
    assert c.failed == 2 and c.first_failure == pytest.approx(2.0)
    assert c.unallocated.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="unknown"):
        run(nodes([1]), pods([(1, 1, 1000)]), "worstfit", rng=np.random.default_rng(0))


def test_malformed_trace_row_names_file_and_line(tmp_path):
    base = tmp_path / "alibaba-gpu-2023"
    base.mkdir()
    (base / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,T4\n")
    (base / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,1,500,\np1,1000,10,one,500,\n"
    )
    with pytest.raises(TraceError, match=r"openb_pod_list_default.csv:3: num_gpu"):
        load_openb(tmp_path)
    (base / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,1,500,T4|V100\n"
    )
    n, p = load_openb(tmp_path)
    assert len(n) == 1 and p.models == (frozenset({"T4", "V100"}),) and p.demand_milli.tolist() == [500]


@pytest.mark.skipif(data_dir() is None, reason="Alibaba 2023 trace not present (RLSCHED_DATA_DIR)")
def test_fgd_fragments_least_on_the_real_trace():
    all_nodes, all_pods = load_openb(data_dir())
    assert len(all_nodes) == 1213 and int(all_nodes.gpus.sum()) == 6212 and len(all_pods) == 8152
    # a quarter of the nodes (seeded) keeps the test in seconds
    sub = subsample(all_nodes, 0.25, np.random.default_rng(0))
    res = experiment(sub, all_pods, seed=0, repeats=1, max_arrived=1.02)
    frag = {p: value_at(res, p, "fragmented", 0.9) for p in POLICIES}
    unalloc = {p: value_at(res, p, "unallocated", 1.0) for p in POLICIES}
    assert min(frag, key=frag.get) == "fgd", frag
    assert min(unalloc, key=unalloc.get) == "fgd", unalloc
    # before the cluster fills, every packing policy leaves exactly the unarrived share
    assert value_at(res, "bestfit", "unallocated", 0.5) == pytest.approx(0.5, abs=0.01)
