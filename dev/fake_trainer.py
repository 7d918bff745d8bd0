"""A fake trainer: progress for running TrainingJobs from the simulator's convergence model.

On a control plane with kwok nodes no container runs, so this stands in for every
job's chief. It plays the pods kwok runs: a job advances only while the chief of its
current generation (``rlsched.dev/generation`` = ``status.restartGeneration``) is a
Running pod, with as many workers as that generation has Running pods, so a job whose
workers are gone (stopped, preempted, restarting) shows no progress, as a real one
would not. Each tick (``epoch_s`` wall seconds) every such job
processes ``workers x samples_per_epoch / minWorkers`` samples — one epoch per tick
at the gang size, more with more workers — and reports the accuracy and loss that
:class:`rlsched.sim.convergence.ConvergenceModel` gives for the effective epochs done
(statistical efficiency falls with each extra worker: diminishing returns).

With ``application`` (a measured Pollux application, :class:`rlsched.sim.measured.Application`)
each report also carries what ``rlsched.trainer``'s :class:`~rlsched.trainer.ProgressReporter`
reports of a real job: the step time the measured profile gives for the generation's
placement (GPUs per node, from the pods' nodes) and per-GPU share of its global batch
(``RLSCHED_GLOBAL_BATCH_SIZE`` in the chief's environment, else ``spec.batchSize``, else
the application's initial batch), that batch and worker count, and the gradient
statistics the application measured at that batch and epoch (per-sample ``tr(Σ)``, as
``rlsched.trainer.GradientNoiseScale`` reports it) — what the goodput allocator models.
An application measured on several GPU types (``../shared/data/sia-sosp23``) replays
the step times of the type the generation is pinned to (``RLSCHED_GPU_TYPE`` in the
chief's environment, which the operator sets with the pods' node affinity) and reports
that type (``gpuType``), as ``rlsched.trainer`` does; unpinned, its first type.

Reports go through :func:`rlsched.trainer.report` with the job's own ServiceAccount
token (TokenRequest API), so they exercise the per-job RBAC the operator created; with
``use_job_token=False`` the trainer's own credentials are used instead.

An API server that restarts does not end it: a tick that cannot read the cluster is
logged and retried with a growing pause (at most ``max_backoff_s``), and
:class:`rlsched.trainer.Reporter` retries its own writes.

Command line: ``rlsched fake-trainer --namespace NS [--kubeconfig K]`` (the demo runs it).
"""

from __future__ import annotations

import argparse
import logging
import threading
import zlib
from dataclasses import dataclass
from typing import Any

from rlsched.core.contract import (
    ENV_BATCH_SIZE,
    ENV_GPU_TYPE,
    GROUP,
    LABEL_GENERATION,
    LABEL_INDEX,
    LABEL_JOB,
    PLURAL,
    VERSION,
    controlling_job,
    worker_account,
)
from rlsched.sim.convergence import ConvergenceModel
from rlsched.trainer import Reporter

__all__ = ["FakeTrainer", "register"]

log = logging.getLogger(__name__)


@dataclass
class _Run:
    model: ConvergenceModel
    epoch: int = 0
    eff_epochs: float = 0.0
    reporter: Reporter | None = None


