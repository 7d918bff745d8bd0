"""The aiohttp layer: decode, call :class:`~rlsched.extender.service.Extender`, encode.

Endpoints: ``POST /filter``, ``/prioritize``, ``/bind`` (kube-scheduler extender/v1),
health, metrics, version and ``/debug`` explanations. Client errors are answered (400,
408, 413 with ``{"Error": message}``), never 500; a pod that cannot be read is
unschedulable, not an error. Details: docs/extender.md, docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ..core.contract import ShapeError
from .service import Extender, bounded
from .wire import decode_binding, encode_binding, encode_filter

__all__ = ["make_app", "DEFAULT_MAX_BODY", "EXTENDER_KEY", "CLIENT_CLOSED"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 10 * 1024 * 1024
EXTENDER_KEY = web.AppKey("extender", Extender)
_JSON = "application/json"
#: the ``code`` label of requests whose client hung up before the answer (nginx's 499)
CLIENT_CLOSED = "499"


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"Error": bounded(message)}), content_type=_JSON)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


async def _answer_and_close(request: web.Request, resp: web.Response) -> web.Response:
    """Send ``resp`` now and close the connection. For a body that cannot be decoded:
    its rest cannot be told from the next request, and aiohttp, left to drain it,
    would meet the decoding error again and log it as an unhandled exception."""
    resp.force_close()
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError as exc:  # gone meanwhile: nothing to answer
        log.debug("client gone before the answer to a bad body: %s", exc)
    request.protocol.force_close()
    return resp


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

    async def read_body(request: web.Request, verb: str) -> bytes | web.Response:
        """The request body, or the error response for a body that cannot be had."""
        if request.content_length is not None and request.content_length > max_body:
            resp = _error(413, f"{verb}: request body larger than {max_body} bytes")
            resp.force_close()
            return resp
        try:
            if request.content.is_eof():  # all of it in the buffer already: no wait, no timer
                return await request.read()
            # asyncio.timeout, not wait_for: no task per request
            async with asyncio.timeout(read_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:  # chunked, or larger once decompressed
            resp = _error(413, f"{verb}: request body larger than {max_body} bytes")
        except asyncio.TimeoutError:
            resp = _error(408, f"{verb}: request body not received within {read_timeout:g}s")
        except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError too
            raise ClientGone(str(exc)) from None
        except (RequestPayloadError, HttpProcessingError) as exc:
            # bad Content-Encoding (deflate/gzip/br that does not decode), bad chunking,
            # or the connection lost mid-body
            if request.transport is None or request.transport.is_closing():
                raise ClientGone(_one_line(exc)) from None
            return await _answer_and_close(request, _error(400, f"{verb}: request body cannot be read: {_one_line(exc)}"))
        resp.force_close()
        return resp

    def verb_handler(verb: str, decide, encode, decode=extender.decode):
        nodes_seen = metrics.nodes.labels(verb=verb)
        duration = metrics.duration.labels(verb=verb)

        async def handler(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            try:
                body = await read_body(request, verb)
                if isinstance(body, web.StreamResponse):
                    resp = body
                else:
                    args = decode(body)
                    if verb != "bind":
                        nodes_seen.observe(len(args.names))
                    result = await decide(args)
                    resp = web.Response(body=encode(args, result), content_type=_JSON)
            except ShapeError as exc:  # not an ExtenderArgs (WireError); a bad pod is no error
                resp = _error(400, f"{verb}: {exc}")
            except ClientGone as exc:
                log.debug("%s: client closed the connection before its request was read: %s", verb, exc)
                metrics.errors.labels(verb=verb, code=CLIENT_CLOSED).inc()
                return web.Response(status=400)  # nobody to send it to; aiohttp drops it
            except asyncio.CancelledError:  # server stopping (or a client gone, with handler_cancellation)
                log.debug("%s: request cancelled", verb)
                metrics.errors.labels(verb=verb, code=CLIENT_CLOSED).inc()
                raise
            except Exception as exc:  # a bug: reported to the caller and logged, never swallowed
                log.exception("%s failed", verb)
                resp = _error(500, f"{verb}: internal error: {type(exc).__name__}: {exc}")
            duration.observe(time.perf_counter() - t0)
            if resp.status != 200:
                metrics.errors.labels(verb=verb, code=str(resp.status)).inc()
            return resp

        return handler

    # the decisions are made under the extender's lock; these encode them after it
    def enc_filter(args, out):
        return encode_filter(args, out.passed, out.failed, out.unresolvable, sent=out.sent)

    def enc_prio(args, scored):
        return scored.encode()

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

    async def debug_overcommit(request: web.Request) -> web.Response:
        nodes = extender.overcommit()
        doc = {"overcommitted_gpus": sum(n["overcommitted"] for n in nodes), "nodes": nodes}
        return web.Response(body=orjson.dumps(doc), content_type=_JSON)

    app.router.add_post("/filter", verb_handler("filter", extender.filter, enc_filter))
    app.router.add_post("/prioritize", verb_handler("prioritize", extender.prioritize, enc_prio))
    app.router.add_post("/bind", verb_handler("bind", extender.bind, lambda a, err: encode_binding(err), decode_binding))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/version", version_handler)
    app.router.add_get("/debug/pods/{namespace}/{name}", debug_pod)
    app.router.add_get("/debug/overcommit", debug_overcommit)
    return app
