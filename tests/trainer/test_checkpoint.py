"""Checkpoint and restore: contents, atomicity, fallbacks, weights-only loading."""

import os
import random
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from rlsched.trainer import (  # noqa: E402
    CheckpointDirError,
    ContractError,
    CheckpointError,
    CheckpointFormatError,
    Checkpointer,
    CheckpointWriteError,
    ChecksumError,
    MissingCheckpointError,
    TrainState,
)
from rlsched.trainer.checkpoint import FORMAT, MARKER, capture_rng, restore_rng  # noqa: E402


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        loss = model(torch.randn(5, 4)).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    sched.step()
    return model, opt, sched


def _fresh():
    torch.manual_seed(99)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return model, opt, sched


def test_round_trip_of_everything(tmp_path):
    model, opt, sched = _trained()
    state = TrainState(epoch=2, consumed=640, step=77)
    ck = Checkpointer(tmp_path)
    random.seed(5)
    torch.manual_seed(6)
    ck.save(model=model, optimizer=opt, scheduler=sched, state=state, world_size=3, generation=4, global_batch=96,
            extra={"note": "x"})
    expected_py, expected_torch = random.random(), torch.rand(3)

    m2, o2, s2 = _fresh()
    random.seed(0)
    got_state, payload = ck.restore(model=m2, optimizer=o2, scheduler=s2)
    assert got_state == state
    assert (payload["world_size"], payload["generation"], payload["global_batch"]) == (3, 4, 96)
    assert payload["format"] == FORMAT and payload["extra"] == {"note": "x"}
    for a, b in zip(model.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert o2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == pytest.approx(0.05)
    for p, q in zip(model.parameters(), m2.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], o2.state[q]["momentum_buffer"])
    assert s2.state_dict() == sched.state_dict()
    # the RNGs continue where they were at the save
    assert random.random() == expected_py and torch.equal(torch.rand(3), expected_torch)


def test_a_wrapped_model_is_saved_unwrapped_and_any_rank_restores(tmp_path):
    """Nothing in a checkpoint depends on the world size: the module inside the
    (Distributed)DataParallel wrapper is saved, and any rank restores it."""
    model, opt, _ = _trained()
    Checkpointer(tmp_path).save(model=torch.nn.DataParallel(model), optimizer=opt, state=TrainState(), world_size=2)
    assert sorted(torch.load(tmp_path / "checkpoint.pt")["model"]) == sorted(model.state_dict())
    m2, o2, _ = _fresh()
    assert Checkpointer(tmp_path, rank=5).restore(model=torch.nn.DataParallel(m2), optimizer=o2) is not None
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m2.parameters()))


def test_only_rank_zero_writes(tmp_path):
    model, opt, _ = _trained()
    assert Checkpointer(tmp_path, rank=1).save(model=model, state=TrainState()) is None
    assert list(tmp_path.iterdir()) == []
    assert Checkpointer(tmp_path).restore(model=model) is None  # nothing yet: None, not an error


