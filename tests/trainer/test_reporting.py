"""Progress reports against a recording fake of the CustomObjectsApi.

The fake stands in for the two CustomObjectsApi calls only, to script failures
(5xx, 429, dropped connections, 404) and time; the real API server, RBAC and the
trainer-status admission policy are exercised by tests/operator/test_k8s_trainer_policy.py.
"""

import copy
import threading

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError

from rlsched.core.contract import GROUP, PLURAL, VERSION, WorkerContract
from rlsched.trainer import NoJobError, ProgressReporter, Reporter


class FakeCustomObjects:
    """Records every call; ``fail`` holds exceptions raised by the next calls, in order;
    patches are applied as a JSON merge patch of ``status``."""

    def __init__(self, progress=None, fail=()):
        self.status = {"phase": "Running", "progress": copy.deepcopy(progress)} if progress else {"phase": "Running"}
        self.fail = list(fail)
        self.calls = []
        self.gate = None  # a threading.Event the calls wait for (background tests)

    def _maybe_fail(self):
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise self.fail.pop(0)

    def get_namespaced_custom_object_status(self, group, version, namespace, plural, name):
        self.calls.append(("get", (group, version, namespace, plural, name)))
        self._maybe_fail()
        return {"metadata": {"name": name}, "status": copy.deepcopy(self.status)}

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **kw):
        self.calls.append(("patch", (group, version, namespace, plural, name), body, kw))
        self._maybe_fail()
        assert set(body) == {"status"} and set(body["status"]) == {"progress"}
        progress = self.status.setdefault("progress", {})
        progress.update(copy.deepcopy(body["status"]["progress"]))
        return {"status": copy.deepcopy(self.status)}

    @property
    def patches(self):
        return [c[2]["status"]["progress"] for c in self.calls if c[0] == "patch"]


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def _pr(api, clock=None, **kw):
    clock = clock or Clock()
    kw.setdefault("interval_s", 10.0)
    return ProgressReporter(job="resnet", namespace="team-a", rank=0, generation=2, workers=3, custom_api=api,
                            background=False, clock=clock, sleep=clock.sleep, metric_name="accuracy", **kw), clock


# --------------------------------------------------------------------------- Reporter
def test_reporter_merge_patches_progress_only():
    api = FakeCustomObjects(progress={"epoch": 1, "loss": 3.0, "maxLoss": 3.0, "accuracy": 0.2, "history": [0.2]})
    out = Reporter("resnet", "team-a", custom_api=api).report(epoch=2, loss=2.0, accuracy=0.4, step=100,
                                                             grad_sqr=0.5, metric_name="top1")
    kind, where, body, kw = api.calls[-1]
    assert kind == "patch" and where == (GROUP, VERSION, "team-a", PLURAL, "resnet")
    assert kw == {"_content_type": "application/merge-patch+json"}
    assert body["status"]["progress"] == out
    assert out["history"] == [0.2, 0.4] and out["maxLoss"] == 3.0 and out["step"] == 100
    assert out["gradSqr"] == 0.5 and out["metricName"] == "top1" and out["updateTime"].endswith("Z")


class ClientBefore36(FakeCustomObjects):
    """kubernetes < 36 (the trainer extra's range): no ``_content_type`` argument; it
    sends merge-patch+json for custom objects by itself."""

    def patch_namespaced_custom_object_status(self, *args, **kw):
        if "_content_type" in kw:
            raise TypeError("Got an unexpected keyword argument '_content_type' to method "
                            "patch_namespaced_custom_object_status")
        return super().patch_namespaced_custom_object_status(*args, **kw)


def test_clients_without_a_content_type_argument_are_served():
    api = ClientBefore36()
    r = Reporter("j", "ns", custom_api=api)
    r.report(epoch=1, loss=1.0, accuracy=0.5)
    r.report(epoch=2, loss=0.5, accuracy=0.7)
    assert [c[3] for c in api.calls if c[0] == "patch"] == [{}, {}]  # asked once, then remembered
    assert api.status["progress"]["history"] == [0.5, 0.7]


