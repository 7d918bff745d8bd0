#!/usr/bin/env python
"""ddp_digits.py with mixed precision (AMP) and FSDP: the same elastic loop, two more ways
teams train.

* ``--amp``: the forward passes under ``torch.autocast`` (bfloat16 on CPU, float16 on
  CUDA) and the loss through a ``torch.amp.GradScaler``, whose state (scale, growth
  tracker) the checkpoint carries (``Checkpointer(..., scaler=)``);
* ``--parallel fsdp``: the MLP sharded with FSDP2 (``fully_shard``, every rank holds a
  shard of each parameter and of its optimizer state) and checkpointed through
  ``torch.distributed.checkpoint`` by every rank (``rt.ShardedCheckpointer``); another
  world size reshards it at restore. Evaluation is a collective then (every rank runs
  the forward pass), and the final model is gathered before rank 0 writes it;
* several processes per pod: run it under ``python -m rlsched.trainer.launch`` (torchrun
  whose agreed stop exits 0; ``PET_NPROC_PER_NODE`` processes per worker pod).

The data, model and evaluation are ``ddp_digits.py``'s (imported from beside this file);
the command-line test hooks (``--log-file``, ``--log-samples``, ``--step-delay``) too.
A checkpoint that cannot be used ends every process with exit 74
(``rt.exit_on_checkpoint_error``), which the operator reports as the checkpoint's failure.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path

from rlsched import trainer as rt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_digits import append_jsonl, build_model, evaluate, load_data  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--amp", action="store_true", help="autocast and a GradScaler")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=32,
                   help="global batch size when the scheduler sets none (RLSCHED_GLOBAL_BATCH_SIZE)")
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="default: RLSCHED_CHECKPOINT_DIR")
    p.add_argument("--allow-fresh-start", action="store_true",
                   help="a restarted generation without a checkpoint starts from scratch instead of failing")
    p.add_argument("--log-samples", default=None)
    p.add_argument("--log-file", default=None)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--backend", default=None)
    p.add_argument("--result", default=None, help="rank 0 appends one JSON line with the outcome (a smoke test's)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rt.install_stop_handler()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    contract = rt.init_distributed(args.backend, timeout_s=args.timeout)
    rank, world, gen = contract.rank, contract.world_size, contract.generation
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    xtr, ytr, xte, yte = (t.to(device) for t in load_data())
    model = build_model(args.hidden, args.seed).to(device)
    fsdp = args.parallel == "fsdp"
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler(device.type) if args.amp else None
    amp_dtype = torch.float16 if cuda else torch.bfloat16

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if args.amp else contextlib.nullcontext()

    global_batch = contract.batch_size or args.global_batch
    plan = rt.plan_batch(global_batch, world, args.micro_batch or contract.micro_batch_limit)
    sampler = rt.ElasticSampler(len(ytr), plan, rank, seed=args.seed)
    ckpt_dir = args.checkpoint_dir or contract.checkpoint_dir
    kind = rt.ShardedCheckpointer if fsdp else rt.Checkpointer
    ckpt = kind(ckpt_dir, rank=rank, generation=gen)  # checks the directory: a real write
    got = ckpt.restore(model=net, optimizer=opt, scheduler=sched, scaler=scaler,
                       allow_fresh_start=args.allow_fresh_start)
    state, restored = got if got is not None else (rt.TrainState(), None)

    def evaluate_now() -> tuple[float, float] | None:
        """(accuracy, loss) on rank 0; under FSDP every rank runs the forward pass."""
        if fsdp or rank == 0:
            with autocast():
                acc, loss = evaluate(net if fsdp else model, xte, yte)
            return acc, loss
        return None

    def event(kind: str, **fields) -> None:
        if rank == 0:
            append_jsonl(args.log_file, {"event": kind, "t": round(time.time(), 3), "gen": gen, "world": world,
                                         "epoch": state.epoch, "consumed": state.consumed, "step": state.step,
                                         **fields})

    def save() -> None:
        ckpt.save(model=net, optimizer=opt, scheduler=sched, scaler=scaler, state=state, world_size=world,
                  generation=gen, global_batch=global_batch)

    def finish(code: int, **outcome) -> int:
        if rank == 0 and args.result:
            append_jsonl(args.result, {"gen": gen, "world": world, "step": state.step, "exit": code, **outcome})
        rt.shutdown_distributed()
        return code

    ev = evaluate_now()
    if ev is not None:
        event("start", resumed=restored is not None, from_gen=None if restored is None else restored["generation"],
              global_batch=global_batch, shares=list(plan.shares), eval_acc=ev[0], eval_loss=ev[1],
              scale=None if scaler is None else scaler.get_scale())

    while state.epoch < args.epochs:
        for step in sampler.steps(state.epoch, state.consumed):
            loss_sum, last = 0.0, len(step.micro_batches) - 1
            for k, micro in enumerate(step.micro_batches):
                if fsdp:
                    net.set_requires_gradient_sync(k == last)
                    sync = contextlib.nullcontext()
                else:
                    sync = contextlib.nullcontext() if k == last else net.no_sync()
                with sync:
                    idx = torch.tensor(micro, dtype=torch.long, device=device)
                    with autocast():
                        loss = F.cross_entropy(net(xtr[idx]), ytr[idx], reduction="sum")
                    scaled = loss * step.loss_scale
                    (scaled if scaler is None else scaler.scale(scaled)).backward()
                    loss_sum += loss.item()
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            opt.zero_grad(set_to_none=True)
            total = torch.tensor([loss_sum], dtype=torch.float64, device=device)
            dist.all_reduce(total)
            mean_loss = total.item() / step.global_size
            if args.step_delay:
                time.sleep(args.step_delay)
            state.advance(step)
            append_jsonl(args.log_samples, {"gen": gen, "rank": rank, "epoch": step.epoch, "start": step.start,
                                            "indices": list(step.indices)})
            event("step", loss=mean_loss, at=step.start)
            if rt.agree_to_stop():
                ev = evaluate_now()
                if ev is not None:
                    event("stop", eval_acc=ev[0], eval_loss=ev[1],
                          scale=None if scaler is None else scaler.get_scale())
                save()
                return finish(rt.EXIT_STOPPED, stopped=True, resumed=restored is not None)
        sched.step()
        state.next_epoch()
        ev = evaluate_now()
        if ev is not None:
            event("epoch", eval_acc=ev[0], eval_loss=ev[1])
        save()

    if fsdp:  # the whole model, gathered from the shards (a collective)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = model.state_dict()
    ev = evaluate_now()
    if rank == 0:
        rt.atomic_save(full, Path(ckpt_dir) / "model.pt")
        event("done", eval_acc=ev[0], eval_loss=ev[1])
    return finish(0, stopped=False, resumed=restored is not None, eval_acc=None if ev is None else ev[0])


if __name__ == "__main__":
    with rt.exit_on_checkpoint_error():  # an unusable checkpoint: exit 74, the operator names it
        code = main()
    sys.exit(code)
