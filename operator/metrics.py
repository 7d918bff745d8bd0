"""Prometheus metrics of the operator, on a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["OperatorMetrics", "COMPLETION_REASONS", "RESTART_REASONS"]

#: label values of ``rlsched_operator_completions_total`` (ScalingPlanner.finished)
#: how the operator ends a job well: RLPTO's beta stop, maxEpochs, or the workers' exits
#: (core.lifecycle: the chief's exit 0, or every worker's)
COMPLETION_REASONS = ("Converged", "MaxEpochs", "ChiefSucceeded", "AllWorkersSucceeded")
#: why a worker generation restarts (core.lifecycle's verdicts and the scaling planner's)
RESTART_REASONS = ("Rescaled", "WorkerFailed", "CheckpointFailed", "WorkerDisrupted", "WorkerLost")


class OperatorMetrics:
    """The operator's metrics (names follow Prometheus conventions: base units, ``_total``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._cycle_metrics(self.registry)
        self._job_metrics(self.registry)
        self._queue_metrics(self.registry)

    def _cycle_metrics(self, r: CollectorRegistry) -> None:
        """What the control loop does: cycles, decisions, errors, status restored."""
        self.queue_length = Gauge("rlsched_operator_queue_length", "TrainingJobs waiting, per queue", ["queue"], registry=r)
        self.jobs = Gauge("rlsched_operator_jobs", "TrainingJobs per phase", ["phase"], registry=r)
        self.workers = Gauge("rlsched_operator_workers", "Live worker pods of all TrainingJobs", registry=r)
        self.scaling_decisions = Counter(
            "rlsched_operator_scaling_decisions_total", "Worker count changes applied", ["direction"], registry=r
        )
        self.cycles = Counter("rlsched_operator_cycles_total", "Control-loop cycles started", registry=r)
        self.cycle_errors = Counter(
            "rlsched_operator_cycle_errors_total",
            "Control-loop cycles aborted by an error (decisions of that cycle lost)",
            registry=r,
        )
        self.job_errors = Counter(
            "rlsched_operator_job_errors_total",
            "Errors contained to one TrainingJob within a cycle, by kind: rejected (the API server "
            "refused its pods for good: job failed), transient (retried next cycle), unexpected (a bug)",
            ["kind"],
            registry=r,
        )
        self.status_resets = Counter(
            "rlsched_operator_status_resets_total",
            "Status fields of a TrainingJob that someone other than the operator changed and the operator restored",
            registry=r,
        )
        self.unfittable = Gauge(
            "rlsched_operator_unfittable_jobs", "Waiting TrainingJobs whose gang cannot fit the whole cluster", registry=r
        )

    def _job_metrics(self, r: CollectorRegistry) -> None:
        """What happens to the jobs: preempted, resumed, completed, restarted, failed, waiting."""
        self.preemptions = Counter("rlsched_operator_preemptions_total", "TrainingJobs preempted", registry=r)
        self.resumes = Counter(
            "rlsched_operator_resumes_total",
            "Preempted TrainingJobs admitted again from the interrupt queue (they resume first)",
            registry=r,
        )
        self.completions = Counter(
            "rlsched_operator_completions_total",
            "TrainingJobs finished by the operator, by reason: Converged (RLPTO's beta stop), MaxEpochs, ChiefSucceeded or AllWorkersSucceeded",
            ["reason"],
            registry=r,
        )
        for reason in COMPLETION_REASONS:
            self.completions.labels(reason=reason)  # both series exist from the start (0)
        self.restarts = Counter(
            "rlsched_operator_generation_restarts_total",
            "Worker generations ended and started again, by reason: Rescaled, WorkerFailed and CheckpointFailed "
            "(counted against backoffLimit), WorkerDisrupted or WorkerLost (not counted)",
            ["reason"],
            registry=r,
        )
        for reason in RESTART_REASONS:
            self.restarts.labels(reason=reason)
        self.unclean_stops = Counter(
            "rlsched_operator_unclean_stops_total",
            "Workers stopped with SIGTERM that exited other than 0 or 143 (not counted as failures)",
            registry=r,
        )
        self.failures = Counter(
            "rlsched_operator_failed_jobs_total",
            "TrainingJobs that ended Failed, by reason (BackoffLimitExceeded, InvalidSpec, ...)",
            ["reason"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "rlsched_operator_admission_wait_seconds",
            "Time from queued to admitted",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
            registry=r,
        )
        self.oldest_pending = Gauge(
            "rlsched_operator_oldest_pending_seconds",
            "Age of the oldest TrainingJob waiting for GPUs (0 when none waits); a stuck queue grows it",
            registry=r,
        )

    def _queue_metrics(self, r: CollectorRegistry) -> None:
        """Per team queue (TrainingQueue): one series per queue object, removed with it;
        and the LSP forecast's advice."""
        self.queue_gpus = Gauge("rlsched_queue_gpus_in_use", "GPUs held by the jobs of a TrainingQueue", ["queue"],
                                registry=r)
        self.queue_borrowed = Gauge("rlsched_queue_borrowed_gpus",
                                    "GPUs a TrainingQueue's jobs hold beyond its nominal quota", ["queue"], registry=r)
        self.queue_nominal = Gauge("rlsched_queue_nominal_gpus", "A TrainingQueue's guaranteed GPUs (nominalGpus)",
                                   ["queue"], registry=r)
        self.queue_pending = Gauge("rlsched_queue_pending_jobs", "TrainingJobs of a TrainingQueue waiting for GPUs",
                                   ["queue"], registry=r)
        self.queue_running = Gauge("rlsched_queue_running_jobs", "TrainingJobs of a TrainingQueue holding GPUs",
                                   ["queue"], registry=r)
        self.queue_oldest_pending = Gauge("rlsched_queue_oldest_pending_seconds",
                                          "Age of a TrainingQueue's oldest waiting job (0 when none waits)", ["queue"],
                                          registry=r)
        self.recommended_nodes = Gauge(
            "rlsched_operator_recommended_nodes", "Node count the LSP forecast recommends (advice only)", registry=r
        )
        self.forecast_tasks = Gauge(
            "rlsched_operator_forecast_tasks", "Forecast task volume for the next day (LSP)", registry=r
        )

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Serve ``/metrics`` on ``port`` (0 picks a free one); returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)
