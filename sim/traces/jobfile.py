"""``<path>.yaml|.yml|.json``: a job list, ``{"cluster": <Topology.from_dict>, "jobs":
[JobSpec fields...]}`` or a bare list of jobs."""

from __future__ import annotations

import json
from pathlib import Path

from rlsched.core import Topology

from ..job import JobSpec
from .common import Trace, TraceError

__all__ = ["SUFFIXES", "read"]

SUFFIXES = (".yaml", ".yml", ".json")


def read(path: Path) -> Trace:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from exc
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise their own error types
        raise TraceError(f"{path}: cannot parse: {exc}") from exc
    topo = None
    if isinstance(data, dict):
        if "cluster" in data:
            try:
                topo = Topology.from_dict(data["cluster"])
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}: cluster: {exc}") from exc
        data = data.get("jobs")
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a list of jobs (or a mapping with 'jobs')")
    jobs = []
    for k, d in enumerate(data, 1):
        try:
            if not isinstance(d, dict):
                raise ValueError("job entry must be a mapping")
            jobs.append(JobSpec.from_dict(d))
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}: job #{k}: {exc}") from exc
    return Trace(str(path), jobs, topo)
