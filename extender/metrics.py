"""Prometheus metrics of one extender instance, in its own registry (no globals)."""

from __future__ import annotations

from typing import Callable

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily

__all__ = ["ExtenderMetrics"]

_LATENCY = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_NODES = (1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
_SCORE_LABELS = [str(s) for s in range(11)]


class ExtenderMetrics:
    """All ``rlsched_extender_*`` series; :meth:`render` gives the exposition text."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "rlsched_extender_request_duration_seconds",
            "Time to answer one extender request, by verb.",
            ["verb"],
            buckets=_LATENCY,
            registry=r,
        )
        self.nodes = Histogram(
            "rlsched_extender_nodes_per_request",
            "Candidate nodes named in one filter/prioritize request.",
            ["verb"],
            buckets=_NODES,
            registry=r,
        )
        #: nodes given each score 0..10, added up per request in one numpy call and
        #: exported as the counter ``rlsched_extender_scores_total{score}``
        self._score_counts = np.zeros(len(_SCORE_LABELS), dtype=np.int64)
        r.register(_ScoreCollector(self._score_counts))
        self.fallbacks = Counter(
            "rlsched_extender_policy_fallbacks",
            "Times the configured policy could not be used and a fallback decided "
            "(reason: model_load, policy_error).",
            ["reason"],
            registry=r,
        )
        for reason in ("model_load", "policy_error"):
            self.fallbacks.labels(reason=reason)  # both series exist from the start (0)
        self.errors = Counter(
            "rlsched_extender_errors",
            "Requests answered with an HTTP error, by verb and status code.",
            ["verb", "code"],
            registry=r,
        )
        self.filtered = Counter(
            "rlsched_extender_filtered_nodes",
            "Nodes rejected by filter, by reason (capacity, gpu_model, topology, unknown_node, invalid_pod).",
            ["reason"],
            registry=r,
        )
        self.invalid_pods = Counter(
            "rlsched_extender_invalid_pods",
            "Requests whose pod could not be read, answered as unschedulable (filter: every node "
            "unresolvable; prioritize: all scores 0; bind: an error), by verb.",
            ["verb"],
            registry=r,
        )
        self.overcommitted = Gauge(
            "rlsched_extender_overcommitted_gpus",
            "GPUs in use (bound and assumed pods) beyond the capacity of their node, summed over nodes "
            "(per node: GET /debug/overcommit).",
            registry=r,
        )
        self.retained = Gauge(
            "rlsched_extender_retained_bytes",
            "Estimated bytes kept across requests (/debug explanations, cached candidate lists and score entries).",
            registry=r,
        )
        self.cache_age = Gauge(
            "rlsched_extender_cache_age_seconds",
            "Seconds since the node/pod cache last heard from the API server.",
            registry=r,
        )
        self.assumed = Gauge(
            "rlsched_extender_assumed_pods",
            "Pods scored but not yet seen bound, whose GPUs are counted as used.",
            registry=r,
        )
        self.connections = Gauge(
            "rlsched_extender_open_connections",
            "Open client connections (served with limits; see --max-connections).",
            registry=r,
        )
        self.connections_closed = Counter(
            "rlsched_extender_connections_closed",
            "Connections closed by the extender's limits, by reason (header_timeout: no complete "
            "request headers in time; limit: over --max-connections).",
            ["reason"],
            registry=r,
        )
        self.model = Info(
            "rlsched_extender_model",
            "Placement policy in use and the version of its model file.",
            registry=r,
        )

    def bind_sources(
        self,
        cache_age: Callable[[], float],
        assumed: Callable[[], int],
        overcommitted: Callable[[], int] | None = None,
        retained: Callable[[], int] | None = None,
    ) -> None:
        self.cache_age.set_function(cache_age)
        self.assumed.set_function(assumed)
        if overcommitted is not None:
            self.overcommitted.set_function(overcommitted)
        if retained is not None:
            self.retained.set_function(retained)

    def count_scores(self, scores: np.ndarray) -> None:
        # scores are 0..10 by construction; a larger one would fail the add, not vanish
        self._score_counts += np.bincount(scores, minlength=len(_SCORE_LABELS))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ScoreCollector:
    """``rlsched_extender_scores_total{score}`` from a numpy array of counts (a
    prometheus Counter child per score cost more than the rest of a small request)."""

    def __init__(self, counts: np.ndarray) -> None:
        self._counts = counts

    def describe(self):
        return [CounterMetricFamily("rlsched_extender_scores", _SCORES_HELP, labels=["score"])]

    def collect(self):
        fam = CounterMetricFamily("rlsched_extender_scores", _SCORES_HELP, labels=["score"])
        for label, n in zip(_SCORE_LABELS, self._counts.tolist()):
            fam.add_metric([label], n)
        yield fam


_SCORES_HELP = "Scores (0..10) given to nodes by prioritize, by score value."
