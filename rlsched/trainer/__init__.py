"""rlsched.trainer: what a training script uses to run elastically under rlsched.

One module per concern (contract, signals, batching, sampler, checkpoint, sharded,
launch, gradstats, adascale, reporting, errors), every public name re-exported here
lazily (PEP 562): importing the package loads only the standard library; torch and the
Kubernetes client are imported by the functions that need them. Install it with the
``trainer`` extra. A whole loop: ``examples/ddp_digits.py``; guide: docs/trainer.md.
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
