"""Pure parts of rlsched_dev.cluster, .nodes and .kwok: node objects, scheduler and kwok configuration.
No cluster needed."""

from __future__ import annotations

import yaml

from rlsched.core.topology import NodeSpec, Topology, node_labels
from rlsched_dev.cluster import LocalCluster
from rlsched_dev.kwok import kwok_config, kwok_stages
from rlsched_dev.nodes import kwok_node, node_schedulable_ready


def test_kwok_node_carries_topology_and_gpu_resources():
    spec = NodeSpec(name="g-1", gpus=4, gpu_model="H100", rack="r2", block="b1",
                    clique="c7", cpu_milli=32_000, memory_mib=65_536)
    node = kwok_node(spec)
    assert node["metadata"]["name"] == "g-1"
    assert node_labels(spec).items() <= node["metadata"]["labels"].items()
    assert node["metadata"]["labels"]["nvidia.com/gpu.clique"] == "c7"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    for key in ("capacity", "allocatable"):
        res = node["status"][key]
        assert res == {"cpu": "32000m", "memory": "65536Mi", "pods": "110", "nvidia.com/gpu": "4"}
    assert "taints" not in node["spec"]
    tainted = kwok_node(spec, taint=True)
    assert tainted["spec"]["taints"] == [
        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]


def test_kwok_nodes_round_trip_through_topology_from_labels():
    topo = Topology.uniform(4, gpus_per_node=8, racks=2, prefix="n")
    nodes = [kwok_node(s) for s in topo.nodes]
    back = Topology.from_labels(
        (n["metadata"]["name"], n["metadata"]["labels"],
         int(n["status"]["allocatable"]["nvidia.com/gpu"])) for n in nodes)
    assert [(s.name, s.gpus, s.rack, s.block) for s in back.nodes] == \
        [(s.name, s.gpus, s.rack, s.block) for s in topo.nodes]


