"""The extender places the operator's worker pods where the simulator's DAS places the
gangs (found by the twin check, docs/twin.md): pods built by the operator's
``worker_pod`` and scored one by one by ``Extender.prioritize_now`` (each bound where
the extender picks before the next, gangs of one cycle in admission order) land on the
nodes ``DASPlacement.place`` gives the same gangs on the same cluster state."""

from __future__ import annotations

import numpy as np
import orjson

from rlsched.core.cluster import ClusterState, JobView
from rlsched.core.contract import ANNOTATION_GANG_SIZE
from rlsched.core.das import DEFAULT_MODEL, serving_placement
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.wire import decode_args
from rlsched.operator.resources import worker_pod
from rlsched_dev.nodes import default_topology


def _job(name: str) -> dict:
    return {
        "apiVersion": "rlsched.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "twin", "uid": f"uid-{name}"},
        "spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}},
    }


def _bound(pod: dict, node: str) -> dict:
    pod = {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"},
           "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
    return pod


def test_gangs_of_one_cycle_are_placed_as_the_simulator_places_them():
    """The 7-job twin run at t≈467: tw-00 has finished; tw-02 (resume, 2 × 2 GPUs),
    tw-04 (3 × 2) and tw-05 (2 × 2) are admitted in one cycle. With the model served
    then, the simulator put tw-04 on gpu-2, gpu-0, gpu-1 (its first worker packed the 2
    GPUs left on gpu-2; with the issue-16 model, on gpu-0, still not where a 1-worker job
    would go); live, the
    operator's pods carried no gang size, the extender scored tw-04's first worker as
    a 1-worker job and put it on gpu-0, so tw-05 got other nodes and its scale-ups
    found room one epoch earlier."""
    topo = default_topology()
    names = [n.name for n in topo.nodes]
    running = [("tw-03", 2, [1, 1, 2]), ("tw-01", 2, [2, 2]), ("tw-06", 4, [3, 3])]
    admitted = [("tw-02", 2, 2), ("tw-04", 3, 2), ("tw-05", 2, 2)]

    # the engine's side: DAS on the cluster state, each gang allocated before the next
    das = serving_placement("das", DEFAULT_MODEL)
    st = ClusterState(topo)
    for _, g, nodes in running:
        for i in nodes:
            st.allocate(i, g)
    want = {}
    for job, workers, g in admitted:
        view = JobView(id=job, submit_time=0.0, gpus_per_worker=g, workers=workers, min_workers=workers,
                       max_workers=workers + 1)
        nodes = das.place(view, st)
        assert nodes is not None
        for i in nodes:
            st.allocate(i, g)
        want[job] = [names[i] for i in nodes]
    # the case the twin check met: without its gang size, tw-04's first worker would go
    # elsewhere (computed with the served model, so the scenario keeps discriminating
    # when the committed weights change)
    blind = ClusterState(topo)
    for _, g, nodes in running:
        for i in nodes:
            blind.allocate(i, g)
    for i in [names.index(n) for n in want["tw-02"]]:
        blind.allocate(i, 2)
    one = das.place(JobView(id="tw-04", submit_time=0.0, gpus_per_worker=2, workers=1, min_workers=1,
                            max_workers=2), blind)
    assert one is not None and names[one[0]] != want["tw-04"][0]

    # the live side: the operator's pods, scored one by one by the extender
    ext = build_extender("das", DEFAULT_MODEL)
    ext.cache.replace_nodes(node_list(topo)["items"])
    ext.cache.replace_pods([_bound(worker_pod(_job(job), k, g, gang_size=len(nodes)), names[i])
                            for job, g, nodes in running for k, i in enumerate(nodes)])
    got, sizes = {}, []
    for job, workers, g in admitted:
        got[job] = []
        for k in range(workers):
            pod = worker_pod(_job(job), k, g, scheduler_name="rlsched", gang_size=workers)
            sizes.append(pod["metadata"]["annotations"].get(ANNOTATION_GANG_SIZE))
            free = ext.cache.state().free
            cand = [n for n in names if free[names.index(n)] >= g]
            pod["metadata"]["uid"] = f"uid-{job}-{k}"
            scores = ext.prioritize_now(decode_args(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": cand})))
            node = cand[int(np.argmax(scores))]  # kube-scheduler binds the policy's sole top
            got[job].append(node)
            ext.cache.upsert_pod(_bound(pod, node))
    assert got == want
    assert sizes == ["2", "2", "3", "3", "3", "2", "2"]


def test_an_added_worker_is_placed_as_the_extender_places_its_pod():
    """A scale-up worker: the operator's pod says ``rlsched.dev/gang-size`` = the new
    count, so the extender scores it as the last worker of a job of ``n + 1``; the
    engine placed it as one more worker of a job of ``n`` (``JobView.workers`` still the
    old count), which counts the gang's GPUs one worker short in DAS's room and learned
    terms and picks another node on such a state (job j: 2 × 4 GPUs on gpu-2 and gpu-0;
    free 2, 8, 0, 6)."""
    from hand_policies import Pinned
    from rlsched.core import make_ordering
    from rlsched.sim import Simulator
    from rlsched.sim.engine_jobs import grown
    from rlsched.sim.job import JobSpec

    topo = default_topology()
    names = [n.name for n in topo.nodes]
    fixed = dict(submit_time=0.0, duration=1000.0)
    specs = [JobSpec("f0", gpus_per_worker=2, **fixed), JobSpec("f2", gpus_per_worker=4, **fixed),
             JobSpec("f3", gpus_per_worker=2, **fixed),
             JobSpec("j", workers=2, gpus_per_worker=4, min_workers=2, max_workers=3, **fixed)]
    where = {"f0": [0], "f2": [2], "f3": [3], "j": [2, 0]}

    sim = Simulator(specs, topo, ordering=make_ordering("fifo"), placement=Pinned(where))  # where the test wants
    sim.advance_until(0.0)
    sim.placement = serving_placement("das", DEFAULT_MODEL)  # then DAS places added workers
    assert sim.state.free.tolist() == [2, 8, 0, 6]
    (engine,) = sim.placement.place(grown(sim.job("j"), 1), sim.state, workers=1)  # where the engine grows it

    ext = build_extender("das", DEFAULT_MODEL)
    ext.cache.replace_nodes(node_list(topo)["items"])
    ext.cache.replace_pods(
        [_bound(worker_pod(_job(s.id), k, s.gpus_per_worker, gang_size=len(where[s.id])), names[i])
         for s in specs for k, i in enumerate(where[s.id])])
    pod = worker_pod(_job("j"), 2, 4, scheduler_name="rlsched", gang_size=3)  # reconcile_pods(target=3)
    pod["metadata"]["uid"] = "uid-j-2"
    free = ext.cache.state().free
    cand = [n for n in names if free[names.index(n)] >= 4]
    scores = ext.prioritize_now(decode_args(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": cand})))
    assert cand[int(np.argmax(scores))] == names[engine]
