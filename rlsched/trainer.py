"""Progress reporting for a training job's chief: ``rlsched.trainer.report(...)``.

Inside a worker pod the operator sets ``RLSCHED_JOB_NAME`` and (downward API)
``RLSCHED_JOB_NAMESPACE`` and runs the pod under the job's own ServiceAccount, whose
Role allows ``get``/``patch`` on this one TrainingJob's status and nothing else. The
helper merge-patches ``status.progress`` only — the operator's status fields are
never touched::

    from rlsched import trainer
    for epoch in range(1, epochs + 1):
        loss, acc = train_one_epoch(), evaluate()
        trainer.report(epoch=epoch, loss=loss, accuracy=acc)

``maxLoss`` is the largest loss reported so far and ``history`` the accuracy after each
epoch (the last ``history_limit`` kept), as the RLPTO scaling policy reads them.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from typing import Any

from rlsched.core.contract import ENV_JOB, ENV_NAMESPACE, GROUP, PLURAL, VERSION

__all__ = ["Reporter", "report", "ENV_JOB", "ENV_NAMESPACE"]

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _default_api():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Reporter:
    """Writes one job's ``status.progress``; ``api`` is a ``kubernetes.client.ApiClient``
    (default: in-cluster credentials, else the local kubeconfig)."""

    def __init__(
        self,
        job: str | None = None,
        namespace: str | None = None,
        *,
        api: Any = None,
        history_limit: int = 200,
    ) -> None:
        job = job or os.environ.get(ENV_JOB)
        namespace = namespace or os.environ.get(ENV_NAMESPACE) or _read(_SA_NAMESPACE)
        if not job or not namespace:
            raise RuntimeError(
                f"rlsched.trainer: no job to report to; set {ENV_JOB} and {ENV_NAMESPACE} "
                f"(the operator sets them in worker pods) or pass job= and namespace="
            )
        if history_limit < 2:
            raise ValueError("history_limit must be >= 2 (the gain needs two evaluations)")
        from kubernetes import client

        self.job, self.namespace, self.history_limit = job, namespace, history_limit
        self.api = client.CustomObjectsApi(api or _default_api())

    def report(self, *, epoch: int, loss: float, accuracy: float) -> dict:
        """Record the evaluation after ``epoch``; returns the progress written."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if not (math.isfinite(loss) and math.isfinite(accuracy)):
            raise ValueError(f"loss and accuracy must be finite, got {loss}, {accuracy}")
        obj = self.api.get_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.job)
        old = (obj.get("status") or {}).get("progress") or {}
        history = list(old.get("history") or [])
        if history and int(old.get("epoch", 0)) >= epoch:
            history = history[:-1]  # a re-evaluation of the same epoch replaces the last one
        history.append(float(accuracy))
        prev_max = old.get("maxLoss")
        progress = {
            "epoch": int(epoch),
            "loss": float(loss),
            "maxLoss": float(loss) if prev_max is None else max(float(prev_max), float(loss)),
            "accuracy": float(accuracy),
            "history": history[-self.history_limit :],
            "updateTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, self.job, {"status": {"progress": progress}},
            _content_type="application/merge-patch+json",
        )
        return progress


def report(*, epoch: int, loss: float, accuracy: float, job: str | None = None,
           namespace: str | None = None, api: Any = None) -> dict:
    """One-shot :meth:`Reporter.report` (job and namespace from the environment)."""
    return Reporter(job, namespace, api=api).report(epoch=epoch, loss=loss, accuracy=accuracy)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None
