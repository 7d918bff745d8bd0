"""A real distributed PyTorch job under rlsched, end to end (issue 24, must show).

The real operator, extender and kube-scheduler of the local control plane; the worker
pods run as real processes on two nodes played by the test-only node agent
(``rlsched_dev.node_agent``); the script is ``examples/ddp_digits.py``
(torch.distributed over gloo on CPU, ``rlsched.trainer``). The kwok nodes are cordoned
for the test, so the agent's 4 GPUs are the whole cluster.

The job goes 2 -> 3 workers (scale-up), 3 -> 2 -> 1 (scale-down: one worker per cycle,
each step a new generation), is preempted by a ``highest`` job that needs all 4 GPUs,
resumes, and Succeeds when its chief exits 0 after the last epoch, its model saved.
A script that crashes ends Failed after ``backoffLimit`` with its exit code. A worker
whose checkpoint directory cannot be made exits 74, a counted ``CheckpointFailed``
naming the directory; a script that exits non-zero after the agreed SIGTERM shows as
``StopUnclean``, not counted; ``RLSCHED_RESUME`` is 0 until a generation has run.
"""

from __future__ import annotations

import contextlib
import json
import textwrap

import pytest

from rlsched.core.contract import GROUP, LABEL_GENERATION, PLURAL, VERSION

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.timeout(900)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"

AGENT_SELECTOR = {"rlsched.dev/node-agent": "true"}


@contextlib.contextmanager
def agent_cluster(kube_cluster, kapi, tmp_path):
    """The node agent with two 2-GPU nodes; every kwok node cordoned meanwhile."""
    from rlsched_dev.node_agent import NodeAgent

    kwok = list(kube_cluster.node_names)
    for n in kwok:
        kapi.core.patch_node(n, {"spec": {"unschedulable": True}})
    try:
        with NodeAgent(str(kube_cluster.kubeconfig), ["agent-a:2:rack-a", "agent-b:2:rack-a"],
                       log_dir=tmp_path / "agent") as agent:
            yield agent
    finally:
        for n in kwok:
            kapi.core.patch_node(n, {"spec": {"unschedulable": False}})


def digits_template(tmp_path, *extra):
    return {"spec": {
        "nodeSelector": AGENT_SELECTOR,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test", "command": [
            "python", "examples/ddp_digits.py", "--epochs", "8", "--step-delay", "0.05", "--report-interval", "0.5",
            "--log-file", str(tmp_path / "events.jsonl"), *extra]}],
    }}


def events_log(tmp_path):
    path = tmp_path / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_real_ddp_job_rescaled_preempted_resumed_succeeds(kube_cluster, kapi, ns, tj, run_operator, extender,
                                                           wait_until, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()

    def st():
        return kapi.status(ns, "digits")

    def training(workers):
        """The current generation runs with ``workers`` and has reported a step."""
        s = st()
        p = s.get("progress") or {}
        return (p.get("generation") == s.get("restartGeneration", 0) and p.get("workers") == workers
                and (p.get("step") or 0) > 0)

    def scale(n):
        kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "digits", {"spec": {"workers": n}})

    with agent_cluster(kube_cluster, kapi, tmp_path) as agent, \
            run_operator(ns, allocator=FIFO, patience=1000, grace_period_s=30, start_timeout_s=120.0):
        tj(ns, "digits", 1, 3, gpus=1, workers=2, maxEpochs=1000,
           checkpoint={"path": str(ckpt), "volume": {"hostPath": {"path": str(ckpt), "type": "DirectoryOrCreate"}}},
           template=digits_template(tmp_path))
        wait_until(lambda: training(2), 120, "2 workers training (generation 0)", every=0.5)
        g0 = st()["restartGeneration"] if "restartGeneration" in st() else 0
        scale(3)  # scale-up
        wait_until(lambda: training(3), 120, "3 workers training", every=0.5)
        scale(1)  # scale-down, 3 -> 2 -> 1
        wait_until(lambda: training(1), 180, "1 worker training", every=0.5)
        assert st()["restartGeneration"] == g0 + 3
        # a highest-class job that needs every GPU preempts it
        tj(ns, "boss", 4, gpus=1, klass="highest", template={"spec": {
            "nodeSelector": AGENT_SELECTOR,
            "containers": [{"name": "c", "image": "x", "command": ["python", "-c", "import time; time.sleep(2)"]}]}})
        wait_until(lambda: kapi.phase(ns, "boss") == "Succeeded", 180, "the preemptor ran and exited 0", every=0.5)
        assert st()["preemptions"] == 1
        wait_until(lambda: kapi.phase(ns, "digits") == "Succeeded", 300, "the job finished", every=1.0)
        final = st()
        agent_log = agent.log.read_text() if agent.log.exists() else ""

    assert final["reason"] == "ChiefSucceeded", final
    assert final.get("failures", 0) == 0  # every stop was intentional: none counted
    assert (ckpt / "model.pt").is_file()
    assert final["restartGeneration"] == g0 + 4  # + the resume after the preemption
    # what the processes did: world sizes per generation, every SIGTERMed process saved and exited 0
    ev = events_log(tmp_path)
    starts = [e for e in ev if e.get("event") == "start"]
    assert {e["world"] for e in starts} >= {1, 2, 3}, starts
    stops = [e for e in ev if e.get("event") == "stop"]
    # every generation that started and was replaced saved and stopped: 2->3, the
    # scale-downs, the preemption (a generation replaced while its processes were still
    # starting, as 3->2 can be when 2->1 follows at once, never starts)
    started, stopped = {e["gen"] for e in starts}, {e["gen"] for e in stops}
    assert started - {max(started)} == stopped and len(stopped) >= 3, (starts, stops)
    # the loss curve goes on from the checkpoint: each generation starts at the step,
    # and with the model, the one before it stopped at (same test loss, same step)
    assert not starts[0]["resumed"] and all(e["resumed"] for e in starts[1:])
    by_gen = {e["gen"]: e for e in stops}
    for e in starts[1:]:
        before = by_gen[max(g for g in by_gen if g < e["gen"])]
        assert e["step"] == before["step"] and abs(e["eval_loss"] - before["eval_loss"]) < 1e-4, (before, e)
    done = [e for e in ev if e.get("event") == "done"]
    assert len(done) == 1 and done[0]["eval_acc"] > 0.9, done
    assert kapi.events(ns, "digits", "ScaledUp") and kapi.events(ns, "digits", "ScaledDown")
    assert kapi.events(ns, "digits", "Preempted")
    assert "Traceback" not in agent_log


