"""Progress reports into the TrainingJob's ``status.progress``.

Reports merge-patch ``status.progress`` only, under the job's own ServiceAccount.
:class:`Reporter` writes one report now and raises on an API error;
:class:`ProgressReporter` is what a training loop calls every step: rank 0 only,
rate-limited, delivered by a background thread with retries, dropped (and logged) when
the API server stays away. Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any, Callable

from rlsched.core.contract import ENV_GPU_TYPE, ENV_JOB, ENV_NAMESPACE, ENV_RANK, GROUP, PLURAL, VERSION, WorkerContract

from .errors import NoJobError

__all__ = ["Reporter", "ProgressReporter", "report", "detect_gpu_type", "ENV_JOB", "ENV_NAMESPACE"]

log = logging.getLogger("rlsched.trainer")

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
MERGE_PATCH = "application/merge-patch+json"

#: keyword of :meth:`Reporter.report` -> field of ``status.progress`` (the CRD's names)
_FIELDS = {
    "step": "step",
    "generation": "generation",
    "metric_name": "metricName",
    "step_time_seconds": "stepTimeSeconds",
    "samples_per_second": "samplesPerSecond",
    "workers": "workers",
    "global_batch_size": "globalBatchSize",
    "grad_sqr": "gradSqr",
    "grad_var": "gradVar",
    "scale_invariant_epochs": "scaleInvariantEpochs",
    "gpu_type": "gpuType",
}
#: string fields (the rest are numbers)
_TEXT_FIELDS = {"metric_name", "gpu_type"}
#: the longest ``gpuType`` the CRD takes (a label value)
_MAX_GPU_TYPE = 63
#: fields a None value removes from ``status.progress`` (JSON null in a merge patch):
#: gradient statistics not measured in this generation and a GPU not known are absent,
#: never stale
_REMOVABLE_FIELDS = {"grad_sqr", "grad_var", "gpu_type"}
_INTEGER_FIELDS = {"step", "generation", "workers", "global_batch_size"}


def _default_api():
    """An ApiClient with the pod's ServiceAccount, else the local kubeconfig
    (``$KUBECONFIG`` or ``~/.kube/config``)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def detect_gpu_type(environ: Any = None) -> str | None:
    """The GPU this process trains on, as ``status.progress.gpuType``: the type the
    operator pinned its generation to (:data:`~rlsched.core.contract.ENV_GPU_TYPE`),
    else the CUDA device's name as GPU Feature Discovery writes the product label
    (spaces as ``-``, e.g. ``Tesla-T4``; the operator maps it to a type), read only when
    the script has imported torch and CUDA is up; None when neither is known."""
    env = os.environ if environ is None else environ
    pinned = (env.get(ENV_GPU_TYPE) or "").strip()
    if pinned:
        return pinned[:_MAX_GPU_TYPE]
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    try:
        name = torch.cuda.get_device_name(torch.cuda.current_device())
    except RuntimeError as exc:  # CUDA present but not usable in this process
        log.info("rlsched.trainer: no GPU type reported, CUDA device name unavailable: %s", exc)
        return None
    return "-".join(str(name).split())[:_MAX_GPU_TYPE] or None


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reporter:
    """Writes one job's ``status.progress``; ``api`` is a ``kubernetes.client.ApiClient``
    (default: in-cluster credentials, else the local kubeconfig), or ``custom_api`` an
    object with the two ``CustomObjectsApi`` methods used. The client is made on the
    first report."""

    def __init__(
        self,
        job: str | None = None,
        namespace: str | None = None,
        *,
        api: Any = None,
        custom_api: Any = None,
        history_limit: int = 200,
    ) -> None:
        job = job or os.environ.get(ENV_JOB)
        namespace = namespace or os.environ.get(ENV_NAMESPACE) or _read(_SA_NAMESPACE)
        if not job or not namespace:
            raise NoJobError(
                f"rlsched.trainer: no job to report to; set {ENV_JOB} and {ENV_NAMESPACE} "
                f"(the operator sets them in worker pods) or pass job= and namespace="
            )
        if history_limit < 2:
            raise ValueError("history_limit must be >= 2 (the gain needs two evaluations)")
        self.job, self.namespace, self.history_limit = job, namespace, history_limit
        self._api_client, self._custom = api, custom_api
        self._content_type_kw = True

    @property
    def api(self) -> Any:
        """The ``CustomObjectsApi`` (made on first use)."""
        if self._custom is None:
            from kubernetes import client

            self._custom = client.CustomObjectsApi(self._api_client or _default_api())
        return self._custom

    def report(self, *, epoch: int, loss: float, accuracy: float | None = None, **fields: Any) -> dict:
        """Write ``epoch`` (completed epochs), ``loss`` and, after an evaluation, the
        metric ``accuracy`` (appended to ``history``); ``fields`` are the optional
        progress fields by their snake-case names (``step``, ``generation``,
        ``metric_name``, ``step_time_seconds``, ``samples_per_second``, ``workers``,
        ``global_batch_size``, ``grad_sqr``, ``grad_var``, ``scale_invariant_epochs``,
        ``gpu_type``);
        ``grad_sqr``/``grad_var`` given as None are removed (not measured), other None
        fields are left as they are. Validates before any API call; returns the progress
        written. API errors propagate."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if not math.isfinite(loss) or (accuracy is not None and not math.isfinite(accuracy)):
            raise ValueError(f"loss and accuracy must be finite, got {loss}, {accuracy}")
        extra: dict[str, Any] = {}
        for key, value in fields.items():
            if key not in _FIELDS:
                raise TypeError(f"report() got an unexpected field {key!r}; known: {', '.join(_FIELDS)}")
            if value is None:
                if key in _REMOVABLE_FIELDS:
                    extra[_FIELDS[key]] = None
                continue
            if key in _TEXT_FIELDS:
                if key == "gpu_type" and not 0 < len(str(value)) <= _MAX_GPU_TYPE:
                    raise ValueError(f"gpu_type must be 1 to {_MAX_GPU_TYPE} characters, got {value!r}")
                extra[_FIELDS[key]] = str(value)
            elif key in _INTEGER_FIELDS:
                if isinstance(value, bool) or int(value) != value or value < 0:
                    raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
                extra[_FIELDS[key]] = int(value)
            else:
                if not math.isfinite(float(value)):
                    raise ValueError(f"{key} must be finite, got {value!r}")
                if key == "scale_invariant_epochs" and value < 0:
                    raise ValueError(f"{key} must be >= 0, got {value!r}")
                extra[_FIELDS[key]] = float(value)
        obj = self.api.get_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.job)
        old = (obj.get("status") or {}).get("progress") or {}
        prev_max = old.get("maxLoss")
        progress: dict[str, Any] = {
            "epoch": int(epoch),
            "loss": float(loss),
            "maxLoss": float(loss) if prev_max is None else max(float(prev_max), float(loss)),
        }
        if accuracy is not None:
            history = list(old.get("history") or [])
            if history and int(old.get("epoch", 0)) >= epoch:
                history = history[:-1]  # a re-evaluation of the same epoch replaces the last one
            history.append(float(accuracy))
            progress["accuracy"] = float(accuracy)
            progress["history"] = history[-self.history_limit :]
        progress.update(extra)
        progress["updateTime"] = _now()
        self._patch({"status": {"progress": progress}})
        return progress

    def _patch(self, body: dict) -> None:
        """A JSON merge patch of the status. Clients from 36 on take the content type as
        ``_content_type``; older ones (the ``trainer`` extra's range) have no such
        argument and always send ``application/merge-patch+json`` for custom objects."""
        args = (GROUP, VERSION, self.namespace, PLURAL, self.job, body)
        if self._content_type_kw:
            try:
                self.api.patch_namespaced_custom_object_status(*args, _content_type=MERGE_PATCH)
                return
            except TypeError as exc:  # kubernetes.client.exceptions.ApiTypeError before 36
                if "_content_type" not in str(exc):
                    raise
                self._content_type_kw = False
        self.api.patch_namespaced_custom_object_status(*args)


def report(*, epoch: int, loss: float, accuracy: float, job: str | None = None,
           namespace: str | None = None, api: Any = None) -> dict:
    """One-shot :meth:`Reporter.report` (job and namespace from the environment)."""
    return Reporter(job, namespace, api=api).report(epoch=epoch, loss=loss, accuracy=accuracy)


def _classify(exc: BaseException) -> str:
    """``"gone"`` (404: the job was deleted), ``"retry"`` (429, 5xx, a connection
    error) or ``"fail"`` (anything else: 401, 403, 422...)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        if status == 404:
            return "gone"
        if status == 429 or status >= 500:
            return "retry"
        return "fail"
    return "retry"  # no HTTP status: the connection failed


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a report may raise for reasons outside the script: API errors and
    connection failures (the Kubernetes client is imported here, at the first report)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (ApiException, HTTPError, OSError)


class ProgressReporter:
    """Rate-limited, retried progress reports of a training loop (rank 0 only).

    Call :meth:`step` after every optimizer step, :meth:`epoch_end` after each epoch's
    evaluation and :meth:`close` before the process exits. ``contract`` (or ``job``,
    ``namespace``, ``rank``, ``generation``, ``workers``) names the job and this worker.
    ``interval_s``: at most one step report per interval. ``retries``/``backoff_s``/
    ``max_backoff_s``: the exponential backoff (``backoff_s * 2**k``, capped) on 429,
    5xx and connection errors. ``background``: deliver from a thread so the loop never
    waits for the API server (False delivers inline: tests). ``clock``/``sleep``:
    injectable time."""

    def __init__(
        self,
        contract: WorkerContract | None = None,
        *,
        job: str | None = None,
        namespace: str | None = None,
        rank: int | None = None,
        generation: int | None = None,
        workers: int | None = None,
        metric_name: str | None = None,
        interval_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        api: Any = None,
        custom_api: Any = None,
        history_limit: int = 200,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        gpu_type: str | None = None,
    ) -> None:
        if contract is not None:
            job = job or contract.job
            namespace = namespace or contract.namespace or None
            rank = contract.rank if rank is None else rank
            generation = contract.generation if generation is None else generation
            workers = contract.world_size if workers is None else workers
        if rank is None:
            rank = int(os.environ.get(ENV_RANK) or 0)
        if interval_s < 0 or retries < 0 or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("interval_s, retries, backoff_s and max_backoff_s must be >= 0")
        self.rank, self.generation, self.workers, self.metric_name = rank, generation, workers, metric_name
        self.interval_s, self.retries, self.backoff_s, self.max_backoff_s = interval_s, retries, backoff_s, max_backoff_s
        self.background, self._clock, self._sleep = background, clock, sleep
        self.enabled = rank == 0
        #: the GPU the step times are measured on (``gpuType``; default :func:`detect_gpu_type`)
        self.gpu_type = gpu_type if gpu_type is not None else detect_gpu_type() if self.enabled else None
        #: set when reporting ended for good (the job is gone, no credentials, no client)
        self.stopped_reason: str | None = None
        self.delivered = 0
        self.failed = 0
        self.last_progress: dict | None = None
        self._reporter: Reporter | None = None
        if self.enabled:  # the job must be known on the chief; the client is made later
            self._reporter = Reporter(job, namespace, api=api, custom_api=custom_api, history_limit=history_limit)
        self._last_sent: float | None = None
        self._epoch = 0
        self._latest: dict[str, Any] = {}
        self._window_loss = 0.0
        self._window_steps = 0
        self._window_samples = 0
        self._window_time = 0.0
        self._queue: deque[tuple[str, dict]] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self.stopped_reason is not None

    # ------------------------------------------------------------------ the loop's calls
    def step(self, *, step: int, epoch: int, loss: float, samples: int, step_time_s: float,
             global_batch: int | None = None, grad_sqr: float | None = None, grad_var: float | None = None,
             scale_invariant_epochs: float | None = None) -> bool:
        """Record one optimizer step (``epoch``: completed epochs, ``samples``: global
        samples of the step, ``loss``: its global mean loss); report when ``interval_s``
        has passed since the last report. ``grad_sqr``/``grad_var`` None: not measured
        (removed from the status). ``scale_invariant_epochs``: progress in base-batch
        epochs (:attr:`AdaScale.epochs <rlsched.trainer.adascale.AdaScale.epochs>`), the
        figure the scheduler judges epochs by when present. Returns whether a report was
        queued."""
        if not self.enabled or self.stopped:
            return False
        if math.isfinite(loss):
            self._window_loss += loss
            self._window_steps += 1
        self._window_samples += samples
        self._window_time += step_time_s
        self._epoch = epoch
        self._latest.update(step=step, global_batch_size=global_batch,
                            grad_sqr=None if grad_sqr is None else max(0.0, grad_sqr),
                            grad_var=None if grad_var is None else max(0.0, grad_var))
        if scale_invariant_epochs is not None:
            self._latest["scale_invariant_epochs"] = scale_invariant_epochs
        now = self._clock()
        if self._last_sent is not None and now - self._last_sent < self.interval_s:
            return False
        return self._emit("step", None)

    def epoch_end(self, *, epoch: int, loss: float, accuracy: float) -> bool:
        """After epoch ``epoch`` (1-based: completed epochs) was evaluated: always
        reported, with the metric appended to ``history``."""
        if not self.enabled or self.stopped:
            return False
        self._epoch = epoch
        return self._emit("epoch", {"loss": loss, "accuracy": accuracy})

    def close(self, timeout_s: float = 10.0) -> None:
        """Report the steps made since the last report, and wait (at most ``timeout_s``;
        keep it inside the pod's grace period) for the queued reports to be delivered."""
        if self.enabled and not self.stopped and self._window_steps:
            self._emit("final", None)  # the steps since the last report
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("%d progress report(s) not delivered within %.0fs at exit",
                            len(self._queue) + 1, timeout_s)

    # ------------------------------------------------------------------ delivery
    def _emit(self, kind: str, evaluation: dict | None) -> bool:
        fields: dict[str, Any] = {k: v for k, v in self._latest.items()}
        if self._window_steps:
            fields["loss"] = self._window_loss / self._window_steps
            if self._window_time > 0:
                fields["step_time_seconds"] = self._window_time / self._window_steps
                fields["samples_per_second"] = self._window_samples / self._window_time
        elif "loss" in self._latest:
            fields["loss"] = self._latest["loss"]
        if evaluation is not None:
            fields.update(evaluation)
        if "loss" not in fields:
            return False  # nothing measured yet
        fields.update(epoch=self._epoch, generation=self.generation, workers=self.workers,
                      metric_name=self.metric_name, gpu_type=self.gpu_type)
        # what the next report repeats when no step happened in between
        self._latest.update({k: fields[k] for k in ("loss", "step_time_seconds", "samples_per_second") if k in fields})
        self._window_loss, self._window_steps, self._window_samples, self._window_time = 0.0, 0, 0, 0.0
        self._last_sent = self._clock()
        if not self.background:
            self._deliver(fields)
            return True
        with self._cv:
            if kind in ("step", "final") and self._queue and self._queue[-1][0] == "step":
                self._queue[-1] = (kind, fields)  # newer progress supersedes an undelivered step report
            else:
                self._queue.append((kind, fields))
            self._cv.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlsched-progress", daemon=True)
            self._thread.start()
        return True

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                _, fields = self._queue.popleft()
            try:
                self._deliver(fields)
            except Exception:  # a bug, not an API error: say so loudly, keep training
                log.exception("progress reporting failed unexpectedly; reporting stops")
                self.stopped_reason = "internal error"
                return

    def _deliver(self, fields: dict) -> None:
        """One report with retries; never raises for API or connection errors."""
        if self.stopped:
            return
        try:
            errors = _api_errors()
            from kubernetes.config import ConfigException
        except ImportError as exc:
            self.stopped_reason = "no Kubernetes client"
            log.warning("progress not reported, the Kubernetes client is missing "
                        "(install rlsched with its trainer extra): %s", exc)
            return
        try:
            self._reporter.api  # noqa: B018 - makes the client: credentials are read here
        except ConfigException as exc:
            self.stopped_reason = "no credentials"
            log.warning("progress not reported, no Kubernetes credentials "
                        "(in-cluster ServiceAccount or $KUBECONFIG): %s", exc)
            return
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                self.last_progress = self._reporter.report(**fields)
                self.delivered += 1
                return
            except errors as exc:
                kind = _classify(exc)
                what = f"{getattr(exc, 'status', '') or type(exc).__name__} {getattr(exc, 'reason', '') or exc}"
                if kind == "gone":
                    self.stopped_reason = "job gone"
                    log.warning("TrainingJob %s/%s is gone (404); reporting stops",
                                self._reporter.namespace, self._reporter.job)
                    return
                if kind == "retry" and attempt < self.retries:
                    log.info("progress report failed (%s); retry %d/%d in %.1fs",
                             what, attempt + 1, self.retries, delay)
                    self._sleep(delay)
                    delay = min(delay * 2, self.max_backoff_s)
                    continue
                self.failed += 1
                log.warning("progress report dropped after %d attempt(s) (%s); training goes on",
                            attempt + 1, what)
                return
