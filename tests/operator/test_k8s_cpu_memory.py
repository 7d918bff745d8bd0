"""Admission counts the CPU and memory a worker asks for (issue 25 item 1), as
kube-scheduler's resource fit will: on the real control plane with the kwok nodes (8
GPUs, 96 cores each), a job whose workers ask for 40 cores runs at most two workers per
node, and a gang whose workers ask for more cores than any node has is reported
unfittable and gets no pods — before, the operator counted GPUs only, started workers
that stayed Pending at kube-scheduler and took them back at the start timeout."""

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"


def _template(cpu: str, memory: str = "1Gi") -> dict:
    return {"spec": {"containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


def _node_cores(kapi) -> set[int]:
    return {int(n.status.allocatable["cpu"].rstrip("m")) // (1000 if n.status.allocatable["cpu"].endswith("m") else 1)
            for n in kapi.core.list_node().items if "nvidia.com/gpu" in (n.status.allocatable or {})}


def _bound(kapi, ns, name) -> list[str]:
    return [p.spec.node_name for p in kapi.pods(ns, name)]


def test_allocator_gives_no_more_workers_than_their_cpu_fits(extender, kapi, ns, tj, run_operator, wait_until):
    assert _node_cores(kapi) == {96}, _node_cores(kapi)  # the default kwok nodes
    with run_operator(ns, allocator="goodput"):
        tj(ns, "wide", 1, 16, template=_template("40"))  # 16 GPUs wanted, 2 workers per node by CPU
        tj(ns, "huge", 1, 1, template=_template("100"))  # more cores than any node has
        wait_until(lambda: kapi.phase(ns, "wide") == "Running", 90, "wide running")
        w = wait_until(lambda: (kapi.status(ns, "huge").get("waiting") or {}).get("reason") == "Unfittable"
                       and kapi.status(ns, "huge")["waiting"], 30, "huge unfittable")
        assert "100000m CPU" in w["message"], w
        assert kapi.phase(ns, "huge") == "Queued" and not kapi.pods(ns, "huge")
        workers = kapi.status(ns, "wide")["workers"]
        nodes = _bound(kapi, ns, "wide")
        assert 2 <= workers <= 8 and len(nodes) == workers and None not in nodes, (workers, nodes)
        assert max(nodes.count(n) for n in set(nodes)) <= 2
        assert not kapi.events(ns, "wide", "GangTimeout")


def test_gang_admission_counts_worker_cpu(extender, kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO):
        tj(ns, "five", 5, 5, template=_template("60"))  # one worker per node by CPU: 4 nodes hold 4
        tj(ns, "four", 4, 4, template=_template("60"))
        wait_until(lambda: kapi.phase(ns, "four") == "Running", 90, "the gang of four running")
        cond = wait_until(lambda: (kapi.condition(ns, "five", "Schedulable") or {}).get("reason") == "Unfittable"
                          and kapi.condition(ns, "five", "Schedulable"), 30, "five unfittable")
        assert "60000m CPU" in cond["message"], cond
        assert kapi.phase(ns, "five") == "Queued" and not kapi.pods(ns, "five")
        nodes = _bound(kapi, ns, "four")
        assert len(set(nodes)) == 4 and None not in nodes, nodes
