"""The one HTTP probe of the dev tooling: health and readiness endpoints."""

from __future__ import annotations

import http.client
import ssl
import urllib.request

__all__ = ["http_ok"]


def http_ok(url: str, context: ssl.SSLContext | None = None, *, expect: str | None = None,
            timeout: float = 2.0) -> bool:
    """True when ``GET url`` answers 2xx (and its body contains ``expect``, if given).

    ``context``: TLS settings for an ``https`` URL (a client certificate, a CA).
    Connection errors, TLS errors and error statuses all read as "not (yet) ok".
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            if not 200 <= resp.status < 300:
                return False
            return expect is None or expect in resp.read().decode(errors="replace")
    except (OSError, ValueError, http.client.HTTPException):  # URLError and SSLError are OSErrors
        return False
