"""Run directories and promotion: training writes only into out/train/<run>/,
evaluation reads a run, and `rlsched models promote` copies a checked model into the
served folder with a record of where it came from."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlsched.cli import main as rlsched_main
from rlsched.core.nn import load_policy_file
from rlsched.models.cli import ALGORITHMS, _load_module, build_algo_parser, run
from rlsched.models.export import export_policy, update_evaluation
from rlsched.models.runs import RunError, add_run_arguments, eval_target, new_run, promote, served_dir

REPO = Path(__file__).resolve().parents[2]


def fake_run(runs_dir: Path, name: str = "r1", policy: str = "toy") -> tuple[Path, dict]:
    """A finished run as training leaves it: the model exported by the real export code."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model = runs_dir / name / "model.safetensors"
    export_policy(model, net.state_dict(), policy=policy, version="1", observation={"features": ["a", "b", "c"]},
                  architecture={"hidden": [4]}, training={"lr": 0.1, "best_iteration": 3, "best_val_jct_ratio": 0.93},
                  trained_on={"env": "none"})
    update_evaluation(model, {"table": [{"trace": "t", "jct": 1.0}]})
    (runs_dir / name / "train.csv").write_text("iteration,loss\n0,1.0\n")
    return model, {k: v.numpy() for k, v in net.state_dict().items()}


def promote_cli(*argv: str) -> int:
    return rlsched_main(["models", "promote", *argv])


# ------------------------------------------------------------------------------ promote
def test_promote_copies_the_checked_model_and_records_where_it_came_from(tmp_path):
    runs, served = tmp_path / "train", tmp_path / "weights"
    model, state = fake_run(runs)
    _, src_meta = load_policy_file(model, policy="toy")
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    assert promote_cli("r1", "--runs-dir", str(runs), "--weights-dir", str(served)) == 0
    weights, meta = load_policy_file(served / "toy.safetensors", policy="toy")  # format, shapes and SHA-256 hold
    for k, v in state.items():
        np.testing.assert_array_equal(weights[k], v)
    assert (served / "toy.safetensors").read_bytes() == model.read_bytes()
    rec = meta.pop("promotion")
    assert meta == src_meta  # everything else is the run's metadata as recorded
    assert rec["run"] == "r1" and rec["source"] == str(model)
    assert before <= dt.datetime.fromisoformat(rec["time"]) <= dt.datetime.now(dt.timezone.utc)
    assert rec["validation"] == {"best_iteration": 3, "best_val_jct_ratio": 0.93}
    assert rec["evaluation"] == ["table"]
    assert sorted(p.name for p in served.iterdir()) == ["toy.json", "toy.safetensors"]  # no temporary left
    # --name picks the served file name; promoting again replaces it
    assert promote("r1", "other", runs, served) == served / "other.safetensors"
    assert load_policy_file(served / "other.safetensors", policy="toy")[1]["promotion"]["run"] == "r1"


def test_promote_a_checkpoint_chosen_on_validation(tmp_path):
    """``--checkpoint last.safetensors``: that file of the run is served, not model.safetensors."""
    runs, served = tmp_path / "train", tmp_path / "weights"
    model, _ = fake_run(runs)
    last = model.with_name("last.safetensors")
    export_policy(last, {"w": torch.ones(2)}, policy="toy", version="1", observation={}, architecture={},
                  training={}, trained_on={})
    assert promote_cli("r1", "--runs-dir", str(runs), "--weights-dir", str(served), "--checkpoint", "last.safetensors") == 0
    weights, meta = load_policy_file(served / "toy.safetensors", policy="toy")
    assert list(weights) == ["w"] and meta["promotion"]["source"] == str(last)
    with pytest.raises(RunError, match="no checkpoint 'best.safetensors'"):
        promote("r1", None, runs, served, checkpoint="best.safetensors")
    with pytest.raises(RunError, match="no checkpoint 'train.csv'"):
        promote("r1", None, runs, served, checkpoint="train.csv")


def test_promote_refuses_missing_runs_and_files_with_one_error(tmp_path, capsys):
    runs, served = tmp_path / "train", tmp_path / "weights"
    with pytest.raises(RunError, match="no training run 'nope'"):
        promote("nope", runs_dir=runs, weights_dir=served)
    (runs / "empty").mkdir(parents=True)
    with pytest.raises(RunError, match="has no model.safetensors"):
        promote("empty", runs_dir=runs, weights_dir=served)
    model, _ = fake_run(runs, "nometa")
    model.with_suffix(".json").unlink()
    with pytest.raises(RunError, match="has no model.json"):
        promote("nometa", runs_dir=runs, weights_dir=served)
    model, _ = fake_run(runs, "corrupt")
    model.write_bytes(b"\x00 not a safetensors file")
    with pytest.raises(RunError, match="corrupt"):
        promote("corrupt", runs_dir=runs, weights_dir=served)
    model, _ = fake_run(runs, "tampered")
    data = bytearray(model.read_bytes())
    data[-1] ^= 0x55
    model.write_bytes(bytes(data))
    with pytest.raises(RunError, match="SHA-256"):
        promote("tampered", runs_dir=runs, weights_dir=served)
    model, _ = fake_run(runs, "badjson")
    model.with_suffix(".json").write_text("{not json")
    with pytest.raises(RunError, match="not valid JSON"):
        promote("badjson", runs_dir=runs, weights_dir=served)
    for bad in ("../r1", "a/b", ""):
        with pytest.raises(RunError, match="not a plain name"):
            promote(bad, runs_dir=runs, weights_dir=served)
    assert not served.exists()  # nothing was written
    # the command line turns the error into a one-line message, no traceback
    with pytest.raises(SystemExit, match="rlsched models promote: run 'corrupt'.*corrupt"):
        promote_cli("corrupt", "--runs-dir", str(runs), "--weights-dir", str(served))


