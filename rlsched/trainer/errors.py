"""The error types of ``rlsched.trainer``: one per failure a training script may want to
tell apart. :class:`~rlsched.core.contract.ContractError` (a worker's environment does
not hold the worker contract) comes from :mod:`rlsched.core.contract` and is re-exported
by the package."""

from __future__ import annotations

from rlsched.core.contract import ContractError

__all__ = ["ContractError", "RendezvousError", "BatchSizeError", "CheckpointError", "NoJobError"]


class RendezvousError(RuntimeError):
    """``torch.distributed`` could not be initialised from the contract (the chief at
    ``MASTER_ADDR:MASTER_PORT`` did not answer in time, or the world did not assemble)."""


class BatchSizeError(ValueError):
    """A global batch size that cannot be split over the workers (smaller than the
    world size, or not a positive whole number)."""


class CheckpointError(RuntimeError):
    """No usable checkpoint: every candidate file is missing, truncated or was written
    by something else than :class:`rlsched.trainer.Checkpointer`."""


class NoJobError(RuntimeError):
    """Nothing to report to: the job name or namespace is unknown (not set by the
    operator and not passed)."""
