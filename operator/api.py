"""What the operator makes of the API server's answers: JSON bodies read raw, a
conflict on create taken as "already there", and a refused worker pod classified as
the job's fault for good (it fails) or a passing one (retried next cycle)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

MERGE = "application/merge-patch+json"
#: ``Status.reason`` the API server gives for each HTTP status (when its body has none)
HTTP_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "AlreadyExists",
                410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                503: "ServiceUnavailable", 504: "Timeout"}


class JobRejected(Exception):
    """A job cannot go on: the API server refused its worker pods for good, or its pod
    could not be built. The job fails with condition ``ctype=False``, ``reason`` and
    ``message``."""

    def __init__(self, ctype: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.ctype, self.reason, self.message = ctype, reason, message


def api_error(exc: ApiException) -> tuple[str, str]:
    """``(reason, message)`` of an API error: the ``reason`` and ``message`` of the
    ``Status`` object in its body when there is one, else from the HTTP status."""
    reason = message = None
    body = getattr(exc, "body", None)
    if body:
        try:
            st = json.loads(body)
        except ValueError:
            st = None
            message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:500]
        if isinstance(st, dict):
            reason = st.get("reason") if isinstance(st.get("reason"), str) else None
            message = st.get("message") if isinstance(st.get("message"), str) else message
    reason = reason or HTTP_REASONS.get(exc.status or 0) or ("ServerError" if (exc.status or 0) >= 500 else "ApiError")
    message = message or str(exc.reason or f"HTTP {exc.status}")
    return reason, message


def permanent_rejection(status: int | None, message: str) -> bool:
    """Whether the API server's refusal of a pod would repeat for the same pod: 400,
    422, and 403 except quota (``exceeded quota``, may free up) and the operator's own
    RBAC (``cannot create resource``, fixed by an administrator, not by the job)."""
    if status in (400, 422):
        return True
    if status == 403:
        return "exceeded quota" not in message and "cannot create resource" not in message
    return False


async def read_json(coro) -> Any:
    """Await a ``_preload_content=False`` call and decode its JSON body (raw dicts,
    camelCase, as the pure modules expect); HTTP errors raise ApiException."""
    resp = await coro
    try:
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=f"{resp.reason}: {(await resp.text())[:300]}")
        return await resp.json()
    finally:
        resp.release()


async def create_ignoring_conflict(coro) -> bool:
    """Await a create call; True when it created the object, False when one of that
    name exists (409)."""
    try:
        await coro
        return True
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
