"""Pod security of TrainingJobs: which level applies to a job, and the gate the control
loop asks before a job may hold GPUs.

The level is the namespace's ``pod-security.kubernetes.io/enforce`` label, else the
operator's ``--pod-security-level``; Secrets are refused unless allowed. The pure check
is :mod:`rlsched.core.podsecurity`; :class:`PodSecurityGate` checks a job before
admission and again when its spec changes. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import (
    LABEL_ALLOW_SECRET_MOUNTS,
    LABEL_POD_SECURITY_ENFORCE,
    POD_SECURITY_LEVELS,
    POD_SECURITY_RESTRICTED,
    ShapeError,
)
from rlsched.core.podsecurity import RULE_SECRETS, Violation, check_template, parse_level, secret_references

__all__ = ["POD_SECURITY_REASON", "PodSecurityResult", "Refusal", "PodSecurityGate", "effective_level",
           "secrets_allowed", "check_job"]

log = logging.getLogger(__name__)

#: status.reason, condition reason and Event reason of a job refused here
POD_SECURITY_REASON = "PodSecurity"
#: violations listed in a message; the rest are counted
MAX_LISTED = 20


class PolicyConfig(Protocol):
    """What the gate reads of :class:`~rlsched.operator.controller.OperatorConfig`."""

    namespace: str | None
    pod_security_level: str
    allow_secret_mounts: bool


def _labels(namespace: Mapping | None) -> Mapping:
    meta = namespace.get("metadata") if isinstance(namespace, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def effective_level(namespace: Mapping | None, default: str) -> tuple[str, str]:
    """``(level, why)``: the namespace's enforce label if set, else ``default``."""
    value = _labels(namespace).get(LABEL_POD_SECURITY_ENFORCE)
    if value is None:
        return parse_level(default), f"the operator's default; the namespace has no {LABEL_POD_SECURITY_ENFORCE} label"
    if isinstance(value, str) and value in POD_SECURITY_LEVELS:
        return value, f"namespace label {LABEL_POD_SECURITY_ENFORCE}={value}"
    return POD_SECURITY_RESTRICTED, (f"namespace label {LABEL_POD_SECURITY_ENFORCE}={value!r:.40} is not a level "
                                     f"({', '.join(POD_SECURITY_LEVELS)}); {POD_SECURITY_RESTRICTED} applies")


def secrets_allowed(namespace: Mapping | None, config: PolicyConfig) -> bool:
    """Whether the job's template may read Secrets: the operator allows it for all
    namespaces, or the namespace is labelled ``rlsched.dev/allow-secret-mounts=true``."""
    return bool(config.allow_secret_mounts) or _labels(namespace).get(LABEL_ALLOW_SECRET_MOUNTS) == "true"


@dataclass(frozen=True)
class PodSecurityResult:
    """The verdict on one job's pod template."""

    level: str
    #: why this level applies (namespace label, operator default, namespace unreadable)
    why: str
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def message(self) -> str:
        """One line for the job's condition and Event."""
        listed = "; ".join(str(v) for v in self.violations[:MAX_LISTED])
        more = len(self.violations) - MAX_LISTED
        if more > 0:
            listed += f"; and {more} more"
        msg = f"the worker pod template breaks pod security level {self.level} ({self.why}): {listed}"
        if any(v.level == RULE_SECRETS for v in self.violations):
            msg += (f". Secrets are refused unless the operator runs with --allow-secret-mounts or the namespace "
                    f"is labelled {LABEL_ALLOW_SECRET_MOUNTS}=true")
        return msg