def test_crashing_script_fails_after_backoff_limit_with_its_exit_code(kube_cluster, kapi, ns, tj, run_operator,
                                                                       extender, wait_until, tmp_path):
    with agent_cluster(kube_cluster, kapi, tmp_path), run_operator(ns, allocator=FIFO):
        tj(ns, "broken", 2, gpus=1, backoffLimit=1, template={"spec": {
            "nodeSelector": AGENT_SELECTOR,
            "containers": [{"name": "c", "image": "x", "command": [
                "python", "-c", "import sys, time; time.sleep(1); sys.exit(7)"]}]}})
        wait_until(lambda: kapi.phase(ns, "broken") == "Failed", 120, "Failed after backoffLimit", every=0.5)
        s = kapi.status(ns, "broken")
        cond = kapi.condition(ns, "broken", "Failed")
    assert s["failures"] == 2 and s["lastFailure"]["exitCode"] == 7
    assert cond["reason"] == "BackoffLimitExceeded" and "code 7" in cond["message"]
    assert len(kapi.events(ns, "broken", "WorkerFailed")) == 1
    gens = {p.metadata.labels[LABEL_GENERATION] for p in kapi.pods(ns, "broken", terminating=True)}
    assert gens <= {"1"}  # the first generation's pods were replaced, the second's are kept for their logs


# every generation records what it was told; generation 0 waits for the stop and exits 3
# (as a script whose save failed would), later ones exit 0 once the test says so
STOPPER = textwrap.dedent("""
    import json, os, sys, time
    from rlsched import trainer as rt
    rt.install_stop_handler()
    gen = int(os.environ["RLSCHED_GENERATION"])
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"gen": gen, "rank": int(os.environ["RANK"]),
                             "resume": os.environ.get("RLSCHED_RESUME")}) + "\\n")
    while not rt.stop_requested() and not (gen > 0 and os.path.exists(sys.argv[2])):
        time.sleep(0.1)
    sys.exit(3 if gen == 0 else 0)
""")