def test_a_re_evaluation_of_the_same_epoch_replaces_the_last_history_entry():
    api = FakeCustomObjects()
    r = Reporter("j", "ns", custom_api=api)
    r.report(epoch=1, loss=2.0, accuracy=0.3)
    r.report(epoch=2, loss=1.0, accuracy=0.5)
    r.report(epoch=2, loss=1.5, accuracy=0.45)  # a restarted generation evaluates epoch 2 again
    assert api.status["progress"]["history"] == [0.3, 0.45] and api.status["progress"]["maxLoss"] == 2.0


def test_a_step_report_leaves_the_metric_and_history_alone():
    api = FakeCustomObjects(progress={"epoch": 3, "accuracy": 0.7, "history": [0.5, 0.7], "maxLoss": 2.0})
    out = Reporter("j", "ns", custom_api=api).report(epoch=3, loss=0.4, step=12, samples_per_second=100.0)
    assert "accuracy" not in out and "history" not in out
    assert api.status["progress"]["history"] == [0.5, 0.7] and api.status["progress"]["accuracy"] == 0.7


def test_history_is_capped():
    api = FakeCustomObjects()
    r = Reporter("j", "ns", custom_api=api, history_limit=3)
    for e in range(1, 6):
        r.report(epoch=e, loss=1.0, accuracy=e / 10)
    assert api.status["progress"]["history"] == [0.3, 0.4, 0.5]


@pytest.mark.parametrize("kw", [dict(bogus=1), dict(step=-1), dict(workers=1.5), dict(grad_var=float("inf"))])
def test_bad_fields_are_refused_before_any_call(kw):
    api = FakeCustomObjects()
    with pytest.raises((TypeError, ValueError)):
        Reporter("j", "ns", custom_api=api).report(epoch=1, loss=1.0, **kw)
    assert api.calls == []


def test_no_job_is_a_no_job_error(monkeypatch):
    monkeypatch.delenv("RLSCHED_JOB_NAME", raising=False)
    monkeypatch.delenv("RLSCHED_JOB_NAMESPACE", raising=False)
    with pytest.raises(NoJobError, match="set RLSCHED_JOB_NAME and RLSCHED_JOB_NAMESPACE"):
        ProgressReporter(rank=0)
    assert issubclass(NoJobError, RuntimeError)  # what callers of Reporter caught before


# --------------------------------------------------------------------------- rate limiting
def test_at_most_one_step_report_per_interval_plus_epoch_ends_and_exit():
    api = FakeCustomObjects()
    pr, clock = _pr(api)
    sent = []
    for i in range(26):  # one step per second
        clock.now = float(i)
        sent.append(pr.step(step=i + 1, epoch=0, loss=2.0 - i / 100, samples=32, step_time_s=0.5, global_batch=32))
    assert [i for i, s in enumerate(sent) if s] == [0, 10, 20]
    clock.now = 26.5
    assert pr.epoch_end(epoch=1, loss=1.5, accuracy=0.6)  # always, and it restarts the interval
    clock.now = 30.0
    assert not pr.step(step=27, epoch=1, loss=1.4, samples=32, step_time_s=0.5)
    pr.close()
    p = api.patches
    assert len(p) == 5
    assert [x["step"] for x in p] == [1, 11, 21, 26, 27]
    # a step report carries the mean loss of the steps since the last report
    assert p[1]["loss"] == pytest.approx(sum(2.0 - i / 100 for i in range(1, 11)) / 10)
    assert p[1]["samplesPerSecond"] == pytest.approx(64.0) and p[1]["stepTimeSeconds"] == pytest.approx(0.5)
    assert (p[1]["epoch"], p[1]["generation"], p[1]["workers"], p[1]["globalBatchSize"]) == (0, 2, 3, 32)
    assert p[1]["metricName"] == "accuracy" and "accuracy" not in p[1]
    assert p[3]["accuracy"] == 0.6 and p[3]["loss"] == 1.5 and p[3]["epoch"] == 1
    assert p[4]["loss"] == pytest.approx(1.4)  # the exit report
    assert api.status["progress"]["history"] == [0.6]


