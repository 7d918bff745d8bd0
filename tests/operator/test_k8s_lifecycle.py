"""The job lifecycle against the real control plane, with crashes injected between its
steps (issue 24, item 2): completion by the chief's exit, failure after backoffLimit,
generation restarts on rescale and preemption.

The workers are kwok pods: ``rlsched.dev/duration-seconds`` makes them exit that many
seconds after they start, 0 or the code in ``rlsched.dev/exit-code`` (the Stages in
``dev/kwok-stages.yaml``). The operator is a Controller the test steps one cycle at a
time; "a crash" is an exception that no handler catches (:class:`Crash`), raised

* *after a step's record*: at the first pod the step would stop (or its event), after
  its status write landed — the operator died between recording a decision and
  acting on it;
* *at a step's record*: the status write itself never reaches the API server — a
  lost write.

A fresh Controller (no memory of the one that died, as a restarted operator) then
carries on. The default dev topology is 4 kwok nodes x 8 GPUs = 32 GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rlsched.core.contract import ANNOTATION_DURATION, ANNOTATION_EXIT_CODE, LABEL_GENERATION

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

IMAGE = "registry.example/rlsched/trainer:test"

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"


class Crash(BaseException):
    """The operator process dies here (no ``except Exception`` catches it)."""


@contextlib.contextmanager
def operator_process(kube_cluster, ns, **kw):
    """One operator 'process': a Controller whose cycles the test runs; yields
    ``(ctl, step)``. Its event loop and API client die with it."""
    from rlsched.operator.controller import Controller, OperatorConfig
    from rlsched.operator.handlers import make_api_client
    from rlsched.operator.metrics import OperatorMetrics
    from prometheus_client import CollectorRegistry

    cfg = OperatorConfig(kubeconfig=str(kube_cluster.kubeconfig), namespace=ns, cycle_s=3600.0,
                         start_timeout_s=60.0, grace_period_s=1, metrics_port=None, forecast_interval_s=0,
                         patience=1000, **{"allocator": FIFO, **kw})
    loop = asyncio.new_event_loop()
    api = loop.run_until_complete(make_api_client(cfg.kubeconfig))
    try:
        ctl = Controller(cfg, api, OperatorMetrics(CollectorRegistry()))
        yield ctl, lambda: loop.run_until_complete(ctl.cycle())
    finally:
        loop.run_until_complete(api.close())
        loop.close()


def crash_after_record(ctl):
    """The next pod deletion or event kills the operator: the step's status write landed,
    nothing after it happened."""
    async def die(*a, **k):
        raise Crash("operator killed after recording the step, before acting on it")
    ctl.workers.delete_pod = ctl.status.event = die


def crash_at_record(ctl, key, value=None):
    """The status write carrying ``key`` (equal to ``value`` when given) is lost and the
    operator dies with it."""
    real = ctl.status.patch

    async def patch_status(job, patch, **k):
        if key in patch and (value is None or patch[key] == value):
            raise Crash(f"operator killed while writing {key}")
        return await real(job, patch, **k)
    ctl.status.patch = patch_status


def enqueue(kapi, ns, tj, name, wait_until, **kw):
    tj(ns, name, **kw)
    # the create handler enqueues (phase Queued); here the test does what it does
    from rlsched.core.contract import GROUP, PLURAL, VERSION
    kapi.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                      {"status": {"phase": "Queued", "queue": "normal"}})
    wait_until(lambda: kapi.phase(ns, name) == "Queued", 10, f"{name} queued")


def template(duration=None, code=None, **spec):
    ann = {}
    if duration is not None:
        ann[ANNOTATION_DURATION] = str(duration)
    if code is not None:
        ann[ANNOTATION_EXIT_CODE] = str(code)
    return {"metadata": {"annotations": ann}, "spec": {"containers": [{"name": "train", "image": IMAGE}], **spec}}


def job_pods(kapi, ns, job, terminating=True):
    return kapi.pods(ns, job, terminating=terminating)


def step_until(step, cond, what, kapi, ns, job, max_pods, n=60, wait=0.5):
    """Run cycles until ``cond()``; after every cycle the job never holds more than
    ``max_pods`` pods (terminating ones included) nor live pods of two generations."""
    import time

    for _ in range(n):
        step()
        pods = job_pods(kapi, ns, job)
        assert len(pods) <= max_pods, [p.metadata.name for p in pods]
        live = [p for p in pods if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")]
        assert len({p.metadata.labels[LABEL_GENERATION] for p in live}) <= 1, [p.metadata.labels for p in live]
        if cond():
            return
        time.sleep(wait)
    raise AssertionError(f"not reached after {n} cycles: {what}; status {kapi.status(ns, job)}")


@pytest.mark.parametrize("crash", ["after-record", "at-record"])
def test_chief_exit_completes_once_across_a_crash(kube_cluster, kapi, ns, tj, wait_until, crash):
    """Both workers exit 0 after 3 s: the job Succeeds (reason ChiefSucceeded) exactly
    once, whichever side of the completion's record the operator dies on; no worker
    is created again."""
    enqueue(kapi, ns, tj, "done", wait_until, mn=2, gpus=1, template=template(duration=3))
    with operator_process(kube_cluster, ns) as (ctl, step):
        step_until(step, lambda: kapi.phase(ns, "done") == "Running", "Running", kapi, ns, "done", 2)
        uids = {p.metadata.uid for p in job_pods(kapi, ns, "done")}
        wait_until(lambda: all(p.status.phase == "Succeeded" for p in job_pods(kapi, ns, "done")), 20, "exits")
        if crash == "after-record":
            crash_after_record(ctl)
        else:
            crash_at_record(ctl, "phase", "Succeeded")
        with pytest.raises(Crash):
            step()
        assert kapi.phase(ns, "done") == ("Succeeded" if crash == "after-record" else "Running")
    with operator_process(kube_cluster, ns) as (_, step):
        for _ in range(4):
            step()
    st = kapi.status(ns, "done")
    assert (st["phase"], st["reason"]) == ("Succeeded", "ChiefSucceeded")
    assert {p.metadata.uid for p in job_pods(kapi, ns, "done")} == uids  # nothing ran again
    assert len(kapi.events(ns, "done", "Admitted")) == 1
    # the event after the record died with the operator; the completion is not repeated
    assert len(kapi.events(ns, "done", "Completed")) == (0 if crash == "after-record" else 1)


@pytest.mark.parametrize("crash", ["after-record", "at-record"])
def test_failures_counted_once_across_a_crash_then_backoff_limit_fails(kube_cluster, kapi, ns, tj, wait_until, crash):
    """Every worker exits 3 after 2 s, backoffLimit 1: the first failure restarts the
    generation after the 10 s backoff, the second fails the job with the exit code in
    its condition. A crash on either side of the first failure's record neither loses
    nor doubles the count."""
    enqueue(kapi, ns, tj, "crashy", wait_until, mn=2, gpus=1, template=template(duration=2, code=3), backoffLimit=1)
    with operator_process(kube_cluster, ns) as (ctl, step):
        step_until(step, lambda: kapi.phase(ns, "crashy") == "Running", "Running", kapi, ns, "crashy", 2)
        wait_until(lambda: all(p.status.phase == "Failed" for p in job_pods(kapi, ns, "crashy")), 20, "exits")
        if crash == "after-record":
            crash_after_record(ctl)
        else:
            crash_at_record(ctl, "failures")
        with pytest.raises(Crash):
            step()
        st = kapi.status(ns, "crashy")
        assert (st.get("failures", 0), st.get("restartGeneration", 0)) == ((1, 1) if crash == "after-record" else (0, 0))
    with operator_process(kube_cluster, ns) as (ctl, step):
        step_until(step, lambda: kapi.status(ns, "crashy").get("failures") == 1
                   and kapi.status(ns, "crashy").get("restartGeneration") == 1, "first failure counted",
                   kapi, ns, "crashy", 2, n=10)
        # the next generation starts after the backoff and fails the same way
        step_until(step, lambda: kapi.phase(ns, "crashy") == "Failed", "Failed", kapi, ns, "crashy", 2, n=80)
    st = kapi.status(ns, "crashy")
    assert st["failures"] == 2 and st["lastFailure"]["exitCode"] == 3 and st["lastFailure"]["generation"] == 1
    cond = kapi.condition(ns, "crashy", "Failed")
    assert cond["status"] == "True" and cond["reason"] == "BackoffLimitExceeded" and "code 3" in cond["message"]
    assert len(kapi.events(ns, "crashy", "WorkerFailed")) == (0 if crash == "after-record" else 1)  # see above
    assert not [p for p in job_pods(kapi, ns, "crashy", terminating=False) if p.status.phase in ("Pending", "Running")]


@pytest.mark.parametrize("crash", ["after-record", "at-record"])
def test_rescale_restarts_the_generation_and_never_exceeds_max_workers(kube_cluster, kapi, ns, tj, wait_until, crash):
    """``kubectl scale`` 1 -> 3 (one worker per cycle): each step is a new generation of
    every worker; an operator crash at the first step never leaves two generations
    running nor more than maxWorkers pods."""
    from rlsched.core.contract import GROUP, PLURAL, VERSION

    enqueue(kapi, ns, tj, "elastic", wait_until, mn=1, mx=3, gpus=1, template=template(), workers=1)
    with operator_process(kube_cluster, ns) as (ctl, step):
        step_until(step, lambda: kapi.phase(ns, "elastic") == "Running", "Running", kapi, ns, "elastic", 1)
        kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "elastic", {"spec": {"workers": 3}})
        if crash == "after-record":
            crash_after_record(ctl)
        else:
            crash_at_record(ctl, "restartGeneration")
        with pytest.raises(Crash):
            step()
    with operator_process(kube_cluster, ns) as (_, step):
        def at_three():
            live = job_pods(kapi, ns, "elastic", terminating=False)
            return len(live) == 3 and all(p.status.phase == "Running" for p in live)
        step_until(step, at_three, "3 running workers", kapi, ns, "elastic", 3)
    st = kapi.status(ns, "elastic")
    assert st["restartGeneration"] == 2 and st["targetWorkers"] == 3  # 1 -> 2 -> 3: two new generations
    gens = {p.metadata.labels[LABEL_GENERATION] for p in job_pods(kapi, ns, "elastic")}
    assert gens == {"2"}
    envs = {e.name: e.value for e in job_pods(kapi, ns, "elastic")[0].spec.containers[0].env}
    assert (envs["WORLD_SIZE"], envs["RLSCHED_GENERATION"]) == ("3", "2")


@pytest.mark.parametrize("crash", ["after-record", "at-record"])
def test_preemption_across_a_crash_then_the_victim_resumes_in_a_new_generation(kube_cluster, kapi, ns, tj,
                                                                                wait_until, crash):
    """A job holding all 32 GPUs is preempted by a highest-class job: its requeue and
    next generation are recorded before its workers are stopped; a crash on either
    side leaves it requeued (interrupt), the preemptor runs and exits, the victim
    resumes with its workers of generation 1 and was never run twice at once."""
    enqueue(kapi, ns, tj, "victim", wait_until, mn=4, gpus=8, template=template())
    with operator_process(kube_cluster, ns) as (ctl, step):
        step_until(step, lambda: kapi.phase(ns, "victim") == "Running", "victim Running", kapi, ns, "victim", 4)
        enqueue(kapi, ns, tj, "boss", wait_until, mn=1, gpus=8, klass="highest", template=template(duration=2))
        if crash == "after-record":
            crash_after_record(ctl)
        else:
            crash_at_record(ctl, "queue", "interrupt")
        with pytest.raises(Crash):
            step()
    with operator_process(kube_cluster, ns) as (_, step):
        step_until(step, lambda: kapi.phase(ns, "boss") == "Succeeded", "the preemptor ran and exited",
                   kapi, ns, "victim", 4, n=80)
        step_until(step, lambda: kapi.phase(ns, "victim") == "Running", "the victim resumed", kapi, ns, "victim", 4,
                   n=80)
    st = kapi.status(ns, "victim")
    assert st["preemptions"] == 1 and st["restartGeneration"] == 1
    assert {p.metadata.labels[LABEL_GENERATION] for p in job_pods(kapi, ns, "victim", terminating=False)} == {"1"}
    assert len(kapi.events(ns, "victim", "Preempted")) <= 1  # its event may have died with the operator


SERVED_ALLOCATOR = "goodput-rlpto"  # the served default (core/served.py), as the operator runs it


def test_a_job_in_failure_backoff_holds_its_gpus_where_it_ran_and_a_whole_node_gang_starts(
        kube_cluster, kapi, ns, tj, wait_until):
    """A 1-GPU job crash-loops on the last node, which another pod shares; while it waits
    out its backoff its GPU is held on that node (not on the freest one), so a gang of
    three whole 8-GPU nodes starts at once, before the crashing job's next generation."""
    from kubernetes import client

    from rlsched.core.contract import GROUP, PLURAL, VERSION

    last = kube_cluster.node_names[-1]
    kapi.core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="filler"),
        spec=client.V1PodSpec(node_name=last, restart_policy="Never", containers=[client.V1Container(
            name="c", image=IMAGE, resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}))])))
    wait_until(lambda: kapi.core.read_namespaced_pod("filler", ns).status.phase == "Running", 30, "filler running")
    tj(ns, "crashy", mn=1, gpus=1, backoffLimit=50,
       template=template(duration=1, code=3, nodeSelector={"kubernetes.io/hostname": last}))
    # four failures already: the next backoff is 160 s, far longer than the test
    kapi.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "crashy", {"status": {
        "phase": "Queued", "queue": "normal", "failures": 4}})
    wait_until(lambda: kapi.phase(ns, "crashy") == "Queued", 10, "crashy queued")
    with operator_process(kube_cluster, ns, allocator=SERVED_ALLOCATOR) as (_, step):
        step_until(step, lambda: kapi.phase(ns, "crashy") == "Running", "crashy Running", kapi, ns, "crashy", 1)
        assert job_pods(kapi, ns, "crashy")[0].spec.node_name == last
        step_until(step, lambda: kapi.status(ns, "crashy").get("failures") == 5, "crashy's failure counted",
                   kapi, ns, "crashy", 1)
        enqueue(kapi, ns, tj, "gang", wait_until, mn=3, gpus=8, template=template())
        step_until(step, lambda: kapi.phase(ns, "gang") == "Running", "the gang running", kapi, ns, "gang", 3)
        assert {p.spec.node_name for p in job_pods(kapi, ns, "gang")} == set(kube_cluster.node_names[:-1])
        # crashy is still waiting out its backoff: the gang did not wait for its next crash
        assert not job_pods(kapi, ns, "crashy", terminating=False)
        assert kapi.status(ns, "crashy")["restartGeneration"] == 1