def test_the_previous_checkpoint_is_kept(tmp_path):
    model, _, _ = _trained()
    ck = Checkpointer(tmp_path)
    ck.save(model=model, state=TrainState(step=1))
    ck.save(model=model, state=TrainState(step=2))
    ck.save(model=model, state=TrainState(step=3))
    assert torch.load(ck.path)["state"]["step"] == 3
    assert torch.load(ck.previous_path)["state"]["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "checkpoint.prev.pt", "checkpoint.pt"]


def test_a_crash_mid_write_leaves_the_last_checkpoint_loadable(tmp_path):
    """A real crash: the writer process dies (os._exit) half-way through torch.save of
    the second checkpoint. The first stays loadable; the next save removes the debris."""
    code = f"""
        import os, torch
        from rlsched.trainer import Checkpointer, TrainState
        model = torch.nn.Linear(3, 2)
        ck = Checkpointer({str(tmp_path)!r})
        ck.save(model=model, state=TrainState(step=1))
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            f.write(b"PK\\x03\\x04 half a zip archive")
            f.flush()
            os._exit(9)  # killed mid-write: no cleanup, no exception handler runs
        torch.save = dying_save
        ck.save(model=model, state=TrainState(step=2))
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 9, out.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].startswith(".checkpoint.pt.tmp-") and names[1:] == [MARKER, "checkpoint.pt"], names
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    state, payload = ck.restore(model=model)
    assert state.step == 1 and payload["path"] == str(ck.path)
    ck.save(model=model, state=TrainState(step=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "checkpoint.prev.pt", "checkpoint.pt"]


def test_an_exception_mid_write_changes_nothing(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    ck.save(model=model, state=TrainState(step=1))
    before = ck.path.read_bytes()

    def failing_save(obj, f, *a, **k):
        f.write(b"garbage")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(CheckpointWriteError, match=f"writing the checkpoint {ck.path} failed: No space"):
        ck.save(model=model, state=TrainState(step=2))
    assert ck.path.read_bytes() == before and not ck.previous_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "checkpoint.pt"]


def test_a_torn_newest_file_falls_back_to_the_previous(tmp_path, caplog):
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    ck.save(model=model, state=TrainState(step=1))
    ck.save(model=model, state=TrainState(step=2))
    data = ck.path.read_bytes()
    ck.path.write_bytes(data[: len(data) // 2])  # as a filesystem without atomic rename could leave it
    state, payload = ck.restore(model=model)
    assert state.step == 1 and payload["path"] == str(ck.previous_path)
    assert "unreadable" in caplog.text
    ck.previous_path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        ck.restore(model=model)


def test_a_foreign_file_is_not_a_checkpoint(tmp_path):
    torch.save({"model": {}}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not an rlsched.trainer checkpoint"):
        Checkpointer(tmp_path).load()


class Custom:  # a script's own class in extra=
    def __init__(self):
        self.value = 3


def test_weights_only_loading_refuses_code_and_says_how_to_opt_out(tmp_path):
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    ck.save(model=model, state=TrainState(), extra={"obj": Custom()})
    with pytest.raises(CheckpointError, match="weights_only=False"):
        ck.load()
    assert ck.load(weights_only=False)["extra"]["obj"].value == 3


def test_rng_capture_saves_numpy_only_when_it_is_imported(monkeypatch):
    import numpy  # noqa: F401 - torch imports it when installed; the test hides it below

    with monkeypatch.context() as m:
        m.delitem(sys.modules, "numpy")
        assert sorted(capture_rng()) == ["python", "torch"]
        assert "numpy" not in sys.modules  # capture_rng did not import it
    np = pytest.importorskip("numpy")
    np.random.seed(3)
    states = capture_rng()
    want = np.random.rand(4)
    np.random.seed(8)
    restore_rng(states)
    assert np.array_equal(np.random.rand(4), want)


def test_the_temporary_file_is_beside_the_checkpoint(tmp_path, monkeypatch):
    """Same directory, so the same filesystem: os.replace is atomic there."""
    model = torch.nn.Linear(3, 2)
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.path.dirname(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    ck = Checkpointer(tmp_path / "sub")
    ck.save(model=model, state=TrainState())
    ck.save(model=model, state=TrainState())
    assert len(seen) == 4 and all(a == b == str(tmp_path / "sub") for a, b in seen)  # the marker, 2 + 1 saves


# --------------------------------------------------------------------------- loud failures


def test_a_directory_that_cannot_be_made_fails_at_start(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointDirError, match=f"{tmp_path / 'a-file' / 'ckpt'} does not exist and cannot be "
                                                 f"created: Not a directory"):
        Checkpointer(tmp_path / "a-file" / "ckpt")


def test_a_directory_that_cannot_be_written_fails_at_start_and_exits_74(tmp_path):
    """A real failed write (as a full volume gives it, also to root): the process's file
    size limit is 0, so the probe file cannot be written. Through the documented pattern
    the process exits 74 and says which directory and why."""
    code = f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        from rlsched import trainer as rt
        with rt.exit_on_checkpoint_error(termination_log={str(tmp_path / 'termination-log')!r}):
            rt.Checkpointer({str(tmp_path / 'ckpt')!r}, generation=0)
        print("not reached")
    """
    (tmp_path / "termination-log").write_text("")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 74, (out.returncode, out.stderr)
    assert "not reached" not in out.stdout
    assert f"CheckpointDirError): checkpoint directory {tmp_path / 'ckpt'} is not writable: File too large" \
        in out.stderr


def test_a_restarted_generation_without_a_checkpoint_fails_unless_allowed(tmp_path, caplog):
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path / "fresh-volume", generation=2)
    with pytest.raises(MissingCheckpointError, match="generation 2 finds no checkpoint .*allow_fresh_start=True"):
        ck.restore(model=model)
    assert ck.restore(model=model, allow_fresh_start=True) is None
    # generation 0 never finds one: no error
    assert Checkpointer(tmp_path / "new", generation=0).restore(model=model) is None
    # generation 0 started there but ended before its first save: a restart may start over
    assert Checkpointer(tmp_path / "new", generation=1).restore(model=model) is None
    assert "where an earlier generation started and none was completed" in caplog.text