def test_gradient_statistics_are_reported_and_never_negative():
    api = FakeCustomObjects()
    pr, _ = _pr(api)
    pr.step(step=1, epoch=0, loss=1.0, samples=8, step_time_s=0.1, grad_sqr=-0.01, grad_var=4.0)
    assert api.patches[0]["gradSqr"] == 0.0 and api.patches[0]["gradVar"] == 4.0


def test_scale_invariant_progress_and_statistics_not_measured():
    """The scale-invariant epochs go out as scaleInvariantEpochs; statistics not
    measured (None) go out as null, which the merge patch removes: never stale ones."""
    api = FakeCustomObjects(progress={"epoch": 1, "loss": 1.0, "gradSqr": 1.0, "gradVar": 8.0})
    pr, _ = _pr(api)
    pr.step(step=1, epoch=1, loss=1.0, samples=8, step_time_s=0.1, scale_invariant_epochs=1.25)
    p = api.patches[0]
    assert p["scaleInvariantEpochs"] == 1.25 and p["gradSqr"] is None and p["gradVar"] is None
    out = Reporter("resnet", "team-a", custom_api=api).report(epoch=2, loss=1.0)
    assert "gradSqr" not in out and "scaleInvariantEpochs" not in out  # not given: left alone
    with pytest.raises(ValueError):
        Reporter("resnet", "team-a", custom_api=api).report(epoch=2, loss=1.0, scale_invariant_epochs=-1.0)


def test_only_rank_zero_reports_and_others_need_no_job_nor_client(monkeypatch):
    monkeypatch.delenv("RLSCHED_JOB_NAME", raising=False)
    c = WorkerContract(job="j", namespace="ns", index=2, workers=3)
    pr = ProgressReporter(c, background=False)
    assert not pr.enabled and pr._reporter is None
    assert not pr.step(step=1, epoch=0, loss=1.0, samples=1, step_time_s=1.0)
    assert not pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)
    pr.close()
    chief = ProgressReporter(WorkerContract(job="j", namespace="ns", index=0, workers=3), custom_api=FakeCustomObjects())
    assert chief.enabled and (chief.generation, chief.workers) == (0, 3)


# --------------------------------------------------------------------------- failures
def test_transient_errors_are_retried_with_exponential_backoff():
    api = FakeCustomObjects(fail=[ApiException(status=503, reason="Service Unavailable"),
                                  ApiException(status=429, reason="Too Many Requests"),
                                  MaxRetryError(None, "/apis", "connection refused"),
                                  ProtocolError("Connection aborted."),
                                  ConnectionResetError(104, "reset")])
    pr, clock = _pr(api, backoff_s=0.5, max_backoff_s=4.0, retries=6)
    pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]  # doubling, capped
    assert pr.delivered == 1 and pr.failed == 0 and api.status["progress"]["history"] == [0.5]


def test_a_report_that_keeps_failing_is_dropped_and_training_goes_on(caplog):
    api = FakeCustomObjects(fail=[ApiException(status=500)] * 3)
    pr, clock = _pr(api, retries=2)
    pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)  # does not raise
    assert (pr.delivered, pr.failed, len(clock.sleeps)) == (0, 1, 2)
    assert "dropped after 3 attempt(s)" in caplog.text and "training goes on" in caplog.text
    pr.epoch_end(epoch=2, loss=0.9, accuracy=0.6)  # the API server is back
    assert pr.delivered == 1 and api.status["progress"]["history"] == [0.6]


@pytest.mark.parametrize("status", [400, 401, 403, 422])
def test_client_errors_are_not_retried(status):
    api = FakeCustomObjects(fail=[ApiException(status=status)])
    pr, clock = _pr(api)
    pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)
    assert clock.sleeps == [] and pr.failed == 1 and not pr.stopped
    pr.epoch_end(epoch=2, loss=1.0, accuracy=0.5)
    assert pr.delivered == 1


