"""Feed a :class:`~rlsched.extender.cache.ClusterCache` from the API server.

List + watch for nodes and for pods of all namespaces, with bookmarks. A watch that
ends normally resumes from the last resourceVersion; ``410 Gone`` (the version
expired) triggers a fresh list; any other failure (API server restarting, network)
retries with exponential backoff and jitter drawn from the ``rng`` given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import orjson

from .cache import ClusterCache

__all__ = ["EventLines", "Watcher", "connect", "make_binder"]

log = logging.getLogger(__name__)


class EventLines:
    """A watch stream cut into its events (one JSON document per line), whatever the
    chunks it arrives in. Each chunk is split once, so a chunk of many events costs its
    bytes once (cutting events off the front of a buffer one at a time copied the rest
    of the buffer each time)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""  # the start of an event whose newline has not come yet

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events completed by ``chunk``, blank lines left out."""
        lines = (self._rest + chunk if self._rest else chunk).split(b"\n")
        self._rest = lines.pop()
        return [line for line in lines if line.strip()]


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


async def connect(kubeconfig: str | None):
    """A ``CoreV1Api`` from a kubeconfig file (or in-cluster / default config)."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


class Watcher:
    """Keeps ``cache`` in step with the API server until cancelled."""

    def __init__(
        self,
        cache: ClusterCache,
        api: Any,
        rng: np.random.Generator,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        watch_timeout: int = 300,
    ) -> None:
        self.cache = cache
        self.api = api
        self.rng = rng
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.watch_timeout = int(watch_timeout)
        self.relists = {"nodes": 0, "pods": 0}
        self.failures = {"nodes": 0, "pods": 0}

    async def run(self) -> None:
        await asyncio.gather(self._loop("nodes"), self._loop("pods"))

    def _delay(self, attempt: int) -> float:
        d = min(self.backoff_cap, self.backoff_base * 2.0**attempt)
        return d * (0.5 + 0.5 * float(self.rng.random()))

    async def _loop(self, kind: str) -> None:
        attempt = 0
        while True:
            try:
                rv = await self._list(kind)
                self.relists[kind] += 1
                attempt = 0
                while True:
                    rv = await self._watch(kind, rv)
            except _Gone:
                log.info("watch %s: resourceVersion expired, listing again", kind)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # API server down or restarting: retry with backoff
                self.failures[kind] += 1
                delay = self._delay(attempt)
                attempt += 1
                log.warning("watch %s failed (%s: %s); retrying in %.1fs", kind, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    def _call(self, kind: str, **kw):
        if kind == "nodes":
            return self.api.list_node(_preload_content=False, **kw)
        return self.api.list_pod_for_all_namespaces(_preload_content=False, **kw)

    async def _list(self, kind: str) -> str:
        resp = await self._call(kind, _request_timeout=60)
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"list {kind}: HTTP {resp.status}: {body[:200]!r}")
        doc = orjson.loads(body)
        items = doc.get("items") or []
        if kind == "nodes":
            self.cache.replace_nodes(items)
        else:
            self.cache.replace_pods(items)
        return doc.get("metadata", {}).get("resourceVersion", "")

    async def _watch(self, kind: str, rv: str) -> str:
        resp = await self._call(
            kind,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _request_timeout=self.watch_timeout + 30,
        )
        try:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                raise RuntimeError(f"watch {kind}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
            lines = EventLines()
            async for chunk in resp.content.iter_any():
                for line in lines.feed(chunk):
                    rv = self._event(kind, orjson.loads(line), rv)
            return rv
        finally:
            resp.release()

    def _event(self, kind: str, ev: dict, rv: str) -> str:
        etype = ev.get("type")
        obj = ev.get("object") or {}
        if etype == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch {kind}: {obj.get('message', obj)}")
        meta = obj.get("metadata") or {}
        new_rv = meta.get("resourceVersion") or rv
        if etype == "BOOKMARK":
            self.cache.touch()
            return new_rv
        try:
            if kind == "nodes":
                if etype == "DELETED":
                    self.cache.delete_node(meta.get("name", ""))
                else:
                    self.cache.upsert_node(obj)
            else:
                key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
                if etype == "DELETED":
                    self.cache.delete_pod(key)
                else:
                    self.cache.upsert_pod(obj)
        except ValueError as exc:  # one malformed object must not stop the watch
            log.warning("watch %s: skipping %s event: %s", kind, etype, exc)
        return new_rv


def make_binder(api: Any):
    """``binder(args)`` creating the pod's Binding (what kube-scheduler's default
    binder does) for the extender's bind verb."""

    async def bind(args) -> None:
        meta = {"name": args.name, "namespace": args.namespace}
        if args.uid:
            meta["uid"] = args.uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        resp = await api.create_namespaced_pod_binding(
            args.name, args.namespace, body, _preload_content=False, _request_timeout=30
        )
        try:
            if resp.status not in (200, 201):
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300].decode(errors='replace')}")
        finally:
            resp.release()

    return bind