def test_promote_never_replaces_a_model_of_another_policy(tmp_path):
    runs, served = tmp_path / "train", tmp_path / "weights"
    fake_run(runs, "das-run", policy="das")
    fake_run(runs, "toy-run", policy="toy")
    promote("das-run", runs_dir=runs, weights_dir=served)
    with pytest.raises(RunError, match="holds policy 'das'"):
        promote("toy-run", "das", runs_dir=runs, weights_dir=served)
    assert load_policy_file(served / "das.safetensors")[1]["promotion"]["run"] == "das-run"
    (served / "broken.json").write_text("{not json")
    with pytest.raises(RunError, match="broken.json is not valid JSON"):
        promote("toy-run", "broken", runs_dir=runs, weights_dir=served)


# ------------------------------------------------------------------------------ runs
def _run_args(tmp_path, **kw):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    a = p.parse_args(["--runs-dir", str(tmp_path)])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_a_new_run_is_named_after_the_algorithm_and_never_reused(tmp_path):
    a = _run_args(tmp_path)
    r = new_run(a, "dqn")
    assert a.run == r.name and r.name.startswith("dqn-") and r.dir == tmp_path / r.name and r.dir.is_dir()
    r.log.write_text("x\n")
    with pytest.raises(RunError, match="already exists"):
        new_run(_run_args(tmp_path, run=r.name), "dqn")
    with pytest.raises(RunError, match="--model"):
        new_run(_run_args(tmp_path, model=Path("x.safetensors")), "dqn")


def test_eval_reads_a_run_or_a_given_model_and_never_rewrites_served_files(tmp_path):
    model, _ = fake_run(tmp_path, "r1")
    assert eval_target(_run_args(tmp_path, run="r1"), "toy") == (model, tmp_path / "r1", True)
    given = tmp_path / "elsewhere.safetensors"
    m, res, record = eval_target(_run_args(tmp_path, model=given), "toy")
    assert m == given and record and res.parts[:2] == ("out", "eval") and res.name.startswith("toy-")
    served = served_dir() / "das.safetensors"
    assert eval_target(_run_args(tmp_path, results=tmp_path / "t"), "das", served=served) == (served, tmp_path / "t", False)
    with pytest.raises(RunError, match="give --run RUN"):
        eval_target(_run_args(tmp_path), "a2c")
    with pytest.raises(RunError, match="no training run 'r2'"):
        eval_target(_run_args(tmp_path, run="r2"), "a2c")
    with pytest.raises(SystemExit, match="rlsched eval a2c: .*give --run RUN"):
        run("eval", "a2c", ["--runs-dir", str(tmp_path)])


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_no_option_defaults_into_the_source_tree(algo):
    """Every path option of train/eval defaults to None or to a folder under out/."""
    for command in ("train", "eval"):
        parser = build_algo_parser(command, algo, _load_module(algo))
        for action in parser._actions:
            if isinstance(action.default, Path):
                assert not action.default.is_absolute() and action.default.parts[0] == "out", (algo, action.dest, action.default)


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_training_writes_only_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLSCHED_DATA_DIR", raising=False)
    watched = [REPO / "docs" / "results", served_dir()]
    before = [_tree(d) for d in watched]
    assert run("train", "lsp", ["--source", "synthetic", "--days", "40", "--epochs", "3", "--hidden", "4"]) == 0
    (name,) = [p.name for p in (tmp_path / "out" / "train").iterdir()]
    assert name.startswith("lsp-") and [p.name for p in tmp_path.iterdir()] == ["out"]
    assert sorted(p.name for p in (tmp_path / "out" / "train").iterdir()) == [name]
    assert sorted(p.name for p in (tmp_path / "out" / "train" / name).iterdir()) == ["model.json", "model.safetensors", "train.csv"]
    assert [_tree(d) for d in watched] == before
    # then eval and promote the run like a user would
    assert run("eval", "lsp", ["--source", "synthetic", "--days", "40", "--run", name]) == 0
    assert json.loads((tmp_path / "out" / "train" / name / "lsp_eval_synthetic.json").read_text())["test_days"] == 7
    assert promote_cli(name, "--weights-dir", str(tmp_path / "w")) == 0
    assert load_policy_file(tmp_path / "w" / "lsp_gru.safetensors", policy="lsp_gru")[1]["promotion"]["run"] == name


CONFIGS = sorted((REPO / "models" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_the_published_training_configs_use_known_options_and_run_directories(config):
    from rlsched.models.cli import read_config

    algo = config.stem.split("_")[0]
    cfg = read_config(config)
    parser = build_algo_parser("train", algo, _load_module(algo))
    assert set(cfg) <= {a.dest for a in parser._actions}
    assert cfg["run"] and "runs_dir" not in cfg  # a named run under out/train/
    if "init" in cfg:  # starts from another published run's model
        init = Path(cfg["init"])
        assert init.parts[:2] == ("out", "train") and init.name == "model.safetensors"
        assert any(read_config(c).get("run") == init.parts[2] for c in CONFIGS)


def test_configs_exist():
    assert {c.stem for c in CONFIGS} >= {"das_stage0_init", "das_stage1", "das_stage2", "a2c", "dqn", "hierrl"}