def test_the_generation_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSCHED_GENERATION", "3")
    with pytest.raises(MissingCheckpointError, match="generation 3"):
        Checkpointer(tmp_path).load()


def test_resume_decides_the_restart_check_whatever_the_generation(tmp_path, caplog):
    """With RLSCHED_RESUME the check follows whether an earlier generation ran, not the
    generation's number: generations that never ran (rescaled while pending) are no
    false alarm; the first one that runs leaves the marker for the ones after it."""
    model = torch.nn.Linear(3, 2)
    d = tmp_path / "ckpt"
    # generation 3 is the first that ran: no check, and rank 0 leaves the marker (rank 1 does not)
    assert Checkpointer(d, rank=1, generation=3, resume=False).restore(model=model) is None
    assert not (d / MARKER).exists()
    assert Checkpointer(d, generation=3, resume=False).restore(model=model) is None
    assert (d / MARKER).exists()
    # it ended before its first save: the next one starts over with a warning
    assert Checkpointer(d, generation=4, resume=True).restore(model=model) is None
    assert "where an earlier generation started and none was completed" in caplog.text
    # an earlier generation ran, but not on this volume: loud, even at generation 0's number
    with pytest.raises(MissingCheckpointError, match=r"generation 0 finds no checkpoint .* \(RLSCHED_RESUME=1: "
                                                     r"an earlier generation ran\)"):
        Checkpointer(tmp_path / "other", generation=0, resume=True).restore(model=model)
    assert not (tmp_path / "other" / MARKER).exists()
    # a checkpoint found is restored either way
    m, opt, _ = _trained()
    Checkpointer(d, generation=4, resume=True).save(model=m, optimizer=opt, state=TrainState(step=7))
    got = Checkpointer(d, generation=5, resume=False).restore(model=_fresh()[0])
    assert got is not None and got[0].step == 7


def test_resume_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSCHED_GENERATION", "2")
    monkeypatch.setenv("RLSCHED_RESUME", "0")  # generations 0 and 1 never ran
    assert Checkpointer(tmp_path / "a").load() is None
    monkeypatch.setenv("RLSCHED_RESUME", "1")
    with pytest.raises(MissingCheckpointError, match="RLSCHED_RESUME=1"):
        Checkpointer(tmp_path / "b").load()
    monkeypatch.setenv("RLSCHED_RESUME", "maybe")
    with pytest.raises(ContractError, match="RLSCHED_RESUME='maybe' is neither 0 nor 1"):
        Checkpointer(tmp_path / "c")


def _newest_and_previous(tmp_path):
    model, opt, _ = _trained()
    ck = Checkpointer(tmp_path, generation=1)
    ck.save(model=model, optimizer=opt, state=TrainState(step=1))
    ck.save(model=model, optimizer=opt, state=TrainState(step=2))
    return ck, model


