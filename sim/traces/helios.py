"""``helios:<file>``: SenseTime Helios ``cluster_log.csv``."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from ..job import JobSpec
from .common import Rows, Trace, parse_float, parse_int, resolve, shift_to_zero

__all__ = ["FORM", "load", "read"]

FORM = "helios:<file>"


def load(arg: str, ddir: Path | None, skip_bad: bool) -> Trace:
    """The file ``arg`` (absolute, relative or under the data folder)."""
    return read(resolve(arg, ddir), skip_bad)


def _time(s: str, what: str) -> float:
    if not s:
        raise ValueError(f"missing {what}")
    try:
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return parse_float(s, what)  # some releases carry epoch seconds


def read(path: Path, skip_bad: bool) -> Trace:
    """``cluster_log.csv`` (header: job_id, user, vc, jobname, gpu_num, cpu_num,
    node_num, state, submit_time, start_time, end_time, duration, queue; only
    job_id, gpu_num, node_num, submit_time and duration or start/end_time are needed).
    Workers = node_num, GPUs per worker = ceil(gpu_num / node_num)."""
    trace = Trace(f"helios:{path}", [])

    def row(line: int, r: dict) -> None:
        gpus = parse_int(r.get("gpu_num"), "gpu_num")
        if gpus < 0:
            raise ValueError(f"negative gpu_num {gpus}")
        if gpus == 0:
            trace.skip("no_gpu")
            return
        nodes = max(parse_int(r.get("node_num") or "1", "node_num"), 1)
        sub = _time(r.get("submit_time", ""), "submit_time")
        if r.get("duration"):
            dur = parse_float(r["duration"], "duration")
        else:
            dur = _time(r.get("end_time", ""), "end_time") - _time(r.get("start_time", ""), "start_time")
        if dur < 0:
            raise ValueError(f"negative duration {dur}")
        if dur == 0:
            trace.skip("zero_duration")
            return
        trace.jobs.append(
            JobSpec(
                id=str(r.get("job_id") or f"line-{line}"),
                submit_time=sub,
                workers=nodes,
                gpus_per_worker=math.ceil(gpus / nodes),
                duration=dur,
            )
        )

    Rows(path, trace, skip_bad, header=True).each(row)
    shift_to_zero(trace)
    return trace