def test_unwritable_checkpoint_counts_and_an_unclean_stop_shows(kube_cluster, kapi, ns, tj, run_operator, extender,
                                                                 wait_until, tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    bad_ckpt = tmp_path / "a-file" / "ckpt"
    record, go = tmp_path / "stopper.jsonl", tmp_path / "stopper.go"

    def records():
        return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []

    with agent_cluster(kube_cluster, kapi, tmp_path), run_operator(ns, allocator=FIFO, patience=1000, grace_period_s=30):
        tj(ns, "ckfail", 1, gpus=1, workers=1, backoffLimit=1, checkpoint={"path": str(bad_ckpt)},
           template=digits_template(tmp_path))
        tj(ns, "stopper", 1, 2, gpus=1, workers=1, template={"spec": {
            "nodeSelector": AGENT_SELECTOR, "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "x", "command": ["python", "-c", STOPPER, str(record), str(go)]}]}})
        # the stopper's generation 0 runs (its gang started), then a rescale stops it
        wait_until(lambda: kapi.status(ns, "stopper").get("startedGeneration") == 0 and records(), 120,
                   "the stopper's generation 0 running", every=0.5)
        kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stopper", {"spec": {"workers": 2}})
        wait_until(lambda: kapi.events(ns, "ckfail", "CheckpointFailed"), 120, "the checkpoint failure judged",
                   every=0.5)
        ck = kapi.status(ns, "ckfail")
        ck_events = kapi.events(ns, "ckfail", "CheckpointFailed")
        wait_until(lambda: kapi.events(ns, "stopper", "StopUnclean") and len(records()) == 3, 120,
                   "the unclean stop judged, generation 1 running", every=0.5)
        unclean = kapi.condition(ns, "stopper", "StopUnclean")
        stop_events = kapi.events(ns, "stopper", "StopUnclean")
        go.touch()
        wait_until(lambda: kapi.phase(ns, "stopper") == "Succeeded", 120, "the stopper's generation 1 done",
                   every=0.5)
        st = kapi.status(ns, "stopper")

    # (a) the worker exited 74 at start (CheckpointDirError); one failure counted, named
    assert ck["failures"] == 1 and ck["lastFailure"]["exitCode"] == 74, ck
    assert ck["lastFailure"]["reason"] == "CheckpointFailed"
    msg = ck_events[0].message
    assert f"exited with code 74 (its checkpoint in {bad_ckpt} is unusable" in msg, msg
    log = (tmp_path / "agent" / "pods")
    worker_logs = "".join(p.read_text() for p in log.glob(f"{ns}_ckfail-worker-0_*.log"))
    assert f"CheckpointDirError): checkpoint directory {bad_ckpt} does not exist and cannot be created" \
        in worker_logs, worker_logs[-2000:]
    # (b) exit 3 after the agreed SIGTERM: shown, not counted
    assert len(stop_events) == 1 and "was stopped with SIGTERM and it exited with code 3" in stop_events[0].message
    assert unclean["status"] == "True" and unclean["reason"] == "ExitAfterStop", unclean
    assert st.get("failures", 0) == 0 and st["reason"] == "ChiefSucceeded", st
    # RLSCHED_RESUME: 0 in the first generation that ran, 1 in both workers of the next
    assert sorted((r["gen"], r["rank"], r["resume"]) for r in records()) == [(0, 0, "0"), (1, 0, "1"), (1, 1, "1")]


def test_a_generation_that_never_ran_is_no_missing_checkpoint(kube_cluster, kapi, ns, tj, run_operator, extender,
                                                              wait_until, tmp_path):
    """Generation 0's pods cannot be placed (a node label no node has yet) and time out;
    generation 1 runs the real example on an empty checkpoint directory: told that no
    generation ran (RLSCHED_RESUME=0), it starts from scratch instead of exiting 74."""
    ckpt = tmp_path / "ckpt"
    template = digits_template(tmp_path)
    template["spec"]["nodeSelector"] = {**AGENT_SELECTOR, "rlsched.test/late": "yes"}
    with agent_cluster(kube_cluster, kapi, tmp_path) as agent, run_operator(ns, allocator=FIFO, patience=1000, start_timeout_s=3.0):
        try:
            tj(ns, "late", 1, gpus=1, workers=1, checkpoint={"path": str(ckpt)}, template=template)
            wait_until(lambda: kapi.events(ns, "late", "GangTimeout"), 60, "generation 0 timed out pending",
                       every=0.5)
            kapi.core.patch_node(agent.node_names[0], {"metadata": {"labels": {"rlsched.test/late": "yes"}}})
            wait_until(lambda: [e for e in events_log(tmp_path) if e.get("event") == "start"]
                       or kapi.events(ns, "late", "CheckpointFailed"), 120, "a later generation started", every=0.5)
            st = kapi.status(ns, "late")
        finally:
            kapi.core.patch_node(agent.node_names[0], {"metadata": {"labels": {"rlsched.test/late": None}}})
    starts = [e for e in events_log(tmp_path) if e.get("event") == "start"]
    assert not kapi.events(ns, "late", "CheckpointFailed") and not st.get("failures"), st
    assert len(starts) == 1 and starts[0]["gen"] >= 1 and not starts[0]["resumed"], starts
    assert (ckpt / ".rlsched-job").is_file()  # the first generation that ran left the marker
