"""The kwok controller as a local process, and the Stages it plays.

kwok makes the fake GPU nodes behave like kubelets: our Stages (the package data file
``kwok-stages.yaml``) make nodes Ready with a heartbeat, bound pods Running, pods
annotated ``rlsched.dev/duration-seconds`` Succeeded after that many seconds, and
deleted pods go away.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import yaml

from rlsched.core.contract import ANNOTATION_DURATION

from .probe import http_ok
from .proc import Process, free_ports, wait_for
from .tools import find_tools

__all__ = [
    "DURATION_ANNOTATION",
    "KWOK_NODE_ANNOTATION",
    "KWOK_TAINT_KEY",
    "KwokController",
    "kwok_config",
    "kwok_stages",
]

DURATION_ANNOTATION = ANNOTATION_DURATION  # the stage YAML spells it too (data)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"


def kwok_stages() -> str:
    """The Stage manifests kwok plays (YAML documents, from the package data)."""
    return resources.files(__package__).joinpath("kwok-stages.yaml").read_text()


def kwok_config(stages: str) -> str:
    """kwok's ``--config`` file: its options, then the ``stages`` documents."""
    conf = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE_ANNOTATION}=fake",
            "nodeLeaseDurationSeconds": 40,
            # kwok leaves these at 0 (and refuses to start) when read from a file
            "nodeLeaseParallelism": 4,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 2,
        },
    }
    return yaml.safe_dump(conf, sort_keys=False) + "---\n" + stages


class KwokController:
    """The kwok controller as a local process, against any API server.

    Used by :class:`rlsched_dev.cluster.LocalCluster`, and on its own for a cluster
    handed over as a kubeconfig (kind in CI), so the fake nodes behave the same
    everywhere. ``stages``: the Stage manifests (default :func:`kwok_stages`).
    """

    def __init__(self, kubeconfig: str | os.PathLike, workdir: str | os.PathLike,
                 *, tools_bin: str | os.PathLike | None = None, stages: str | None = None,
                 port: int | None = None, log: str | os.PathLike | None = None,
                 detach: bool = False) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.bin = find_tools(tools_bin)
        self.stages = kwok_stages() if stages is None else stages
        self.port = port or free_ports(1)[0]
        self.log = Path(log) if log else self.workdir / "kwok.log"
        self.detach = detach
        self.process: Process | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "kwok.yaml"
        conf.write_text(kwok_config(self.stages))
        self.process = Process("kwok", [
            str(self.bin / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={conf}",
            f"--server-address=127.0.0.1:{self.port}", "--node-ip=10.0.0.1",
            "--cidr=10.0.0.1/16",
        ], self.log, detach=self.detach)
        self.process.start(self.workdir)

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.port}/healthz", expect="ok")

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None:
            self.process.stop(grace)

    def __enter__(self) -> "KwokController":
        self.start()
        wait_for(self.ready, 30.0, "healthz", self.process)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
