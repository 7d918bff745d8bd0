"""Checkpoint and restore: contents, atomicity, fallbacks, weights-only loading."""

import os
import random
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from rlsched.trainer import Checkpointer, CheckpointError, TrainState  # noqa: E402
from rlsched.trainer.checkpoint import FORMAT, capture_rng, restore_rng  # noqa: E402


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


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
    assert names[0].startswith(".checkpoint.pt.tmp-") and names[1:] == ["checkpoint.pt"], names
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    state, payload = ck.restore(model=model)
    assert state.step == 1 and payload["path"] == str(ck.path)
    ck.save(model=model, state=TrainState(step=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_an_exception_mid_write_changes_nothing(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    ck = Checkpointer(tmp_path)
    ck.save(model=model, state=TrainState(step=1))
    before = ck.path.read_bytes()

    def failing_save(obj, f, *a, **k):
        f.write(b"garbage")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="No space"):
        ck.save(model=model, state=TrainState(step=2))
    assert ck.path.read_bytes() == before and not ck.previous_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


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
    assert len(seen) == 3 and all(a == b == str(tmp_path / "sub") for a, b in seen)
