"""The worker contract kept both ways, against the real control plane: the job's own
ServiceAccount and its report permission, the batch its reports show, and how its
workers exit when stopped.

* A template naming its own account: the pods run under it, its reports land, the
  trainer-status policy holds it to ``status.progress``, and it cannot write another
  job's status (RBAC: the operator's Role is bound to it for its own job only).
* A report of the running generation whose ``globalBatchSize`` is not the batch set:
  condition ``BatchSizeIgnored=True`` and a Warning event, ``False`` once they agree.
* Workers stopped with SIGTERM that exit 1 (kwok pods annotated
  ``rlsched.dev/stop-exit-code``): event and condition ``StopUnclean``, no failure
  counted, and the pods go once the operator read their exit (its finalizer); a worker
  of a running generation exiting 74: a counted failure naming the checkpoint.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rlsched.core.contract import (ANNOTATION_DURATION, ANNOTATION_EXIT_CODE, ANNOTATION_STOP_EXIT_CODE,
                                   EXIT_CHECKPOINT, GROUP, PLURAL, VERSION)
from rlsched.operator.status import parse_time

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"

IMAGE = "registry.example/rlsched/trainer:test"


def _patch_status(api, ns, job, status, dry_run=None):
    return client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, job, {"status": status}, dry_run=dry_run,
        _content_type="application/merge-patch+json")


def _guarded(api, ns, job) -> bool:
    """The trainer-status policy holds this account on ``job`` (a dry run of a write of
    an operator field is denied by it)."""
    try:
        _patch_status(api, ns, job, {"targetWorkers": 40}, dry_run="All")
    except ApiException as exc:
        if exc.status == 403 and "a trainer may write only status.progress" in exc.body:
            return True
        raise
    return False


def test_the_jobs_own_account_reports_its_batch_and_nothing_else(kapi, ns, tj, run_operator, wait_until):
    from rlsched.trainer import Reporter

    kapi.core.create_namespaced_service_account(ns, {"metadata": {"name": "team-sa"}})
    own = {"spec": {"serviceAccountName": "team-sa", "containers": [{"name": "train", "image": IMAGE}]}}
    with run_operator(ns, allocator=FIFO):
        tj(ns, "mine", 1, gpus=1, template=own, batchSize=64)
        tj(ns, "other", 1, gpus=1)
        wait_until(lambda: kapi.phase(ns, "mine") == kapi.phase(ns, "other") == "Running", 60, "both running")
        assert {p.spec.service_account_name for p in kapi.pods(ns, "mine")} == {"team-sa"}
        assert {p.spec.service_account_name for p in kapi.pods(ns, "other")} == {"other-trainer"}
        rb = kapi.rbac.read_namespaced_role_binding("mine-trainer", ns)
        assert [(s.kind, s.name) for s in rb.subjects] == [("ServiceAccount", "team-sa")]
        assert rb.metadata.owner_references[0].name == "mine"
        with pytest.raises(ApiException) as gone:  # the team's account is the team's: no <job>-trainer made
            kapi.core.read_namespaced_service_account("mine-trainer", ns)
        assert gone.value.status == 404
        api = kapi.token_client(ns, "team-sa")
        try:
            wait_until(lambda: _guarded(api, ns, "mine"), 30, "the trainer-status policy holding team-sa")
            # its reports land; one of another batch than the one set is noticed
            Reporter("mine", ns, api=api).report(epoch=1, loss=2.0, accuracy=0.25, generation=0,
                                                 global_batch_size=32)
            assert kapi.status(ns, "mine")["progress"]["globalBatchSize"] == 32
            # the first report of the generation its admission started: the stall it measured
            wait_until(lambda: "restartStall" in kapi.status(ns, "mine"), 30, "status.restartStall")
            st = kapi.status(ns, "mine")
            assert st["allocatedGeneration"] == 0 and st["restartStall"]["generation"] == 0
            admitted, reported = (parse_time(x) for x in (st["attainedSince"], st["progress"]["updateTime"]))
            assert 0.0 <= st["restartStall"]["seconds"] <= reported - admitted + 1.0, st
            wait_until(lambda: (kapi.condition(ns, "mine", "BatchSizeIgnored") or {}).get("status") == "True",
                       30, "BatchSizeIgnored=True")
            cond = kapi.condition(ns, "mine", "BatchSizeIgnored")
            assert "reports global batch 32, rlsched set 64" in cond["message"], cond
            # kopf posts events from a queue, after the status patch: wait for it
            wait_until(lambda: kapi.events(ns, "mine", "BatchSizeIgnored"), 30, "a BatchSizeIgnored event")
            assert [e.type for e in kapi.events(ns, "mine", "BatchSizeIgnored")] == ["Warning"]
            Reporter("mine", ns, api=api).report(epoch=2, loss=1.5, accuracy=0.5, generation=0,
                                                 global_batch_size=64)
            wait_until(lambda: kapi.condition(ns, "mine", "BatchSizeIgnored")["status"] == "False",
                       30, "BatchSizeIgnored=False")
            wait_until(lambda: kapi.events(ns, "mine", "BatchSizeFollowed"), 30, "a BatchSizeFollowed event")
            assert len(kapi.events(ns, "mine", "BatchSizeFollowed")) == 1
            # the same account: nothing of another job's status (RBAC), nothing but progress of its own
            with pytest.raises(ApiException) as other:
                _patch_status(api, ns, "other", {"progress": {"epoch": 1, "accuracy": 0.5}})
            assert other.value.status == 403
            assert "ValidatingAdmissionPolicy" not in json.loads(other.value.body)["message"]  # RBAC said no
            with pytest.raises(ApiException) as own_field:
                _patch_status(api, ns, "mine", {"targetWorkers": 40})
            assert own_field.value.status == 403
            assert kapi.status(ns, "other").get("progress") is None
        finally:
            api.close()
    # the account cannot be swapped under a running job (the guard and the binding follow it)
    with pytest.raises(ApiException) as swap:
        kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "mine", {
            "spec": {"template": {"spec": {"serviceAccountName": "other-trainer"}}}})
    assert swap.value.status == 422 and "serviceAccountName cannot change" in swap.value.body


def test_an_unclean_stop_is_shown_and_not_counted_a_checkpoint_exit_is(kapi, ns, tj, run_operator, wait_until):
    stops = {"metadata": {"annotations": {ANNOTATION_STOP_EXIT_CODE: "1"}},
             "spec": {"containers": [{"name": "train", "image": IMAGE}]}}
    ckpt = {"metadata": {"annotations": {ANNOTATION_DURATION: "1", ANNOTATION_EXIT_CODE: str(EXIT_CHECKPOINT)}},
            "spec": {"containers": [{"name": "train", "image": IMAGE}]}}
    with run_operator(ns, allocator=FIFO):
        tj(ns, "stopper", 2, gpus=1, template=stops)
        tj(ns, "ckpt", 1, gpus=1, template=ckpt)
        wait_until(lambda: kapi.phase(ns, "stopper") == "Running", 60, "stopper running")
        # the agreed stop: suspending ends the generation, the workers get SIGTERM and exit 1
        kapi.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stopper", {"spec": {"suspend": True}})
        wait_until(lambda: len(kapi.events(ns, "stopper", "StopUnclean")) == 2, 60, "two StopUnclean events")
        cond = kapi.condition(ns, "stopper", "StopUnclean")
        assert cond["status"] == "True" and cond["reason"] == "ExitAfterStop", cond
        assert "of generation 0 was stopped with SIGTERM" in cond["message"] and "code 1" in cond["message"]
        assert all(e.type == "Warning" for e in kapi.events(ns, "stopper", "StopUnclean"))
        st = kapi.status(ns, "stopper")
        assert not st.get("failures") and "lastFailure" not in st
        # read, the stopped workers go (the operator's finalizer is off)
        wait_until(lambda: not kapi.pods(ns, "stopper", terminating=True), 30, "the stopped workers gone")

        # exit 74 in a running generation: a failure, counted, that names the checkpoint
        wait_until(lambda: kapi.status(ns, "ckpt").get("failures") == 1, 60, "the checkpoint failure counted")
        st = kapi.status(ns, "ckpt")
        assert (st["lastFailure"]["exitCode"], st["lastFailure"]["reason"]) == (EXIT_CHECKPOINT, "CheckpointFailed")
        ev = kapi.events(ns, "ckpt", "CheckpointFailed")
        assert ev and ev[0].type == "Warning" and "checkpoint is unusable" in ev[0].message
        assert "failure 1 of backoffLimit" in ev[0].message
