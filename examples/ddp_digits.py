#!/usr/bin/env python
"""An elastic PyTorch DDP training script under rlsched: an MLP on the UCI digits.

Run by the operator as the worker command of ``examples/trainingjob.yaml`` (one process
per worker pod; the environment is the worker contract, docs/trainer.md). Everything
elastic comes from ``rlsched.trainer``:

* ``init_distributed`` joins the generation's process group (gloo on CPU, nccl on GPUs);
* the scheduler's global batch (``RLSCHED_GLOBAL_BATCH_SIZE``, else ``--global-batch``)
  is kept at every world size: each rank takes its share of every global batch
  (``ElasticSampler``), in micro-batches of at most ``--micro-batch`` with gradient
  accumulation, and the summed loss is scaled by ``W/B`` so the gradient is the
  global-batch mean, however unevenly it divides;
* SIGTERM (a rescale or a preemption) finishes the current step, all ranks agree to
  stop after the same step, rank 0 checkpoints (model, optimizer, LR schedule, position
  inside the epoch, RNG) and every rank exits 0; the next generation restores the
  checkpoint at its own world size and goes on from the same sample;
* the learning rate follows the batch the scheduler sets: ``AdaScale`` multiplies the
  LR tuned for ``--base-batch`` by the gain the gradient statistics predict and counts
  progress in base-batch epochs, and the script trains until ``--epochs`` of that
  progress (``--lr-rule`` linear, sqrt or legw instead; ``none``: a fixed LR for
  ``--epochs`` passes over the data);
* progress (loss, accuracy, step time, throughput, gradient statistics, scale-invariant
  epochs) goes to the TrainingJob's ``status.progress`` from rank 0, rate-limited;
* after the last epoch, rank 0 writes the final model (``model.pt`` in the checkpoint
  directory, or ``--out``) and exits 0: the job Succeeds.
* a checkpoint that cannot be used (the directory not writable, none found by a
  restarted generation, an unknown format, a bad checksum) ends the process with exit
  74, which the operator reports as the checkpoint's failure.

The digits data are committed beside the script (``examples/data``, UCI, CC BY 4.0);
nothing is downloaded. Outside the operator, set
the contract by hand, e.g. one process::

    RLSCHED_JOB_NAME=digits MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=1 RANK=0 \\
      RLSCHED_CHECKPOINT_DIR=/tmp/digits python examples/ddp_digits.py --epochs 3 --no-report

Test hooks: ``--log-samples FILE`` appends, per step and rank, the sample indices
consumed (with epoch and generation); ``--log-file FILE`` appends JSON events (start,
steps, stop, epoch ends, done); ``--step-delay S`` stands for a model S seconds slower
per step.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

from rlsched import trainer as rt

#: the held-out part of the 1,797 digits (a fixed, seeded split)
TEST_SAMPLES = 360
SPLIT_SEED = 1234


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=float, default=5,
                   help="progress to train, in base-batch epochs (with --lr-rule none: passes over the data)")
    p.add_argument("--global-batch", type=int, default=32,
                   help="global batch size when the scheduler sets none (RLSCHED_GLOBAL_BATCH_SIZE)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="largest per-worker micro-batch; more is done by gradient accumulation")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate at --base-batch")
    p.add_argument("--base-batch", type=int, default=32, help="the global batch --lr is tuned for")
    p.add_argument("--lr-rule", default="adascale", choices=("adascale", "linear", "sqrt", "legw", "none"),
                   help="learning rate and progress at another batch (default adascale; none: fixed LR)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--checkpoint-dir", default=None, help="default: RLSCHED_CHECKPOINT_DIR")
    p.add_argument("--out", default=None, help="final model file (default: model.pt in the checkpoint directory)")
    p.add_argument("--report-interval", type=float, default=30.0, help="seconds between progress reports")
    p.add_argument("--no-report", action="store_true", help="do not write status.progress")
    p.add_argument("--log-samples", default=None, help="append each rank's consumed sample indices (JSON lines)")
    p.add_argument("--log-file", default=None, help="append JSON events (start, step, stop, epoch, done)")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (a slower model)")
    p.add_argument("--timeout", type=float, default=120.0, help="rendezvous and collective timeout, seconds")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default: nccl with CUDA, else gloo)")
    return p.parse_args(argv)


def append_jsonl(path: str | None, record: dict) -> None:
    """One line, one write(2) with O_APPEND: lines of concurrent ranks never interleave."""
    if not path:
        return
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_digits(path: str | os.PathLike | None = None) -> tuple[list[list[float]], list[int]]:
    """The 1,797 8x8 digits of the UCI optical digits test set (``examples/data/digits.csv.gz``
    beside this script, or ``path``; source and licence in ``examples/data/README.md``):
    the file scikit-learn's ``load_digits`` reads, read with the standard library, so the
    image needs neither scikit-learn nor numpy. tests/trainer checks it equals
    ``load_digits(return_X_y=True)``."""
    path = Path(path) if path is not None else Path(__file__).resolve().parent / "data" / "digits.csv.gz"
    if not path.is_file():
        raise SystemExit(f"ddp_digits: the digits data are not at {path} (examples/data/digits.csv.gz)")
    xs, ys = [], []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            row = [float(v) for v in line.split(",")]
            xs.append(row[:-1])
            ys.append(int(row[-1]))
    return xs, ys


def load_data():
    """Digits as float tensors in [0, 1], split by a fixed seed: (train X, train y,
    test X, test y)."""
    import torch

    x, y = read_digits()
    order = list(range(len(y)))
    random.Random(SPLIT_SEED).shuffle(order)
    test, train = order[:TEST_SAMPLES], order[TEST_SAMPLES:]
    xt = torch.tensor(x, dtype=torch.float32) / 16.0
    yt = torch.tensor(y, dtype=torch.long)
    return xt[train], yt[train], xt[test], yt[test]


def build_model(hidden: int, seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def evaluate(model, x, y) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on ``x, y``."""
    import torch
    import torch.nn.functional as F

    model.eval()
    with torch.no_grad():
        out = model(x)
        loss = F.cross_entropy(out, y).item()
        acc = (out.argmax(dim=1) == y).float().mean().item()
    model.train()
    return acc, loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rt.install_stop_handler()  # before the rendezvous: a SIGTERM during start-up is kept

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    try:
        contract = rt.init_distributed(args.backend, timeout_s=args.timeout)
    except rt.ContractError as exc:
        print(f"ddp_digits: not run by the rlsched operator: {exc}", file=sys.stderr)
        return 2
    rank, world, gen = contract.rank, contract.world_size, contract.generation

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    xtr, ytr, xte, yte = (t.to(device) for t in load_data())
    model = build_model(args.hidden, args.seed).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    gns = rt.GradientNoiseScale().attach(ddp)
    train_size = len(ytr)
    sched, ada = None, None
    if args.lr_rule == "none":  # the LR halves every 2 passes over the data, whatever the batch
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    else:  # the same schedule over base-batch epochs of progress, times the gain
        ada = rt.AdaScale(opt, base_batch=args.base_batch, rule=args.lr_rule, gns=gns, dataset_size=train_size,
                          schedule=lambda t: 0.5 ** (int(t * ada.base_batch / train_size + 1e-9) // 2))

    global_batch = contract.batch_size or args.global_batch
    plan = rt.plan_batch(global_batch, world, args.micro_batch)
    sampler = rt.ElasticSampler(len(ytr), plan, rank, seed=args.seed)

    ckpt_dir = args.checkpoint_dir or contract.checkpoint_dir
    ckpt = rt.Checkpointer(ckpt_dir, rank=rank) if ckpt_dir else None
    if ckpt is None and rank == 0:
        logging.warning("no checkpoint directory: a rescale or preemption restarts from scratch")
    state, restored = rt.TrainState(), None
    if ckpt is not None:
        got = ckpt.restore(model=ddp, optimizer=opt, scheduler=sched)  # to CPU, copied to the device
        if got is not None:
            state, restored = got
            extra = restored.get("extra", {})
            if ada is not None and "adascale" in extra:
                ada.load_state_dict(extra["adascale"])  # progress, base batch, gradient statistics
            elif "gns" in extra:
                gns.load_state_dict(extra["gns"])

    reporter = None
    if not args.no_report:
        reporter = rt.ProgressReporter(contract, interval_s=args.report_interval, metric_name="accuracy")

    def save() -> None:
        if ckpt is not None:
            ckpt.save(model=ddp, optimizer=opt, scheduler=sched, state=state, world_size=world, generation=gen,
                      global_batch=global_batch,
                      extra={"gns": gns.state_dict(), **({"adascale": ada.state_dict()} if ada else {})})

    def event(kind: str, **fields) -> None:
        """Rank 0's log: every event to --log-file, all but the steps to stdout."""
        if rank == 0:
            rec = {"event": kind, "t": round(time.time(), 3), "gen": gen, "world": world, "epoch": state.epoch,
                   "consumed": state.consumed, "step": state.step, **fields}
            append_jsonl(args.log_file, rec)
            if kind != "step":
                print(json.dumps(rec), flush=True)

    def finish(code: int) -> int:
        if reporter is not None:
            reporter.close()
        rt.shutdown_distributed()
        return code

    def progress() -> float:
        """Epochs of progress: base-batch epochs (a rule), else passes over the data."""
        return ada.epochs if ada is not None else state.epoch + state.consumed / train_size

    def reached() -> bool:
        return ada.reached(args.epochs) if ada is not None else state.epoch >= args.epochs

    if rank == 0:
        acc, loss = evaluate(model, xte, yte)
        event("start", resumed=restored is not None, from_gen=None if restored is None else restored["generation"],
              global_batch=global_batch, progress=progress(), shares=list(plan.shares),
              accumulation=plan.accumulation_steps, eval_loss=loss, eval_acc=acc)

    while not reached():
        for step in sampler.steps(state.epoch, state.consumed):
            t0 = time.perf_counter()
            gns.begin_step(step.shares, rank, step.micro_batches)
            loss_sum, last = 0.0, len(step.micro_batches) - 1
            for k, micro in enumerate(step.micro_batches):
                sync = contextlib.nullcontext() if k == last else ddp.no_sync()
                with sync:
                    idx = torch.tensor(micro, dtype=torch.long, device=device)
                    # an empty share still runs forward/backward: every rank joins DDP's all-reduce
                    loss = F.cross_entropy(ddp(xtr[idx]), ytr[idx], reduction="sum")
                    (loss * step.loss_scale).backward()
                    loss_sum += loss.item()
            gns.end_step()
            if ada is not None:  # LR = base schedule(progress) x gain; progress += gain
                ada.step(global_batch, samples=step.global_size)
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            total = torch.tensor([loss_sum], dtype=torch.float64, device=device)
            dist.all_reduce(total)
            mean_loss = total.item() / step.global_size
            if args.step_delay:
                time.sleep(args.step_delay)
            state.advance(step)
            append_jsonl(args.log_samples, {"gen": gen, "rank": rank, "epoch": step.epoch, "start": step.start,
                                            "indices": list(step.indices)})
            event("step", loss=mean_loss, at=step.start, progress=progress(), lr=opt.param_groups[0]["lr"],
                  gain=None if ada is None else ada.last_gain)
            if reporter is not None:
                reporter.step(step=state.step, epoch=state.epoch, loss=mean_loss, samples=step.global_size,
                              step_time_s=time.perf_counter() - t0, global_batch=global_batch,
                              grad_sqr=gns.grad_sqr, grad_var=gns.grad_var,
                              scale_invariant_epochs=None if ada is None else ada.epochs)
            if rt.agree_to_stop():
                if rank == 0:
                    acc, loss = evaluate(model, xte, yte)
                    event("stop", eval_loss=loss, eval_acc=acc)
                save()
                return finish(rt.EXIT_STOPPED)
            if ada is not None and reached():  # every rank holds the same progress
                break
        if state.consumed < train_size:  # the progress target was reached inside the epoch
            save()
            break
        # the epoch is done (possibly by several generations): evaluate, report, checkpoint
        if sched is not None:
            sched.step()
        state.next_epoch()
        if rank == 0:
            acc, loss = evaluate(model, xte, yte)
            event("epoch", eval_loss=loss, eval_acc=acc, lr=opt.param_groups[0]["lr"], progress=progress(),
                  grad_sqr=gns.grad_sqr, grad_var=gns.grad_var)
            if reporter is not None:
                reporter.epoch_end(epoch=state.epoch, loss=loss, accuracy=acc)
        save()

    if rank == 0:
        out = Path(args.out) if args.out else (Path(ckpt_dir) / "model.pt" if ckpt_dir else None)
        if out is not None:
            rt.atomic_save(model.state_dict(), out)
        acc, loss = evaluate(model, xte, yte)
        event("done", eval_loss=loss, eval_acc=acc, progress=progress(), model=None if out is None else str(out))
    return finish(0)


if __name__ == "__main__":
    with rt.exit_on_checkpoint_error():  # an unusable checkpoint: exit 74, the operator names it
        code = main()
    sys.exit(code)
