"""The mission with the old default admission + scaling policies as one allocator
(``--allocator fifo/das/rlpto+nobackfill``: FIFO, DAS, RLPTO's committed weights; the
served default is the goodput allocator, tests/operator/test_k8s_goodput.py), against
the real control plane.

The other operator tests scale with the β rule and feed the fake trainer little noise
(σ = 0.0005) against a large β (0.02). These run RLPTO's committed actor and the fake
trainer's default noise model (σ = 0.002 against β = 0.001), as the demo does. The actor
grows the running job with the least work left and shrinks the one with the most (its
rank feature). Jobs are sized in whole nodes (``gpusPerWorker: 8``, 4 nodes) so that
who fits is unambiguous.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from rlsched.core.contract import GROUP as G
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data") / "pollux-osdi21" / "traces"

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

#: the old default policies as one allocator: FIFO, DAS, RLPTO's committed weights, no backfill
RLPTO = dict(allocator="fifo/das/rlpto+nobackfill")


def _t(ev) -> float:
    return float(ev.metadata.annotations["rlsched.dev/event-time"])


def _metrics(rt) -> str:
    port = rt.metrics_server[0].server_port
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_default_policy_converged_job_gives_workers_to_a_waiting_job(extender, fake_trainer, kapi, ns, tj,
                                                                     run_operator, wait_until):
    with fake_trainer(ns) as th:  # the demo's convergence and noise model (its defaults)
        assert (th.trainer.noise, th.trainer.tau) == (0.002, 6.0)
        with run_operator(ns, **RLPTO) as rt:
            wait_until(lambda: rt.controller is not None, 30, "the operator started")
            policy = rt.controller.allocation.allocator.planner.policy
            assert policy.name == "rlpto" and policy.fallback_reason is None  # the learned actor serves
            tj(ns, "conv", 1, 4, gpus=8, beta=0.001, maxEpochs=200)
            th.start()
            wait_until(lambda: kapi.status(ns, "conv").get("targetWorkers") == 4, 90, "conv grown to the cluster")
            tj(ns, "late", 2, gpus=8)
            wait_until(lambda: kapi.status(ns, "late").get("queue") == "normal", 20, "late queued")
            wait_until(lambda: kapi.phase(ns, "late") == "Running", 180, "late running on conv's workers")
            wait_until(lambda: kapi.phase(ns, "conv") == "Succeeded", 120, "conv converged")
            st = kapi.status(ns, "conv")
            # the β stop, not the epoch budget: the windowed gain fell below beta
            assert st["reason"] == "Converged" and st["progress"]["epoch"] < 200
            assert st["rlpto"]["gain"] < 0.001 and st["rlpto"]["streak"] >= 5
            downs = kapi.events(ns, "conv", "ScaledDown")
            assert [e.message.split(" (")[0] for e in downs][:2] == ["workers 4 -> 3", "workers 3 -> 2"]
            # late (2 nodes) started only once conv had given back two
            assert _t(kapi.events(ns, "late", "Admitted")[0]) > _t(downs[1])
            text = _metrics(rt)
            assert 'rlsched_operator_completions_total{reason="Converged"} 1.0' in text
            down = [ln for ln in text.splitlines() if ln.startswith('rlsched_operator_scaling_decisions_total{direction="down"}')]
            assert down and float(down[0].split()[-1]) >= 2
            wait_until(lambda: not kapi.pods(ns, "conv"), 30, "conv pods deleted")


def test_default_policies_highest_job_preempts_and_its_victim_resumes_first(extender, fake_trainer, kapi, ns, tj,
                                                                            run_operator, wait_until):
    with fake_trainer(ns) as th:  # the demo's convergence and noise model (its defaults)
        assert (th.trainer.noise, th.trainer.tau) == (0.002, 6.0)
        with run_operator(ns, grace_period_s=2, **RLPTO) as rt:
            # first holds two nodes and has the most work left (the actor would shrink it,
            # its range does not let it); second, with less, grows into the spare nodes
            tj(ns, "first", 2, 2, gpus=8, beta=0.001, maxEpochs=4000)
            th.start()
            wait_until(lambda: kapi.phase(ns, "first") == "Running", 60, "first running")
            tj(ns, "second", 1, 2, gpus=8, beta=0.001, maxEpochs=400)
            wait_until(lambda: kapi.status(ns, "first").get("workers") == 2
                       and kapi.status(ns, "second").get("workers") == 2, 90, "the cluster full")
            tj(ns, "waiter", 1, gpus=8)
            wait_until(lambda: kapi.status(ns, "waiter").get("queue") == "normal", 20, "waiter queued")
            tj(ns, "boss", 1, gpus=8, klass="highest", maxEpochs=400)
            wait_until(lambda: kapi.phase(ns, "boss") in ("Starting", "Running"), 60, "boss admitted")
            # the most recently started job of the lowest class and priority is the victim;
            # of its two nodes boss needs one: from the interrupt queue it takes the other
            # back at once, ahead of the waiter queued before the preemption
            wait_until(lambda: kapi.events(ns, "second", "Preempted"), 20, "Preempted event")
            wait_until(lambda: len(kapi.events(ns, "second", "Admitted")) == 2, 60, "second resumed")
            st = kapi.status(ns, "second")
            assert st["preemptions"] == 1 and st["phase"] in ("Starting", "Running")
            resumed = kapi.events(ns, "second", "Admitted")[-1]
            assert "from queue interrupt (resuming after a preemption)" in resumed.message
            assert _t(resumed) > _t(kapi.events(ns, "second", "Preempted")[0])
            assert kapi.phase(ns, "first") == "Running" and not kapi.status(ns, "first").get("preemptions")
            assert kapi.phase(ns, "waiter") == "Queued"
            text = _metrics(rt)
            assert "rlsched_operator_preemptions_total 1.0" in text and "rlsched_operator_resumes_total 1.0" in text
            # GPUs free up (first finishes by hand): now the waiter starts
            kapi.custom.delete_namespaced_custom_object(G, V, ns, P, "first")
            wait_until(lambda: kapi.phase(ns, "waiter") in ("Starting", "Running"), 90, "waiter admitted")
            # the event is posted after the status patch: wait for it, not only for the phase
            wait_until(lambda: kapi.events(ns, "waiter", "Admitted"), 20, "waiter Admitted event")
            assert _t(kapi.events(ns, "waiter", "Admitted")[0]) > _t(resumed)


def test_default_scaling_policy_reads_what_the_job_reported(extender, fake_trainer, kapi, ns, tj, run_operator,
                                                            wait_until):
    """The scaling mode folds each report into ``status.goodput`` as the allocator mode
    does, and the learned policy's measured speed-up ``s`` is the model fitted to those
    step times (core's ``measured_view``): 0 (unknown) before the first
    report, > 1 once the job has reported on its placement."""
    from rlsched.sim.measured import load_applications

    if not TRACES.is_dir():
        pytest.skip(f"measured profiles not found at {TRACES} (../shared/data)")
    app = load_applications(TRACES, ("cifar10",))["cifar10"]
    with fake_trainer(ns, application=app) as th:
        with run_operator(ns, **RLPTO) as rt:
            wait_until(lambda: rt.controller is not None, 30, "the operator started")
            policy = rt.controller.allocation.allocator.planner.policy
            seen: list[tuple[str, float, float]] = []
            decide = policy.decide

            def spy(running, state):  # what the served policy is shown, recorded
                seen.extend((v.id, v.speedup, v.stat_efficiency) for v in running)
                return decide(running, state)

            policy.decide = spy
            tj(ns, "meas", 1, 2, gpus=8, beta=0.001, maxEpochs=400)
            th.start()
            wait_until(lambda: any(s > 1 for _, s, _ in seen), 120, "the policy shown a measured speed-up")
            shapes = kapi.status(ns, "meas")["goodput"]["shapes"]
            assert shapes and all(row[4] > 0 for row in shapes), shapes
            assert all(0 <= x <= 1 for _, _, x in seen)