def test_an_unknown_format_is_an_error_not_a_roll_back(tmp_path):
    ck, model = _newest_and_previous(tmp_path)
    payload = torch.load(ck.path, weights_only=True)
    payload["format"] = "rlsched.trainer/2"
    torch.save(payload, ck.path)
    with pytest.raises(CheckpointFormatError, match=r"format 'rlsched.trainer/2' \(a newer rlsched.trainer wrote "
                                                    r"it\?\); this library reads 'rlsched.trainer/1'"):
        ck.restore(model=model)


def _flip_a_tensor_byte(path, entry_suffix):
    """Flip one byte inside a tensor's data in a torch.save archive (stored, not
    compressed: the byte sits at the entry's data offset)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(entry_suffix))
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 2] ^= 0x40
    path.write_bytes(bytes(raw))


def test_flipped_bytes_inside_a_tensor_fail_the_checksum(tmp_path):
    ck, model = _newest_and_previous(tmp_path)
    before = torch.load(ck.path, weights_only=True)["model"]
    _flip_a_tensor_byte(ck.path, "data/0")
    # torch itself loads the changed file without complaint: the checksum is what catches it
    changed = torch.load(ck.path, weights_only=True)["model"]
    assert [k for k in before if not torch.equal(before[k], changed[k])] == ["0.weight"]
    with pytest.raises(ChecksumError, match=f"{ck.path}: the checksum does not match its contents"):
        ck.restore(model=model)


def test_the_example_exits_74_when_a_restart_finds_no_checkpoint(tmp_path):
    """The documented pattern in the example script: generation 1 of a job whose
    checkpoint volume is empty (not the one generation 0 wrote to)."""
    import socket
    from pathlib import Path

    from rlsched.core.contract import WorkerContract

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    contract = WorkerContract(job="digits", namespace="default", index=0, workers=1, generation=1,
                              master_addr="127.0.0.1", master_port=port, checkpoint_dir=str(tmp_path / "ckpt"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLSCHED_", "PET_", "TORCHELASTIC_"))}
    env.update(contract.env(), RLSCHED_JOB_NAME="digits", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    example = Path(__file__).resolve().parents[2] / "examples" / "ddp_digits.py"
    out = subprocess.run([sys.executable, str(example), "--epochs", "1", "--no-report"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 74, out.stderr[-3000:]
    assert f"MissingCheckpointError): generation 1 finds no checkpoint in {tmp_path / 'ckpt'}" in out.stderr


@pytest.mark.parametrize("failure", ["missing", "format", "checksum"])
def test_every_checkpoint_error_exits_74_through_the_pattern(tmp_path, failure):
    from rlsched import trainer as rt

    model = torch.nn.Linear(3, 2)
    if failure == "missing":
        ck = Checkpointer(tmp_path / "empty", generation=1)
    else:
        ck, model = _newest_and_previous(tmp_path)
        if failure == "format":
            torch.save({"format": "rlsched.trainer/2"}, ck.path)
        else:
            _flip_a_tensor_byte(ck.path, "data/0")
    with pytest.raises(SystemExit) as exc:
        with rt.exit_on_checkpoint_error(termination_log=str(tmp_path / "none" / "log")):
            ck.restore(model=model)
    assert exc.value.code == rt.EXIT_CHECKPOINT == 74


def test_the_grad_scaler_is_saved_and_restored(tmp_path):
    model, opt, _ = _trained()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    for _ in range(4):  # three good steps grow the scale once, then the tracker counts again
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 2.0**11
    ck = Checkpointer(tmp_path)
    ck.save(model=model, optimizer=opt, scaler=scaler, state=TrainState(step=4))
    m2, o2, _ = _fresh()
    s2 = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=3)
    ck.restore(model=m2, optimizer=o2, scaler=s2)
    assert s2.state_dict() == scaler.state_dict() and s2.state_dict()["_growth_tracker"] == 1
