"""Checkpoint and restore for checkpoint-restart elasticity.

What a checkpoint holds: the model, the optimizer and the LR scheduler (their
``state_dict``), the training position (:class:`TrainState`: epoch, samples of the
epoch's global order consumed, global step), the RNG states (Python's, torch's CPU and
CUDA generators, numpy's global one only when numpy is already imported), and the world
size, generation and global batch it was written at, plus anything the script adds.
Nothing in it depends on the world size: the model and optimizer are those of the
unwrapped module (identical on every rank under DDP) and the position counts samples,
so any world size restores it (:class:`~rlsched.trainer.sampler.ElasticSampler`).

Writing is atomic and done by rank 0 only: ``torch.save`` into a temporary file in the
same directory, ``flush`` + ``fsync``, the current checkpoint kept as the previous one
(hard link, else copy), ``os.replace`` of the temporary file onto the checkpoint's
name, ``fsync`` of the directory. A crash at any point leaves the last complete
checkpoint (or the previous one) loadable; :meth:`Checkpointer.load` falls back to the
previous file when the newest is unreadable. Loading uses ``torch.load(weights_only=True)``
(no arbitrary code from a checkpoint file) unless told otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError

__all__ = ["TrainState", "Checkpointer", "FORMAT", "atomic_save", "capture_rng", "restore_rng", "unwrap"]

log = logging.getLogger("rlsched.trainer")

#: the ``format`` entry of every checkpoint this module writes
FORMAT = "rlsched.trainer/1"


@dataclass(slots=True)
class TrainState:
    """Where training is: ``epoch`` (0-based, the one in progress), ``consumed``
    (samples of that epoch's global order done) and ``step`` (optimizer steps in all)."""

    epoch: int = 0
    consumed: int = 0
    step: int = 0

    def advance(self, step: Any) -> None:
        """After finishing ``step`` (a :class:`~rlsched.trainer.sampler.Step`)."""
        self.consumed = step.end
        self.step += 1

    def next_epoch(self) -> None:
        self.epoch += 1
        self.consumed = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "step": self.step}


