"""Manifests the operator creates for a TrainingJob, as plain dicts.

Every object is owned by its TrainingJob and labelled ``rlsched.dev/job``; worker names
are deterministic (``<job>-worker-<index>``), so a restarted operator gets 409 Conflict
instead of a duplicate. :func:`worker_pod` builds only pods whose effective GPU request
is exactly ``gpusPerWorker`` (:class:`WorkerGPUError`). Details: docs/design-notes.md.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from rlsched.core.contract import (
    ANNOTATION_GANG_SIZE,
    CHECKPOINT_VOLUME,
    DEFAULT_MASTER_PORT,
    FINALIZER_WORKER_EXIT,
    LABEL_GENERATION,
    WorkerContract,
    service_name,
    worker_hostname,
    API_VERSION,
    DEFAULT_SCHEDULER_NAME,
    ENV_GPU_TYPE,
    ENV_JOB,
    ENV_NAMESPACE,
    LABEL_GPU_PRODUCT,
    GROUP,
    KIND,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGED_BY_OPERATOR,
    PLURAL,
    RESOURCE_GPU,
    ROLE_CHIEF,
    ROLE_WORKER,
    pod_gpus,
    products_of_type,
    trainer_account_name,
    worker_account,
)

__all__ = ["owner_reference", "worker_name", "worker_pod", "worker_service", "trainer_rbac",
           "trainer_account_name", "set_worker_gpus", "pin_gpu_type", "WorkerGPUError", "RENDEZVOUS_PORT_NAME"]

#: the port of the headless Service (the chief's rendezvous, MASTER_PORT)
RENDEZVOUS_PORT_NAME = "rendezvous"


class WorkerGPUError(ValueError):
    """The worker pod built from the template would not ask for ``gpusPerWorker`` GPUs."""


def owner_reference(body: Mapping, controller: bool = True) -> dict:
    md = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": md["name"],
        "uid": md["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def worker_name(job: str, index: int) -> str:
    """The pod name of worker ``index``: its stable hostname (``core.contract``)."""
    return worker_hostname(job, index)


def master_port(body: Mapping) -> int:
    port = (body.get("spec") or {}).get("masterPort")
    return int(port) if isinstance(port, int) and not isinstance(port, bool) else DEFAULT_MASTER_PORT


def worker_service(body: Mapping) -> dict:
    """The job's headless Service: it gives worker ``i`` the stable DNS name
    ``<job>-worker-<i>.<job>`` (the pods' ``hostname`` and ``subdomain``), published
    before the pods are ready so that the workers can rendezvous."""
    md = body["metadata"]
    job = md["name"]
    port = master_port(body)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(job), "namespace": md["namespace"], "labels": job_labels(job),
                     "ownerReferences": [owner_reference(body)]},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job},
            "ports": [{"name": RENDEZVOUS_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def job_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_MANAGED_BY: MANAGED_BY_OPERATOR}


def set_worker_gpus(pod_spec: dict, gpus_per_worker: int) -> dict:
    """Put ``gpus_per_worker`` GPUs (requests and limits) on the first container of
    ``pod_spec`` (changed in place and returned); other containers keep what they ask."""
    c = pod_spec["containers"][0]
    if not isinstance(c.get("resources"), dict):
        c["resources"] = {}
    res = c["resources"]
    for part in ("limits", "requests"):
        if not isinstance(res.get(part), dict):
            res[part] = {}
        res[part][RESOURCE_GPU] = str(gpus_per_worker)
    return pod_spec


def pin_gpu_type(pod_spec: dict, gpu_type: str, gpu_types: Mapping[str, str]) -> dict:
    """Pin ``pod_spec`` (changed in place and returned) to nodes of ``gpu_type``: a
    required node affinity on :data:`~rlsched.core.contract.LABEL_GPU_PRODUCT` ``In``
    the type's products (:func:`~rlsched.core.contract.products_of_type`), added to each
    of the template's own terms (terms are ORed, so it must hold in each), and
    :data:`~rlsched.core.contract.ENV_GPU_TYPE` in every container, which the trainer
    reports (a pod cannot read its node's labels through the downward API)."""
    expr = {"key": LABEL_GPU_PRODUCT, "operator": "In", "values": list(products_of_type(gpu_type, gpu_types))}
    aff = pod_spec["affinity"] = dict(pod_spec.get("affinity") or {})
    node = aff["nodeAffinity"] = dict(aff.get("nodeAffinity") or {})
    req = node["requiredDuringSchedulingIgnoredDuringExecution"] = dict(
        node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms") or [{}]
    req["nodeSelectorTerms"] = [{**t, "matchExpressions": list(t.get("matchExpressions") or []) + [copy.deepcopy(expr)]}
                                for t in terms]
    for c in pod_spec["containers"]:
        c["env"] = [e for e in c.get("env") or [] if e.get("name") != ENV_GPU_TYPE] + [
            {"name": ENV_GPU_TYPE, "value": gpu_type}]
    return pod_spec


def _contract(body: Mapping, index: int, workers: int, generation: int, gpus_per_worker: int,
              batch_size: int | None, resume: bool | None, ckpt: Mapping | None) -> WorkerContract:
    """The worker contract of worker ``index`` (``batch_size`` defaults to ``spec.batchSize``)."""
    md, spec = body["metadata"], body["spec"]
    if batch_size is None and isinstance(spec.get("batchSize"), int):
        batch_size = int(spec["batchSize"])
    local = spec.get("localBatchSize") if isinstance(spec.get("localBatchSize"), Mapping) else {}
    limit = local.get("max")
    return WorkerContract(job=md["name"], namespace=md.get("namespace", ""), index=index, workers=workers,
                          generation=int(generation), master_port=master_port(body), batch_size=batch_size,
                          checkpoint_dir=ckpt["path"] if ckpt else None,
                          micro_batch_limit=limit if isinstance(limit, int) and not isinstance(limit, bool)
                          else None,
                          procs_per_worker=int(gpus_per_worker), resume=resume)


def _give_contract(pod_spec: dict, job: str, contract: WorkerContract, ckpt: Mapping | None) -> None:
    """Every container of ``pod_spec`` gets the contract's variables (replacing its own
    of the same names) and the checkpoint volume mounted at its path."""
    env = [
        {"name": ENV_JOB, "value": job},
        {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ] + [{"name": k, "value": v} for k, v in contract.env().items()]
    names = {e["name"] for e in env}
    for c in pod_spec["containers"]:
        c["env"] = [e for e in c.get("env") or [] if e.get("name") not in names] + copy.deepcopy(env)
    if ckpt and isinstance(ckpt.get("volume"), Mapping):
        pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or [] if v.get("name") != CHECKPOINT_VOLUME] + [
            {"name": CHECKPOINT_VOLUME, **copy.deepcopy(dict(ckpt["volume"]))}]
        for c in pod_spec["containers"]:
            c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m.get("name") != CHECKPOINT_VOLUME] + [
                {"name": CHECKPOINT_VOLUME, "mountPath": ckpt["path"]}]


def worker_pod(
    body: Mapping,
    index: int,
    gpus_per_worker: int,
    *,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    grace_period_s: int = 30,
    gang_size: int | None = None,
    generation: int = 0,
    batch_size: int | None = None,
    resume: bool | None = None,
    gpu_type: str | None = None,
    gpu_types: Mapping[str, str] | None = None,
) -> dict:
    """The pod of worker ``index`` (0 is the chief) of ``generation``, one of
    ``gang_size`` workers, from the job's pod template.

    The pod carries the worker contract (:class:`~rlsched.core.contract.WorkerContract`:
    rendezvous variables, generation, global batch size, checkpoint directory) in every
    container, its stable hostname under the job's headless Service, the checkpoint
    volume of ``spec.checkpoint`` mounted in every container, and ``restartPolicy:
    Never`` (the operator restarts whole generations, counting failures).

    ``gang_size`` is also written as ``rlsched.dev/gang-size`` so the extender scores
    every worker of a gang as one worker of that many (the DAS room and learned terms
    count the whole gang's GPUs, as ``Placement.place`` and the simulator do); without
    it the extender sees the first worker of a gang as a job of one worker (found by
    the twin check). ``batch_size`` defaults to ``spec.batchSize``. ``resume``: whether
    an earlier generation of the job ran (``RLSCHED_RESUME``; unset when None).
    ``gpu_type``: the GPU type the generation runs on (:func:`pin_gpu_type`, products
    mapped to types by ``gpu_types``); None: any node."""
    md = body["metadata"]
    job = md["name"]
    spec = body["spec"]
    template = copy.deepcopy(spec["template"])
    tmd = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template["spec"]
    role = ROLE_CHIEF if index == 0 else ROLE_WORKER
    workers = int(gang_size) if gang_size else index + 1
    labels = {**(tmd.get("labels") or {}), **job_labels(job), LABEL_ROLE: role, LABEL_INDEX: str(index),
              LABEL_GENERATION: str(int(generation))}
    pod_spec["schedulerName"] = scheduler_name
    pod_spec["restartPolicy"] = "Never"
    pod_spec.setdefault("terminationGracePeriodSeconds", grace_period_s)
    # the template's own account (cloud workload identity, the team's RBAC), else the
    # job's; the deprecated alias is dropped so that the pod cannot run under another
    pod_spec["serviceAccountName"] = worker_account(job, pod_spec)
    pod_spec.pop("serviceAccount", None)
    pod_spec["hostname"] = worker_hostname(job, index)
    pod_spec["subdomain"] = service_name(job)
    ckpt = spec.get("checkpoint") if isinstance(spec.get("checkpoint"), Mapping) else None
    contract = _contract(body, index, workers, generation, gpus_per_worker, batch_size, resume, ckpt)
    _give_contract(pod_spec, job, contract, ckpt)
    if gpu_type:
        pin_gpu_type(pod_spec, gpu_type, gpu_types or {})
    set_worker_gpus(pod_spec, gpus_per_worker)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": worker_name(job, index),
            "namespace": md["namespace"],
            "labels": labels,
            "annotations": {**(tmd.get("annotations") or {}),
                            **({ANNOTATION_GANG_SIZE: str(int(gang_size))} if gang_size else {})},
            "ownerReferences": [owner_reference(body)],
            "finalizers": [FINALIZER_WORKER_EXIT],
        },
        "spec": pod_spec,
    }
    got = pod_gpus(pod, f"worker pod {worker_name(job, index)}")
    if got != gpus_per_worker:
        raise WorkerGPUError(
            f"worker pod {worker_name(job, index)} would ask for {got} {RESOURCE_GPU}, "
            f"spec.gpusPerWorker is {gpus_per_worker}"
        )
    return pod


def trainer_rbac(body: Mapping) -> tuple[dict | None, dict, dict]:
    """ServiceAccount, Role and RoleBinding letting the job's pods read and patch the
    status of this one TrainingJob (``resourceNames: [job]``) and nothing else.

    The pods run under the account their template names
    (:func:`~rlsched.core.contract.worker_account`); the binding grants the Role to it.
    The ServiceAccount ``<job>-trainer`` is made only when the template names none
    (None otherwise: the team's account is the team's). Role and RoleBinding are named
    ``<job>-trainer`` either way."""
    md = body["metadata"]
    job, ns = md["name"], md["namespace"]
    name = trainer_account_name(job)
    account = worker_account(job, ((body.get("spec") or {}).get("template") or {}).get("spec"))
    meta = {"name": name, "namespace": ns, "labels": job_labels(job), "ownerReferences": [owner_reference(body)]}
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)} if account == name else None
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": copy.deepcopy(meta),
        "rules": [
            {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [job], "verbs": ["get"]},
            {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [job], "verbs": ["get", "patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": copy.deepcopy(meta),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }
    return sa, role, binding