def test_a_job_that_is_gone_stops_reporting(caplog):
    api = FakeCustomObjects(fail=[ApiException(status=404, reason="Not Found")])
    pr, clock = _pr(api)
    pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)
    assert pr.stopped and pr.stopped_reason == "job gone" and clock.sleeps == []
    n = len(api.calls)
    clock.now = 100.0
    assert not pr.step(step=5, epoch=1, loss=1.0, samples=1, step_time_s=1.0)
    assert not pr.epoch_end(epoch=2, loss=1.0, accuracy=0.5)
    pr.close()
    assert len(api.calls) == n and "is gone (404)" in caplog.text


def test_no_credentials_stops_reporting_without_stopping_training(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    pr = ProgressReporter(job="j", namespace="ns", rank=0, background=False)
    pr.epoch_end(epoch=1, loss=1.0, accuracy=0.5)
    assert pr.stopped_reason == "no credentials" and "no Kubernetes credentials" in caplog.text


# --------------------------------------------------------------------------- background delivery
def test_background_delivery_never_blocks_the_loop_and_coalesces_step_reports():
    api = FakeCustomObjects()
    api.gate = threading.Event()  # the API server hangs until the gate opens
    clock = Clock()
    pr = ProgressReporter(job="j", namespace="ns", rank=0, custom_api=api, interval_s=0.0, clock=clock)
    pr.step(step=1, epoch=0, loss=1.0, samples=4, step_time_s=0.1)  # the thread takes it and hangs
    for i in range(2, 6):
        clock.now = float(i)
        assert pr.step(step=i, epoch=0, loss=1.0, samples=4, step_time_s=0.1)  # returns at once
    pr.epoch_end(epoch=1, loss=0.8, accuracy=0.5)
    pr.step(step=6, epoch=1, loss=0.7, samples=4, step_time_s=0.1)
    api.gate.set()
    pr.close(timeout_s=10)
    steps = [p.get("step") for p in api.patches]
    # step 1 (in flight), then the newest pending step report only, the epoch end, then
    # the last step report (the exit report superseded it, it is the same progress)
    assert steps[0] == 1 and 2 not in steps and 3 not in steps
    assert api.status["progress"]["history"] == [0.5] and api.status["progress"]["step"] == 6
    assert len(api.patches) <= 5


def test_the_gpu_type_comes_from_the_pinned_environment_else_is_removed(monkeypatch):
    """``gpuType``: RLSCHED_GPU_TYPE (the operator pins the generation and sets it),
    reported with every step; without it and without CUDA nothing is known and the
    field goes out as null (removed), so a type of an earlier generation never stays."""
    from rlsched.trainer.reporting import detect_gpu_type

    assert detect_gpu_type({"RLSCHED_GPU_TYPE": "dgx-ext"}) == "dgx-ext"
    monkeypatch.setenv("RLSCHED_GPU_TYPE", "aws")
    api = FakeCustomObjects()
    pr, _ = _pr(api)
    pr.step(step=1, epoch=0, loss=1.0, samples=8, step_time_s=0.1)
    assert api.patches[0]["gpuType"] == "aws"
    monkeypatch.delenv("RLSCHED_GPU_TYPE")
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)  # no CUDA to ask
    assert detect_gpu_type() is None
    api = FakeCustomObjects(progress={"epoch": 1, "loss": 1.0, "gpuType": "aws"})
    pr, _ = _pr(api)
    pr.step(step=1, epoch=1, loss=1.0, samples=8, step_time_s=0.1)
    assert api.patches[0]["gpuType"] is None
    with pytest.raises(ValueError, match="gpu_type"):
        Reporter("resnet", "team-a", custom_api=api).report(epoch=2, loss=1.0, gpu_type="x" * 64)


def test_without_the_environment_the_cuda_device_name_is_reported_as_gfd_writes_it(monkeypatch):
    import sys
    import types

    from rlsched.trainer.reporting import detect_gpu_type

    cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                                 get_device_name=lambda i: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert detect_gpu_type({}) == "NVIDIA-A100-SXM4-40GB"
    assert detect_gpu_type({"RLSCHED_GPU_TYPE": "aws"}) == "aws"
