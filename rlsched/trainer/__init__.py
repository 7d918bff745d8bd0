"""rlsched.trainer: what a training script uses to run elastically under rlsched.

One module per concern, every public name re-exported here lazily (PEP 562): importing
the package loads nothing but the standard library; torch is imported by the functions
that need it and the Kubernetes client by the first progress report. Install it in a
training image with the ``trainer`` extra, from a checkout (``pip install './[trainer]'``)
or the built wheel (its only dependency: the Kubernetes client; torch comes from the
image). See ``docs/trainer.md``.

=====================  ====================================================================
module                 what
=====================  ====================================================================
``contract``           :func:`worker_contract` (the operator's environment), :func:`init_distributed`
``signals``            SIGTERM as a flag, :func:`agree_to_stop`, exit codes, :func:`exit_on_checkpoint_error`
``batching``           the scheduler's global batch over the workers: :func:`plan_batch`, :func:`loss_scale`
``sampler``            :class:`ElasticSampler`: one global order per epoch, resumable at any world size
``checkpoint``         :class:`Checkpointer` (atomic, rank 0, checksummed), :class:`TrainState`
``sharded``            :class:`ShardedCheckpointer`: FSDP through ``torch.distributed.checkpoint``, every rank
``launch``             ``python -m rlsched.trainer.launch``: torchrun whose agreed stop exits 0
``gradstats``          :class:`GradientNoiseScale`: Pollux's gradient statistics from DDP
``adascale``           :class:`AdaScale`: learning rate and scale-invariant progress across batch sizes
``reporting``          :class:`ProgressReporter` (rate-limited, retried, rank 0), :class:`Reporter`, :func:`report`
``errors``             one error type per failure
=====================  ====================================================================

A loop, in short (``examples/ddp_digits.py`` is the whole of it)::

    from rlsched import trainer as rt

    rt.install_stop_handler()
    contract = rt.init_distributed()
    plan = rt.plan_batch(contract.batch_size or 256, contract.world_size, micro_batch_limit=64)
    sampler = rt.ElasticSampler(len(data), plan, contract.rank, seed=0)
    ckpt = rt.Checkpointer(contract.checkpoint_dir, rank=contract.rank)
    state = (ckpt.restore(model=model, optimizer=opt) or (rt.TrainState(), None))[0]
    while state.epoch < epochs:
        for step in sampler.steps(state.epoch, state.consumed):
            ...  # forward/backward on step.micro_batches, loss * step.loss_scale
            state.advance(step)
            if rt.agree_to_stop():
                ckpt.save(model=model, optimizer=opt, state=state, ...)
                raise SystemExit(rt.EXIT_STOPPED)
        ...  # evaluate, report, state.next_epoch(), checkpoint
"""

from __future__ import annotations

import importlib

#: public name -> submodule of this package that defines it
_EXPORTS = {
    # contract
    "WorkerContract": "contract",
    "ContractError": "contract",
    "EXIT_SIGTERM": "contract",
    "ENV_JOB": "contract",
    "ENV_NAMESPACE": "contract",
    "ENV_MASTER_ADDR": "contract",
    "ENV_MASTER_PORT": "contract",
    "ENV_WORLD_SIZE": "contract",
    "ENV_RANK": "contract",
    "ENV_LOCAL_RANK": "contract",
    "ENV_GENERATION": "contract",
    "ENV_BATCH_SIZE": "contract",
    "ENV_CHECKPOINT_DIR": "contract",
    "worker_contract": "contract",
    "local_rank": "contract",
    "init_distributed": "contract",
    "shutdown_distributed": "contract",
    # signals
    "EXIT_STOPPED": "signals",
    "install_stop_handler": "signals",
    "stop_requested": "signals",
    "clear_stop_request": "signals",
    "agree_to_stop": "signals",
    "EXIT_CHECKPOINT": "signals",
    "exit_on_checkpoint_error": "signals",
    # batching
    "BatchPlan": "batching",
    "plan_batch": "batching",
    "split_evenly": "batching",
    "loss_scale": "batching",
    "global_batch_size": "batching",
    "micro_batch_limit": "batching",
    # sampler
    "Step": "sampler",
    "ElasticSampler": "sampler",
    "epoch_order": "sampler",
    # checkpoint
    "TrainState": "checkpoint",
    "Checkpointer": "checkpoint",
    "atomic_save": "checkpoint",
    "unwrap": "checkpoint",
    "check_directory": "checkpoint",
    # sharded checkpoints (FSDP, torch.distributed.checkpoint)
    "ShardedCheckpointer": "sharded",
    # gradient statistics
    "GradientNoiseScale": "gradstats",
    "noise_estimate": "gradstats",
    # learning rate across batch sizes
    "AdaScale": "adascale",
    "gain_ratio": "adascale",
    "rule_gain": "adascale",
    # reporting
    "Reporter": "reporting",
    "ProgressReporter": "reporting",
    "report": "reporting",
    # errors
    "RendezvousError": "errors",
    "BatchSizeError": "errors",
    "CheckpointError": "errors",
    "CheckpointDirError": "errors",
    "CheckpointWriteError": "errors",
    "MissingCheckpointError": "errors",
    "CheckpointFormatError": "errors",
    "ChecksumError": "errors",
    "NoJobError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
