"""``spec.suspend`` (issue 26 item 3, Kueue's field) on the real control plane: a
suspended TrainingJob creates no pods and is never admitted; unsuspended it starts;
suspended again while running, its workers are stopped and it waits in the queue —
with a heuristic (FIFO) and with the served goodput allocator alike."""

import pytest

from rlsched.core.contract import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]


def _suspend(kapi, ns, name, value: bool) -> None:
    kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": {"suspend": value}})


@pytest.mark.parametrize("allocator", ["fifo/das+nobackfill", "goodput"])
def test_a_suspended_job_holds_no_pods_and_resumes_when_unsuspended(allocator, extender, kapi, ns, tj, run_operator,
                                                                     wait_until):
    with run_operator(ns, allocator=allocator):
        tj(ns, "held", 1, 2, suspend=True)
        wait_until(lambda: (kapi.condition(ns, "held", "Suspended") or {}).get("status") == "True", 30,
                   "condition Suspended=True")
        assert kapi.phase(ns, "held") == "Queued" and not kapi.pods(ns, "held")
        _suspend(kapi, ns, "held", False)
        wait_until(lambda: kapi.phase(ns, "held") == "Running", 60, "held running once unsuspended")
        assert (kapi.condition(ns, "held", "Suspended") or {}).get("status") == "False"
        gen = kapi.status(ns, "held").get("restartGeneration") or 0
        _suspend(kapi, ns, "held", True)
        wait_until(lambda: kapi.phase(ns, "held") == "Queued" and not kapi.pods(ns, "held"), 60,
                   "held back in the queue, its workers stopped")
        st = kapi.status(ns, "held")
        assert st["restartGeneration"] == gen + 1 and st.get("targetWorkers") == 0
        assert [e.reason for e in kapi.events(ns, "held", "Suspended")]
