"""A job's trainer may write its progress and nothing else (issue 12, item 4), against
the real control plane with the trainer-status ValidatingAdmissionPolicy the chart
ships (``deploy/helm/rlsched/files/policies/trainer-status.yaml``, installed by the
``crd`` fixture).

The trainer's Role lets it patch the whole status of its job; reproduced before the
policy: its token patched ``{"status": {"targetWorkers": 40}}`` on a job with
maxWorkers 2 and the operator created 40 pods.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rlsched.core.contract import GROUP as G
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V
from rlsched.core.contract import trainer_account_name

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"

MAX_WORKERS = 2
#: status fields the operator acts on, each with a value a hostile trainer would write
ATTACKS = {
    "targetWorkers": 40,
    "phase": "Succeeded",
    "queue": "interrupt",
    "effectivePriority": 999.0,
    "conditions": [{"type": "Admitted", "status": "False", "reason": "SetByTrainer", "message": "x"}],
}


def _trainer_client(kapi, ns, job) -> client.ApiClient:
    """An API client holding a token of the job's ServiceAccount (what its pods get)."""
    return kapi.token_client(ns, trainer_account_name(job))


def _patch(api: client.ApiClient, ns, job, status: dict, dry_run: str | None = None):
    return client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        G, V, ns, P, job, {"status": status}, dry_run=dry_run, _content_type="application/merge-patch+json")


def _denied(api, ns, job, status: dict) -> ApiException:
    with pytest.raises(ApiException) as exc:
        _patch(api, ns, job, status)
    return exc.value


def _message(exc: ApiException) -> str:
    return json.loads(exc.body).get("message", "")


def _policy_in_force(api, ns, job) -> bool:
    """A dry run of the reproduced attack is denied: the API server's admission plugin
    has loaded the policy (a moment after it is created)."""
    try:
        _patch(api, ns, job, {"targetWorkers": 40}, dry_run="All")
    except ApiException as exc:
        if exc.status == 403:
            return True
        raise
    return False


def test_trainer_writes_progress_only_and_the_operator_stays_within_the_spec(kapi, ns, tj, run_operator, wait_until):
    from rlsched.trainer import Reporter

    with run_operator(ns, allocator=FIFO) as rt:
        tj(ns, "small", 1, MAX_WORKERS, gpus=1)
        # the operator's own status writes pass the policy
        wait_until(lambda: kapi.status(ns, "small").get("phase") == "Running", 60, "job running")
        api = _trainer_client(kapi, ns, "small")
        try:
            wait_until(lambda: _policy_in_force(api, ns, "small"), 30, "the trainer-status policy in force")
            # what the chief reports goes through (rlsched.trainer)
            Reporter("small", ns, api=api).report(epoch=1, loss=2.0, accuracy=0.25)
            assert kapi.status(ns, "small")["progress"]["history"] == [0.25]

            for field, value in ATTACKS.items():
                exc = _denied(api, ns, "small", {field: value})
                assert exc.status == 403, (field, exc.status, exc.body)
                msg = _message(exc)
                assert "a trainer may write only status.progress" in msg and f"status.{field}" in msg, msg
                assert kapi.status(ns, "small").get(field) != value, field
            # a patch that mixes progress with another field is denied as a whole
            exc = _denied(api, ns, "small", {"progress": {"epoch": 9, "accuracy": 0.9}, "targetWorkers": 40})
            assert exc.status == 403 and "status.targetWorkers" in _message(exc)
            assert kapi.status(ns, "small")["progress"]["epoch"] == 1
            # so is removing the operator's status
            exc = _denied(api, ns, "small", None)
            assert exc.status == 403 and "status.phase" in _message(exc)
            # progress values out of range
            for bad in ({"epoch": -1}, {"accuracy": 1.5}, {"accuracy": -0.1}, {"history": [0.5, 2.0]}):
                exc = _denied(api, ns, "small", {"progress": bad})
                assert exc.status == 422 and "status.progress" in _message(exc), (bad, exc.status, exc.body)
            assert kapi.status(ns, "small")["progress"]["epoch"] == 1

            # the operator keeps acting on its own numbers: a few more cycles, never more
            # workers than maxWorkers
            c0 = rt.controller.cycles
            wait_until(lambda: rt.controller.cycles >= c0 + 4, 30, "four more operator cycles")
            st = kapi.status(ns, "small")
            assert st.get("targetWorkers", 1) <= MAX_WORKERS and st["phase"] == "Running"
            assert len(kapi.pods(ns, "small", terminating=True)) <= MAX_WORKERS
        finally:
            api.close()

    # the admin (and the operator, above) still write any status field
    kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "small", {"status": {"message": "set by an admin",
                                                                                       "targetWorkers": 1}})
    st = kapi.status(ns, "small")
    assert (st["message"], st["targetWorkers"]) == ("set by an admin", 1)


def test_policy_matches_only_the_jobs_own_trainer(kapi, ns, tj, run_operator, wait_until):
    """Another job's trainer is stopped by RBAC before the policy; a user who may patch
    the status (here the admin) is not matched by the policy at all."""
    with run_operator(ns, allocator=FIFO):
        tj(ns, "mine", 1, gpus=1)
        tj(ns, "other", 1, gpus=1)
        wait_until(lambda: kapi.status(ns, "mine").get("phase") == kapi.status(ns, "other").get("phase")
                   == "Running", 60, "both running")
    api = _trainer_client(kapi, ns, "mine")
    try:
        wait_until(lambda: _policy_in_force(api, ns, "mine"), 30, "the trainer-status policy in force")
        exc = _denied(api, ns, "other", {"progress": {"epoch": 1, "accuracy": 0.5}})
        assert exc.status == 403 and "ValidatingAdmissionPolicy" not in _message(exc)  # RBAC said no
    finally:
        api.close()
    kapi.custom.patch_namespaced_custom_object_status(G, V, ns, P, "mine", {"status": {"queue": "urgent",
                                                                                      "progress": {"epoch": 2}}})
    st = kapi.status(ns, "mine")
    assert st["queue"] == "urgent" and st["progress"]["epoch"] == 2