def unwrap(model: Any) -> Any:
    """The module inside ``DistributedDataParallel``/``DataParallel`` (else ``model``)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    return model.module if isinstance(model, (DistributedDataParallel, DataParallel)) else model


def capture_rng() -> dict[str, Any]:
    """The RNG states: Python's, torch's CPU (and CUDA when initialised), numpy's global
    generator only when numpy is already imported. Stored in types ``weights_only``
    loading accepts."""
    import torch

    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy"] = {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def restore_rng(states: dict[str, Any]) -> None:
    """Set the RNG states :func:`capture_rng` returned (the parts present here)."""
    import torch

    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in states:
        torch.set_rng_state(states["torch"].cpu())
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in states["cuda"]])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in states:
        s = states["numpy"]
        np.random.set_state((s["name"], s["keys"].cpu().numpy().astype("uint32"), s["pos"], s["has_gauss"],
                             s["cached_gaussian"]))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as exc:  # some filesystems (and Windows) cannot open a directory
        log.debug("cannot fsync %s: %s", directory, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        log.debug("fsync of %s failed: %s", directory, exc)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: str | os.PathLike[str], *, keep_previous: str | os.PathLike[str] | None = None) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: a temporary file beside it, fsync,
    ``os.replace``. With ``keep_previous``, the file ``path`` held before is kept there."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if keep_previous is not None and path.exists():
            prev = Path(keep_previous)
            prev_tmp = prev.with_name(f".{prev.name}.tmp-{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                prev_tmp.unlink()
            try:
                os.link(path, prev_tmp)
            except OSError:  # no hard links on this filesystem: copy
                shutil.copyfile(path, prev_tmp)
            os.replace(prev_tmp, prev)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return path


class Checkpointer:
    """The job's checkpoint in ``directory`` (``RLSCHED_CHECKPOINT_DIR``, a volume every
    worker mounts): ``<filename>`` and the one before it, ``<stem>.prev<suffix>``.
    Only ``rank`` 0 writes; every rank reads."""

    def __init__(self, directory: str | os.PathLike[str], *, rank: int = 0, filename: str = "checkpoint.pt",
                 keep_previous: bool = True) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.path = self.directory / filename
        self.previous_path = self.path.with_name(f"{self.path.stem}.prev{self.path.suffix}")
        self.keep_previous = keep_previous

    def save(self, *, model: Any, state: TrainState, optimizer: Any = None, scheduler: Any = None,
             world_size: int = 1, generation: int = 0, global_batch: int | None = None,
             extra: dict[str, Any] | None = None) -> Path | None:
        """Write the checkpoint (rank 0; other ranks return None at once)."""
        if self.rank != 0:
            return None
        payload = {
            "format": FORMAT,
            "time": time.time(),
            "state": state.as_dict(),
            "world_size": int(world_size),
            "generation": int(generation),
            "global_batch": None if global_batch is None else int(global_batch),
            "model": unwrap(model).state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "rng": capture_rng(),
            "extra": dict(extra or {}),
        }
        self._remove_stale_temporaries()
        return atomic_save(payload, self.path, keep_previous=self.previous_path if self.keep_previous else None)

    def _remove_stale_temporaries(self) -> None:
        """Temporary files a crashed writer left (one writer at a time: rank 0 of the
        one running generation)."""
        for pattern in (f".{self.path.name}.tmp-*", f".{self.previous_path.name}.tmp-*"):
            for stale in self.directory.glob(pattern):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()

    def exists(self) -> bool:
        return self.path.exists() or self.previous_path.exists()

    def load(self, *, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any] | None:
        """The newest readable checkpoint as written by :meth:`save`; None when there is
        none at all. An unreadable newest file falls back to the previous one; when
        files exist but none is readable, :class:`CheckpointError`."""
        import torch

        problems = []
        for candidate in (self.path, self.previous_path):
            if not candidate.exists():
                continue
            try:
                payload = torch.load(candidate, map_location=map_location, weights_only=weights_only)
            except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError... on a bad file
                # a whole archive that weights-only unpickling refuses is a policy matter,
                # not a torn file: falling back would silently restore an older state
                if weights_only and "Weights only load failed" in str(exc) and zipfile.is_zipfile(candidate):
                    raise CheckpointError(
                        f"{candidate} holds objects weights_only loading refuses (a script's own class in "
                        f"extra=?); load it with weights_only=False if the file is trusted: {exc}"
                    ) from exc
                problems.append(f"{candidate.name}: {type(exc).__name__}: {exc}")
                log.warning("checkpoint %s is unreadable (%s); trying the previous one",
                            candidate, exc)
                continue
            if not isinstance(payload, dict) or payload.get("format") != FORMAT:
                problems.append(f"{candidate.name}: not an rlsched.trainer checkpoint")
                continue
            if candidate != self.path:
                log.warning("restoring the previous checkpoint %s", candidate)
            payload["path"] = str(candidate)
            return payload
        if problems:
            raise CheckpointError(f"no usable checkpoint in {self.directory}: " + "; ".join(problems))
        return None

    def restore(self, *, model: Any, optimizer: Any = None, scheduler: Any = None, map_location: Any = "cpu",
                weights_only: bool = True, rng: bool = True) -> tuple[TrainState, dict[str, Any]] | None:
        """Load the newest checkpoint into ``model`` (the unwrapped module),
        ``optimizer`` and ``scheduler``, set the RNG states (``rng``), and return the
        position and the checkpoint's payload; None (nothing changed) when there is no
        checkpoint yet. Any world size restores it."""
        payload = self.load(map_location=map_location, weights_only=weights_only)
        if payload is None:
            return None
        unwrap(model).load_state_dict(payload["model"])
        if optimizer is not None and payload.get("optimizer") is not None:
            optimizer.load_state_dict(payload["optimizer"])
        if scheduler is not None and payload.get("scheduler") is not None:
            scheduler.load_state_dict(payload["scheduler"])
        if rng and payload.get("rng"):
            restore_rng(payload["rng"])
        s = payload["state"]
        return TrainState(epoch=int(s["epoch"]), consumed=int(s["consumed"]), step=int(s["step"])), payload