class FakeTrainer:
    """Advances every Running TrainingJob of ``namespace`` by one tick per ``epoch_s``."""

    def __init__(
        self,
        namespace: str,
        *,
        kubeconfig: str | None = None,
        epoch_s: float = 1.0,
        seed: int = 0,
        tau: float = 6.0,
        gamma: float = 0.05,
        noise: float = 0.002,
        use_job_token: bool = True,
        max_backoff_s: float = 10.0,
        application: Any = None,
    ) -> None:
        from kubernetes import client, config

        #: the measured application whose step times and gradient statistics are reported
        self.application = application
        #: (job uid, generation) -> node name of each Running worker, and the chief's global batch
        self._nodes: dict[tuple[str, int], list[str]] = {}
        self._batch: dict[tuple[str, int], int] = {}
        self._type: dict[tuple[str, int], str] = {}
        self.namespace = namespace
        self.epoch_s = epoch_s
        self.seed, self.tau, self.gamma, self.noise = seed, tau, gamma, noise
        self.use_job_token = use_job_token
        self.max_backoff_s = max_backoff_s
        self.conf = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=self.conf)
        self.admin = client.ApiClient(self.conf)
        self.custom = client.CustomObjectsApi(self.admin)
        self.core = client.CoreV1Api(self.admin)
        self.runs: dict[str, _Run] = {}

    def _model(self, body: dict) -> ConvergenceModel:
        spec = body["spec"]
        spe = int(spec.get("dataSize") or 0) or 50_000
        seed = (self.seed * 1_000_003 + zlib.crc32(body["metadata"]["uid"].encode())) & 0x7FFFFFFF
        return ConvergenceModel(spe, tau=self.tau, gamma=self.gamma, noise=self.noise, seed=seed)

    def _reporter(self, body: dict) -> Reporter:
        from kubernetes import client

        name = body["metadata"]["name"]
        if not self.use_job_token:
            return Reporter(name, self.namespace, api=self.admin)
        tok = self.core.create_namespaced_service_account_token(
            worker_account(name, ((body.get("spec") or {}).get("template") or {}).get("spec")), self.namespace,
            {"spec": {"audiences": [], "expirationSeconds": 3600}},
        )
        c = client.Configuration()
        c.host, c.ssl_ca_cert, c.verify_ssl = self.conf.host, self.conf.ssl_ca_cert, self.conf.verify_ssl
        c.api_key = {"authorization": f"Bearer {tok.status.token}"}
        return Reporter(name, self.namespace, api=client.ApiClient(c))

    def tick(self) -> dict[str, dict]:
        """One tick for every Running job; returns the progress written per job."""
        from kubernetes.client.exceptions import ApiException

        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        playing = self.playing()
        out: dict[str, dict] = {}
        live = set()
        for body in items:
            uid = body["metadata"]["uid"]
            live.add(uid)
            st = body.get("status") or {}
            if st.get("phase") != "Running":
                continue
            gen = st.get("restartGeneration") or 0
            workers = playing.get((uid, gen), 0)
            if not workers:
                continue  # no live chief of the current generation: nothing trains
            run = self.runs.get(uid)
            if run is None:
                run = self.runs[uid] = _Run(self._model(body))
                run.epoch = int((st.get("progress") or {}).get("epoch", 0))  # resume after a preemption
                run.eff_epochs = float(run.epoch)
            m = run.model
            per_tick = m.samples_per_epoch * workers / int(body["spec"]["minWorkers"])
            run.eff_epochs += m.effective_epochs(per_tick, workers)
            run.epoch += 1
            acc = float(m.evaluate([run.epoch], [run.eff_epochs])[0])
            loss = float(m.loss_at(run.eff_epochs))
            extra = self._throughput(body, uid, gen, workers, run.epoch - 1) if self.application is not None else {}
            try:
                if run.reporter is None:
                    run.reporter = self._reporter(body)
                out[body["metadata"]["name"]] = run.reporter.report(epoch=run.epoch, loss=loss, accuracy=acc, **extra)
            except ApiException as exc:
                run.epoch -= 1
                run.reporter = None
                log.warning("fake trainer: report for %s failed: %s %s", body["metadata"]["name"], exc.status, exc.reason)
        for uid in set(self.runs) - live:
            del self.runs[uid]
        return out

    def _throughput(self, body: dict, uid: str, gen: int, workers: int, epoch: int) -> dict:
        """What a real chief reports of its speed and gradients, from the measured
        profile (module docstring)."""
        app = self.application
        gtype = self._type.get((uid, gen))
        known = gtype if gtype in app.gpu_types else None
        bounds = app.bounds_on(known)
        gpw = int(body["spec"].get("gpusPerWorker") or 1)
        batch = self._batch.get((uid, gen)) or body["spec"].get("batchSize") or bounds.init_batch
        per_node: dict[str, int] = {}
        for n in self._nodes.get((uid, gen), []):
            per_node[n] = per_node.get(n, 0) + gpw
        placement = tuple(sorted(per_node.values(), reverse=True)) or (workers * gpw,)
        gpus = sum(placement)
        share = -(-int(batch) // gpus)
        micro = -(-share // bounds.largest_local)
        atomic = -(-share // micro)
        seconds, _, _ = app.update_time(placement, atomic, micro - 1, known)
        sqr, var = app.grad_stats(batch, epoch)
        return {"step_time_seconds": float(seconds), "workers": workers, "global_batch_size": int(batch),
                "generation": gen, "grad_sqr": float(sqr), "grad_var": float(var) * bounds.init_batch,
                "gpu_type": gtype or None}

    def playing(self) -> dict[tuple[str, int], int]:
        """``(job uid, generation) -> Running workers`` for each generation whose chief
        (worker 0) is a Running pod: the pods this trainer plays."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=LABEL_JOB).items
        running: dict[tuple[str, int], int] = {}
        nodes: dict[tuple[str, int], list[str]] = {}
        batches: dict[tuple[str, int], int] = {}
        types: dict[tuple[str, int], str] = {}
        chiefs: set[tuple[str, int]] = set()
        for p in pods:
            owner = controlling_job(self.admin.sanitize_for_serialization(p))
            if owner is None or p.metadata.deletion_timestamp is not None or (p.status and p.status.phase) != "Running":
                continue
            labels = p.metadata.labels or {}
            try:
                key = (owner.uid, int(labels.get(LABEL_GENERATION, "0")))
            except ValueError:
                continue
            running[key] = running.get(key, 0) + 1
            nodes.setdefault(key, []).append(p.spec.node_name or "")
            if labels.get(LABEL_INDEX) == "0":
                chiefs.add(key)
                env = {e.name: e.value for c in p.spec.containers for e in (c.env or [])}
                if (env.get(ENV_BATCH_SIZE) or "").isdigit():
                    batches[key] = int(env[ENV_BATCH_SIZE])
                if env.get(ENV_GPU_TYPE):
                    types[key] = env[ENV_GPU_TYPE]
        self._nodes, self._batch, self._type = nodes, batches, types
        return {k: n for k, n in running.items() if k in chiefs}

    def safe_tick(self) -> bool:
        """:meth:`tick`, a failure logged instead of raised; True when it succeeded."""
        try:
            self.tick()
            return True
        except Exception as exc:  # the API server restarting, a lost connection: retried
            log.warning("fake trainer: tick failed, retrying: %r", exc)
            return False

    def run_until(self, stop: threading.Event) -> None:
        """Tick every ``epoch_s`` until ``stop`` is set (for a thread); after failed
        ticks the pause doubles, up to ``max_backoff_s``."""
        pause = self.epoch_s
        while not stop.wait(pause):
            pause = self.epoch_s if self.safe_tick() else min(self.max_backoff_s, pause * 2)

    async def run(self) -> None:
        """Tick forever (CLI), with the same backoff as :meth:`run_until`."""
        import asyncio

        pause = self.epoch_s
        while True:
            ok = await asyncio.to_thread(self.safe_tick)
            pause = self.epoch_s if ok else min(self.max_backoff_s, pause * 2)
            await asyncio.sleep(pause)

    def close(self) -> Any:
        for r in self.runs.values():
            if r.reporter is not None:
                r.reporter.api.api_client.close()
        self.admin.close()


def _run(args: argparse.Namespace) -> int:
    import asyncio

    asyncio.run(FakeTrainer(args.namespace, kubeconfig=args.kubeconfig, epoch_s=args.epoch_seconds, seed=args.seed).run())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rlsched fake-trainer``."""
    f = subparsers.add_parser("fake-trainer", help="write convergence-model progress for running TrainingJobs (dev)")
    f.add_argument("--kubeconfig")
    f.add_argument("--namespace", "-n", required=True)
    f.add_argument("--epoch-seconds", type=float, default=1.0, help="wall seconds per simulated epoch")
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=_run)
