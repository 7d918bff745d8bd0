"""Live views in the short form the allocation tests write them."""

from __future__ import annotations

from typing import Any

from rlsched.core.cluster import JobView


def view(id: str, submit_time: float, min_workers: int, max_workers: int, **fields: Any) -> JobView:
    """A job's live view (:class:`~rlsched.core.cluster.JobView`): its id, submit time
    and worker range first, the rest by name. A running job has ``placement``: the
    node of each worker."""
    return JobView(id=id, submit_time=submit_time, min_workers=min_workers, max_workers=max_workers, **fields)
