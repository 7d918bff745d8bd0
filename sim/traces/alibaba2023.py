"""``alibaba2023:<list>``: the Alibaba GPU cluster trace 2023 (openb).

``openb_pod_list_<list>.csv`` and ``openb_node_list_gpu_node.csv`` in
``<data-dir>/alibaba-gpu-2023``. One pod is one job of one worker × ``num_gpu`` GPUs;
GPU-sharing pods (``gpu_milli`` < 1000) count as one whole GPU; pods without GPUs are
skipped and counted; ``gpu_spec`` (``A|B``) restricts GPU models. The re-sampled lists
without times (``multigpu20``) arrive 1 s apart in file order and run
:data:`TIMELESS_DURATION` s each. Nodes are grouped :data:`NODES_PER_RACK` to a rack.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rlsched.core import Topology

from ..job import JobSpec
from .common import NODES_PER_RACK, Rows, Trace, TraceError, need_dir, parse_float, parse_int, racked, shift_to_zero

__all__ = ["FORM", "SUBDIR", "TIMELESS_DURATION", "NODES_PER_RACK", "load", "read"]

FORM = "alibaba2023:<list>"
#: the trace's folder under the data folder
SUBDIR = "alibaba-gpu-2023"
#: run time given to pods of the openb lists that carry no times (multigpu20)
TIMELESS_DURATION = 3600.0


def load(arg: str, ddir: Path | None, skip_bad: bool) -> Trace:
    """The pod list ``arg`` (``default`` when empty) from the data folder."""
    return read(arg or "default", need_dir(ddir, SUBDIR), skip_bad)


def read(name: str, folder: Path, skip_bad: bool) -> Trace:
    trace = Trace(f"alibaba2023:{name}", [])
    nodes: list[dict] = []

    def node(line: int, r: dict) -> None:
        gpus = parse_int(r["gpu"], "gpu")
        if gpus < 0:
            raise ValueError(f"negative gpu count {gpus}")
        if gpus == 0:
            return
        nodes.append(
            dict(
                name=r["sn"] or f"line-{line}",
                gpus=gpus,
                gpu_model=r["model"] or "unknown",
                cpu_milli=parse_int(r["cpu_milli"], "cpu_milli"),
                memory_mib=parse_int(r["memory_mib"], "memory_mib"),
            )
        )

    Rows(folder / "openb_node_list_gpu_node.csv", trace, skip_bad, header=True).each(node)
    trace.topology = Topology(racked(nodes))

    pods = folder / f"openb_pod_list_{name}.csv"
    if not pods.exists():
        known = sorted(p.name[len("openb_pod_list_") : -4] for p in folder.glob("openb_pod_list_*.csv"))
        raise TraceError(f"{pods}: no such pod list; known: {', '.join(known)}")
    sharing = 0
    with open(pods, newline="") as f:
        header = next(csv.reader(f), [])
    timeless = "creation_time" not in header
    if timeless:
        trace.notes.append(
            f"{pods.name} has no times: pods arrive 1 s apart in file order and run {TIMELESS_DURATION:.0f} s each"
        )

    def pod(line: int, r: dict) -> None:
        nonlocal sharing
        num_gpu = parse_int(r["num_gpu"], "num_gpu")
        if num_gpu < 0:
            raise ValueError(f"negative num_gpu {num_gpu}")
        if num_gpu == 0:
            trace.skip("no_gpu")
            return
        milli = parse_int(r["gpu_milli"], "gpu_milli") if r.get("gpu_milli") else 1000
        if milli < 1000:
            sharing += 1
        if timeless:  # the re-sampled lists carry no times: arrive 1 s apart, in order
            created = began = float(line - 2)
            deleted = began + TIMELESS_DURATION
        else:
            created = parse_float(r["creation_time"], "creation_time")
            deleted = parse_float(r["deletion_time"], "deletion_time")
            sched = r.get("scheduled_time") or ""
            began = parse_float(sched, "scheduled_time") if sched else created
            if deleted < began:
                raise ValueError(f"deletion_time {deleted} before start {began}")
        spec = r.get("gpu_spec") or ""
        models = frozenset(m for m in spec.split("|") if m) or None
        trace.jobs.append(
            JobSpec(
                id=r["name"] or f"line-{line}",
                submit_time=created,
                workers=1,
                gpus_per_worker=num_gpu,
                gpu_models=models,
                cpu_milli=parse_int(r["cpu_milli"], "cpu_milli"),
                memory_mib=parse_int(r["memory_mib"], "memory_mib"),
                queue="normal",
                duration=max(deleted - began, 1.0),
            )
        )

    Rows(pods, trace, skip_bad, header=True).each(pod)
    trace.notes.append(
        f"{sharing} GPU-sharing pods (gpu_milli < 1000) count as one whole GPU; "
        f"{trace.skipped.get('no_gpu', 0)} pods without GPUs skipped"
    )
    shift_to_zero(trace)
    return trace