def test_an_admission_recorded_before_a_crash_is_finished_not_rolled_back(kube_cluster, kapi, ns, tj, wait_until):
    """The operator dies right after recording an admission (phase Starting), before any
    pod exists: the operator that takes over creates the gang; no StatusReset."""
    enqueue(kapi, ns, tj, "admitted", wait_until, mn=2, gpus=1, template=template())
    with operator_process(kube_cluster, ns, allocator=SERVED_ALLOCATOR) as (ctl, step):
        real = ctl.status.event

        async def event(body, reason, *a, **k):
            if reason == "Admitted":
                raise Crash("operator killed after recording the admission")
            return await real(body, reason, *a, **k)
        ctl.status.event = event
        with pytest.raises(Crash):
            step()
    assert kapi.phase(ns, "admitted") == "Starting" and not job_pods(kapi, ns, "admitted")
    with operator_process(kube_cluster, ns, allocator=SERVED_ALLOCATOR) as (_, step):
        step_until(step, lambda: kapi.phase(ns, "admitted") == "Running", "Running", kapi, ns, "admitted", 2)
    assert kapi.events(ns, "admitted", "StatusReset") == []
    assert {p.metadata.labels[LABEL_GENERATION] for p in job_pods(kapi, ns, "admitted")} == {"0"}


