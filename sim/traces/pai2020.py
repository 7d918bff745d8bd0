"""``pai2020:<dir>``: the Alibaba PAI 2020 trace.

Header-less ``pai_job_table.csv``, ``pai_task_table.csv`` and ``pai_machine_spec.csv``
with the upstream columns (:data:`PAI_JOB_COLUMNS`, :data:`PAI_TASK_COLUMNS`,
:data:`PAI_MACHINE_COLUMNS`); ``<dir>`` absolute or under the data folder.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlsched.core import Topology

from ..job import JobSpec
from .common import Rows, Trace, parse_float, parse_int, racked, resolve, shift_to_zero

__all__ = ["FORM", "PAI_JOB_COLUMNS", "PAI_TASK_COLUMNS", "PAI_MACHINE_COLUMNS", "load", "read"]

FORM = "pai2020:<dir>"
PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK_COLUMNS = (
    "job_name", "task_name", "inst_num", "status", "start_time", "end_time",
    "plan_cpu", "plan_mem", "plan_gpu", "gpu_type",
)
PAI_MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")


def load(arg: str, ddir: Path | None, skip_bad: bool) -> Trace:
    """The folder ``arg`` (absolute, relative or under the data folder)."""
    return read(resolve(arg, ddir), skip_bad)


def read(folder: Path, skip_bad: bool) -> Trace:
    """One job per GPU task (``job_name/task_name``): ``inst_num`` workers of
    ``ceil(plan_gpu / 100)`` GPUs (plan_gpu is percent of one GPU; sharing tasks count
    as one GPU); submit = the job's start_time; duration = task end − start.
    plan_cpu is percent of a core (×10 → milli-CPU), plan_mem and cap_mem GB."""
    trace = Trace(f"pai2020:{folder}", [])

    def cols(row: list[str], names: tuple[str, ...]) -> dict[str, str]:
        if len(row) != len(names):
            raise ValueError(f"expected {len(names)} columns ({', '.join(names)}), got {len(row)}")
        return dict(zip(names, row))

    nodes: list[dict] = []

    def machine(line: int, row: list[str]) -> None:
        r = cols(row, PAI_MACHINE_COLUMNS)
        gpus = parse_int(r["cap_gpu"], "cap_gpu")
        if gpus <= 0:
            return
        nodes.append(
            dict(
                name=r["machine"] or f"line-{line}",
                gpus=gpus,
                gpu_model=r["gpu_type"] or "unknown",
                cpu_milli=int(parse_float(r["cap_cpu"], "cap_cpu") * 1000),
                memory_mib=int(parse_float(r["cap_mem"], "cap_mem") * 1024),
            )
        )

    Rows(folder / "pai_machine_spec.csv", trace, skip_bad, header=False).each(machine)
    trace.topology = Topology(racked(nodes)) if nodes else None

    submit: dict[str, float] = {}

    def job(line: int, row: list[str]) -> None:
        r = cols(row, PAI_JOB_COLUMNS)
        if r["start_time"]:
            submit[r["job_name"]] = parse_float(r["start_time"], "start_time")

    Rows(folder / "pai_job_table.csv", trace, skip_bad, header=False).each(job)

    def task(line: int, row: list[str]) -> None:
        r = cols(row, PAI_TASK_COLUMNS)
        plan_gpu = parse_float(r["plan_gpu"], "plan_gpu") if r["plan_gpu"] else 0.0
        if plan_gpu <= 0:
            trace.skip("no_gpu")
            return
        if not r["start_time"] or not r["end_time"]:
            trace.skip("no_time")
            return
        start, end = parse_float(r["start_time"], "start_time"), parse_float(r["end_time"], "end_time")
        if end < start:
            raise ValueError(f"end_time {end} before start_time {start}")
        gtype = r["gpu_type"]
        trace.jobs.append(
            JobSpec(
                id=f"{r['job_name']}/{r['task_name']}",
                submit_time=min(submit.get(r["job_name"], start), start),
                workers=max(parse_int(r["inst_num"], "inst_num"), 1),
                gpus_per_worker=max(math.ceil(plan_gpu / 100.0), 1),
                gpu_models=frozenset([gtype]) if gtype and gtype != "MISC" else None,
                cpu_milli=int(parse_float(r["plan_cpu"], "plan_cpu") * 10) if r["plan_cpu"] else 0,
                memory_mib=int(parse_float(r["plan_mem"], "plan_mem") * 1024) if r["plan_mem"] else 0,
                duration=max(end - start, 1.0),
            )
        )

    Rows(folder / "pai_task_table.csv", trace, skip_bad, header=False).each(task)
    shift_to_zero(trace)
    return trace
