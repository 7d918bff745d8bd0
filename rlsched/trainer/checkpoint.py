"""Checkpoint and restore for checkpoint-restart elasticity.

A checkpoint holds the model, optimizer, LR scheduler, training position, RNG states and
the world size, generation and batch it was written at; nothing in it depends on the
world size. Writing is atomic, by rank 0, checksummed; loading falls back to the previous
file only when the newest is torn. Failures are loud, never a silent start from scratch.
Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.core.contract import ENV_GENERATION, ENV_RESUME, parse_resume

from .contract import env_int
from .errors import (
    CheckpointDirError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointWriteError,
    ChecksumError,
    MissingCheckpointError,
)

__all__ = ["TrainState", "Checkpointer", "FORMAT", "FORMAT_FAMILY", "MARKER", "atomic_save", "capture_rng", "restore_rest",
           "restore_rng", "unwrap", "check_directory", "payload_digest", "verify_payload", "env_generation",
           "env_resume", "atomic_write_text"]

log = logging.getLogger("rlsched.trainer")

#: the ``format`` entry of every checkpoint this module writes
FORMAT = "rlsched.trainer/1"
#: what every format of this library starts with (a newer one is refused, not skipped)
FORMAT_FAMILY = "rlsched.trainer"
#: left in the checkpoint directory by rank 0 of the first generation that ran: "this
#: job started here"
MARKER = ".rlsched-job"


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


def env_generation(environ: Any = None) -> int:
    """``RLSCHED_GENERATION`` (0 when unset); a :class:`ContractError` when malformed."""
    return env_int(ENV_GENERATION, default=0, minimum=0, environ=environ)


def env_resume(environ: Any = None) -> bool | None:
    """``RLSCHED_RESUME``: whether an earlier generation of the job ran; None when unset
    (an operator that does not set it); a :class:`ContractError` when malformed."""
    return parse_resume((os.environ if environ is None else environ).get(ENV_RESUME))


def check_directory(directory: str | os.PathLike[str]) -> Path:
    """Make ``directory`` if needed and prove it writable by writing, syncing, reading
    back and removing a small file (a read-only or full volume fails here, at start,
    not at the first save); :class:`CheckpointDirError` naming the directory and the
    cause."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointDirError(f"checkpoint directory {directory} does not exist and cannot be created: "
                                 f"{exc.strerror or exc}") from exc
    probe = directory / f".rlsched-probe-{socket.gethostname()}-{os.getpid()}"
    data = b"rlsched.trainer write probe\n"
    try:
        with open(probe, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if probe.read_bytes() != data:
            raise CheckpointDirError(f"checkpoint directory {directory}: a file written there reads back changed")
    except OSError as exc:
        raise CheckpointDirError(f"checkpoint directory {directory} is not writable: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return directory


def _feed(h: Any, obj: Any, torch: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.layout is not torch.strided:
            t = t.to_dense()
        t = t.cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():  # the tensor's bytes, read in place (no copy, no numpy)
            h.update(memoryview((ctypes.c_ubyte * (t.numel() * t.element_size())).from_address(t.data_ptr())))
    elif isinstance(obj, dict):
        h.update(b"D%d;" % len(obj))
        for k, v in obj.items():
            _feed(h, k, torch)
            _feed(h, v, torch)
    elif isinstance(obj, (list, tuple)):
        h.update(b"%s%d;" % (b"L" if isinstance(obj, list) else b"U", len(obj)))
        for v in obj:
            _feed(h, v, torch)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:  # a script's own object in extra= (weights_only=False): its type only
        h.update(f"O:{type(obj).__module__}.{type(obj).__qualname__};".encode())


def payload_digest(payload: Any) -> str:
    """SHA-256 (hex) of a checkpoint payload: every tensor's dtype, shape and bytes and
    every other value, in the payload's order. Computed before ``torch.save`` and again
    after ``torch.load``: a byte changed anywhere in a tensor changes it."""
    import torch

    h = hashlib.sha256()
    _feed(h, payload, torch)
    return h.hexdigest()


def _atomic_write(path: Path, write: Any, *, keep_previous: str | os.PathLike[str] | None = None) -> Path:
    """``write(fh)`` into a temporary file beside ``path``, fsync, ``os.replace`` onto
    ``path`` and fsync of the directory; with ``keep_previous``, the file ``path`` held
    before is kept there (hard link, else copy). A failure leaves ``path`` as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
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


def atomic_save(obj: Any, path: str | os.PathLike[str], *, keep_previous: str | os.PathLike[str] | None = None) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: a temporary file beside it, fsync,
    ``os.replace``. With ``keep_previous``, the file ``path`` held before is kept there."""
    import torch

    return _atomic_write(Path(path), lambda fh: torch.save(obj, fh), keep_previous=keep_previous)


class Checkpointer:
    """The job's checkpoint in ``directory`` (``RLSCHED_CHECKPOINT_DIR``, a volume every
    worker mounts): ``<filename>`` and the one before it, ``<stem>.prev<suffix>``.
    Only ``rank`` 0 writes; every rank reads.

    Made, it checks the directory (``check``: every rank writes a probe file;
    :class:`CheckpointDirError`). ``resume`` (default ``RLSCHED_RESUME``: whether an
    earlier generation of the job ran) arms the restart check of :meth:`load`; where it
    is unknown (None: an operator that does not set it), ``generation`` (default
    ``RLSCHED_GENERATION``, else 0) above 0 arms it. Rank 0 of a generation the check
    does not arm (the first one that runs) leaves a marker file (:data:`MARKER`) saying
    the job started here."""

    def __init__(self, directory: str | os.PathLike[str], *, rank: int = 0, generation: int | None = None,
                 resume: bool | None = None, filename: str = "checkpoint.pt", keep_previous: bool = True,
                 check: bool = True) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.generation = env_generation() if generation is None else int(generation)
        self.resume = env_resume() if resume is None else bool(resume)
        self.path = self.directory / filename
        self.previous_path = self.path.with_name(f"{self.path.stem}.prev{self.path.suffix}")
        self.keep_previous = keep_previous
        if check:
            check_directory(self.directory)
            if rank == 0 and self.first_run:
                self._write_marker()

    @classmethod
    def from_contract(cls, contract: Any, **kwargs: Any) -> "Checkpointer":
        """The checkpointer of a :class:`~rlsched.core.contract.WorkerContract`: its
        checkpoint directory, rank and generation; a :class:`CheckpointDirError` when the
        contract names no directory."""
        if not contract.checkpoint_dir:
            raise CheckpointDirError("the worker contract names no checkpoint directory (RLSCHED_CHECKPOINT_DIR; "
                                     "spec.checkpoint.path of the TrainingJob)")
        return cls(contract.checkpoint_dir, rank=contract.rank, generation=contract.generation,
                   resume=contract.resume, **kwargs)

    @property
    def first_run(self) -> bool:
        """No earlier generation of the job ran (``resume`` False), or, where that is
        unknown, this is generation 0: a checkpoint cannot be missing."""
        return not self.resume if self.resume is not None else self.generation == 0

    def _write_marker(self) -> None:
        marker = self.directory / MARKER
        if marker.exists():
            return
        try:
            atomic_write_text(marker, json.dumps({"format": FORMAT_FAMILY, "started": time.time()}) + "\n")
        except OSError as exc:
            raise CheckpointDirError(f"checkpoint directory {self.directory} is not writable: "
                                     f"{exc.strerror or exc}") from exc

    def save(self, *, model: Any, state: TrainState, optimizer: Any = None, scheduler: Any = None,
             scaler: Any = None, world_size: int = 1, generation: int | None = None, global_batch: int | None = None,
             extra: dict[str, Any] | None = None) -> Path | None:
        """Write the checkpoint (rank 0; other ranks return None at once). ``scaler``:
        a ``torch.amp.GradScaler`` (its scale and growth tracker). A failed write is a
        :class:`CheckpointWriteError`."""
        if self.rank != 0:
            return None
        payload = {
            "format": FORMAT,
            "time": time.time(),
            "state": state.as_dict(),
            "world_size": int(world_size),
            "generation": int(self.generation if generation is None else generation),
            "global_batch": None if global_batch is None else int(global_batch),
            "model": unwrap(model).state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "rng": capture_rng(),
            "extra": dict(extra or {}),
        }
        payload["checksum"] = {"algorithm": "sha256", "digest": payload_digest(payload)}
        try:
            self._remove_stale_temporaries()
            return atomic_save(payload, self.path, keep_previous=self.previous_path if self.keep_previous else None)
        except OSError as exc:
            raise CheckpointWriteError(f"writing the checkpoint {self.path} failed: {exc.strerror or exc}") from exc

    def _remove_stale_temporaries(self) -> None:
        """Temporary files a crashed writer left (one writer at a time: rank 0 of the
        one running generation)."""
        for pattern in (f".{self.path.name}.tmp-*", f".{self.previous_path.name}.tmp-*"):
            for stale in self.directory.glob(pattern):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()

    def exists(self) -> bool:
        return self.path.exists() or self.previous_path.exists()

    def load(self, *, map_location: Any = "cpu", weights_only: bool = True,
             allow_fresh_start: bool = False) -> dict[str, Any] | None:
        """The newest checkpoint as written by :meth:`save`, its checksum verified.

        Only a newest file that cannot be read (torn) falls back to the previous one,
        with a warning; a readable file of an unknown format is a
        :class:`CheckpointFormatError`, a checksum mismatch a :class:`ChecksumError`;
        files that exist but none readable, a :class:`CheckpointError`. No checkpoint at
        all: None in the first generation that runs (:attr:`first_run`), when an earlier
        generation left the marker without completing a checkpoint (it ended before its
        first save), or with ``allow_fresh_start``; else :class:`MissingCheckpointError`."""
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
            verify_payload(payload, candidate)
            if candidate != self.path:
                log.warning("restoring the previous checkpoint %s", candidate)
            payload["path"] = str(candidate)
            return payload
        if problems:
            raise CheckpointError(f"no usable checkpoint in {self.directory}: " + "; ".join(problems))
        self._fresh_start(allow_fresh_start)
        return None

    def _fresh_start(self, allowed: bool) -> None:
        """No checkpoint: whether this generation may start from scratch."""
        if self.first_run:
            return
        if allowed:
            log.warning("generation %d finds no checkpoint in %s; starting from scratch (allow_fresh_start)",
                        self.generation, self.directory)
            return
        if (self.directory / MARKER).exists():
            log.warning("generation %d finds no checkpoint in %s, where an earlier generation started and none "
                        "was completed; starting from scratch", self.generation, self.directory)
            return
        ran = f"{ENV_RESUME}=1: an earlier generation ran" if self.resume else "a restarted generation"
        raise MissingCheckpointError(
            f"generation {self.generation} finds no checkpoint in {self.directory} ({ran}), and no earlier "
            f"generation of the job started there ({MARKER} missing): the volume is not the one the job wrote to. "
            f"Pass allow_fresh_start=True to start from scratch deliberately")

    def restore(self, *, model: Any, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
                map_location: Any = "cpu", weights_only: bool = True, rng: bool = True,
                allow_fresh_start: bool = False) -> tuple[TrainState, dict[str, Any]] | None:
        """Load the newest checkpoint (:meth:`load`) into ``model`` (the unwrapped
        module), ``optimizer``, ``scheduler`` and ``scaler``, set the RNG states
        (``rng``), and return the position and the checkpoint's payload; None (nothing
        changed) when there is no checkpoint yet. Any world size restores it."""
        payload = self.load(map_location=map_location, weights_only=weights_only,
                            allow_fresh_start=allow_fresh_start)
        if payload is None:
            return None
        unwrap(model).load_state_dict(payload["model"])
        if optimizer is not None and payload.get("optimizer") is not None:
            optimizer.load_state_dict(payload["optimizer"])
        return restore_rest(payload, scheduler=scheduler, scaler=scaler, rng=rng), payload


def restore_rest(payload: dict[str, Any], *, scheduler: Any = None, scaler: Any = None, rng: bool = True) -> TrainState:
    """What every checkpointer restores beside the model and optimizer: the LR
    scheduler, the GradScaler and the RNG states (each when given and saved); returns
    the training position."""
    if scheduler is not None and payload.get("scheduler") is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None and payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])
    if rng and payload.get("rng"):
        restore_rng(payload["rng"])
    s = payload["state"]
    return TrainState(epoch=int(s["epoch"]), consumed=int(s["consumed"]), step=int(s["step"]))


def verify_payload(payload: Any, source: Any) -> None:
    """Refuse a loaded payload of another format (:class:`CheckpointFormatError`) or
    whose checksum does not match (:class:`ChecksumError`); a file written before
    checksums existed is accepted with a warning."""
    if not isinstance(payload, dict) or not isinstance(payload.get("format"), str):
        raise CheckpointFormatError(f"{source} is not an rlsched.trainer checkpoint (no format entry)")
    fmt = payload["format"]
    if fmt != FORMAT:
        newer = " (a newer rlsched.trainer wrote it?)" if fmt.startswith(FORMAT_FAMILY) else ""
        raise CheckpointFormatError(f"{source} has the format {fmt!r:.60}{newer}; this library reads {FORMAT!r}: "
                                    f"not an rlsched.trainer checkpoint it knows")
    checksum = payload.pop("checksum", None)
    if checksum is None:
        log.warning("%s carries no checksum (written by an older rlsched.trainer); not verified", source)
        return
    if not isinstance(checksum, dict) or checksum.get("algorithm") != "sha256":
        raise CheckpointFormatError(f"{source}: unknown checksum entry {checksum!r:.80}")
    got = payload_digest(payload)
    if got != checksum.get("digest"):
        raise ChecksumError(f"{source}: the checksum does not match its contents (sha256 {got[:16]}..., "
                            f"written {str(checksum.get('digest'))[:16]}...): the file was changed after it "
                            f"was written")


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    _atomic_write(Path(path), lambda fh: fh.write(text.encode()))
