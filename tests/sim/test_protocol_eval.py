"""The evaluation protocol (``rlsched eval protocol``): selection on validation, paired
reports on test, clairvoyant rows never baselines, per-policy backfill, the ``rlsched``
name, and clear errors for bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlsched.core import Topology
from rlsched.core.served import SERVED, parse_policy_name
from rlsched.sim import evaluate as ev
from rlsched.sim.allocators import make_allocator
from rlsched.sim.cli import parse_policies
from rlsched.sim.job import JobSpec
from rlsched.sim.protocol import SPLITS
from rlsched.sim.traces import Trace, TraceError, load_trace
from rlsched.sim.traces.spec import parse_options, scale_for_load, window_jobs


# --------------------------------------------------------------------------- names
def test_rlsched_resolves_to_the_served_policy():
    pol = parse_policy_name("rlsched")
    assert (pol.allocator, pol.placement) == (SERVED.allocator, SERVED.placement) == ("goodput-rlpto@adaptive=0.8,room_rounds=30", "das")
    assert not pol.ordering and pol.scaling is None
    assert pol.label == "rlsched" and pol.served and pol.backfill is None
    assert SERVED.reason  # the record says why
    assert parse_policy_name("rlsched+nobackfill").label == "rlsched+nobackfill"
    [a, b] = parse_policies("fifo/firstfit,rlsched")
    assert a.triple == "fifo/firstfit" and b.triple == SERVED.triple


def test_backfill_suffix_is_part_of_the_name():
    assert parse_policy_name("fifo/firstfit").backfill is None
    assert parse_policy_name("fifo/firstfit+backfill").backfill is True
    pol = parse_policy_name("drf/topology/beta+nobackfill")
    assert (pol.ordering, pol.placement, pol.scaling, pol.backfill) == ("drf", "topology", "beta", False)
    assert pol.label == "drf/topology/beta+nobackfill"
    assert parse_policy_name("fifo/firstfit/none").scaling is None


@pytest.mark.parametrize("bad", ["fifo/firstfit+bf", "a/b/c/d", "fifo/", "+backfill", "/x"])
def test_malformed_policy_names_are_refused(bad):
    with pytest.raises(ValueError):
        parse_policy_name(bad)


def test_cli_refuses_an_unknown_single_word():
    with pytest.raises(ValueError, match="allocation policy"):
        parse_policies("fifo/firstfit,nosuchthing")


def test_interval_engine_backfill_per_policy_and_rlsched():
    assert make_allocator("fifo/firstfit").backfill is True  # the gang allocator's default
    assert make_allocator("fifo/firstfit+nobackfill").backfill is False
    with pytest.raises(ValueError, match="own queue rules"):
        make_allocator("tiresias-2q+backfill")
    with pytest.raises(ValueError, match="own queue rules"):
        make_allocator("rlsched+backfill")  # the served goodput allocator keeps its own order
    assert make_allocator("rlsched").name == "goodput"


def test_allocator_with_a_placement_is_an_event_engine_policy():
    pol = parse_policy_name("goodput/bestfit")
    assert (pol.allocator, pol.placement, pol.ordering) == ("goodput", "bestfit", "")
    assert parse_policy_name("goodput@p=0/das").allocator == "goodput@p=0"
    assert parse_policy_name("fifo/bestfit").allocator == ""  # an ordering, not an allocator


def _blocking_jobfile(tmp_path):
    # 4 GPUs. A (3 GPUs, 0-1000); B (2 GPUs, submit 100) blocks the head; C (1 GPU, submit
    # 200, 400 s) fits beside A. No backfill: C waits for A: B and C start at 1000, C ends at
    # 1400, JCTs A 1000, B 1400, C 1200 (mean 1200). Backfill: C runs 200-600, JCTs 1000,
    # 1400, 400 (mean 2800/3). The events are further apart than the protocol's decision
    # gap (30 s), so each is decided on at once.
    jobs = [dict(id="A", submit_time=0, gpus_per_worker=3, duration=1000),
            dict(id="B", submit_time=100, gpus_per_worker=2, duration=500),
            dict(id="C", submit_time=200, gpus_per_worker=1, duration=400)]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"cluster": Topology.uniform(1, 4).to_dict(), "jobs": jobs}))
    return str(path)


def test_event_engine_backfill_per_policy_in_one_comparison(tmp_path):
    rows = ev.run_unit(_blocking_jobfile(tmp_path), 0, [("fifo/firstfit+nobackfill", False),
                                                        ("fifo/firstfit+backfill", False),
                                                        ("fifo/firstfit", False)], "event")
    jct = {r["policy"]: r["jct_mean"] for r in rows}
    assert jct["fifo/firstfit+nobackfill"] == pytest.approx(1200.0)
    assert jct["fifo/firstfit+backfill"] == pytest.approx(2800 / 3)
    assert jct["fifo/firstfit"] == pytest.approx(1200.0)  # no suffix: the engine's default (off)


def test_sim_compare_runs_rlsched_and_both_backfills(tmp_path):
    from rlsched.sim.cli import register
    import argparse

    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="c"))
    out = tmp_path / "out"
    args = p.parse_args(["sim", "compare", "--trace", _blocking_jobfile(tmp_path), "--policies",
                         "fifo/firstfit+backfill,fifo/firstfit+nobackfill,rlsched", "--out", str(out), "--quiet"])
    assert args.func(args) == 0
    rows = json.loads((out / "compare.json").read_text())
    jct = {r["policy"]: r["metrics"]["jct_mean"] for r in rows}
    assert jct["fifo/firstfit+backfill"] == pytest.approx(2800 / 3)
    assert jct["fifo/firstfit+nobackfill"] == pytest.approx(1200.0)
    assert "rlsched" in jct


# --------------------------------------------------------------------------- selection
def test_select_strongest_exact():
    means = {"a": 3.0, "b": 1.0, "c": 2.0, "d": float("nan"), "e": 1.0}
    assert ev.select_strongest(means, 2) == ["b", "e"]  # tie by name
    assert ev.select_strongest(means, 3, exclude=["b"]) == ["e", "c", "a"]
    assert ev.select_strongest(means, 10) == ["b", "e", "c", "a"]  # nan never chosen
    with pytest.raises(ev.ProtocolError):
        ev.select_strongest(means, 0)


def test_pair_by_unit_keeps_the_common_units_in_order():
    units, a, b = ev.pair_by_unit({"w1": 1.0, "w2": 2.0, "w3": 3.0}, {"w3": 30.0, "w1": 10.0})
    assert units == ["w1", "w3"] and a == [1.0, 3.0] and b == [10.0, 30.0]


# hand-set JCTs: on validation B < C < A < D; on test the order of B and C flips, so a
# selection that peeked at test would differ; the candidate X is 10% below C, 20% above B
VAL = {"A": 300.0, "B": 100.0, "C": 200.0, "D": 400.0}
TEST = {"A": 300.0, "B": 250.0, "C": 200.0, "D": 50.0, "X": 180.0}


def _fake_run_unit(spec, seed, policies, engine, data_dir=None, progress=None):
    split = "validation" if SPLITS["validation"][0] <= seed < SPLITS["validation"][1] else "test"
    out = []
    for name, clair in policies:
        base = (VAL if split == "validation" else TEST)[name.split("/")[0]]
        # per-seed noise identical for every policy: the paired differences are exact
        out.append({"policy": name, "clairvoyant": clair, "jct_mean": base * (1 + 0.01 * (seed % 7)),
                    "jobs_completed": 1, "jobs_unfinished": 0, "wall_s": 0.0})
        if progress:
            progress()
    return out


def test_unregistered_names_are_refused_before_anything_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(ev, "run_unit", lambda *a, **k: calls.append(a) or [])
    with pytest.raises(ev.ProtocolError, match="interval suites"):
        ev.run_protocol(["synthetic"], candidates=["X"], pool=["fifo/firstfit"], loads=[1.0],
                        validation_seeds=1, test_seeds=2)
    with pytest.raises(ev.ProtocolError, match="unknown scaling"):
        ev.run_protocol(["synthetic"], pool=["fifo/firstfit/nosuch"], loads=[1.0], validation_seeds=1, test_seeds=2)
    assert calls == []


def test_protocol_exact_answers(monkeypatch):
    monkeypatch.setattr(ev, "run_unit", _fake_run_unit)
    monkeypatch.setattr(ev, "check_pool", lambda names, suite, role="compared_with": [parse_policy_name(n) for n in names])
    seen = []
    res = ev.run_protocol(["synthetic"], candidates=["X/x"], pool=["A/a", "B/b", "C/c"], loads=[1.0],
                          validation_seeds=3, test_seeds=4, top=2, clairvoyant=["D/d"],
                          progress=lambda n, tot: seen.append((n, tot)))
    [screen] = res.screens
    # validation only: B (100) and C (200) are the strongest; test would pick C and then B
    assert screen["strongest"] == ["B/b", "C/c"]
    assert screen["units"] == ["seed=10000", "seed=10001", "seed=10002"]
    [cell] = res.cells
    assert cell["units"] == [f"seed={s}" for s in range(20000, 20004)]
    roles = {r["policy"]: r["role"] for r in cell["rows"]}
    assert roles == {"X/x": "candidate", "B/b": "strongest baseline", "C/c": "strongest baseline",
                     "D/d": "clairvoyant reference"}
    comps = {(c["compared_with"], c["role"]): c for c in cell["comparisons"]}
    # X = 180 vs C = 200 (x the same per-seed factor): -10%, CI on a constant ratio is a point
    c = comps[("C/c", "strongest baseline")]
    assert c["rel"] == pytest.approx(-0.10) and c["rel_lo"] == pytest.approx(-0.10) and c["rel_hi"] == pytest.approx(-0.10)
    assert c["below"] is True and c["n"] == 4
    b = comps[("B/b", "strongest baseline")]
    assert b["rel"] == pytest.approx(180 / 250 - 1) and b["below"] is True
    # the best of the strongest on test: C (200 < 250)
    assert comps[("C/c", "best of the strongest on test")]["diff"] == pytest.approx(c["diff"])
    # the clairvoyant row: reported, never a baseline (D was best of all on test)
    assert "D/d" not in cell["strongest"]
    assert comps[("D/d", "clairvoyant reference")]["above"] is True
    # 3 pool x 3 validation seeds, then (X, B, C, D) x 4 test seeds
    assert seen[-1] == (9 + 16, 9 + 16)
    md = ev.markdown(res)
    assert "D/d (clairvoyant reference)" in md and "reference, not a baseline" in md


def test_runs_per_load_merge_into_one_result(monkeypatch):
    monkeypatch.setattr(ev, "run_unit", _fake_run_unit)
    monkeypatch.setattr(ev, "check_pool", lambda names, suite, role="compared_with": [parse_policy_name(n) for n in names])
    kw = dict(candidates=["X/x"], pool=["A/a", "B/b", "C/c"], validation_seeds=2, test_seeds=3, top=1)
    hi = ev.run_protocol(["synthetic"], loads=[2.0], **kw)
    lo = ev.run_protocol(["synthetic"], loads=[0.5], **kw)
    m = ev.merge([hi, lo.to_dict()])
    assert [c["load"] for c in m.cells] == [0.5, 2.0] and [s["load"] for s in m.screens] == [0.5, 2.0]
    assert m.settings["runs"] == hi.settings["runs"] + lo.settings["runs"]
    with pytest.raises(ev.ProtocolError, match="top differs"):
        ev.merge([hi, ev.run_protocol(["synthetic"], loads=[1.0], **{**kw, "top": 2})])


def test_clairvoyant_baselines_are_refused():
    with pytest.raises(ev.ProtocolError, match="clairvoyant"):
        ev.check_pool(["optimus-oracle"], ev.SUITES["pollux"])
    with pytest.raises(ev.ProtocolError, match="not clairvoyant"):
        ev.check_pool(["tiresias-2q"], ev.SUITES["pollux"], role="clairvoyant reference")
    with pytest.raises(ev.ProtocolError, match="interval engine"):
        ev.check_pool(["fifo/firstfit"], ev.SUITES["pollux"], role="clairvoyant reference")
    assert all("optimus-oracle" not in n for n in ev.baseline_pool("pollux"))


def test_default_pool_is_the_issues():
    pool = ev.baseline_pool("alibaba")
    assert len(pool) == 3 * 5 * 2
    assert "tiresias/fgd+backfill" in pool and "tiresias/fgd+nobackfill" in pool
    assert "drf/das+nobackfill" in pool
    pool = ev.baseline_pool("pollux")
    assert len(pool) == 3 * 5 * 4 * 2 + 1 and pool[-1] == "tiresias-2q"
    assert "fifo/bestfit/optimus+backfill" in pool and "fifo/bestfit+nobackfill" in pool
    ev.check_pool(pool, ev.SUITES["pollux"])  # all registered and runnable
    ev.check_pool(ev.baseline_pool("synthetic"), ev.SUITES["synthetic"])


@pytest.mark.parametrize("kw, msg", [
    (dict(suites=["nosuch"]), "unknown suite"),
    (dict(pool=["fifo/nosuchplacement"]), "unknown placement"),
    (dict(candidates=["nosuchorder/firstfit"]), "unknown ordering"),
    (dict(pool=["tiresias-2q"]), "interval suites"),
    (dict(test_seeds=1), "test-seeds"),
    (dict(validation_seeds=0), "validation-seeds"),
    (dict(test_seeds=5000), "holds 1000 seeds"),
    (dict(top=0), "top"),
    (dict(pool=["fifo/firstfit+backfill", "fifo/firstfit+backfill"]), "twice"),
    (dict(loads=[0.0]), "load"),
])
def test_bad_input_gives_a_clear_error(kw, msg):
    args = dict(suites=["synthetic"], pool=["fifo/firstfit"], loads=[1.0], validation_seeds=1, test_seeds=2)
    args.update(kw)
    with pytest.raises(ev.ProtocolError, match=msg):
        ev.run_protocol(args.pop("suites"), **args)


def test_recorded_rows_pair_by_workload(tmp_path):
    p = tmp_path / "peers.json"
    p.write_text(json.dumps({"runs": [
        {"policy": "pollux", "load": 1.0, "workload": 1, "jct_mean": 100.0},
        {"policy": "pollux", "load": 1.0, "workload": 3, "jct_mean": 300.0},
        {"policy": "tiresias-2q", "load": 1.0, "workload": 3, "jct_mean": 9.0}]}))
    rec = ev.load_recorded(p)
    assert rec == {1.0: {"workload-1": 100.0, "workload-3": 300.0}}
    cand = {f"workload-{w}": 10.0 * w for w in range(1, 9)}
    row = ev._comparison("rlsched", "pollux", "recorded peer", cand, rec[1.0])
    assert row["n"] == 2 and row["diff"] == pytest.approx(((10 - 100) + (30 - 300)) / 2)
    assert ev.load_recorded(tmp_path / "none.json") == {}


# --------------------------------------------------------------------------- a real tiny run
def test_tiny_protocol_end_to_end(tmp_path):
    res = ev.run_protocol(["synthetic"], pool=["fifo/firstfit+nobackfill", "fifo/firstfit+backfill", "drf/bestfit+backfill"],
                          clairvoyant=["fifo/firstfit+backfill"], loads=[1.5], validation_seeds=2, test_seeds=3,
                          top=2, jobs=40)
    [screen] = res.screens
    assert screen["strongest"] == ev.select_strongest(screen["means"], 2)
    [cell] = res.cells
    for cp in cell["comparisons"]:
        assert cp["n"] == 3
        rows = {(r["policy"], r["role"]): r for r in cell["rows"]}
        a = rows[(cp["candidate"], "candidate")]["per_unit"]
        b = next(r for r in cell["rows"] if r["policy"] == cp["compared_with"] and
                 (r["role"] == "clairvoyant reference") == (cp["role"] == "clairvoyant reference"))["per_unit"]
        assert cp["diff"] == pytest.approx(np.mean([a[u] - b[u] for u in a]))
    paths = ev.write_outputs(res, tmp_path, "p")
    assert [p.name for p in paths] == ["p.json", "p.md", "p.png"] and all(p.stat().st_size > 0 for p in paths)
    d = json.loads(paths[0].read_text())
    assert d["settings"]["test_seeds"] == [20000, 20001, 20002]
    assert all(math.isfinite(r["mean"]) for r in d["cells"][0]["rows"])


def _real_data() -> str | None:
    env = os.environ.get("RLSCHED_DATA_DIR")
    cand = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return str(cand) if (cand / "pollux-osdi21" / "traces" / "philly.csv").is_file() else None


@pytest.mark.skipif(_real_data() is None, reason="Pollux OSDI'21 data not found ($RLSCHED_DATA_DIR or ../shared/data)")
def test_pollux_suite_cells_and_a_tiny_interval_run():
    suite = ev.SUITES["pollux"]
    assert suite.test_cells(1.0) == ["published", "generated"] and suite.test_cells(2.0) == ["generated"]
    units = suite.test_units(1.5, "published", 20, 160)
    assert [u.key for u in units] == [f"workload-{w}" for w in range(1, 9)]
    assert units[0].spec == "pollux:workloads-1.5/workload-1"
    assert [u.seed for u in suite.validation_units(1.0, 2, 160)] == [10000, 10001]
    res = ev.run_protocol(["pollux"], pool=["fifo/firstfit+nobackfill", "tiresias-2q"], loads=[2.0],
                          validation_seeds=1, test_seeds=2, top=1, jobs=10, clairvoyant=["optimus-oracle"],
                          data_dir=_real_data())
    [cell] = res.cells
    assert cell["cell"] == "generated" and cell["units"] == ["seed=20000", "seed=20001"]
    roles = {r["policy"]: r["role"] for r in cell["rows"]}
    assert roles["rlsched"] == "candidate" and roles["optimus-oracle"] == "clairvoyant reference"
    assert "tiresias-2q" in roles  # always reported on the pollux suite
    assert "optimus-oracle" not in cell["strongest"]


def test_eval_protocol_cli_imports_no_torch(tmp_path):
    code = (
        "import sys\n"
        "from rlsched.models.cli import run\n"
        f"rc = run('eval', 'protocol', ['--suite', 'synthetic', '--jobs', '30', '--loads', '1', '--pool', "
        f"'fifo/firstfit+backfill,drf/topology+nobackfill', '--validation-seeds', '1', '--test-seeds', '2', "
        f"'--top', '1', '--out', {str(tmp_path)!r}, '--quiet'])\n"
        "assert rc == 0, rc\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "rc = run('eval', 'protocol', ['--suite', 'nosuch', '--out', 'x', '--quiet'])\n"
        "assert rc == 2, rc\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "unknown suite 'nosuch'" in r.stderr
    assert (tmp_path / "protocol_synthetic.md").is_file()


# --------------------------------------------------------------------------- trace options
def _trace(n=10):
    jobs = [JobSpec(id=f"j{k}", submit_time=10.0 * k, gpus_per_worker=1, duration=100.0 * (k + 1)) for k in range(n)]
    return Trace("t", jobs, Topology.uniform(1, 4))


def test_window_is_seeded_consecutive_and_starts_at_zero():
    a, b, c = _trace(), _trace(), _trace()
    window_jobs(a, 4, seed=1)
    window_jobs(b, 4, seed=1)
    assert [j.id for j in a.jobs] == [j.id for j in b.jobs]
    ks = [int(j.id[1:]) for j in a.jobs]
    assert ks == list(range(ks[0], ks[0] + 4)) and a.jobs[0].submit_time == 0.0
    starts = set()
    for s in range(20):
        t = _trace()
        window_jobs(t, 4, seed=s)
        starts.add(t.jobs[0].id)
    assert len(starts) > 1  # seeds replay different stretches
    with pytest.raises(TraceError, match="only 10 jobs"):
        window_jobs(c, 11, seed=0)


def test_tail_clips_the_durations_that_set_the_load():
    t = _trace(4)  # durations 100..400, submits 0..30, 4 GPUs
    assert scale_for_load(t, 1.0) == pytest.approx(1000 / (4 * 30))
    # durations at most the 0.5-quantile (250): 100 + 200 + 250 + 250
    assert scale_for_load(t, 1.0, tail=0.5) == pytest.approx(800 / (4 * 30))
    with pytest.raises(TraceError, match="tail"):
        parse_options("x,tail=0.5")  # needs load
    with pytest.raises(TraceError, match="tail"):
        parse_options("x,load=1,tail=1.5")
    with pytest.raises(TraceError, match="whole number"):
        parse_options("x,window=2.5")


def test_sia_suite_cells_on_the_mixed_cluster_and_a_tiny_run():
    """The sia suite: the paper's 8 Philly workloads at load 1.0, pollux-gen workloads
    drawn for the 64-GPU mix of three types at every load in the same setting (the Sia
    artifact's calibration and restart costs), disjoint seeds."""
    suite = ev.SUITES["sia"]
    assert suite.test_cells(1.0) == ["published", "generated"] and suite.test_cells(0.5) == ["generated"]
    units = suite.test_units(1.0, "published", 20, 160)
    assert [u.spec for u in units] == [f"sia:workloads/philly/workload-{w}" for w in range(1, 9)]
    gen = suite.test_units(0.5, "generated", 2, 160)
    assert [u.spec for u in gen] == [f"pollux-gen:seed={s},jobs=160,load=0.5,cluster=sia-64,calibration=sia,restart=sia"
                                     for s in (20000, 20001)]
    assert {u.seed for u in suite.validation_units(0.5, 2, 160)}.isdisjoint(u.seed for u in gen)
    assert {"sia", "gavel", "pollux-paper", "tiresias-2q"} <= set(suite.also)
    ev.check_pool(ev.baseline_pool("sia"), suite)  # every peer registered and runnable
    (row,) = ev.run_unit(suite.test_units(0.5, "generated", 1, 8)[0].spec, 20000,
                         [("fifo/firstfit+nobackfill", False)], "interval", _real_data())
    assert row["jobs_completed"] == 4 and row["jct_mean"] > 0  # 8 jobs x load 0.5, on the mix
