"""kopf handlers: a thin layer that translates events into the pure decisions.

:func:`build_registry` returns a fresh :class:`kopf.OperatorRegistry` closing over one
:class:`~rlsched.operator.controller.OperatorConfig` (no module-level registration, so
several operators can live in one process): login, create (validate and enqueue),
startup (control loop, metrics, LSP forecast) and cleanup. With peering only the
highest-priority peer acts. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime, timezone
from typing import Any

import kopf
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio import config as kconfig

from rlsched.core.contract import GROUP, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY_OPERATOR, PLURAL, VERSION, node_gpus
from rlsched.core.planning import DynamicPriority

from .api import read_json
from .controller import Controller, OperatorConfig
from .job import requests_count
from .metrics import OperatorMetrics
from .spec import SpecError, parse_spec
from .status import format_time, parse_time, set_condition

__all__ = ["build_registry", "OperatorRuntime", "make_api_client", "leader_of"]

log = logging.getLogger(__name__)


async def make_api_client(kubeconfig: str | None) -> kclient.ApiClient:
    """An API client from ``kubeconfig``, else in-cluster, else the default kubeconfig."""
    if kubeconfig:
        return await kconfig.new_client_from_config(config_file=kubeconfig)
    try:
        kconfig.load_incluster_config()
        return kclient.ApiClient()
    except kconfig.ConfigException:
        return await kconfig.new_client_from_config()


class OperatorRuntime:
    """What one running operator holds: API client, controller, background tasks."""

    def __init__(self, config: OperatorConfig, metrics: OperatorMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or OperatorMetrics()
        self.identity: str | None = None
        self.api: kclient.ApiClient | None = None
        self.controller: Controller | None = None
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.metrics_server: Any = None

    async def start(self) -> None:
        self.stop = asyncio.Event()
        self.api = await make_api_client(self.config.kubeconfig)
        self.controller = Controller(self.config, self.api, self.metrics)
        leader = self.is_leader if self.config.peering else None
        self.tasks.append(asyncio.create_task(self.controller.run(self.stop, leader), name="rlsched-cycle"))
        if self.config.forecast_interval_s > 0:
            self.tasks.append(asyncio.create_task(self.forecast_loop(), name="rlsched-forecast"))
        if self.config.metrics_port is not None:
            self.metrics_server = self.metrics.serve(self.config.metrics_port)
            log.info("metrics on :%d/metrics", self.metrics_server[0].server_port)

    async def close(self) -> None:
        self.stop.set()
        for t in self.tasks:
            try:
                await asyncio.wait_for(t, timeout=10)
            except asyncio.TimeoutError:
                t.cancel()
        self.tasks.clear()
        if self.metrics_server is not None:
            self.metrics_server[0].shutdown()
            self.metrics_server[0].server_close()
            self.metrics_server = None
        if self.api is not None:
            await self.api.close()
            self.api = None

    async def is_leader(self) -> bool:
        """Whether this peer is registered in the peering object and has the highest
        priority among live peers (ties: lowest id)."""
        assert self.api is not None
        custom = kclient.CustomObjectsApi(self.api)
        name = self.config.peering
        try:
            if self.config.namespace:
                obj = await custom.get_namespaced_custom_object("kopf.dev", "v1", self.config.namespace, "kopfpeerings", name)
            else:
                obj = await custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
        except kclient.exceptions.ApiException as exc:
            log.warning("peering object %s unreadable (%s); not acting", name, exc.reason)
            return False
        # not yet registered by kopf (or expired): wait rather than risk two leaders
        return leader_of(obj.get("status") or {}, datetime.now(timezone.utc).timestamp()) == self.identity

    async def forecast_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await self.forecast_once()
            except kclient.exceptions.ApiException as exc:
                log.error("forecast failed: API %s %s", exc.status, exc.reason)
            except ValueError as exc:
                log.warning("forecast skipped: %s", exc)
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=self.config.forecast_interval_s)
            except asyncio.TimeoutError:
                pass

    async def forecast_once(self) -> dict | None:
        """Forecast tomorrow's task volume from the TrainingJobs' creation days and
        write it to the ``rlsched-forecast`` ConfigMap and the metrics."""
        from rlsched.core.forecast import GRUForecaster, LSPForecast

        assert self.controller is not None
        jobs = await self.controller.list_jobs()
        nodes = await read_json(self.controller.core.list_node(_preload_content=False))
        n_nodes = max(1, sum(1 for n in nodes["items"] if node_gpus(n) > 0))
        days = sorted(
            int(t // 86400) for b in jobs if (t := parse_time(b["metadata"].get("creationTimestamp"))) is not None
        )
        if not days:
            return None
        counts = [0] * (days[-1] - days[0] + 1)
        for d in days:
            counts[d - days[0]] += 1
        gru = GRUForecaster.from_file(self.config.gru_model) if self.config.gru_model else None
        fc = LSPForecast(gru=gru).forecast(counts, [c / n_nodes for c in counts])
        tpn = fc.tasks_per_node if fc.tasks_per_node > 0 else 1.0
        nodes_rec = math.ceil(fc.volume / tpn - 1e-9) if fc.volume > 0 else 0
        self.metrics.recommended_nodes.set(nodes_rec)
        self.metrics.forecast_tasks.set(fc.volume)
        data = {
            "taskVolume": f"{fc.volume:.3f}", "arima": f"{fc.arima:.3f}",
            "gru": "" if fc.gru is None else f"{fc.gru:.3f}", "usedGru": str(fc.used_gru).lower(),
            "tasksPerNode": f"{fc.tasks_per_node:.3f}", "recommendedNodes": str(nodes_rec),
            "currentNodes": str(n_nodes), "days": str(len(counts)), "updateTime": format_time(datetime.now(timezone.utc).timestamp()),
            "note": "recommendation only; rlsched never removes nodes",
        }
        ns = self.config.namespace or self.config.forecast_namespace
        cm = {"metadata": {"name": self.config.forecast_configmap, "namespace": ns,
                           "labels": {LABEL_MANAGED_BY: MANAGED_BY_OPERATOR}}, "data": data}
        core = self.controller.core
        try:
            await core.replace_namespaced_config_map(self.config.forecast_configmap, ns, cm)
        except kclient.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            await core.create_namespaced_config_map(ns, cm)
        return data


def leader_of(peers: dict, now: float) -> str | None:
    """The live peer (``lastseen + lifetime > now``) with the highest priority, ties to
    the lowest identity; ``None`` if no peer is alive. ``peers`` is a kopf peering
    object's status: ``{identity: {priority, lifetime, lastseen}}``."""
    live = []
    for ident, peer in peers.items():
        if not isinstance(peer, dict):
            continue
        seen = parse_time(str(peer.get("lastseen", ""))) or 0.0
        if seen + float(peer.get("lifetime", 60)) > now:
            live.append((-int(peer.get("priority", 0)), ident))
    return min(live)[1] if live else None


