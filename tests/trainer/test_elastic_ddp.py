"""The must-show: a real torch.distributed (gloo, CPU) job rescaled and preempted.

``examples/ddp_digits.py`` runs as the operator runs worker pods: one process per
worker, the worker contract in the environment (exactly what
:meth:`WorkerContract.env` gives the pods, plus the job's name and namespace), a fresh
MASTER_PORT per generation, a shared checkpoint directory. Generation 0 has 2 workers
and is SIGTERMed mid-epoch (a rescale), generation 1 has 3 workers and is SIGTERMed
mid-epoch, generation 2 has 1 worker and is SIGTERMed (a preemption), then after a pause
generation 3 resumes with 2 workers and finishes. SIGTERMs are sent once the event log
shows the generation's k-th step (no blind sleeps). The same script run uninterrupted on
2 workers with the same seed is the reference.

Measured (2-core machine): the elastic run's step losses equal the reference's at every
global step to ~1e-6 and its final test accuracy equals the reference's (difference
0.0 points), as it must: every global batch holds the same samples at every world size
and the loss is weighted to the global-batch mean, so the optimisation is the same
up to floating-point summation order. The tolerances below (0.01 on step losses, 1
point of accuracy) leave room for that order only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from rlsched.core.contract import EXIT_SIGTERM, WorkerContract

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_digits.py"
EPOCHS = 3
GLOBAL_BATCH = 32
TRAIN_SAMPLES = 1797 - 360
STEPS_PER_EPOCH = -(-TRAIN_SAMPLES // GLOBAL_BATCH)  # 45
ACCURACY_TOLERANCE = 0.01
LOSS_TOLERANCE = 0.01

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    # read while workers append: a line still being written has no newline yet
    *complete, _partial = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


class Job:
    """One TrainingJob's worker processes, generation after generation."""

    def __init__(self, workdir: Path, name: str, step_delay: float) -> None:
        self.dir = workdir / name
        self.ckpt = self.dir / "checkpoint"
        self.ckpt.mkdir(parents=True)
        self.events = self.dir / "events.jsonl"
        self.samples = self.dir / "samples.jsonl"
        self.name, self.step_delay = name, step_delay
        self.exit_codes: dict[int, list[int]] = {}

    procs_per_worker = 1

    def command(self) -> list[str]:
        """One worker's command."""
        return [sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), "--global-batch", "999", "--seed", "0",
                "--report-interval", "2", "--log-file", str(self.events), "--log-samples", str(self.samples),
                "--step-delay", str(self.step_delay), "--timeout", "60"]

    def _env(self, gen: int, world: int, rank: int, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KUBERNETES_", "RLSCHED_", "PET_")) and k not in
               ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
        contract = WorkerContract(job=self.name, namespace="default", index=rank, workers=world, generation=gen,
                                  master_addr="127.0.0.1", master_port=port, batch_size=GLOBAL_BATCH,
                                  checkpoint_dir=str(self.ckpt), procs_per_worker=self.procs_per_worker)
        env.update(contract.env())
        env.update(RLSCHED_JOB_NAME=self.name, RLSCHED_JOB_NAMESPACE="default", CUDA_VISIBLE_DEVICES="",
                   OMP_NUM_THREADS="1", KUBECONFIG=str(self.dir / "no-kubeconfig"), PYTHONUNBUFFERED="1")
        return env

    def generation(self, gen: int, world: int, *, stop_after: int | None, timeout: float = 90.0) -> list[int]:
        """Run generation ``gen`` on ``world`` workers; with ``stop_after``, SIGTERM every
        worker once the log shows the generation's ``stop_after``-th step. Returns the
        exit codes."""
        port = _free_port()
        cmd = self.command()
        procs = []
        for rank in range(world):
            log = open(self.dir / f"gen{gen}-rank{rank}.log", "w")
            procs.append(subprocess.Popen(cmd, env=self._env(gen, world, rank, port), stdout=log,
                                          stderr=subprocess.STDOUT, cwd=ROOT))
            log.close()
        deadline = time.monotonic() + timeout
        try:
            if stop_after is not None:
                while True:
                    ev = [e for e in _events(self.events) if e["gen"] == gen]
                    start = next((e for e in ev if e["event"] == "start"), None)
                    if start is not None and any(e["event"] == "step" and e["step"] >= start["step"] + stop_after
                                                 for e in ev):
                        break
                    dead = [p.returncode for p in procs if p.poll() is not None]
                    assert not dead, f"generation {gen} ended before its SIGTERM: {dead}\n{self.logs(gen)}"
                    assert time.monotonic() < deadline, f"generation {gen} made no progress\n{self.logs(gen)}"
                    time.sleep(0.02)
                for p in procs:
                    p.send_signal(signal.SIGTERM)
            codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.exit_codes[gen] = codes
        return codes

    def logs(self, gen: int) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.dir.glob(f"gen{gen}-rank*.log")))


