"""Certificates and the admin kubeconfig of the local control plane (openssl, EC P-256)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

from .proc import ClusterError

__all__ = ["admin_kubeconfig", "make_pki"]


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ClusterError("openssl is needed to create the cluster's certificates")
    res = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()}")


_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, IP:10.96.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""


def make_pki(pki: Path) -> None:
    """CA, API server serving cert, admin client cert, service-account key (EC P-256)."""
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "openssl.cnf").write_text(_OPENSSL_CNF)
    for key in ("ca", "server", "admin", "sa"):
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", f"{key}.key", cwd=pki)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-config", "openssl.cnf",
             "-extensions", "ca", "-subj", "/CN=rlsched-devcluster-ca", "-days", "3650",
             "-out", "ca.crt", cwd=pki)
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", "server"),
        ("admin", "/O=system:masters/CN=rlsched-admin", "client"),
    ):
        _openssl("req", "-new", "-key", f"{name}.key", "-config", "openssl.cnf",
                 "-subj", subj, "-out", f"{name}.csr", cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "365",
                 "-extfile", "openssl.cnf", "-extensions", ext, "-out", f"{name}.crt", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def admin_kubeconfig(server: str, pki: Path, name: str = "rlsched-dev") -> dict:
    b64 = lambda p: base64.b64encode((pki / p).read_bytes()).decode()  # noqa: E731
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }
