"""Where the dev tooling finds the programs it runs; no machine path is written in.

The control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok; helm and kubectl beside them) are built from Go modules by
``make tools`` into a versioned cache (``tools/build.sh``, docs/control-plane.md).
Prometheus is an ordinary program on ``PATH`` (Debian's package: ``make prometheus``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .proc import ClusterError

__all__ = ["REQUIRED_TOOLS", "find_tools", "find_program"]

REQUIRED_TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def _cache_bin() -> Path:
    cache = os.environ.get("RLSCHED_TOOLS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlsched", "tools"
    )
    return Path(cache) / "current" / "bin"


def _build_script_bin() -> Path | None:
    """``tools/build.sh --print-bin`` of the source tree in the current directory (the
    cache key of the checked-out tool versions), when there is one and Go is there."""
    script = Path.cwd() / "tools" / "build.sh"
    if not script.is_file() or not shutil.which(os.environ.get("GO", "go")):
        return None
    out = subprocess.run(["bash", str(script), "--print-bin"], capture_output=True, text=True, check=False)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def find_tools(bin_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding the control-plane binaries.

    Looked up in order: ``bin_dir``, ``$RLSCHED_TOOLS_BIN``; else ``tools/build.sh
    --print-bin`` of a source tree in the current directory, the ``current`` link the
    last build left in the tools cache (``$RLSCHED_TOOLS_CACHE``, default
    ``~/.cache/rlsched/tools``), and the directory of ``kube-apiserver`` on ``PATH``.
    Raises :class:`ClusterError` naming ``make tools`` when the binaries are missing.
    """
    candidates: list[Path] = []
    if bin_dir:
        candidates.append(Path(bin_dir))
    elif os.environ.get("RLSCHED_TOOLS_BIN"):
        candidates.append(Path(os.environ["RLSCHED_TOOLS_BIN"]))
    else:
        built = _build_script_bin()
        if built is not None:
            candidates.append(built)
        candidates.append(_cache_bin())
        on_path = shutil.which("kube-apiserver")
        if on_path:
            candidates.append(Path(on_path).parent)
    for cand in candidates:
        if all((cand / t).is_file() and os.access(cand / t, os.X_OK) for t in REQUIRED_TOOLS):
            return cand
    tried = ", ".join(str(c) for c in candidates) or "(nothing)"
    raise ClusterError(
        f"control-plane binaries not found (tried {tried}); build them with `make tools` "
        "or point RLSCHED_TOOLS_BIN at their directory"
    )


def find_program(name: str, hint: str, exe: str | os.PathLike | None = None) -> str:
    """The executable ``exe`` if given, else ``name`` on ``PATH``; :class:`ClusterError`
    with ``hint`` (how to install it) when there is none."""
    found = shutil.which(str(exe or name))
    if found is None:
        where = f"{exe}" if exe else f"{name} on PATH"
        raise ClusterError(f"{where} not found: {hint}")
    return found