def check_each_sample_once(samples: Path, epochs: int, plan) -> None:
    """Within every epoch each sample index was consumed exactly once, over all ranks
    and generations; in each generation all ranks stopped after the same step.
    ``plan``: (generation, processes, ...) per generation."""
    per_epoch: dict[int, Counter] = defaultdict(Counter)
    last_start: dict[tuple[int, int], int] = {}
    for line in samples.read_text().splitlines():
        rec = json.loads(line)
        per_epoch[rec["epoch"]].update(rec["indices"])
        key = (rec["gen"], rec["rank"])
        last_start[key] = max(last_start.get(key, -1), rec["epoch"] * TRAIN_SAMPLES + rec["start"])
    assert sorted(per_epoch) == list(range(epochs))
    for epoch, counts in per_epoch.items():
        assert set(counts) == set(range(TRAIN_SAMPLES)), f"epoch {epoch}: samples skipped"
        assert max(counts.values()) == 1, f"epoch {epoch}: samples repeated: {[i for i, c in counts.items() if c > 1][:10]}"
    for gen, procs, *_ in plan:
        assert len({last_start[(gen, r)] for r in range(procs)}) == 1, f"generation {gen}: ranks stopped apart"


def test_rescaled_and_preempted_training_resumes_exactly(tmp_path):
    # the reference: 2 workers, never interrupted
    ref = Job(tmp_path, "reference", step_delay=0.0)
    assert ref.generation(0, 2, stop_after=None) == [0, 0], ref.logs(0)

    job = Job(tmp_path, "elastic", step_delay=0.03)
    plan = [(0, 2, 15), (1, 3, 40), (2, 1, 20), (3, 2, None)]  # (generation, workers, SIGTERM after k steps)
    for gen, world, stop_after in plan:
        if gen == 3:
            time.sleep(0.5)  # preempted: nothing runs until the job is resumed
        codes = job.generation(gen, world, stop_after=stop_after)
        if stop_after is None:
            assert codes == [0] * world, job.logs(gen)  # the chief's exit 0: the job Succeeds
        else:
            # an intentional stop, never a failure
            assert all(c in (0, EXIT_SIGTERM) for c in codes), (codes, job.logs(gen))

    events = _events(job.events)
    by_gen = defaultdict(list)
    for e in events:
        by_gen[e["gen"]].append(e)

    # every stop was mid-epoch, and the next generation resumed from exactly there
    for gen in (1, 2, 3):
        stop = next(e for e in by_gen[gen - 1] if e["event"] == "stop")
        start = next(e for e in by_gen[gen] if e["event"] == "start")
        assert 0 < stop["consumed"] < TRAIN_SAMPLES, stop
        assert start["resumed"] and start["from_gen"] == gen - 1
        assert (start["epoch"], start["consumed"], start["step"]) == (stop["epoch"], stop["consumed"], stop["step"])
        assert start["world"] == plan[gen][1] and start["shares"] == [len(s) for s in _shares(plan[gen][1])]
        # the restored model is the stopped one (same test loss), not a fresh one
        assert start["eval_loss"] == pytest.approx(stop["eval_loss"], abs=1e-6)
        assert start["eval_loss"] < by_gen[0][0]["eval_loss"] - 0.05

    # the loss curve continues: every step's loss (the first of each generation included)
    # is the uninterrupted run's at that global step
    ref_loss = {e["step"]: e["loss"] for e in _events(ref.events) if e["event"] == "step"}
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "step"}
    assert sorted(losses) == sorted(ref_loss) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    worst = max(abs(losses[s] - ref_loss[s]) for s in losses)
    assert worst < LOSS_TOLERANCE, f"elastic loss curve left the reference's by {worst}"

    check_each_sample_once(job.samples, EPOCHS, plan)

    # the result: the final model, and its accuracy against the uninterrupted run
    done = next(e for e in by_gen[3] if e["event"] == "done")
    ref_done = next(e for e in _events(ref.events) if e["event"] == "done")
    assert abs(done["eval_acc"] - ref_done["eval_acc"]) <= ACCURACY_TOLERANCE, (done["eval_acc"], ref_done["eval_acc"])
    assert done["eval_acc"] > 0.85
    print(f"\nfinal test accuracy: elastic {done['eval_acc']:.4f}, uninterrupted {ref_done['eval_acc']:.4f}; "
          f"largest step-loss difference {worst:.2e}")
    import torch

    state = torch.load(job.ckpt / "model.pt", weights_only=True)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
    final = torch.load(job.ckpt / "checkpoint.pt", weights_only=True)
    assert (final["generation"], final["world_size"], final["state"]["epoch"]) == (3, 2, EPOCHS)
    # gradient statistics were measured whenever there were two or more workers
    epochs = [e for e in events if e["event"] == "epoch"]
    assert epochs and all(e["grad_sqr"] is not None and e["grad_var"] > 0 for e in epochs)


def _shares(world: int) -> list[range]:
    base, extra = divmod(GLOBAL_BATCH, world)
    return [range(base + (1 if r < extra else 0)) for r in range(world)]