def build_registry(config: OperatorConfig, runtime: OperatorRuntime | None = None) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers bound to ``config``."""
    registry = kopf.OperatorRegistry()
    rt = runtime or OperatorRuntime(config)
    prio = DynamicPriority(config.mu, config.promote_at, config.demote_at)

    if config.kubeconfig:

        @kopf.on.login(registry=registry)
        async def login(**_: Any) -> kopf.ConnectionInfo:
            from kubernetes import client as sclient
            from kubernetes import config as sconfig

            c = sclient.Configuration()
            sconfig.load_kube_config(config_file=config.kubeconfig, client_configuration=c)
            token = (c.api_key or {}).get("authorization", "")
            return kopf.ConnectionInfo(
                server=c.host, ca_path=c.ssl_ca_cert, insecure=not c.verify_ssl,
                certificate_path=c.cert_file, private_key_path=c.key_file,
                token=token.removeprefix("Bearer ").strip() or None, default_namespace=config.namespace,
            )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 60
        await rt.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await rt.close()

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    async def created(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        """Validate and enqueue a new TrainingJob (returns nothing: kopf would store a
        result in the status, which the CRD schema does not allow)."""
        if (body.get("status") or {}).get("phase"):
            return
        try:
            spec = parse_spec(body.get("spec"), scheduler_name=config.scheduler_name, name=body["metadata"]["name"])
        except SpecError as exc:
            msg = f"invalid TrainingJob: {exc}"
            now = datetime.now(timezone.utc).timestamp()
            patch.status["phase"] = "Failed"
            patch.status["reason"] = "InvalidSpec"
            patch.status["message"] = msg
            patch.status["conditions"] = set_condition(None, "Valid", "False", "InvalidSpec", msg, now)
            kopf.warn(body, reason="InvalidSpec", message=msg)
            raise kopf.PermanentError(msg) from exc
        now = datetime.now(timezone.utc).timestamp()
        pr = spec.priority_value
        requests = requests_count(body)
        pr, seen = prio.update(pr, requests, 0)
        queue = prio.queue(spec.priority_class, pr)
        patch.status.update({
            "phase": "Queued", "queue": queue, "effectivePriority": pr, "priorityRequestsSeen": seen,
            "queuedTime": format_time(now), "workers": 0, "readyWorkers": 0,
            "selector": f"{LABEL_JOB}={body['metadata']['name']}",
            "conditions": set_condition(None, "Valid", "True", "SpecValid", "spec accepted", now),
        })
        kopf.info(body, reason="Queued",
                  message=f"queued in {queue} (class {spec.priority_class}, priority {pr:g}, gang "
                          f"{spec.min_workers} x {spec.gpus_per_worker} GPUs)")

    return registry
