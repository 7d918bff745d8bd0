"""Running the operator: in-process (tests, ``asyncio``) or as a blocking call (CLI)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from importlib import resources
from pathlib import Path

import kopf

from .controller import OperatorConfig
from .handlers import OperatorRuntime, build_registry

__all__ = ["operator", "run", "crd_path", "queue_crd_path", "peering_crd_path", "policy_path",
           "priority_policy_path", "install_crd", "install_trainer_policy"]


def crd_path() -> Path:
    """The TrainingJob CRD manifest shipped with the package."""
    return Path(str(resources.files("rlsched.operator").joinpath("crd/trainingjob.yaml")))


def queue_crd_path() -> Path:
    """The TrainingQueue CRD manifest shipped with the package (teams' quotas)."""
    return Path(str(resources.files("rlsched.operator").joinpath("crd/trainingqueue.yaml")))


def peering_crd_path() -> Path:
    """kopf's peering CRDs (for HA with ``--peering``)."""
    return Path(str(resources.files("rlsched.operator").joinpath("crd/kopf-peering.yaml")))


def policy_path() -> Path:
    """The trainer-status ValidatingAdmissionPolicy and its binding (one YAML file, two
    documents): a job's trainer may write ``status.progress`` and nothing else of its
    TrainingJob's status. Its one source is the Helm chart, which installs it
    (``deploy/helm/rlsched/files/policies/trainer-status.yaml``); the package does not
    ship it, so this finds it in the source tree the package runs from, else raises
    :class:`FileNotFoundError` saying where it lives."""
    return _chart_policy("trainer-status")


def priority_policy_path() -> Path:
    """The priority-guard ValidatingAdmissionPolicy and its binding (one YAML file, two
    documents): only a user with the RBAC verb ``raise-priority`` on a job's TrainingQueue
    may give the job class ``highest`` or set the ``rlsched.dev/priority-requests``
    annotation. Like :func:`policy_path`, its one source is the Helm chart
    (``deploy/helm/rlsched/files/policies/priority-guard.yaml``); found in the source
    tree the package runs from, else :class:`FileNotFoundError`. Install it with
    :func:`install_trainer_policy` (``install_trainer_policy(api, priority_policy_path())``)."""
    return _chart_policy("priority-guard")


def _chart_policy(name: str) -> Path:
    """``deploy/helm/rlsched/files/policies/<name>.yaml`` of the source tree this
    package runs from; FileNotFoundError saying where it lives."""
    rel = Path("deploy", "helm", "rlsched", "files", "policies", f"{name}.yaml")
    path = Path(__file__).resolve().parents[1] / rel
    if not path.is_file():
        raise FileNotFoundError(f"{rel} (the {name} admission policy) is not next to this package; "
                                "install the Helm chart, or apply that file from an rlsched source tree")
    return path


def install_crd(api_client, path: str | Path | None = None, timeout_s: float = 30.0) -> str:
    """Create or replace the CRD of :func:`crd_path` (or ``path``) with a
    ``kubernetes.client.ApiClient`` and wait until it is Established; returns its name.
    For tests and benchmarks; clusters get it from the Helm chart."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(Path(path or crd_path()).read_text())
    name = body["metadata"]["name"]
    try:
        api.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = api.read_custom_resource_definition(name).metadata.resource_version
        api.replace_custom_resource_definition(name, body)
    deadline = time.monotonic() + timeout_s
    while not any(c.type == "Established" and c.status == "True"
                  for c in (api.read_custom_resource_definition(name).status.conditions or [])):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout_s:g} s")
        time.sleep(0.2)
    return name


def install_trainer_policy(api_client, path: str | Path | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create or replace the objects of :func:`policy_path` (or ``path``, e.g.
    :func:`priority_policy_path`: any file of ValidatingAdmissionPolicies and their
    bindings) with a ``kubernetes.client.ApiClient`` and wait until the API server has
    type-checked each policy; returns ``kind/name`` of each. For tests and the dev demo;
    clusters get them from the Helm chart."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.AdmissionregistrationV1Api(api_client)
    verbs = {
        "ValidatingAdmissionPolicy": (api.create_validating_admission_policy, api.read_validating_admission_policy,
                                      api.replace_validating_admission_policy),
        "ValidatingAdmissionPolicyBinding": (api.create_validating_admission_policy_binding,
                                             api.read_validating_admission_policy_binding,
                                             api.replace_validating_admission_policy_binding),
    }
    done, policies = [], []
    for doc in yaml.safe_load_all(Path(path or policy_path()).read_text()):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind not in verbs:
            raise ValueError(f"{path or policy_path()}: unexpected {kind} {name}")
        create, read, replace = verbs[kind]
        try:
            create(doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
            doc["metadata"]["resourceVersion"] = read(name).metadata.resource_version
            replace(name, doc)
        done.append(f"{kind}/{name}")
        if kind == "ValidatingAdmissionPolicy":
            policies.append(name)
    deadline = time.monotonic() + timeout_s
    for name in policies:
        while True:
            cur = api.read_validating_admission_policy(name)
            if cur.status is not None and cur.status.observed_generation == cur.metadata.generation:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ValidatingAdmissionPolicy {name} not type-checked after {timeout_s:g} s")
            time.sleep(0.2)
    return done


async def operator(
    config: OperatorConfig,
    *,
    runtime: OperatorRuntime | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run kopf with the rlsched handlers until ``stop_flag`` is set."""
    rt = runtime or OperatorRuntime(config)
    rt.identity = rt.identity or f"rlsched-{uuid.uuid4().hex[:8]}"
    registry = build_registry(config, rt)
    ns = config.namespace
    await kopf.operator(
        registry=registry,
        standalone=config.peering is None,
        peering_name=config.peering,
        priority=config.priority,
        clusterwide=ns is None,
        namespaces=[ns] if ns else (),
        identity=rt.identity,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run(config: OperatorConfig) -> int:
    """Blocking: run until interrupted (SIGINT/SIGTERM are handled by kopf)."""
    asyncio.run(operator(config))
    return 0
