"""The kwok controller as a local process, and the Stages it plays.

kwok makes the fake GPU nodes behave like kubelets: our Stages (the package data file
``kwok-stages.yaml``) make nodes Ready (their heartbeat is kwok's node lease), bound pods Running, pods
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
    "NODE_LEASE_DURATION_S",
    "NODE_MONITOR_GRACE_S",
    "kwok_config",
    "kwok_stages",
]

DURATION_ANNOTATION = ANNOTATION_DURATION  # the stage YAML spells it too (data)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"


def kwok_stages() -> str:
    """The Stage manifests kwok plays (YAML documents, from the package data)."""
    return resources.files(__package__).joinpath("kwok-stages.yaml").read_text()


#: kwok's node lease: renewed every quarter of it (as a kubelet does). The lease is
#: the nodes' heartbeat (the node lifecycle controller reads it, see
#: ``NODE_MONITOR_GRACE_S``); the Ready condition's own heartbeat (the
#: ``rlsched-node-heartbeat`` Stage) is kubelet's 5-minute status report. 1,000
#: nodes then cost ~33 lease writes/s instead of 100 (40 s) plus 30-50 node status
#: writes/s that every scheduler re-reads.
NODE_LEASE_DURATION_S = 120
#: what the kube-controller-manager must wait for a lease renewal before it calls a
#: node unhealthy: a full lease, four renewal periods (a busy 2-core machine delays
#: kwok's renewals by seconds)
NODE_MONITOR_GRACE_S = NODE_LEASE_DURATION_S
#: kwok's workers per kind: node leases, node Stages, pod Stages, pods-on-node syncs.
#: kwok does no client-side rate limiting, so these bound its requests in flight.
#: 16 node workers bring 1,000 new nodes to Ready in seconds (4, kwok's default,
#: takes tens of seconds behind a busy API server).
NODE_PARALLELISM = 16
POD_PARALLELISM = 16


def kwok_config(stages: str) -> str:
    """kwok's ``--config`` file: its options, then the ``stages`` documents."""
    conf = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE_ANNOTATION}=fake",
            "nodeLeaseDurationSeconds": NODE_LEASE_DURATION_S,
            # kwok leaves these at 0 (and refuses to start) when read from a file
            "nodeLeaseParallelism": NODE_PARALLELISM,
            "podPlayStageParallelism": POD_PARALLELISM,
            "nodePlayStageParallelism": NODE_PARALLELISM,
            "podsOnNodeSyncParallelism": 4,
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