def check_job(body: Mapping, namespace: Mapping | None, config: PolicyConfig, *,
              namespace_error: str | None = None) -> PodSecurityResult:
    """Check the TrainingJob ``body``'s pod template against the level of its namespace
    (the namespace object as the API serves it; ``None`` when there is none, and with
    ``namespace_error`` when it could not be read: the operator's default applies)."""
    level, why = effective_level(namespace, config.pod_security_level)
    if namespace_error is not None:
        why = f"the operator's default; the namespace could not be read: {namespace_error}"
    spec = body.get("spec") if isinstance(body, Mapping) else None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    try:
        found = check_template(template, level)
        if not secrets_allowed(namespace, config):
            found += secret_references((template or {}).get("spec"))
    except ShapeError as exc:  # the template is not an object at all: refuse, say why
        found = [Violation(level, "Shape", str(exc), "spec.template")]
    return PodSecurityResult(level=level, why=why, violations=tuple(found))


@dataclass(frozen=True)
class Refusal:
    """A job the gate does not let through: ``final`` ones are failed; the others
    (namespace unreadable) wait in the queue and are checked again next cycle."""

    message: str
    final: bool


class PodSecurityGate:
    """The control loop's pod-security check, with the namespaces read once per cycle."""

    def __init__(self, core: Any, read_json: Callable[[Any], Awaitable[Any]], config: PolicyConfig) -> None:
        parse_level(config.pod_security_level)  # a bad default is a start-up error, not a per-job one
        self.core = core
        self.read_json = read_json
        self.config = config
        self._lock = asyncio.Lock()
        self._cycle: int | None = None
        self._namespaces: dict[str, dict] | None = None
        self._error: str | None = None
        #: uid -> metadata.generation whose template passed; pruned to the jobs seen last cycle
        self._passed: dict[str, Any] = {}
        self._seen: set[str] = set()
        self._seen_cycle: int | None = None

    async def check(self, body: Mapping, cycle: int) -> Refusal | None:
        """``None`` when the job may go on; a :class:`Refusal` otherwise. ``cycle``
        identifies the control-loop cycle (namespaces are cached for one)."""
        phase = (body.get("status") or {}).get("phase")
        md = body["metadata"]
        uid, generation = md.get("uid"), md.get("generation")
        self._note_seen(uid, cycle)
        if phase in ("Starting", "Running"):
            passed = self._passed.get(uid, generation if generation in (None, 1) else None)
            if passed == generation:  # spec unchanged since it was admitted
                self._passed[uid] = generation
                return None
        elif phase != "Queued":
            return None
        namespaces, error = await self._read_namespaces(cycle)
        result = check_job(body, (namespaces or {}).get(md["namespace"]), self.config, namespace_error=error)
        if result.ok:
            self._passed[uid] = generation
            return None
        return Refusal(result.message(), final=error is None)

    def _note_seen(self, uid: str, cycle: int) -> None:
        if cycle != self._seen_cycle:
            self._passed = {u: g for u, g in self._passed.items() if u in self._seen}
            self._seen, self._seen_cycle = set(), cycle
        self._seen.add(uid)

    async def _read_namespaces(self, cycle: int) -> tuple[dict[str, dict] | None, str | None]:
        async with self._lock:
            if self._cycle != cycle:
                self._namespaces, self._error = await self._load()
                self._cycle = cycle
            return self._namespaces, self._error

    async def _load(self) -> tuple[dict[str, dict] | None, str | None]:
        """Namespace objects by name (the watched one, or all); ``(None, why)`` when
        they cannot be read."""
        ns = self.config.namespace
        try:
            if ns:
                try:
                    return {ns: await self.read_json(self.core.read_namespace(ns, _preload_content=False))}, None
                except ApiException as exc:
                    if exc.status == 404:
                        return {}, None
                    raise
            items = (await self.read_json(self.core.list_namespace(_preload_content=False)))["items"]
            return {item["metadata"]["name"]: item for item in items}, None
        except ApiException as exc:
            why = f"API {exc.status} {exc.reason}"
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
            why = repr(exc)
        log.warning("namespaces unreadable (%s); pod security level %s applies to every job this cycle",
                    why[:300], self.config.pod_security_level)
        return None, why[:300]
