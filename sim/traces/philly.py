"""``philly:<file>``: Microsoft Philly ``cluster_job_log`` (a JSON list of jobs)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ..job import JobSpec
from .common import Trace, TraceError, bad_row, resolve, shift_to_zero

__all__ = ["FORM", "load", "read"]

FORM = "philly:<file>"


def load(arg: str, ddir: Path | None, skip_bad: bool) -> Trace:
    """The file ``arg`` (absolute, relative or under the data folder)."""
    return read(resolve(arg, ddir), skip_bad)


def _time(s, what: str) -> float | None:
    if s is None or s == "None" or s == "":
        return None
    if not isinstance(s, str):
        raise ValueError(f"{what} is not a time string: {s!r}")
    try:
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        raise ValueError(f"{what} is not 'YYYY-MM-DD HH:MM:SS': {s!r}") from None


def read(path: Path, skip_bad: bool) -> Trace:
    """``cluster_job_log``: a JSON list of jobs with ``jobid``, ``submitted_time``,
    ``status`` and ``attempts`` [{start_time, end_time, detail: [{ip, gpus: [...]}]}].
    Workers = machines of the last attempt, GPUs per worker = most GPUs on one of
    them; duration = last attempt end − first attempt start. The "line" of an error
    is the job's 1-based position in the list."""
    trace = Trace(f"philly:{path}", [])
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of jobs")
    for line, j in enumerate(data, 1):
        try:
            if not isinstance(j, dict) or "jobid" not in j:
                raise ValueError("job entry needs a 'jobid'")
            sub = _time(j.get("submitted_time"), "submitted_time")
            attempts = j.get("attempts") or []
            if not isinstance(attempts, list):
                raise ValueError("attempts must be a list")
            if sub is None or not attempts:
                trace.skip("no_attempt")
                continue
            starts = [_time(a.get("start_time"), "start_time") for a in attempts]
            ends = [_time(a.get("end_time"), "end_time") for a in attempts]
            detail = attempts[-1].get("detail") or []
            if starts[0] is None or ends[-1] is None or not detail:
                trace.skip("no_time")
                continue
            gpw = max(len(d.get("gpus") or []) for d in detail)
            if gpw == 0:
                trace.skip("no_gpu")
                continue
            if ends[-1] < starts[0]:
                raise ValueError("last end_time before first start_time")
            trace.jobs.append(
                JobSpec(
                    id=str(j["jobid"]),
                    submit_time=sub,
                    workers=len(detail),
                    gpus_per_worker=gpw,
                    duration=max(ends[-1] - starts[0], 1.0),
                )
            )
        except (ValueError, TypeError, AttributeError) as exc:
            bad_row(trace, path, line, exc, skip_bad)
    shift_to_zero(trace)
    return trace
