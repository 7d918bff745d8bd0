"""Prometheus metrics of the operator, on a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["OperatorMetrics"]


class OperatorMetrics:
    """The operator's metrics (names follow Prometheus conventions: base units, ``_total``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_length = Gauge("rlsched_operator_queue_length", "TrainingJobs waiting, per queue", ["queue"], registry=r)
        self.jobs = Gauge("rlsched_operator_jobs", "TrainingJobs per phase", ["phase"], registry=r)
        self.workers = Gauge("rlsched_operator_workers", "Live worker pods of all TrainingJobs", registry=r)
        self.scaling_decisions = Counter(
            "rlsched_operator_scaling_decisions_total", "Worker count changes applied", ["direction"], registry=r
        )
        self.preemptions = Counter("rlsched_operator_preemptions_total", "TrainingJobs preempted", registry=r)
        self.admission_wait = Histogram(
            "rlsched_operator_admission_wait_seconds",
            "Time from queued to admitted",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
            registry=r,
        )
        self.recommended_nodes = Gauge(
            "rlsched_operator_recommended_nodes", "Node count the LSP forecast recommends (advice only)", registry=r
        )
        self.forecast_tasks = Gauge(
            "rlsched_operator_forecast_tasks", "Forecast task volume for the next day (LSP)", registry=r
        )

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Serve ``/metrics`` on ``port`` (0 picks a free one); returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)
