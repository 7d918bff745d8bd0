"""AdaScale across a rescale that changes the batch (gloo, CPU, ``examples/ddp_digits.py``).

Generation 0 trains at global batch 32 on 2 workers and is SIGTERMed mid-epoch; the
next generation runs at batch 96 from its checkpoint, twice: on 3 workers with AdaScale
to the same scale-invariant progress as an uninterrupted batch-32 run (3 base-batch
epochs), and with the fixed learning rate for the same 3 passes over the data (on one
worker, to spare processes: the global batch trains alike at any world size, as
test_elastic_ddp shows to 1e-6). At batch 32 AdaScale's gain is exactly 1, so
generation 0 and the reference train exactly as a fixed learning rate does. The tolerances (AdaScale within 2 points of the
reference; the fixed LR at least 3 points below it) and the figures measured are in
docs/trainer.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlsched.core.contract import EXIT_SIGTERM, WorkerContract

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_digits.py"
TRAIN_SAMPLES = 1797 - 360

BASE_BATCH, BIG_BATCH, EPOCHS, STOP_AFTER = 32, 96, 3, 15
ACCURACY_TOLERANCE = 0.02
FIXED_LR_LOSS = 0.03

pytestmark = pytest.mark.slow


def _free_port() -> int:  # as test_elastic_ddp launches its workers
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _start(job_dir: Path, gen: int, world: int, batch: int, *extra: str, step_delay: float = 0.0):
    port = _free_port()
    cmd = [sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), "--base-batch", str(BASE_BATCH), "--seed", "0",
           "--no-report", "--log-file", str(job_dir / "events.jsonl"), "--step-delay", str(step_delay),
           "--timeout", "60", *extra]
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "RLSCHED_", "PET_"))}
        env.update(WorkerContract(job=job_dir.name, namespace="default", index=rank, workers=world, generation=gen,
                                  master_addr="127.0.0.1", master_port=port, batch_size=batch,
                                  checkpoint_dir=str(job_dir / "checkpoint")).env())
        env.update(RLSCHED_JOB_NAME=job_dir.name, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        with open(job_dir / f"gen{gen}-rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def _wait(job_dir: Path, procs, timeout: float = 180.0) -> list[int]:
    codes = None
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
        return codes
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if codes is None or any(c not in (0, EXIT_SIGTERM) for c in codes):
            print("\n".join(f.read_text()[-2000:] for f in sorted(job_dir.glob("gen*.log"))), file=sys.stderr)


def _done(job_dir: Path) -> dict:
    return next(e for e in _events(job_dir / "events.jsonl") if e["event"] == "done")


def test_adascale_after_a_batch_change_reaches_the_uninterrupted_accuracy(tmp_path):
    dirs = {name: tmp_path / name for name in ("reference", "adascale", "fixed")}
    for d in dirs.values():
        (d / "checkpoint").mkdir(parents=True)
    reference = _start(dirs["reference"], 0, 1, BASE_BATCH)  # one worker trains as two do (test_elastic_ddp)

    # generation 0 at batch 32, SIGTERMed after STOP_AFTER steps (a rescale)
    first = _start(dirs["adascale"], 0, 2, BASE_BATCH, step_delay=0.02)
    deadline = time.monotonic() + 120
    while not any(e["event"] == "step" and e["step"] >= STOP_AFTER for e in _events(dirs["adascale"] / "events.jsonl")):
        assert all(p.poll() is None for p in first) and time.monotonic() < deadline, "generation 0 ended early"
        time.sleep(0.02)
    for p in first:
        p.send_signal(signal.SIGTERM)
    assert all(c in (0, EXIT_SIGTERM) for c in _wait(dirs["adascale"], first))
    stop = next(e for e in _events(dirs["adascale"] / "events.jsonl") if e["event"] == "stop")
    assert 0 < stop["consumed"] < TRAIN_SAMPLES
    shutil.copytree(dirs["adascale"] / "checkpoint", dirs["fixed"] / "checkpoint", dirs_exist_ok=True)

    # generation 1 at batch 96 on 3 workers: AdaScale, and the fixed learning rate
    ada = _start(dirs["adascale"], 1, 3, BIG_BATCH)
    fixed = _start(dirs["fixed"], 1, 1, BIG_BATCH, "--lr-rule", "none")  # any world size trains alike
    assert _wait(dirs["adascale"], ada) == [0, 0, 0]
    assert _wait(dirs["fixed"], fixed) == [0]
    assert _wait(dirs["reference"], reference) == [0]

    events = _events(dirs["adascale"] / "events.jsonl")
    start = next(e for e in events if e["event"] == "start" and e["gen"] == 1)
    # the progress made at batch 32 came back with the checkpoint: one base iteration per step
    assert start["resumed"] and start["progress"] == pytest.approx(stop["step"] * BASE_BATCH / TRAIN_SAMPLES)
    big = [e for e in events if e["event"] == "step" and e["gen"] == 1]
    assert all(1.0 <= e["gain"] <= 3.0 for e in big) and max(e["gain"] for e in big) > 1.2
    ref, done, fix = _done(dirs["reference"]), _done(dirs["adascale"]), _done(dirs["fixed"])
    # the same scale-invariant progress as the reference, in more passes over the data
    assert ref["progress"] == pytest.approx(EPOCHS) and done["progress"] >= EPOCHS
    assert done["progress"] - EPOCHS < 3.0 * BASE_BATCH / TRAIN_SAMPLES  # stopped at the first step past it
    assert done["epoch"] + done["consumed"] / TRAIN_SAMPLES > EPOCHS and fix["epoch"] == EPOCHS
    print(f"\naccuracy: uninterrupted batch 32 {ref['eval_acc']:.4f}; 32 -> 96 with AdaScale "
          f"{done['eval_acc']:.4f} ({done['step']} steps); 32 -> 96 with the fixed LR {fix['eval_acc']:.4f}")
    assert abs(done["eval_acc"] - ref["eval_acc"]) <= ACCURACY_TOLERANCE
    assert fix["eval_acc"] < ref["eval_acc"] - FIXED_LR_LOSS
