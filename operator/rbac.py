"""The objects a job's workers need beside their pods: the headless Service that names
them and the ServiceAccount, Role and RoleBinding that let the chief report progress
(:func:`~rlsched.operator.resources.trainer_rbac`); made idempotently, and swept once
their TrainingJob is gone."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import controlling_job

from .api import JobRejected, create_ignoring_conflict, read_json
from .job import Job
from .resources import trainer_rbac, worker_service

log = logging.getLogger(__name__)


class Rbac:
    """A job's Service and report permission, in one namespace or all (``namespace`` None)."""

    def __init__(self, core: Any, rbac: Any, namespace: str | None) -> None:
        self.core, self.rbac, self.namespace = core, rbac, namespace

    async def ensure(self, j: Job) -> None:
        """The job's report permission (:func:`~rlsched.operator.resources.trainer_rbac`),
        idempotent; a binding of the job's that names another account (made before the
        template named its own) is replaced: the grant follows the account the pods run
        under, which the spec cannot change (the CRD holds it)."""
        sa, role, binding = trainer_rbac(j.body)
        if sa is not None:
            await create_ignoring_conflict(self.core.create_namespaced_service_account(j.ns, sa))
        await create_ignoring_conflict(self.rbac.create_namespaced_role(j.ns, role))
        if await create_ignoring_conflict(self.rbac.create_namespaced_role_binding(j.ns, binding)):
            return
        name = binding["metadata"]["name"]
        have = await read_json(self.rbac.read_namespaced_role_binding(name, j.ns, _preload_content=False))
        def who(subjects: Any) -> list[tuple]:
            return [(x.get("kind"), x.get("name"), x.get("namespace")) for x in subjects or [] if isinstance(x, Mapping)]

        if who(have.get("subjects")) != who(binding["subjects"]) or \
                (have.get("roleRef") or {}).get("name") != binding["roleRef"]["name"]:
            owner = controlling_job(have)
            if owner is None or owner.uid != j.uid:
                raise JobRejected("PodsCreated", "RoleBindingTaken",
                                  f"RoleBinding {name} exists and is not this job's: rlsched cannot grant the "
                                  f"job's report permission")
            await self.rbac.delete_namespaced_role_binding(name, j.ns)
            await self.rbac.create_namespaced_role_binding(j.ns, binding)
            log.info("%s: RoleBinding %s now binds %s", j.key, name, binding["subjects"][0]["name"])

    async def ensure_service(self, j: Job) -> None:
        """The job's headless Service (idempotent)."""
        await create_ignoring_conflict(self.core.create_namespaced_service(j.ns, worker_service(j.body)))

    async def sweep(self, uids: set[str]) -> None:
        """Delete the workers' Services and trainer ServiceAccounts/Roles/RoleBindings
        controlled by a TrainingJob that is gone (objects only labelled as the
        operator's are kept)."""
        sel = "app.kubernetes.io/managed-by=rlsched-operator"
        ns = self.namespace
        kinds = [
            (self.core.list_service_account_for_all_namespaces, self.core.list_namespaced_service_account,
             self.core.delete_namespaced_service_account),
            (self.core.list_service_for_all_namespaces, self.core.list_namespaced_service,
             self.core.delete_namespaced_service),
            (self.rbac.list_role_for_all_namespaces, self.rbac.list_namespaced_role, self.rbac.delete_namespaced_role),
            (self.rbac.list_role_binding_for_all_namespaces, self.rbac.list_namespaced_role_binding,
             self.rbac.delete_namespaced_role_binding),
        ]
        for list_all, list_ns, delete in kinds:
            call = list_ns(ns, label_selector=sel, _preload_content=False) if ns else list_all(
                label_selector=sel, _preload_content=False)
            for item in (await read_json(call))["items"]:
                owner = controlling_job(item)
                if owner is None or owner.uid in uids:
                    continue
                md = item["metadata"]
                try:
                    await delete(md["name"], md["namespace"])
                except ApiException as exc:
                    if exc.status != 404:
                        raise
