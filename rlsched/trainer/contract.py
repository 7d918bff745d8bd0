"""The worker contract inside the training process, and ``torch.distributed`` from it.

:func:`worker_contract` reads the rendezvous variables (``MASTER_ADDR``, ``WORLD_SIZE``,
``RANK``, ...) and rlsched's own (``RLSCHED_GENERATION``, ``RLSCHED_GLOBAL_BATCH_SIZE``,
``RLSCHED_CHECKPOINT_DIR``, ...) with core's parser; :func:`init_distributed` joins the
generation's process group (under torchrun, the process's own contract). torch is
imported only by :func:`init_distributed`. Details: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Mapping

from rlsched.core.contract import (
    ENV_BATCH_SIZE,
    ENV_CHECKPOINT_DIR,
    ENV_GENERATION,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NAMESPACE,
    ENV_RANK,
    ENV_WORLD_SIZE,
    EXIT_SIGTERM,
    ContractError,
    WorkerContract,
)

from .errors import RendezvousError

__all__ = [
    "WorkerContract",
    "ContractError",
    "EXIT_SIGTERM",
    "ENV_JOB",
    "ENV_NAMESPACE",
    "ENV_MASTER_ADDR",
    "ENV_MASTER_PORT",
    "ENV_WORLD_SIZE",
    "ENV_RANK",
    "ENV_LOCAL_RANK",
    "ENV_GENERATION",
    "ENV_BATCH_SIZE",
    "ENV_CHECKPOINT_DIR",
    "DEFAULT_TIMEOUT_S",
    "worker_contract",
    "env_int",
    "local_rank",
    "init_distributed",
    "shutdown_distributed",
]

_log = logging.getLogger(__name__)

#: rendezvous and collective timeout: a generation whose peers do not arrive, or a peer
#: that died inside a collective, ends the survivors with an error after this long
DEFAULT_TIMEOUT_S = 300.0


def worker_contract(environ: Mapping[str, str] | None = None) -> WorkerContract:
    """This worker's contract from ``environ`` (default ``os.environ``); a
    :class:`ContractError` naming the first missing or malformed variable, which is
    what a script run outside the operator gets."""
    return WorkerContract.from_env(os.environ if environ is None else environ)


def env_int(key: str, *, default: int | None, minimum: int, error: type[Exception] = ContractError,
            environ: Mapping[str, str] | None = None) -> int | None:
    """The whole number in ``key`` of ``environ`` (default ``os.environ``), ``default``
    when unset or empty; ``error`` naming the variable when it is not a whole number
    or below ``minimum``."""
    raw = (os.environ if environ is None else environ).get(key)
    if not raw:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise error(f"{key}={raw!r:.40} is not a whole number") from None
    if value < minimum:
        raise error(f"{key}={value} < {minimum}")
    return value


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """``LOCAL_RANK`` (0 when unset: one process per pod); a :class:`ContractError`
    when it is not a whole number >= 0."""
    return env_int(ENV_LOCAL_RANK, default=0, minimum=0, environ=environ)


def init_distributed(
    backend: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> WorkerContract:
    """Join this generation's ``torch.distributed`` process group and return the
    contract it was built from.

    ``backend``: ``"nccl"`` when CUDA is available (the process then uses GPU
    ``LOCAL_RANK``), else ``"gloo"``. The rendezvous is a TCP store at
    ``MASTER_ADDR:MASTER_PORT`` (the chief, rank 0, hosts it) with ``RANK`` and
    ``WORLD_SIZE`` of the contract; under torchrun (``TORCHELASTIC_RUN_ID`` set) it is
    ``env://``, whose store the agent of node 0 hosts. ``timeout_s`` bounds the
    rendezvous and every collective. Already initialised: the contract is returned and
    nothing else happens.

    Raises :class:`ContractError` outside the operator (a variable missing) and
    :class:`RendezvousError` when the group does not assemble.
    """
    contract = worker_contract(environ)
    lrank = local_rank(environ)
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise RendezvousError("this torch build has no torch.distributed")
    if dist.is_initialized():
        return contract
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(lrank)
    host = contract.master_addr
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal in a URL
    url = f"tcp://{host}:{contract.master_port}"
    if dist.is_torchelastic_launched():  # torchrun: ranks are clients of the agent's store
        url = "env://"
    try:
        dist.init_process_group(
            backend,
            init_method=url,
            rank=contract.rank,
            world_size=contract.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        raise RendezvousError(
            f"rank {contract.rank} of {contract.world_size} (generation {contract.generation}) could not join "
            f"the process group at {url} with {backend} within {timeout_s:g}s: {exc}"
        ) from exc
    return contract


def shutdown_distributed() -> None:
    """Leave the process group if one was joined (before the process exits).

    Every rank first waits at a barrier, so no rank tears down its connections while a
    peer is still using them (rank 0 writing the checkpoint, say). Without it a gloo
    rank that left early was seen to abort at exit (SIGABRT, "terminate called without
    an active exception") about once in a few dozen generations. A barrier that fails
    because a peer is already gone is not an error at shutdown: the group is destroyed
    all the same."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_world_size() > 1:
            dist.barrier()
    except RuntimeError as exc:  # a peer exited or crashed first: nothing left to wait for
        _log.info("shutdown barrier skipped, a peer has already left: %s", exc)
    dist.destroy_process_group()
