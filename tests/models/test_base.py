"""The shared base: the rollout pool's two call forms, episode splitting, CSV logs."""

from __future__ import annotations

import csv

import pytest

from rlsched.models.base import CSVLog
from rlsched.models.rollout import make_pool, merge, split_episodes, task_seeds


def _echo(task):
    return {"task": [task]}


def _seeded(payload, seed):
    return (payload, seed)


def test_map_and_run_give_the_same_answers_in_process_and_in_workers():
    tasks = [1, 2, 3]
    with make_pool("process", 0, seed=5) as p0, make_pool("process", 2, seed=5) as p2:
        assert p0.map(_echo, tasks) == p2.map(_echo, tasks) == [{"task": [t]} for t in tasks]
        a, b = p0.run(_seeded, tasks), p2.run(_seeded, tasks)
        assert a == b == list(zip(tasks, task_seeds(5, 3, 0)))
        # a new round draws new seeds
        assert [s for _, s in p0.run(_seeded, tasks)] == task_seeds(5, 3, 1)
    assert merge([{"task": [1]}, {"task": [2, 3]}]) == {"task": [1, 2, 3]}


def test_split_episodes():
    assert split_episodes(8, 3) == [3, 3, 2]
    assert split_episodes(8, 0) == split_episodes(8, 1) == [8]
    assert split_episodes(1, 2) == [1, 0]


def test_csv_log_header_from_the_first_row_or_given_fields(tmp_path):
    log = CSVLog(tmp_path / "a" / "train.csv")
    log.write({"it": 0, "loss": 1.5})
    log.write({"it": 1, "loss": 0.5, "extra": 9})  # columns after the first row are left out
    assert list(csv.reader((tmp_path / "a" / "train.csv").open())) == [["it", "loss"], ["0", "1.5"], ["1", "0.5"]]
    assert len(log.rows) == 2
    log = CSVLog(tmp_path / "b.csv", fields=["it", "loss", "val"])
    log.write({"it": 0, "loss": 1.0})  # the validation column stays empty until validated
    log.write({"it": 1, "loss": 0.5, "val": 0.9})
    assert list(csv.reader((tmp_path / "b.csv").open())) == [["it", "loss", "val"], ["0", "1.0", ""], ["1", "0.5", "0.9"]]


def test_a_clairvoyant_row_is_never_the_best_heuristic(tmp_path):
    from rlsched.models.base import write_table

    table = [{"trace": "t", "fifo": {"jct_mean": 100.0, "fee_total": 1.0}, "sjf": {"jct_mean": 50.0, "fee_total": 1.0},
              "agent": {"jct_mean": 80.0, "fee_total": 1.0}}]
    md = write_table(table, ["fifo", "sjf", "agent"], ["agent"], ["fifo", "sjf"], tmp_path / "x", "T", clairvoyant=["sjf"])
    assert table[0]["best_heuristic"] == "fifo"
    assert "sjf (clairvoyant reference, not a baseline)" in md
    write_table(table, ["fifo", "sjf", "agent"], ["agent"], ["fifo", "sjf"], tmp_path / "y", "T")
    assert table[0]["best_heuristic"] == "sjf"
