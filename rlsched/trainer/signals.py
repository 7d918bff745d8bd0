"""SIGTERM: the end of a generation, agreed by every rank.

:func:`install_stop_handler` makes SIGTERM set a flag; the loop calls
:func:`agree_to_stop` once per step (an all-reduce of the flags, so every rank leaves
after the same step); rank 0 checkpoints and every process exits :data:`EXIT_STOPPED`.
The operator counts 0 and 143 after SIGTERM as an intentional stop;
:func:`exit_on_checkpoint_error` exits 74. Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from typing import Iterable, Iterator

from rlsched.core.contract import EXIT_CHECKPOINT, EXIT_SIGTERM

from .errors import CheckpointError

__all__ = ["EXIT_STOPPED", "EXIT_SIGTERM", "EXIT_CHECKPOINT", "install_stop_handler", "stop_requested",
           "clear_stop_request", "agree_to_stop", "exit_on_checkpoint_error"]

log = logging.getLogger("rlsched.trainer")

#: where Kubernetes reads a container's termination message (``terminationMessagePath``)
TERMINATION_LOG = "/dev/termination-log"

#: what a worker exits with after an agreed stop (143 is accepted as well)
EXIT_STOPPED = 0

_stop_requested = False  # set by the signal handler; the module's only state


def _on_signal(signum: int, frame: object) -> None:
    global _stop_requested
    _stop_requested = True


def install_stop_handler(signals: Iterable[int] = (signal.SIGTERM,)) -> None:
    """Make ``signals`` (default SIGTERM) request a stop instead of killing the
    process. Call it from the main thread, before the process group is joined, so a
    SIGTERM during start-up is not lost."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_stop_handler must be called from the main thread (a signal-handler rule)")
    for sig in signals:
        signal.signal(sig, _on_signal)


def stop_requested() -> bool:
    """Whether this process received a stop signal (not yet agreed with the others)."""
    return _stop_requested


def clear_stop_request() -> None:
    """Forget a received stop signal (tests, or a loop that decided to go on)."""
    global _stop_requested
    _stop_requested = False


def agree_to_stop(group: object = None) -> bool:
    """True when any rank of ``group`` (default: the whole world) has received a stop
    signal: an all-reduce of the flags with ``MAX``. Every rank must call it at the same
    point of every step (it is a collective). Without an initialised process group it
    is the local flag."""
    local = _stop_requested
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return local
    import torch

    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


@contextlib.contextmanager
def exit_on_checkpoint_error(termination_log: str = TERMINATION_LOG) -> Iterator[None]:
    """Around a script's ``main`` (or as a decorator): a
    :class:`~rlsched.trainer.errors.CheckpointError` ends the process with
    :data:`~rlsched.core.contract.EXIT_CHECKPOINT` (74) after logging it, and writing it
    to ``termination_log`` when that file exists (the pod's termination message).
    A joined process group is left first (every rank meets the same checkpoint), so the
    exit is not turned into an abort by the group's teardown."""
    try:
        yield
    except CheckpointError as exc:
        message = f"checkpoint unusable ({type(exc).__name__}): {exc}"
        log.error("%s; exiting %d", message, EXIT_CHECKPOINT)
        print(f"rlsched.trainer: {message}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            with open(termination_log, "r+") as fh:  # exists only in a container
                fh.write(message[:4000])
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError as teardown:  # the exit code matters more than a clean teardown
                log.info("leaving the process group failed: %s", teardown)
        raise SystemExit(EXIT_CHECKPOINT) from exc
