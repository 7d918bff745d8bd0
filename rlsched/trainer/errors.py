"""The error types of ``rlsched.trainer``: one per failure a training script may want to
tell apart. :class:`~rlsched.core.contract.ContractError` (a worker's environment does
not hold the worker contract) comes from :mod:`rlsched.core.contract` and is re-exported
by the package. Every :class:`CheckpointError` ends a worker with
:data:`~rlsched.core.contract.EXIT_CHECKPOINT` under :func:`rlsched.trainer.exit_on_checkpoint_error`."""

from __future__ import annotations

from rlsched.core.contract import ContractError

__all__ = ["ContractError", "RendezvousError", "BatchSizeError", "CheckpointError", "CheckpointDirError",
           "CheckpointWriteError", "MissingCheckpointError", "CheckpointFormatError", "ChecksumError",
           "NoJobError"]


class RendezvousError(RuntimeError):
    """``torch.distributed`` could not be initialised from the contract (the chief at
    ``MASTER_ADDR:MASTER_PORT`` did not answer in time, or the world did not assemble)."""


class BatchSizeError(ValueError):
    """A global batch size that cannot be split over the workers (smaller than the
    world size, or not a positive whole number)."""


class CheckpointError(RuntimeError):
    """No usable checkpoint: every candidate file is missing, truncated or was written
    by something else than :class:`rlsched.trainer.Checkpointer`. The base of the
    checkpoint errors below."""


class CheckpointDirError(CheckpointError):
    """The checkpoint directory cannot be created or written (checked at start, by a
    real write)."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (the volume is full or went away)."""


class MissingCheckpointError(CheckpointError):
    """A restarted generation (``RLSCHED_RESUME=1``: an earlier generation ran; without
    it, ``RLSCHED_GENERATION`` > 0) finds no checkpoint in a directory no earlier
    generation of the job has used: the volume is not the one the
    job wrote to, and starting from scratch would silently throw the training away."""


class CheckpointFormatError(CheckpointError):
    """A readable checkpoint of a format this library does not know (a newer
    ``rlsched.trainer/N``, or a file something else wrote)."""


class ChecksumError(CheckpointError):
    """A checkpoint whose contents do not match the checksum written with it (bytes
    changed on the volume)."""


class NoJobError(RuntimeError):
    """Nothing to report to: the job name or namespace is unknown (not set by the
    operator and not passed)."""
