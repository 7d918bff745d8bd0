"""The aiohttp layer: decode, call :class:`~rlsched.extender.service.Extender`, encode.

Endpoints: ``POST /filter``, ``POST /prioritize``, ``POST /bind`` (kube-scheduler
extender/v1 JSON; bind needs API access),
``GET /healthz``, ``/readyz``, ``/metrics``, ``/version`` and
``/debug/pods/{namespace}/{name}`` (why a pod got the scores it got). Malformed
requests get 400, bodies over ``max_body`` 413, bodies that do not arrive within
``read_timeout`` seconds 408, all with ``{"Error": message}``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiohttp import web

from ..core.contract import ShapeError
from .service import Extender
from .wire import PriorityEncoder, decode_args, decode_binding, encode_binding, encode_filter

__all__ = ["make_app", "DEFAULT_MAX_BODY", "EXTENDER_KEY"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 10 * 1024 * 1024
EXTENDER_KEY = web.AppKey("extender", Extender)
_JSON = "application/json"


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"Error": message}), content_type=_JSON)


def make_app(
    extender: Extender,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    read_timeout: float = 10.0,
    version: dict | None = None,
) -> web.Application:
    """An aiohttp application serving ``extender``."""
    if max_body < 1 or read_timeout <= 0:
        raise ValueError("max_body and read_timeout must be positive")
    app = web.Application(client_max_size=max_body)
    app[EXTENDER_KEY] = extender
    metrics = extender.metrics
    info = {"policy": extender.policy.name, "model_version": extender.model_version or None,
            "policy_fallback": extender.policy_fallback, **(version or {})}

    async def read_args(request: web.Request, decode):
        if request.content_length is not None and request.content_length > max_body:
            raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=request.content_length)
        body = await asyncio.wait_for(request.read(), read_timeout)
        return decode(body)

    def verb_handler(verb: str, decide, encode, decode=decode_args):
        async def handler(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            try:
                args = await read_args(request, decode)
                if decode is decode_args:
                    metrics.nodes.labels(verb=verb).observe(len(args.names))
                result = await decide(args)
                resp = web.Response(body=encode(args, result), content_type=_JSON)
            except ShapeError as exc:  # the request or its pod is malformed (WireError too)
                resp = _error(400, f"{verb}: {exc}")
            except web.HTTPRequestEntityTooLarge:
                resp = _error(413, f"{verb}: request body larger than {max_body} bytes")
                resp.force_close()
            except asyncio.TimeoutError:
                resp = _error(408, f"{verb}: request body not received within {read_timeout:g}s")
                resp.force_close()
            except Exception as exc:  # reported to the caller and logged, never swallowed
                log.exception("%s failed", verb)
                resp = _error(500, f"{verb}: internal error: {type(exc).__name__}: {exc}")
            metrics.duration.labels(verb=verb).observe(time.perf_counter() - t0)
            if resp.status != 200:
                metrics.errors.labels(verb=verb, code=str(resp.status)).inc()
            return resp

        return handler

    def enc_filter(args, out):
        return encode_filter(args, out.passed, out.failed, out.unresolvable)

    encode_priorities = PriorityEncoder()

    def enc_prio(args, scores):
        return encode_priorities(args.names, scores)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        cache = extender.cache
        if cache.ready:
            return web.Response(text="ok")
        missing = [k for k, v in cache.synced.items() if not v]
        return web.Response(status=503, text=f"cache not synced: {', '.join(missing)}")

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def version_handler(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(info), content_type=_JSON)

    async def debug_pod(request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        doc = extender.explain(key)
        if doc is None:
            return _error(404, f"no filter/prioritize call seen for pod {key}")
        return web.Response(body=orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), content_type=_JSON)

    app.router.add_post("/filter", verb_handler("filter", extender.filter, enc_filter))
    app.router.add_post("/prioritize", verb_handler("prioritize", extender.prioritize, enc_prio))
    app.router.add_post("/bind", verb_handler("bind", extender.bind, lambda a, err: encode_binding(err), decode_binding))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/version", version_handler)
    app.router.add_get("/debug/pods/{namespace}/{name}", debug_pod)
    return app