def test_an_unfittable_gang_under_the_served_allocator_gets_condition_event_and_gauge(kube_cluster, kapi, ns, tj,
                                                                                       wait_until):
    """A gang of 5 x 8 GPUs on a 32-GPU cluster, under the served allocator: condition
    Schedulable=False (Unfittable), one Unfittable event, the gauge at 1 — as admission
    reports it."""
    enqueue(kapi, ns, tj, "huge", wait_until, mn=5, gpus=8, template=template())
    with operator_process(kube_cluster, ns, allocator=SERVED_ALLOCATOR) as (ctl, step):
        step_until(step, lambda: (kapi.condition(ns, "huge", "Schedulable") or {}).get("status") == "False",
                   "Schedulable=False", kapi, ns, "huge", 0, n=10)
        step()
        assert ctl.metrics.registry.get_sample_value("rlsched_operator_unfittable_jobs") == 1.0
    cond = kapi.condition(ns, "huge", "Schedulable")
    assert cond["reason"] == "Unfittable" and "40 GPUs, the cluster has 32" in cond["message"]
    assert len(kapi.events(ns, "huge", "Unfittable")) == 1
    assert kapi.phase(ns, "huge") == "Queued" and kapi.status(ns, "huge")["waiting"]["reason"] == "Unfittable"