def test_rlsched_scheduler_config_has_the_extender_and_its_own_lease(tmp_path):
    cluster = LocalCluster(tmp_path, extender_url="http://127.0.0.1:9999", extender_weight=3,
                           extender_timeout_s=2.5)
    conf = cluster.scheduler_config(extender=True)
    assert conf["clientConnection"]["kubeconfig"] == str(tmp_path.resolve() / "kubeconfig")
    assert conf["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in conf["profiles"]] == ["rlsched"]
    assert conf["leaderElection"]["resourceName"] == "rlsched-scheduler"
    (ext,) = conf["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:9999"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["weight"]) == ("filter", "prioritize", 3)
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["httpTimeout"] == "2.5s"
    # kube-scheduler counts GPUs itself (NodeResourcesFit): the extender only narrows
    # and scores, so a tie broken elsewhere or a dead extender can never over-commit
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    unsafe = LocalCluster(tmp_path, extender_url="http://127.0.0.1:9999",
                          gpu_ignored_by_scheduler=True).scheduler_config(extender=True)
    assert unsafe["extenders"][0]["managedResources"][0]["ignoredByScheduler"] is True
    default = cluster.scheduler_config(extender=False)
    assert [p["schedulerName"] for p in default["profiles"]] == ["default-scheduler"]
    assert "extenders" not in default
    assert default["leaderElection"]["resourceName"] == "kube-scheduler"


def test_kwok_config_parses_and_has_our_stages():
    docs = list(yaml.safe_load_all(kwok_config(kwok_stages())))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["options"]["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"
    stages = {d["metadata"]["name"]: d for d in docs[1:]}
    assert all(d["kind"] == "Stage" for d in stages.values())
    assert {s["spec"]["resourceRef"]["kind"] for s in stages.values()} == {"Node", "Pod"}
    done = stages["rlsched-pod-succeeded"]["spec"]
    assert "rlsched.dev/duration-seconds" in done["delay"]["durationFrom"]["jq"]["expression"]
    assert "phase: Succeeded" in done["next"]["statusTemplate"]


def test_kwok_heartbeat_is_the_lease_and_the_controller_manager_waits_for_it(tmp_path):
    from rlsched_dev.cluster import KCM_BURST, KCM_QPS
    from rlsched_dev.kwok import NODE_LEASE_DURATION_S, NODE_MONITOR_GRACE_S

    opts = next(yaml.safe_load_all(kwok_config(kwok_stages())))["options"]
    assert opts["nodeLeaseDurationSeconds"] == NODE_LEASE_DURATION_S > 0
    for key in ("nodeLeaseParallelism", "nodePlayStageParallelism", "podPlayStageParallelism",
                "podsOnNodeSyncParallelism"):
        assert opts[key] >= 4, key
    # the node lifecycle controller tolerates at least a lease's worth of missed renewals
    assert NODE_MONITOR_GRACE_S >= NODE_LEASE_DURATION_S / 4 * 3
    cluster = LocalCluster(tmp_path)
    cluster.tools_bin, cluster.ports = tmp_path, {"controller-manager": 1, "apiserver": 2}
    argv = cluster._kcm_argv(tmp_path / "pki")
    assert f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s" in argv
    assert f"--kube-api-qps={KCM_QPS}" in argv and f"--kube-api-burst={KCM_BURST}" in argv
    assert KCM_QPS > 20  # the default that took minutes to untaint 1,000 nodes
    stages = {d["metadata"]["name"]: d for d in yaml.safe_load_all(kwok_stages())}
    beat = stages["rlsched-node-heartbeat"]["spec"]["delay"]
    # the Ready condition's heartbeat is a kubelet-like status report, minutes apart
    assert beat["durationMilliseconds"] >= 60_000
    assert beat["jitterDurationMilliseconds"] >= beat["durationMilliseconds"]


def test_node_schedulable_ready_needs_ready_and_no_state_taint():
    ready = {"type": "Ready", "status": "True"}
    assert node_schedulable_ready({"status": {"conditions": [ready]}, "spec": {}})
    assert node_schedulable_ready({"status": {"conditions": [ready]},
                                   "spec": {"taints": [{"key": "kwok.x-k8s.io/node"}]}})
    assert not node_schedulable_ready({"status": {"conditions": [ready]},
                                       "spec": {"taints": [{"key": "node.kubernetes.io/not-ready"}]}})
    assert not node_schedulable_ready({"status": {"conditions": [ready]},
                                       "spec": {"taints": [{"key": "node.kubernetes.io/unreachable"}]}})
    assert not node_schedulable_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not node_schedulable_ready({"metadata": {"name": "new"}})


def test_scheduler_tuning_renders_client_limit_and_nodes_to_score(tmp_path):
    import pytest

    from rlsched_dev.cluster import SchedulerTuning

    plain = LocalCluster(tmp_path, extender_url="http://127.0.0.1:9999")
    for extender in (False, True):
        conf = plain.scheduler_config(extender=extender)
        # kube-scheduler's own defaults (50/100, adaptive) unless tuned
        assert set(conf["clientConnection"]) == {"kubeconfig"}
        assert "percentageOfNodesToScore" not in conf
    tuned = LocalCluster(tmp_path, extender_url="http://127.0.0.1:9999",
                         scheduler_tuning=SchedulerTuning(qps=500, burst=1000),
                         rlsched_tuning=SchedulerTuning(300, 600, 20))
    stock, rl = tuned.scheduler_config(extender=False), tuned.scheduler_config(extender=True)
    assert stock["clientConnection"]["qps"] == 500 and stock["clientConnection"]["burst"] == 1000
    assert "percentageOfNodesToScore" not in stock
    assert (rl["clientConnection"]["qps"], rl["clientConnection"]["burst"]) == (300, 600)
    assert rl["percentageOfNodesToScore"] == 20
    assert rl["clientConnection"]["kubeconfig"] == str(tmp_path.resolve() / "kubeconfig")
    assert SchedulerTuning().describe() == {"qps": 50.0, "burst": 100,
                                            "percentageOfNodesToScore": "adaptive"}
    for bad in ({"qps": 0}, {"burst": 0}, {"qps": 100, "burst": 50},
                {"percentage_of_nodes_to_score": 101}, {"percentage_of_nodes_to_score": -1}):
        with pytest.raises(ValueError):
            SchedulerTuning(**bad)
    with pytest.raises(ValueError, match="no scheduler"):
        tuned.stop_scheduler("etcd")


def test_the_supervisor_restarts_a_scheduler_only_once_the_api_server_answers(tmp_path):
    """kube-scheduler exited while the API server is away: no restart (its predecessor's
    lease could not be released) until the API server answers; then one restart, after
    its lease was released. The controller manager needs no lease: restarted at once."""
    import threading

    class Exited:
        pid, popen, argv = 4242, object(), ["kube-scheduler"]

        def exited(self):
            return 1

    lc = LocalCluster(tmp_path, supervise=False)
    (tmp_path / "logs").mkdir()
    lc.started = True
    lc.processes = {"kube-scheduler": Exited(), "kube-controller-manager": Exited()}
    api_up = threading.Event()
    asked = threading.Event()
    restarted: list[tuple[str, bool]] = []

    def answers():
        asked.set()
        return api_up.is_set()

    def respawn(name, old, counted=True):
        restarted.append((name, api_up.is_set()))
        new = type("Up", (), {"pid": 1, "popen": object(), "argv": old.argv, "exited": lambda self: None})()
        lc.processes[name] = new
        return new

    lc._api_answers, lc._respawn = answers, respawn
    lc.restarts = {"kube-scheduler": 1, "kube-controller-manager": 1}
    th = threading.Thread(target=lc._supervise, kwargs={"every": 0.01}, daemon=True)
    th.start()
    try:
        assert asked.wait(30), "the supervisor never asked whether the API server answers"
        for _ in range(3):  # rounds in which the scheduler's restart is due but the API is down
            asked.clear()
            assert asked.wait(30)
        assert restarted == [("kube-controller-manager", False)]
        api_up.set()
        for _ in range(300):
            if len(restarted) == 2:
                break
            threading.Event().wait(0.05)
        assert restarted == [("kube-controller-manager", False), ("kube-scheduler", True)]
    finally:
        lc._supervisor_stop.set()
        th.join(10)
    assert "the API server does not answer" in (tmp_path / "logs" / "supervisor.log").read_text()
