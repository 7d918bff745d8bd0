"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), for FSDP.

Every rank writes its shards and reads what its new shards need (DCP reshards, so
another world size restores the checkpoint); a checkpoint is a directory with a manifest
of SHA-256s, written under a temporary name and renamed into place; a torn one falls
back to the previous. Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .checkpoint import (
    FORMAT_FAMILY,
    Checkpointer,
    TrainState,
    _fsync_dir,
    atomic_write_text,
    capture_rng,
    restore_rest,
)
from .errors import CheckpointError, CheckpointFormatError, CheckpointWriteError, ChecksumError

__all__ = ["ShardedCheckpointer", "FORMAT_SHARDED", "MANIFEST", "SIDE_FILE"]

log = logging.getLogger("rlsched.trainer")

#: the ``format`` entry of the manifest of every sharded checkpoint this module writes
FORMAT_SHARDED = "rlsched.trainer.dcp/1"
#: the manifest, written last: format and SHA-256 of every other file
MANIFEST = "rlsched.json"
#: rank 0's part: position, scheduler, scaler, RNG, extra
SIDE_FILE = "rlsched.pt"

_ERRORS = {cls.__name__: cls for cls in (CheckpointError, CheckpointFormatError, ChecksumError,
                                          CheckpointWriteError)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a collective; the value itself without a group)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class ShardedCheckpointer(Checkpointer):
    """The job's sharded checkpoint: the directory ``<directory>/<name>`` and the one
    before it, ``<name>.prev``. **Every rank** calls :meth:`save`, :meth:`load` and
    :meth:`restore` (they are collectives). The directory check, the restart check
    (``resume``, ``generation``, ``allow_fresh_start``) and the errors are
    :class:`~rlsched.trainer.checkpoint.Checkpointer`'s."""

    def __init__(self, directory: str | os.PathLike[str], *, rank: int = 0, generation: int | None = None,
                 resume: bool | None = None, name: str = "sharded", keep_previous: bool = True,
                 check: bool = True) -> None:
        super().__init__(directory, rank=rank, generation=generation, resume=resume, filename=name,
                         keep_previous=keep_previous, check=check)

    def save(self, *, model: Any, state: TrainState, optimizer: Any = None, scheduler: Any = None,
             scaler: Any = None, world_size: int = 1, generation: int | None = None, global_batch: int | None = None,
             extra: dict[str, Any] | None = None) -> Path | None:
        """Write the checkpoint: every rank its shards, rank 0 the rest; returns the
        checkpoint's directory on every rank. :class:`CheckpointWriteError` on every rank
        when a write fails."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        gen = self.generation if generation is None else int(generation)
        tmp = self.directory / f".{self.path.name}.tmp-g{gen}-s{state.step}"
        error = None
        if self.rank == 0:
            try:
                self._remove_stale_temporaries()
                tmp.mkdir()
            except OSError as exc:
                error = f"cannot make {tmp}: {exc.strerror or exc}"
        self._raise(_from_rank0(error), CheckpointWriteError)
        model_sd, optim_sd = get_state_dict(model, [] if optimizer is None else optimizer)
        content = {"model": model_sd} if optimizer is None else {"model": model_sd, "optimizer": optim_sd}
        try:
            dcp.save(content, checkpoint_id=tmp)
        except Exception as exc:  # DCP gathers every rank's failure into one CheckpointException
            raise CheckpointWriteError(f"writing the sharded checkpoint {tmp} failed: {exc}") from exc
        if self.rank == 0:
            side = {
                "format": FORMAT_SHARDED,
                "time": time.time(),
                "state": state.as_dict(),
                "world_size": int(world_size),
                "generation": gen,
                "global_batch": None if global_batch is None else int(global_batch),
                "scheduler": None if scheduler is None else scheduler.state_dict(),
                "scaler": None if scaler is None else scaler.state_dict(),
                "rng": capture_rng(),
                "extra": dict(extra or {}),
            }
            try:
                with open(tmp / SIDE_FILE, "wb") as fh:
                    torch.save(side, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
                atomic_write_text(tmp / MANIFEST, json.dumps({"format": FORMAT_SHARDED, "files": files}) + "\n")
                self._swap_in(tmp)
            except OSError as exc:
                error = f"writing the sharded checkpoint {self.path} failed: {exc.strerror or exc}"
        self._raise(_from_rank0(error), CheckpointWriteError)
        return self.path

    def _swap_in(self, tmp: Path) -> None:
        """``path`` -> ``previous_path``, ``tmp`` -> ``path``: at every moment one of
        them is a complete checkpoint (:meth:`load` tries both)."""
        if self.path.exists():
            if self.keep_previous:
                shutil.rmtree(self.previous_path, ignore_errors=True)
                os.replace(self.path, self.previous_path)
            else:
                shutil.rmtree(self.path)
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)

    def _remove_stale_temporaries(self) -> None:
        for stale in self.directory.glob(f".{self.path.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)

    @staticmethod
    def _raise(error: Any, default: type[CheckpointError]) -> None:
        if error is None:
            return
        if isinstance(error, tuple):
            kind, message = error
            raise _ERRORS.get(kind, default)(message)
        raise default(error)

    def _choose(self) -> tuple[Path | None, Any]:
        """Rank 0's choice of the checkpoint directory (or an error to raise)."""
        problems = []
        for candidate in (self.path, self.previous_path):
            if not candidate.exists():
                continue
            try:
                manifest = json.loads((candidate / MANIFEST).read_text())
                if not isinstance(manifest, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                problems.append(f"{candidate.name}: {MANIFEST}: {exc}")
                log.warning("sharded checkpoint %s is incomplete or unreadable (%s); trying the previous one",
                            candidate, exc)
                continue
            fmt = manifest.get("format")
            if fmt != FORMAT_SHARDED:
                newer = " (a newer rlsched.trainer wrote it?)" if str(fmt).startswith(FORMAT_FAMILY) else ""
                return None, ("CheckpointFormatError",
                              f"{candidate} has the format {fmt!r:.60}{newer}; this library reads "
                              f"{FORMAT_SHARDED!r}: not a sharded rlsched.trainer checkpoint it knows")
            files = manifest.get("files")
            if not isinstance(files, dict) or SIDE_FILE not in files:
                return None, ("CheckpointFormatError", f"{candidate / MANIFEST}: no file list")
            for name, digest in files.items():
                try:
                    got = _sha256(candidate / name)
                except OSError as exc:
                    return None, ("ChecksumError", f"{candidate / name}, listed in the manifest, cannot be read: "
                                                   f"{exc.strerror or exc}")
                if got != digest:
                    return None, ("ChecksumError", f"{candidate / name}: the checksum does not match its contents "
                                                   f"(sha256 {got[:16]}..., written {str(digest)[:16]}...): the "
                                                   f"file was changed after it was written")
            if candidate != self.path:
                log.warning("restoring the previous sharded checkpoint %s", candidate)
            return candidate, None
        if problems:
            return None, ("CheckpointError", f"no usable sharded checkpoint in {self.directory}: "
                                             + "; ".join(problems))
        return None, None

    def load(self, *, map_location: Any = "cpu", weights_only: bool = True,
             allow_fresh_start: bool = False) -> dict[str, Any] | None:
        """Rank 0's side payload of the newest verified checkpoint (``path`` added: its
        directory), the same on every rank; None when there is none and a fresh start
        is allowed (:meth:`Checkpointer.load`'s rules). A collective."""
        import torch

        choice, error = (self._choose() if self.rank == 0 else (None, None))
        choice, error = _from_rank0((None if choice is None else str(choice), error))
        self._raise(error, CheckpointError)
        if choice is None:
            self._fresh_start(allow_fresh_start)
            return None
        side = torch.load(Path(choice) / SIDE_FILE, map_location=map_location, weights_only=weights_only)
        side["path"] = choice
        return side

    def restore(self, *, model: Any, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
                map_location: Any = "cpu", weights_only: bool = True, rng: bool = True,
                allow_fresh_start: bool = False) -> tuple[TrainState, dict[str, Any]] | None:
        """Load the newest checkpoint into ``model`` (FSDP, DDP or plain; resharded to
        this world size), ``optimizer``, ``scheduler`` and ``scaler``, set the RNG states,
        and return the position and the side payload; None when there is none yet."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        side = self.load(map_location=map_location, weights_only=weights_only, allow_fresh_start=allow_fresh_start)
        if side is None:
            return None
        model_sd, optim_sd = get_state_dict(model, [] if optimizer is None else optimizer)
        content = {"model": model_sd} if optimizer is None else {"model": model_sd, "optimizer": optim_sd}
        dcp.load(content, checkpoint_id=side["path"])
        set_state_dict(model, [] if optimizer is None else optimizer, model_state_dict=content["model"],
                       optim_state_dict=content.get("optimizer", {}))
        return restore_rest(side, scheduler=scheduler, scaler=scaler, rng=rng), side

    def exists(self) -> bool:
        return (self.path / MANIFEST).exists() or (self.previous_path / MANIFEST).exists()
