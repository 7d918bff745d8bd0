"""Unit tests of the live demo's pure parts (no cluster, no processes)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from rlsched_dev import demo
from rlsched.sim import JobSpec


def _specs(n: int = 40) -> list[JobSpec]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        w = int(rng.integers(1, 5))
        out.append(JobSpec(id=f"job/{i}_X", submit_time=float(100 + 37 * i), workers=w, gpus_per_worker=int(rng.choice([1, 2, 4])),
                           min_workers=w, max_workers=w, samples_per_epoch=int(rng.integers(1000, 60000)),
                           max_epochs=80, beta=0.001))
    # never fits: wider than a node, and a gang larger than half the cluster
    out.append(JobSpec(id="too-wide", submit_time=5.0, workers=1, gpus_per_worker=16))
    out.append(JobSpec(id="too-big", submit_time=6.0, workers=40, gpus_per_worker=1))
    return out


def test_plan_jobs_valid_manifests_in_window():
    plan = demo.plan_jobs(_specs(), 12, np.random.default_rng(1), node_gpus=8, cluster_gpus=64, window_s=60.0)
    assert len(plan) == 12
    times = [j.at_s for j in plan]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] == pytest.approx(60.0)
    names = [j.name for j in plan]
    assert len(set(names)) == len(names)
    for j in plan:
        m = j.manifest
        assert m["kind"] == "TrainingJob" and m["apiVersion"] == "rlsched.dev/v1alpha1"
        assert m["metadata"]["name"] == j.name
        assert all(c.isalnum() or c == "-" for c in j.name) and j.name == j.name.lower() and len(j.name) <= 63
        s = m["spec"]
        assert 1 <= s["minWorkers"] <= s["maxWorkers"]
        assert s["gpusPerWorker"] <= 8
        assert s["minWorkers"] * s["gpusPerWorker"] <= 32
        assert s["maxWorkers"] * s["gpusPerWorker"] <= 32 or s["maxWorkers"] == s["minWorkers"]
        assert 0 < s["beta"] < 1 and 1 <= s["maxEpochs"] <= 40
        assert s["priority"]["class"] in ("normal", "urgent", "highest")
        assert s["template"]["spec"]["containers"]
        assert j.manifest["metadata"]["annotations"]["rlsched.dev/trace-job"] not in ("too-wide", "too-big")


def test_plan_jobs_is_seeded_and_elastic():
    a = demo.plan_jobs(_specs(), 20, np.random.default_rng(3), node_gpus=8, cluster_gpus=64, window_s=30.0)
    b = demo.plan_jobs(_specs(), 20, np.random.default_rng(3), node_gpus=8, cluster_gpus=64, window_s=30.0)
    c = demo.plan_jobs(_specs(), 20, np.random.default_rng(4), node_gpus=8, cluster_gpus=64, window_s=30.0)
    assert [j.manifest for j in a] == [j.manifest for j in b]
    assert [j.name for j in a] != [j.name for j in c] or [j.manifest for j in a] != [j.manifest for j in c]
    # elastic room for RLPTO: some job may grow beyond its gang
    assert any(j.manifest["spec"]["maxWorkers"] > j.manifest["spec"]["minWorkers"] for j in a)


def test_plan_jobs_mixes_queues():
    plan = demo.plan_jobs(_specs(), 40, np.random.default_rng(0), node_gpus=8, cluster_gpus=64, window_s=10.0,
                          p_urgent=0.4, p_highest=0.1)
    classes = {j.manifest["spec"]["priority"]["class"] for j in plan}
    assert classes == {"normal", "urgent", "highest"}


def test_plan_jobs_rejects_trace_that_cannot_fit():
    with pytest.raises(ValueError, match="no job of the trace fits"):
        demo.plan_jobs([JobSpec(id="x", submit_time=0.0, gpus_per_worker=16)], 3, np.random.default_rng(0),
                       node_gpus=8, cluster_gpus=64, window_s=10.0)
    with pytest.raises(ValueError):
        demo.plan_jobs(_specs(), 0, np.random.default_rng(0), node_gpus=8, cluster_gpus=64, window_s=10.0)


def test_prometheus_config_shape():
    cfg = demo.prometheus_config({"rlsched-operator": "127.0.0.1:9100", "rlsched-extender": "127.0.0.1:9200"},
                                 scrape_interval_s=2, rule_files=["rules.yaml"])
    text = yaml.safe_dump(cfg)
    back = yaml.safe_load(text)
    assert back["global"]["scrape_interval"] == "2s"
    assert back["rule_files"] == ["rules.yaml"]
    jobs = {c["job_name"]: c["static_configs"][0]["targets"] for c in back["scrape_configs"]}
    assert jobs == {"rlsched-extender": ["127.0.0.1:9200"], "rlsched-operator": ["127.0.0.1:9100"]}
    with pytest.raises(ValueError):
        demo.prometheus_config({"x": "no-port"})
    with pytest.raises(ValueError):
        demo.prometheus_config({})


def _pod(node, gpus, phase="Running", deleting=False):
    md = {"name": "p"}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "spec": {"nodeName": node, "containers": [
        {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}, {"resources": {}}]}, "status": {"phase": phase}}


def test_gpu_usage_counts_bound_live_pods_only():
    pods = [_pod("n1", 2), _pod("n2", 4), _pod(None, 8, "Pending"), _pod("n1", 1, "Succeeded"), _pod("n3", 2, deleting=True)]
    assert demo.gpu_usage(pods) == (6, 2)


def _job(name, phase, jct=None, wait=None, acc=None, cls="normal", queue="normal", workers=0):
    st = {"phase": phase, "queue": queue, "workers": workers}
    if jct is not None:
        st["jctSeconds"] = jct
    if wait is not None:
        st["admissionWaitSeconds"] = wait
    if acc is not None:
        st["progress"] = {"epoch": 10, "accuracy": acc, "history": [0.1, acc]}
    return {"metadata": {"name": name}, "spec": {"minWorkers": 1, "maxWorkers": 2, "gpusPerWorker": 1,
                                                  "priority": {"class": cls}}, "status": st}


def test_summarize_hand_computed():
    jobs = [_job("a", "Succeeded", 10.0, 1.0, 0.8), _job("b", "Succeeded", 30.0, 3.0, 0.9),
            _job("c", "Running", None, 2.0, 0.5, workers=2), _job("d", "Queued")]
    s = demo.summarize(jobs, planned=5)
    assert s["planned"] == 5 and s["submitted"] == 4 and s["succeeded"] == 2
    assert s["jct_mean_s"] == pytest.approx(20.0) and s["jct_p50_s"] == pytest.approx(20.0)
    assert s["jct_p95_s"] == pytest.approx(29.0)
    assert s["wait_mean_s"] == pytest.approx(2.0)
    assert s["accuracy_mean"] == pytest.approx(0.85)
    assert s["phases"] == {"Succeeded": 2, "Running": 1, "Queued": 1}
    empty = demo.summarize([])
    assert empty["jct_mean_s"] is None and empty["succeeded"] == 0


def test_render_view_and_plots(tmp_path):
    from rich.console import Console

    jobs = [_job("a", "Succeeded", 10.0, 1.0, 0.8), _job("q1", "Queued", queue="urgent"), _job("r", "Running", workers=2)]
    sample = demo.Sample(t=5.0, gpus_used=2, gpus_total=64, workers=2, running=1, queued=1, done=1)
    console = Console(record=True, width=160)
    console.print(demo.render_view(jobs, sample, {"extender_requests": 12.0, "extender_p99_ms": 1.5},
                                   elapsed_s=5, duration_s=180))
    text = console.export_text()
    assert "urgent=1" in text and "2/64 GPUs" in text and "q1" in text and "12 req" in text
    summary = demo.summarize(jobs)
    paths = demo.write_plots(summary, [sample, demo.Sample(6.0, 4, 64, 4, 2, 0, 1)], jobs, tmp_path)
    assert [p.name for p in paths] == ["jct.png", "utilization.png", "accuracy.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_default_trace(tmp_path):
    assert demo.default_trace(None) == "synthetic:small"
    assert demo.default_trace(str(tmp_path)) == "synthetic:small"
    (tmp_path / "alibaba-gpu-2023").mkdir()
    assert demo.default_trace(str(tmp_path)) == "alibaba2023:default"


def test_options_validation():
    with pytest.raises(ValueError):
        demo.DemoOptions(duration_s=0)
    with pytest.raises(ValueError):
        demo.DemoOptions(submit_fraction=1.5)


def test_down_without_a_demo_is_harmless(tmp_path):
    assert demo.down(tmp_path / "nothing") == 0


def test_cli_registers_demo():
    from rlsched.cli import build_parser

    args = build_parser("demo").parse_args(["demo", "up", "--duration", "30", "--jobs", "5"])
    assert args.func is demo._up and args.duration == 30 and args.jobs == 5
    args = build_parser("demo").parse_args(["demo", "down"])
    assert args.func is demo._down


# ------------------------------------------------------------------ issue 13 item 5
def test_plan_jobs_one_small_preemptor_submitted_when_the_cluster_is_full():
    specs = _specs()
    plan = demo.plan_jobs(specs, 20, np.random.default_rng(3), node_gpus=8, cluster_gpus=64, window_s=30.0)
    pre = [j for j in plan if j.when_full]
    assert len(pre) == 1
    assert [j.manifest["spec"]["priority"]["class"] for j in plan].count("highest") == 1  # p_highest defaults to 0
    s = pre[0].manifest["spec"]
    assert s["priority"]["class"] == "highest" and 2 <= pre[0].gang_gpus == s["minWorkers"] * s["gpusPerWorker"] <= 4
    # the first job from 30 % of the submission order on whose gang is at most half a node
    first = round(0.3 * 19)
    k = plan.index(pre[0])
    assert k >= first and all(plan[i].gang_gpus > 4 for i in range(first, k))
    # a one-GPU trace job chosen as the preemptor gets a gang of preemptor_gpus
    one = [JobSpec(id=f"j{i}", submit_time=float(i), workers=1, gpus_per_worker=1, min_workers=1, max_workers=1,
                   max_epochs=30, beta=0.001) for i in range(10)]
    p1 = [j for j in demo.plan_jobs(one, 10, np.random.default_rng(0), node_gpus=8, cluster_gpus=32, window_s=9.0,
                                    preemptor_gpus=3) if j.when_full]
    assert [(j.manifest["spec"]["minWorkers"], j.manifest["spec"]["maxWorkers"]) for j in p1] == [(3, 6)]
    assert not any(j.when_full for j in demo.plan_jobs(specs, 20, np.random.default_rng(3), node_gpus=8,
                                                       cluster_gpus=64, window_s=30.0, preemptor_at=None))
    with pytest.raises(ValueError):
        demo.plan_jobs(specs, 20, np.random.default_rng(3), node_gpus=8, cluster_gpus=64, window_s=30.0, preemptor_at=2.0)


def test_cluster_free_counts_pending_pods_and_releases():
    assert demo.cluster_free([_pod("n1", 4), _pod("n2", 4)], 8) == 0
    assert demo.cluster_free([_pod("n1", 4), _pod("n2", 3)], 8) == 1
    # a pending pod (admitted, not yet bound) will take its GPUs
    assert demo.cluster_free([_pod("n1", 4), _pod(None, 4, "Pending")], 8) == 0
    # finished pods hold nothing; a pod being deleted is about to free its GPUs
    assert demo.cluster_free([_pod("n1", 4), _pod("n2", 4, "Succeeded")], 8) == 4
    assert demo.cluster_free([_pod("n1", 4), _pod("n2", 3), _pod("n2", 1, deleting=True)], 8) == 1


def test_view_shows_scaling_preemption_resume_and_convergence():
    from rich.console import Console

    conv = _job("conv", "Running", workers=1)
    conv["spec"]["beta"] = 0.001
    conv["status"]["rlpto"] = {"gain": 0.0004}
    victim = _job("victim", "Queued", queue="interrupt")
    victim["status"]["preemptions"] = 1
    head = {"scaling_up": 7.0, "scaling_down": 3.0, "preemptions": 1.0, "resumes": 0.0, "converged": 2.0,
            "max_epochs": 1.0}
    console = Console(record=True, width=200)
    console.print(demo.render_view([conv, victim], None, head, elapsed_s=5, duration_s=180))
    text = console.export_text()
    assert "+7/-3" in text and "preempted 1" in text and "resumed 0" in text
    assert "converged 2" in text and "max epochs 1" in text and "interrupt=1" in text and "0.0004" in text
    assert set(demo.HEADLINE_QUERIES) >= {"scaling_up", "scaling_down", "preemptions", "resumes", "converged",
                                          "max_epochs"}
    assert "rlsched_operator_resumes_total" in demo.HEADLINE_QUERIES["resumes"]


def test_plan_jobs_leaves_out_whole_node_workers_by_default():
    specs = _specs() + [JobSpec(id=f"node-{i}", submit_time=50.0 + i, workers=1, gpus_per_worker=8,
                                min_workers=1, max_workers=1, max_epochs=30, beta=0.001) for i in range(20)]
    rng = lambda: np.random.default_rng(5)  # noqa: E731
    plan = demo.plan_jobs(specs, 60, rng(), node_gpus=8, cluster_gpus=64, window_s=30.0)
    assert max(j.manifest["spec"]["gpusPerWorker"] for j in plan) == 4
    wide = demo.plan_jobs(specs, 60, rng(), node_gpus=8, cluster_gpus=64, window_s=30.0, max_worker_gpus=8)
    assert max(j.manifest["spec"]["gpusPerWorker"] for j in wide) == 8


def test_the_demo_runs_the_served_allocator_on_its_own_clock():
    from rlsched.core.served import SERVED
    from rlsched_dev.demo import DemoOptions

    assert DemoOptions().allocator == SERVED.allocator == "goodput-rlpto@adaptive=0.8,room_rounds=30"
    assert DemoOptions(epoch_s=0.5).live_allocator() == f"{SERVED.allocator},restart_delay=0.5"
    assert DemoOptions(allocator="goodput-rlpto", epoch_s=0.5).live_allocator() == "goodput-rlpto@restart_delay=0.5"
    assert DemoOptions(allocator="fifo/das/rlpto+nobackfill").live_allocator() == "fifo/das/rlpto+nobackfill"
    import argparse

    p = argparse.ArgumentParser()
    demo.register(p.add_subparsers(dest="cmd"))
    assert p.parse_args(["demo", "up", "--allocator", "fifo/das"]).allocator == "fifo/das"
    with pytest.raises(SystemExit):  # no second mode: a usage error naming the choices
        p.parse_args(["demo", "up", "--allocator", "none"])
    assert DemoOptions(allocator="goodput@p=0").live_allocator() == "goodput@p=0,restart_delay=1"  # options kept
    assert DemoOptions(allocator="goodput@restart_delay=4").live_allocator() == "goodput@restart_delay=4"


def test_the_summary_names_the_operators_allocator(tmp_path):
    """The printed summary says which policy the operator ran (the served one by default)."""
    from types import SimpleNamespace

    from rich.console import Console

    from rlsched.core.served import SERVED

    opts = demo.DemoOptions(out=tmp_path, epoch_s=0.5)
    s = {"succeeded": 1, "planned": 1, "trace": "t", "seed": 1, "jct_mean_s": 1.0, "jct_p50_s": 1.0, "jct_p95_s": 1.0,
         "wait_mean_s": 0.0, "accuracy_mean": 0.9, "gpu_allocation_mean": 0.5, "phases": {"Succeeded": 1},
         "prometheus": {}, "allocator": opts.live_allocator()}
    fake = SimpleNamespace(console=Console(record=True, width=200), opts=opts)
    demo.Demo._print_summary(fake, s)
    text = fake.console.export_text()
    assert f"{SERVED.allocator},restart_delay=0.5" in text and "operator's --allocator" in text


def test_the_demo_team_queue_allows_its_preemptor():
    from rlsched.core.queues import QueueSpec

    q = QueueSpec.from_manifest(demo.team_queue("rlsched-demo", 32))
    assert q.nominal_gpus == 32 and all(q.allows(c) for c in ("highest", "urgent", "normal"))


def test_the_demo_preemptor_runs_preempts_and_its_victims_resume_under_the_served_allocator():
    """The demo's plan (its trace, seed, cluster and team queue) replayed against the
    allocator the demo's operator serves: each job arrives at its time and every arrival
    is a decision; no job completes until the preemptor has started (the busiest the
    cluster can be). The preemptor is submitted when the demo would
    (:func:`demo.preemptor_due`, else at its deadline) and sized as the demo sizes it
    (:func:`demo.sized_preemptor`), starts at the very next decision by stopping running
    jobs, and once it ends (and then the running jobs, first submitted first) its
    victims start again (resume) before any job submitted after them."""
    import os
    from collections import Counter

    from rlsched.core.cluster import JobView
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.queues import QueueBook, QueueSpec
    from rlsched_dev.nodes import default_topology

    opts = demo.DemoOptions(data_dir=os.environ.get("RLSCHED_DATA_DIR"))
    topo = default_topology()
    total = topo.total_gpus
    specs = demo._load_specs(demo.default_trace(opts.data_dir), opts.data_dir, opts.seed)
    plan = demo.plan_jobs(specs, opts.jobs, np.random.default_rng(opts.seed), node_gpus=max(n.gpus for n in topo.nodes),
                          cluster_gpus=total, window_s=opts.duration_s * opts.submit_fraction, namespace=opts.namespace)
    pre = next(j for j in plan if j.when_full)
    alloc = LiveAllocation.named(opts.live_allocator())
    book = QueueBook([QueueSpec.from_manifest(demo.team_queue(opts.namespace, total))])
    capacity = {i: n.gpus for i, n in enumerate(topo.nodes)}
    submitted: dict[str, tuple[demo.DemoJob, float]] = {}
    nodes: dict[str, tuple[int, ...]] = {}
    since: dict[str, float] = {}
    restarts: Counter[str] = Counter()

    def decide(now: float):
        live = []
        for name, (j, at) in submitted.items():
            s = j.manifest["spec"]
            live.append(JobView(id=name, submit_time=at, min_workers=s["minWorkers"], max_workers=s["maxWorkers"],
                                gpus_per_worker=s["gpusPerWorker"], placement=list(nodes.get(name, ())),
                                priority_class=s["priority"]["class"], team=opts.namespace,
                                restarts=restarts[name], start_time=since.get(name)))
        p = alloc.plan(live, capacity, now, queues=book)
        assert p.error is None, p.error
        for name, t in {**p.start, **p.resize}.items():
            g = submitted[name][0].manifest["spec"]["gpusPerWorker"]
            nodes[name] = p.allocations[name].nodes[::g][:t.workers]
            since.setdefault(name, now)
            restarts[name] += name in p.resize
        for name in p.stop:
            nodes.pop(name), since.pop(name)
            restarts[name] += 1
        return p

    def as_object(name: str) -> dict:
        j = submitted[name][0]
        return {**j.manifest, "status": {"phase": "Running" if nodes.get(name) else "Queued"}}

    deadline = min(pre.at_s + opts.full_wait_s, opts.duration_s / 2, max(pre.at_s, opts.duration_s * opts.submit_fraction))
    started = None
    for job in [j for j in plan if j is not pre] + [None]:
        now = deadline if job is None else job.at_s
        if pre.name not in submitted and now >= pre.at_s:
            used = sum(len(n) * submitted[k][0].manifest["spec"]["gpusPerWorker"] for k, n in nodes.items())
            if job is None or demo.preemptor_due([as_object(k) for k in submitted], total - used, pre.gang_gpus,
                                                 total, shrinks_first=True):
                pre = demo.sized_preemptor(pre, [as_object(k) for k in submitted], total)
                submitted[pre.name] = (pre, now)
                p = decide(now)
                assert pre.name in p.start, f"the preemptor waits: {p.waiting.get(pre.name)}"
                started = (now, list(p.stop))
        if job is not None:
            submitted[job.name] = (job, job.at_s)
            decide(job.at_s)
    assert started is not None, "the preemptor was never submitted"
    now, victims = started
    assert victims, "the preemptor started without stopping a job: the demo shows no preemption"
    del submitted[pre.name], nodes[pre.name]  # the preemptor ends: its GPUs go back
    # then the running jobs end one by one, the first submitted first: each victim
    # resumes before any job submitted after it starts
    started_after: list[str] = []
    for _ in range(len(plan)):
        now += 60.0
        started_after += list(decide(now).start)
        if all(v in started_after for v in victims):
            break
        first = min((k for k in nodes if k not in victims), key=lambda k: submitted[k][1])
        del submitted[first], nodes[first]
    for v in victims:
        assert v in started_after, f"victim {v} never resumed"
        later = [k for k in started_after[:started_after.index(v)] if submitted[k][1] > submitted[v][1]]
        assert not later, f"{later} started before victim {v} resumed"


def test_the_summary_names_every_waiting_job_with_its_reason(tmp_path):
    from types import SimpleNamespace

    from rich.console import Console

    q = _job("q", "Queued", cls="highest")
    q["status"]["waiting"] = {"position": 0, "reason": "PriorityNotAllowed", "message": "queue 'x' allows normal"}
    s = demo.summarize([_job("a", "Succeeded", 10.0, 1.0, 0.8), q, _job("r", "Running", workers=1)])
    assert s["unfinished"] == [
        {"name": "q", "class": "highest", "phase": "Queued", "reason": "PriorityNotAllowed",
         "message": "queue 'x' allows normal"},
        {"name": "r", "class": "normal", "phase": "Running", "reason": "", "message": ""}]
    s.update({"trace": "t", "seed": 1, "gpu_allocation_mean": None, "prometheus": {}, "allocator": "fifo/das"})
    fake = SimpleNamespace(console=Console(record=True, width=200), opts=demo.DemoOptions(out=tmp_path))
    demo.Demo._print_summary(fake, s)
    assert "not finished: q (highest) Queued, waiting PriorityNotAllowed: queue 'x' allows normal" in \
        fake.console.export_text()
