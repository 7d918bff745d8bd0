"""Running the operator: in-process (tests, ``asyncio``) or as a blocking call (CLI)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from importlib import resources
from pathlib import Path

import kopf

from .controller import OperatorConfig
from .handlers import OperatorRuntime, build_registry

__all__ = ["operator", "run", "crd_path", "peering_crd_path"]


def crd_path() -> Path:
    """The TrainingJob CRD manifest shipped with the package."""
    return Path(str(resources.files("rlsched.operator").joinpath("crd/trainingjob.yaml")))


def peering_crd_path() -> Path:
    """kopf's peering CRDs (for HA with ``--peering``)."""
    return Path(str(resources.files("rlsched.operator").joinpath("crd/kopf-peering.yaml")))


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
