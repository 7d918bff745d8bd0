"""ShardedCheckpointer (torch.distributed.checkpoint) in one process: contents, the
torn-directory fallback and the loud failures. Sharding over ranks and resharding at
another world size: tests/trainer/test_elastic_sharded.py."""

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

from rlsched.trainer import (  # noqa: E402
    CheckpointFormatError,
    ChecksumError,
    MissingCheckpointError,
    ShardedCheckpointer,
    TrainState,
)
from rlsched.trainer.sharded import FORMAT_SHARDED, MANIFEST, SIDE_FILE  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def _trained():
    model, opt = _model(0)
    for _ in range(2):
        model(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _saved_twice(tmp_path):
    model, opt = _trained()
    ck = ShardedCheckpointer(tmp_path, generation=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    ck.save(model=model, optimizer=opt, scaler=scaler, state=TrainState(step=1), world_size=2)
    ck.save(model=model, optimizer=opt, scaler=scaler, state=TrainState(epoch=1, consumed=10, step=2), world_size=2)
    return ck, model, opt


def test_round_trip_and_layout(tmp_path):
    ck, model, opt = _saved_twice(tmp_path)
    manifest = json.loads((ck.path / MANIFEST).read_text())
    assert manifest["format"] == FORMAT_SHARDED == "rlsched.trainer.dcp/1"
    assert SIDE_FILE in manifest["files"] and ".metadata" in manifest["files"]
    assert (ck.previous_path / MANIFEST).exists() and not list(tmp_path.glob(".sharded.tmp-*"))
    m2, o2 = _model(9)
    s2 = torch.amp.GradScaler("cpu", init_scale=1.0)
    state, side = ShardedCheckpointer(tmp_path, generation=2).restore(model=m2, optimizer=o2, scaler=s2)
    assert state == TrainState(epoch=1, consumed=10, step=2) and side["world_size"] == 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))
    for p, q in zip(model.parameters(), m2.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], o2.state[q]["momentum_buffer"])
    assert s2.get_scale() == 64.0


def test_a_torn_newest_directory_falls_back_with_a_warning(tmp_path, caplog):
    ck, model, _ = _saved_twice(tmp_path)
    (ck.path / MANIFEST).unlink()  # the manifest is written last: its absence is an incomplete save
    state, side = ck.restore(model=model)
    assert state.step == 1 and side["path"] == str(ck.previous_path)
    assert "incomplete or unreadable" in caplog.text


def test_an_unknown_format_is_an_error(tmp_path):
    ck, model, _ = _saved_twice(tmp_path)
    manifest = json.loads((ck.path / MANIFEST).read_text())
    (ck.path / MANIFEST).write_text(json.dumps({**manifest, "format": "rlsched.trainer.dcp/2"}))
    with pytest.raises(CheckpointFormatError, match="a newer rlsched.trainer wrote it"):
        ck.restore(model=model)


def test_a_changed_shard_fails_the_checksum(tmp_path):
    ck, model, _ = _saved_twice(tmp_path)
    shard = next(p for p in ck.path.iterdir() if p.suffix == ".distcp")
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=f"{shard}: the checksum does not match"):
        ck.restore(model=model)


def test_a_restart_without_a_sharded_checkpoint_fails_unless_allowed(tmp_path):
    model, _ = _model(0)
    ck = ShardedCheckpointer(tmp_path, generation=1)
    with pytest.raises(MissingCheckpointError, match="generation 1 finds no checkpoint"):
        ck.restore(model=model)
    assert ck.restore(model=model, allow_fresh_start=True) is None
