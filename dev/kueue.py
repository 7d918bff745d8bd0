"""Kueue's controller manager on the local control plane (dev and tests only).

Kueue (kubernetes-sigs/kueue) is built from its Go module by ``tools/build.sh`` (part
``kueue``: the ``kueue`` binary and, beside it, the CRDs of the same release in
``kueue-crds/``). :class:`KueueManager` installs those CRDs and runs the manager as a
process against a cluster's API server, configured for rlsched:

* ``integrations.externalFrameworks: [TrainingJob.v1alpha1.rlsched.dev]``: the
  rlsched operator creates and obeys the Workloads of its jobs (``operator/kueue.py``);
* no leader election, no internal certificate management: the webhook server gets a
  self-signed serving certificate made here. Kueue's webhook configurations are not
  installed (the API server of the local control plane cannot reach a Service), so
  Kueue's defaulting and validation of its own objects do not run; the tests create
  complete objects;
* health probes and metrics on free local ports; no visibility server (its on-demand
  API needs an APIService and certificates: feature gate ``VisibilityOnDemand=false``);
* its metrics certificate where Kueue 0.17 reads it without internal certificate
  management, the fixed path ``/etc/kueue/metrics/certs`` (its Deployment mounts a
  Secret there): as a pod's volume would, in a private mount namespace of the manager
  alone (``unshare --mount``; ``/etc`` overlaid on a tmpfs there), so nothing of the
  machine's ``/etc`` changes. This needs root (CAP_SYS_ADMIN), as CI and this machine
  have; without it :meth:`KueueManager.start` raises saying so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from .probe import http_ok
from .proc import ClusterError, Process, free_ports, wait_for

__all__ = ["KueueManager", "find_kueue", "EXTERNAL_FRAMEWORK"]

#: where Kueue's manager reads its metrics serving certificate (not configurable in 0.17)
METRICS_CERTS = "/etc/kueue/metrics/certs"
#: how Kueue's configuration names the TrainingJob kind (Kind.version.group)
EXTERNAL_FRAMEWORK = "TrainingJob.v1alpha1.rlsched.dev"


def find_kueue(bin_dir: Path) -> tuple[Path, Path]:
    """(the ``kueue`` binary, its CRD folder) in the tools' bin directory; ClusterError
    naming the build step when they are missing."""
    exe, crds = bin_dir / "kueue", bin_dir / "kueue-crds"
    if not exe.is_file() or not crds.is_dir():
        raise ClusterError(f"kueue missing from {bin_dir}: run `make tools` (tools/build.sh builds it)")
    return exe, crds


class KueueManager:
    """Kueue's manager for one cluster: :meth:`start` installs its CRDs and runs it,
    :meth:`stop` ends it (the CRDs stay)."""

    def __init__(self, bin_dir: Path, kubeconfig: str, workdir: Path) -> None:
        self.exe, self.crds = find_kueue(Path(bin_dir))
        self.kubeconfig, self.workdir = kubeconfig, Path(workdir)
        self.proc: Process | None = None

    def install_crds(self, api_client) -> list[str]:
        """Create (or keep) Kueue's CRDs and wait until each is Established."""
        from rlsched.operator.main import install_crd

        return [install_crd(api_client, path, timeout_s=60) for path in sorted(self.crds.glob("*.yaml"))]

    def _certs(self) -> Path:
        from .pki import _openssl

        d = self.workdir / "certs"
        d.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", "tls.key", "-out", "tls.crt", "-days", "2", "-subj", "/CN=kueue-webhook",
                 "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd=d)
        return d

    def config(self, webhook_port: int, health_port: int, metrics_port: int, certs: Path) -> dict:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
        }

    def start(self, api_client, timeout_s: float = 90.0) -> None:
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            raise ClusterError("Kueue's manager needs its metrics certificate at "
                               f"{METRICS_CERTS}; the dev runner mounts it in a private mount namespace, "
                               "which needs root and util-linux's unshare")
        self.install_crds(api_client)
        webhook, health, metrics = free_ports(3)
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = self._certs()
        cfg = self.workdir / "kueue-config.yaml"
        cfg.write_text(yaml.safe_dump(self.config(webhook, health, metrics, certs), sort_keys=False))
        ovl = self.workdir / "overlay"
        ovl.mkdir(exist_ok=True)
        script = (
            "set -e; "
            f"mount -t tmpfs tmpfs {ovl}; mkdir {ovl}/upper {ovl}/work; "
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={ovl}/upper,workdir={ovl}/work /etc; "
            f"mkdir -p {METRICS_CERTS}; cp {certs}/tls.crt {certs}/tls.key {METRICS_CERTS}/; "
            f'exec "$0" "$@"')
        self.proc = Process("kueue", [unshare, "--mount", "--propagation", "private", "sh", "-c", script,
                                      str(self.exe), f"--config={cfg}", f"--kubeconfig={self.kubeconfig}",
                                      "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"],
                            self.workdir / "kueue.log")
        self.proc.start(cwd=self.workdir)
        ready = f"http://127.0.0.1:{health}/readyz"
        wait_for(lambda: http_ok(ready), timeout_s, "Kueue's manager /readyz", self.proc, every=0.3)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
