"""``rlsched eval protocol``: candidates against the strongest honest baselines.

Per suite and load: screen the non-clairvoyant baseline pool on validation seeds and
keep the ``K`` strongest; run the candidates (default ``rlsched``) and those baselines on
test seeds and report paired bootstrap 95% intervals (:mod:`.protocol`). Clairvoyant rows
are labelled references, never baselines. Suites: docs/design-notes.md, docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlsched.core.served import SERVED, SERVED_NAME, PolicyName, parse_policy_name

from .protocol import PairedDiff, SplitError, paired_bootstrap, seeds

__all__ = [
    "ProtocolError", "Unit", "Suite", "SUITES", "POOL_ORDERINGS", "POOL_PLACEMENTS", "POOL_SCALINGS",
    "baseline_pool", "select_strongest", "pair_by_unit", "check_pool", "run_unit", "run_protocol",
    "ProtocolResult", "merge", "write_outputs", "add_arguments", "main", "RECORDED_LABEL",
]

log = logging.getLogger("rlsched.sim.evaluate")

#: the pool; all non-clairvoyant
POOL_ORDERINGS = ("fifo", "drf", "tiresias")
POOL_PLACEMENTS = ("firstfit", "bestfit", "topology", "fgd", "das")
POOL_SCALINGS = ("fs", "beta", "optimus")

CLAIRVOYANT_LABEL = "(clairvoyant reference)"
RECORDED_LABEL = "(recorded)"


class ProtocolError(ValueError):
    """Bad protocol input: unknown suite or policy, a clairvoyant baseline, seed counts."""


# --------------------------------------------------------------------------- suites
@dataclass(frozen=True)
class Unit:
    """One paired unit of a cell: a trace spec and its seed (``key`` names it)."""

    key: str
    spec: str
    seed: int


@dataclass(frozen=True)
class Suite:
    name: str
    engine: str  # "event" (sim/engine.py) or "interval" (sim/interval.py)
    loads: tuple[float, ...]
    scalings: tuple[str, ...]  # the pool's scalings ("none" = no scaling)
    also: tuple[str, ...] = ()  # baselines always reported on test
    allocators: tuple[str, ...] = ()  # named allocation policies in the pool
    describe: str = ""
    #: (load, trace spec with ``{w}``) of the published workloads 1-8 tested at that load
    published: tuple[tuple[float, str], ...] = ()
    #: the cluster its generated workloads are drawn for (``cluster=`` of pollux-gen; "": Pollux's)
    cluster: str = ""
    #: pollux-gen options of the setting its generated workloads run in, as its
    #: published ones do ("": Pollux's)
    setting: str = ""

    def published_spec(self, load: float) -> str | None:
        return dict(self.published).get(load)

    def validation_units(self, load: float, n: int, jobs: int) -> list[Unit]:
        return [Unit(f"seed={s}", self._spec(load, s, jobs), s) for s in seeds("validation", n)]

    def test_cells(self, load: float) -> list[str]:
        """The cells tested at ``load`` (screened together on validation)."""
        if self.engine == "interval":
            return (["published"] if self.published_spec(load) else []) + ["generated"]
        return [""]

    def test_units(self, load: float, cell: str, n: int, jobs: int) -> list[Unit]:
        if cell == "published":
            return [Unit(f"workload-{w}", self.published_spec(load).format(w=w), 0) for w in range(1, 9)]
        return [Unit(f"seed={s}", self._spec(load, s, jobs), s) for s in seeds("test", n)]

    def _spec(self, load: float, seed: int, jobs: int) -> str:
        if self.name == "synthetic":
            return f"synthetic:medium,jobs={jobs},load={load:g}"
        if self.name == "alibaba":
            return f"alibaba2023:default,nodes=30,window={jobs},load={load:g},tail=0.9"
        if self.engine == "interval":
            return (f"pollux-gen:seed={seed},jobs={jobs},load={load:g}" + (f",cluster={self.cluster}" if self.cluster else "")
                    + (f",{self.setting}" if self.setting else ""))
        raise ProtocolError(f"suite {self.name!r} has no trace")


#: the published workloads' folders by load (data README)
PUBLISHED_FOLDERS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5"}

SUITES: dict[str, Suite] = {
    "synthetic": Suite("synthetic", "event", (0.5, 1.0, 1.5, 2.0), ("none",) + POOL_SCALINGS,
                       describe="synthetic:medium (64 nodes x 8 GPUs), JOBS jobs, log-normal run times (shape 1.1)"),
    "alibaba": Suite("alibaba", "event", (0.5, 1.0, 1.5, 2.0), ("none",),
                     describe="Alibaba GPU 2023 (openb default list) on 30 of its nodes (147 GPUs), a window of JOBS "
                     "consecutive jobs per seed, arrivals scaled to the load with durations counted up to their "
                     "90th percentile (tail=0.9); single-pod jobs: no scaling. On 100 nodes a 1,000-job window "
                     "never queues at any load (at most ~460 jobs run at once on 489 GPUs)"),
    "pollux": Suite("pollux", "interval", (0.5, 1.0, 1.5), ("none",) + POOL_SCALINGS, also=("tiresias-2q",),
                    allocators=("tiresias-2q",),
                    describe="Pollux OSDI'21 benchmark on the interval engine (16 x 4 GPUs): the 8 published "
                    "workloads, and held-out workloads generated from the Philly list (pollux-gen)",
                    published=tuple((L, f"pollux:{folder}/workload-{{w}}") for L, folder in PUBLISHED_FOLDERS.items())),
    "sia": Suite("sia", "interval", (0.5, 1.0, 1.5), ("none",), also=("sia", "gavel", "pollux-paper", "tiresias-2q"),
                 allocators=("sia", "gavel", "pollux-paper", "tiresias-2q"), cluster="sia-64",
                 setting="calibration=sia,restart=sia",
                 describe="Sia SOSP'23 benchmark on the interval engine, its 64-GPU mix of three types (6 x 4 T4, "
                 "2 x 8 A100, 3 x 8 RTX): the paper's 8 Philly workloads, and held-out pollux-gen workloads "
                 "drawn for the same mix, in the same setting (the artifact's calibration and restart costs); "
                 "Sia, Gavel, the heterogeneity-unaware paper Pollux and Tiresias-2q always reported",
                 published=((1.0, "sia:workloads/philly/workload-{w}"),)),
}

#: default JOBS per suite (the pollux suite's generated workloads keep pollux-gen's 160 x load)
DEFAULT_JOBS = {"synthetic": 1000, "alibaba": 1000, "pollux": 160, "sia": 160}


def baseline_pool(suite: str | Suite, scalings: Sequence[str] | None = None) -> list[str]:
    """The issue's non-clairvoyant pool for ``suite``: orderings x placements x scalings,
    each ``+backfill`` and ``+nobackfill``, plus the suite's named allocators."""
    s = SUITES[suite] if isinstance(suite, str) else suite
    out = []
    for o in POOL_ORDERINGS:
        for p in POOL_PLACEMENTS:
            for sc in (scalings if scalings is not None else s.scalings):
                base = f"{o}/{p}" + ("" if sc == "none" else f"/{sc}")
                out += [base + "+backfill", base + "+nobackfill"]
    return out + list(s.allocators)


def _suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ProtocolError(f"unknown suite {name!r}; known: {', '.join(SUITES)}") from None


def check_pool(names: Sequence[str], suite: Suite, *, role: str = "compared_with") -> list[PolicyName]:
    """Parse and check policy names for ``suite``: registered, runnable on its engine,
    and, for baselines, not clairvoyant (``ProtocolError`` otherwise)."""
    from rlsched.core import ORDERINGS, PLACEMENTS, SCALINGS, make_ordering
    from rlsched.core.policy import allocator_entry, allocator_names

    from .allocators import is_allocator  # importing it registers the simulator's peers

    make_ordering("fifo")  # loads the registries
    out = []
    for name in names:
        try:
            pol = parse_policy_name(name)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        if pol.allocator and pol.placement and suite.engine != "interval":
            pass  # an allocation policy of the event engine (<allocator>/<placement>, or rlsched)
        elif pol.allocator:
            if suite.engine != "interval":
                raise ProtocolError(f"{role} {name!r}: single-word allocation policies run on the interval "
                                    f"suites ({', '.join(n for n, x in SUITES.items() if x.engine == 'interval')}) "
                                    f"only; suite {suite.name!r} runs ordering/placement[/scaling], "
                                    f"<allocator>/<placement> or {SERVED_NAME}")
            base = pol.allocator.partition("@")[0].strip()  # options: name@key=value,...
            if not is_allocator(base):
                raise ProtocolError(f"unknown {role} policy {name!r}; known allocation policies: "
                                    f"{', '.join(allocator_names())}")
            if base == "pollux":
                raise ProtocolError("the released Pollux policy takes ~50 min a workload: its recorded runs are "
                                    "reported instead (--recorded), paired by workload")
            clair = allocator_entry(base).clairvoyant
            if role == "compared_with" and clair:
                raise ProtocolError(f"{name!r} is clairvoyant: give it as --clairvoyant-reference, never as a baseline")
            if role == "clairvoyant reference" and not clair:
                raise ProtocolError(f"{name!r} is not clairvoyant: a baseline, not a reference")
        elif role == "clairvoyant reference" and suite.engine == "interval":
            raise ProtocolError(f"clairvoyant reference {name!r}: the interval engine shows no ordering/placement "
                                "the true run times; its clairvoyant reference is optimus-oracle")
        else:
            for kind, table, v in (("ordering", ORDERINGS, pol.ordering), ("placement", PLACEMENTS, pol.placement),
                                   ("scaling", SCALINGS, pol.scaling)):
                if v is not None and v.lower() not in table:
                    raise ProtocolError(f"{role} {name!r}: unknown {kind} policy {v!r}; known: {', '.join(sorted(table))}")
        out.append(pol)
    labels = [p.label for p in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ProtocolError(f"{role}s named twice: {', '.join(dup)}")
    return out


# --------------------------------------------------------------------------- selection and pairing
def select_strongest(means: Mapping[str, float], k: int, *, exclude: Sequence[str] = ()) -> list[str]:
    """The ``k`` names with the lowest mean (ties by name), leaving out ``exclude``
    (clairvoyant rows) and non-finite means."""
    if k < 1:
        raise ProtocolError(f"--top must be >= 1, got {k}")
    ranked = sorted((v, n) for n, v in means.items() if n not in set(exclude) and math.isfinite(v))
    return [n for _, n in ranked[:k]]


def pair_by_unit(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[list[str], list[float], list[float]]:
    """The units both ``a`` and ``b`` have (in ``a``'s order) and their paired values."""
    keys = [u for u in a if u in b]
    return keys, [float(a[u]) for u in keys], [float(b[u]) for u in keys]


# --------------------------------------------------------------------------- runs
def run_unit(spec: str, seed: int, policies: Sequence[tuple[str, bool]], engine: str,
             data_dir: str | None = None, progress: Callable[[], None] | None = None) -> list[dict]:
    """Run each ``(policy name, clairvoyant)`` on one trace; a small dict per run."""
    from .cli import policy_config, run_allocator, run_policy
    from .engine import SimConfig
    from .traces import MeasuredTrace, default_topology, load_trace

    trace = load_trace(spec, data_dir=data_dir, seed=seed)
    measured = isinstance(trace, MeasuredTrace)
    if measured != (engine == "interval"):
        raise ProtocolError(f"trace {spec!r} does not run on the {engine} engine")
    out = []
    for name, clair in policies:
        t0 = time.perf_counter()
        pol = parse_policy_name(name)
        if measured:
            res, m = run_allocator(trace, trace.cluster, pol.label, trace.interval_config(), seed=seed)
        else:
            topo = trace.topology if trace.topology is not None else default_topology(trace.jobs)
            cfg = policy_config(SimConfig(clairvoyant=clair), pol)
            res, m = run_policy(trace, topo, pol.ordering, pol.placement, pol.scaling, seed, cfg,
                                allocator=pol.allocator)
        out.append({"policy": name, "clairvoyant": bool(m["clairvoyant"]), "jct_mean": m["jct_mean"],
                    "jobs_completed": m["jobs_completed"], "jobs_unfinished": m["jobs_unfinished"],
                    "wall_s": time.perf_counter() - t0})
        if progress is not None:
            progress()
    return out


def _unit_task(args: tuple) -> tuple[Any, list[dict]]:
    key, spec, seed, policies, engine, data_dir = args
    return key, run_unit(spec, seed, policies, engine, data_dir)


class _Runner:
    """Runs (unit, policies) tasks inline or on ``procs`` processes; advances ``tick``."""

    def __init__(self, procs: int, data_dir: str | None, tick: Callable[[int], None]):
        self.procs, self.data_dir, self.tick = procs, data_dir, tick
        self.pool = ProcessPoolExecutor(max_workers=procs) if procs > 1 else None

    def run(self, tasks: list[tuple[Any, Unit, list[tuple[str, bool]], str]]) -> dict[Any, list[dict]]:
        out: dict[Any, list[dict]] = {}
        if self.pool is None:
            for key, unit, pols, engine in tasks:
                out[key] = run_unit(unit.spec, unit.seed, pols, engine, self.data_dir, progress=lambda: self.tick(1))
            return out
        futs = {self.pool.submit(_unit_task, (key, unit.spec, unit.seed, pols, engine, self.data_dir)): len(pols)
                for key, unit, pols, engine in tasks}
        for f in as_completed(futs):
            key, rows = f.result()
            out[key] = rows
            self.tick(futs[f])
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


# --------------------------------------------------------------------------- result
@dataclass
class ProtocolResult:
    settings: dict[str, Any]
    screens: list[dict] = field(default_factory=list)  # per (suite, load): validation means, the strongest
    cells: list[dict] = field(default_factory=list)  # per test cell: rows and paired comparisons

    def to_dict(self) -> dict:
        return {"settings": self.settings, "screens": self.screens, "cells": self.cells}


def _comparison(cand: str, base: str, role: str, a: Mapping[str, float], b: Mapping[str, float]) -> dict:
    units, x, y = pair_by_unit(a, b)
    row: dict[str, Any] = {"candidate": cand, "compared_with": base, "role": role, "units": len(units)}
    if len(units) < 2:
        row["note"] = f"{len(units)} paired unit(s): no interval"
        return row
    d: PairedDiff = paired_bootstrap(x, y)
    row.update(d.to_dict())
    row["below"] = d.below()
    row["above"] = d.above()
    return row


def load_recorded(path: str | Path | None) -> dict[float, dict[str, float]]:
    """The recorded Pollux runs: load -> {"workload-N": mean JCT} (published workloads)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        log.warning("no recorded Pollux runs at %s: the pollux suite reports none", p)
        return {}
    data = json.loads(p.read_text())
    out: dict[float, dict[str, float]] = {}
    for r in data.get("runs", []):
        if r.get("policy") == "pollux" and not r.get("generated") and r.get("jct_mean") is not None:
            out.setdefault(float(r["load"]), {})[f"workload-{int(r['workload'])}"] = float(r["jct_mean"])
    return out


def default_recorded() -> Path:
    """``docs/results/peers_pollux.json`` of this source tree."""
    return Path(__file__).resolve().parents[1] / "docs" / "results" / "peers_pollux.json"


def run_protocol(
    suites: Sequence[str],
    *,
    candidates: Sequence[str] = (SERVED_NAME,),
    pool: Sequence[str] | None = None,
    scalings: Sequence[str] | None = None,
    clairvoyant: Sequence[str] = (),
    also: Sequence[str] | None = None,
    loads: Sequence[float] | None = None,
    validation_seeds: int = 5,
    test_seeds: int = 20,
    top: int = 3,
    jobs: int | None = None,
    procs: int = 1,
    data_dir: str | None = None,
    recorded: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ProtocolResult:
    """Screen on validation, test on test (module docstring). ``pool=None``: the
    issue's pool for each suite (:func:`baseline_pool`, with ``scalings`` if given);
    ``also=None``: the suite's always-reported baselines; ``recorded``: the recorded
    Pollux runs (JSON of ``bench/peers.py``), used on the pollux suite.
    ``progress(done, total)`` is called after each run."""
    if not suites:
        raise ProtocolError("no suite given")
    suite_objs = [_suite(s) for s in suites]
    if not candidates:
        raise ProtocolError("no candidate policy given")
    if validation_seeds < 1:
        raise ProtocolError(f"--validation-seeds must be >= 1, got {validation_seeds}")
    if test_seeds < 2:
        raise ProtocolError(f"--test-seeds must be >= 2 for a paired interval (the protocol asks >= 20), got {test_seeds}")
    if procs < 1:
        raise ProtocolError(f"--procs must be >= 1, got {procs}")
    if top < 1:
        raise ProtocolError(f"--top must be >= 1, got {top}")
    try:
        seeds("validation", validation_seeds), seeds("test", test_seeds)
    except SplitError as exc:
        raise ProtocolError(str(exc)) from None
    if test_seeds < 20:
        log.warning("%d test seeds: the protocol asks >= 20", test_seeds)
    rec = load_recorded(recorded) if recorded is not None else {}

    # plan: check every name before running anything
    plans = []
    for s in suite_objs:
        pool_names = list(pool) if pool is not None else baseline_pool(s, scalings)
        pool_p = check_pool(pool_names, s)
        cand_p = check_pool(candidates, s, role="candidate")
        clair_p = check_pool(clairvoyant, s, role="clairvoyant reference") if clairvoyant else []
        also_p = check_pool(list(also) if also is not None else list(s.also), s)
        ls = list(loads) if loads is not None else list(s.loads)
        for L in ls:
            if not L > 0:
                raise ProtocolError(f"load must be > 0, got {L:g}")
        n_jobs = jobs if jobs is not None else DEFAULT_JOBS[s.name]
        plans.append((s, pool_p, cand_p, clair_p, also_p, ls, n_jobs))

    done = [0]
    total = [sum(len(p[1]) * validation_seeds * len(p[5]) for p in plans)]

    def tick(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total[0])

    settings = {
        "suites": list(suites), "candidates": list(candidates), "top": top,
        "validation_seeds": seeds("validation", validation_seeds), "test_seeds": seeds("test", test_seeds),
        "served": {"name": SERVED_NAME, "ordering": SERVED.ordering, "placement": SERVED.placement,
                   "scaling": SERVED.scaling, "allocator": SERVED.allocator, "reason": SERVED.reason},
        "clairvoyant_reference": list(clairvoyant), "pool": {}, "jobs": {}, "recorded": str(recorded) if recorded else None,
        "pool_kind": "custom (--pool)" if pool is not None else (
            f"the issue's pool, scalings narrowed to {', '.join(scalings)}" if scalings is not None else "the issue's pool"),
        "notes": [],
    }
    result = ProtocolResult(settings)
    runner = _Runner(procs, data_dir, tick)
    t_start = time.perf_counter()
    try:
        for s, pool_p, cand_p, clair_p, also_p, ls, n_jobs in plans:
            settings["pool"][s.name] = [p.label for p in pool_p]
            settings["jobs"][s.name] = n_jobs
            # 1. screen on validation
            tasks = []
            for L in ls:
                for u in s.validation_units(L, validation_seeds, n_jobs):
                    tasks.append(((L, u.key), u, [(p.label, False) for p in pool_p], s.engine))
            rows = runner.run(tasks)
            screens = {}
            for L in ls:
                per: dict[str, dict[str, float]] = {}
                clair_seen = set()
                for u in s.validation_units(L, validation_seeds, n_jobs):
                    for r in rows[(L, u.key)]:
                        per.setdefault(r["policy"], {})[u.key] = r["jct_mean"]
                        if r["clairvoyant"]:
                            clair_seen.add(r["policy"])
                if clair_seen:
                    raise ProtocolError(f"baselines ran clairvoyant: {', '.join(sorted(clair_seen))}")
                means = {n: float(np.mean(list(v.values()))) for n, v in per.items()}
                strongest = select_strongest(means, top)
                screens[L] = strongest
                result.screens.append({"suite": s.name, "load": L,
                                       "units": [u.key for u in s.validation_units(L, validation_seeds, n_jobs)],
                                       "means": means, "strongest": strongest,
                                       "ranking": sorted(means, key=lambda n: (means[n], n))})
            # 2. test
            test_plan = []
            for L in ls:
                for cell in s.test_cells(L):
                    units = s.test_units(L, cell, test_seeds, n_jobs)
                    runs: list[tuple[str, bool]] = []
                    for p in cand_p:
                        runs.append((p.label, False))
                    for name in screens[L] + [p.label for p in also_p]:
                        if (name, False) not in runs:
                            runs.append((name, False))
                    for p in clair_p:
                        if (p.label, True) not in runs:
                            runs.append((p.label, True))
                    test_plan.append((L, cell, units, runs))
                    total[0] += len(units) * len(runs)
            tasks = [((L, cell, u.key), u, runs, s.engine) for L, cell, units, runs in test_plan for u in units]
            rows = runner.run(tasks)
            for L, cell, units, runs in test_plan:
                result.cells.append(_cell(s, L, cell, units, runs, rows, cand_p, screens[L], also_p,
                                          rec.get(L, {}) if (s.name == "pollux" and cell == "published") else {}))
    finally:
        runner.close()
    settings["wall_s"] = time.perf_counter() - t_start
    settings["runs"] = done[0]
    return result


def _cell(s: Suite, L: float, cell: str, units: list[Unit], runs, rows, cand_p, strongest, also_p, recorded) -> dict:
    values: dict[tuple[str, bool], dict[str, float]] = {}
    clair_of: dict[tuple[str, bool], bool] = {}
    for u in units:
        for r in rows[(L, cell, u.key)]:
            key = (r["policy"], r["clairvoyant"])
            values.setdefault(key, {})[u.key] = r["jct_mean"]
    cands = [p.label for p in cand_p]
    also_names = [p.label for p in also_p]
    out_rows = []

    def add(name: str, role: str, vals: Mapping[str, float], clair: bool = False) -> None:
        out_rows.append({"policy": name, "role": role, "clairvoyant": clair,
                         "mean": float(np.mean(list(vals.values()))) if vals else None,
                         "units": len(vals), "per_unit": {k: float(v) for k, v in vals.items()}})

    for c in cands:
        add(c, "candidate", values.get((c, False), {}))
    for b in strongest:
        add(b, "strongest baseline", values.get((b, False), {}))
    for b in also_names:
        if b not in strongest:
            add(b, "reported baseline", values.get((b, False), {}))
    # reference rows: the runs that saw true run times (asked, or an inherently clairvoyant allocator)
    refs = list(dict.fromkeys(name for name, clair in values if clair))
    for name in refs:
        add(name, "clairvoyant reference", values.get((name, True), {}), clair=True)
    if recorded:
        add("pollux", "recorded peer", recorded)

    comps = []
    for c in cands:
        a = values.get((c, False), {})
        for b in strongest:
            comps.append(_comparison(c, b, "strongest baseline", a, values.get((b, False), {})))
        if strongest:
            best = min(strongest, key=lambda b: (np.mean(list(values.get((b, False), {0: math.inf}).values())), b))
            comps.append(_comparison(c, best, "best of the strongest on test", a, values.get((best, False), {})))
        for b in also_names:
            if b not in strongest:
                comps.append(_comparison(c, b, "reported baseline", a, values.get((b, False), {})))
        if recorded:
            comps.append(_comparison(c, "pollux", "recorded peer", a, recorded))
        for name in refs:
            comps.append(_comparison(c, name, "clairvoyant reference", a, values.get((name, True), {})))
    return {"suite": s.name, "load": L, "cell": cell, "units": [u.key for u in units],
            "specs": sorted({u.spec.split("seed=")[0] for u in units}), "strongest": list(strongest),
            "rows": out_rows, "comparisons": comps}


# --------------------------------------------------------------------------- outputs
def _cell_name(c: Mapping) -> str:
    return f"{c['suite']}{' ' + c['cell'] if c['cell'] else ''} load {c['load']:g}"


def _shown(name: str, role: str) -> str:
    if role == "clairvoyant reference":
        return f"{name} {CLAIRVOYANT_LABEL}"
    if role == "recorded peer":
        return f"{name} {RECORDED_LABEL}"
    return name


def _f(x: Any, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{100 * x:+.1f}%" if pct else f"{x:,.0f}"


def _served_text(served: Mapping) -> str:
    if served.get("allocator"):
        return f"{served['allocator']} (new workers placed by {served['placement']})"
    return f"{served['ordering']} / {served['placement']} / {served['scaling']}"


def markdown(result: ProtocolResult | Mapping) -> str:
    d = result.to_dict() if isinstance(result, ProtocolResult) else result
    st = d["settings"]
    val, test = st["validation_seeds"], st["test_seeds"]
    lines = [
        "# Evaluation protocol: candidates against the strongest baselines", "",
        f"Candidates: {', '.join(st['candidates'])} (`{SERVED_NAME}` = {_served_text(st['served'])}: "
        f"{st['served']['reason']}).",
        f"Strongest baselines: per suite and load, the {st['top']} lowest mean JCTs of the pool on "
        f"{len(val)} validation seeds ({val[0]}..{val[-1]}); reported on {len(test)} test seeds "
        f"({test[0]}..{test[-1]}) (the pollux suite's published workloads: workloads 1-8). "
        "Differences are candidate - baseline, paired per seed (per workload), with percentile bootstrap "
        "95% intervals; negative is better for the candidate. **below** = the whole interval is below zero.",
        f"Clairvoyant rows are marked {CLAIRVOYANT_LABEL} and never count as baselines; recorded rows "
        f"{RECORDED_LABEL} are runs recorded earlier, paired on the workloads both have.", "",
    ]
    for cmd in st.get("commands") or ([st["command"]] if st.get("command") else []):
        lines += [f"Command: `{cmd}`", ""]
    for note in st.get("notes", []):
        lines += [f"Note: {note}", ""]
    for suite in st["suites"]:
        pool = st["pool"].get(suite, [])
        lines += [f"## {suite}", "", f"{SUITES[suite].describe.replace('JOBS', str(st['jobs'].get(suite, '')))}; "
                  f"pool of {len(pool)} policies ({st.get('pool_kind', 'the issue pool')}).", ""]
        lines += ["| cell | candidate | against | role | n | candidate mean JCT s | baseline mean JCT s | "
                  "diff s [95% CI] | rel [95% CI] | below? |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in (c for c in d["cells"] if c["suite"] == suite):
            for cp in c["comparisons"]:
                if "diff" not in cp:
                    lines.append(f"| {_cell_name(c)} | {cp['candidate']} | {_shown(cp['compared_with'], cp['role'])} | "
                                 f"{cp['role']} | {cp['units']} | - | - | {cp.get('note', '-')} | - | - |")
                    continue
                ref = cp["role"] == "clairvoyant reference"
                verdict = "yes" if cp["below"] else ("no (above)" if cp["above"] else "no")
                if ref:
                    verdict = f"({verdict}; reference, not a baseline)"
                lines.append(
                    f"| {_cell_name(c)} | {cp['candidate']} | {_shown(cp['compared_with'], cp['role'])} | {cp['role']} | {cp['n']} | "
                    f"{_f(cp['mean_a'])} | {_f(cp['mean_b'])} | {_f(cp['diff'])} [{_f(cp['diff_lo'])}, {_f(cp['diff_hi'])}] | "
                    f"{_f(cp['rel'], True)} [{_f(cp['rel_lo'], True)}, {_f(cp['rel_hi'], True)}] | {verdict} |")
        lines.append("")
        lines += ["Validation screening (mean JCT s over the validation seeds; the strongest in bold):", "",
                  "| load | top of the pool |", "|---|---|"]
        for sc in (x for x in d["screens"] if x["suite"] == suite):
            top = [f"**{n}** {_f(sc['means'][n])}" if n in sc["strongest"] else f"{n} {_f(sc['means'][n])}"
                   for n in sc["ranking"][: max(len(sc["strongest"]) + 3, 5)]]
            lines.append(f"| {sc['load']:g} | {'; '.join(top)} |")
        lines.append("")
    lines.append(f"{st.get('runs', 0)} simulations, {st.get('wall_s', 0):.0f} s wall.")
    return "\n".join(lines) + "\n"


def plot(result: ProtocolResult | Mapping, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = result.to_dict() if isinstance(result, ProtocolResult) else result
    cells = d["cells"]
    roles = ("strongest baseline", "best of the strongest on test", "reported baseline", "recorded peer")
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cells) + 2), 4.5))
    marks = {}
    cand_marker = {c: "osD^v<>"[k % 7] for k, c in enumerate(d["settings"]["candidates"])}
    for i, c in enumerate(cells):
        comps = [cp for cp in c["comparisons"] if cp["role"] in roles and "rel" in cp]
        step = 0.8 / max(len(comps), 1)
        for j, cp in enumerate(comps):
            off = (j - (len(comps) - 1) / 2) * step
            key = cp["role"] if cp["role"] != "strongest baseline" else "each strongest baseline"
            color = {"each strongest baseline": "C0", "best of the strongest on test": "C3",
                     "reported baseline": "C2", "recorded peer": "C1"}[key]
            lo, hi = 100 * (cp["rel"] - cp["rel_lo"]), 100 * (cp["rel_hi"] - cp["rel"])
            h = ax.errorbar(i + off, 100 * cp["rel"], yerr=[[lo], [hi]], fmt=cand_marker[cp["candidate"]], color=color,
                            capsize=3, ms=4)
            marks.setdefault(key, h)
    if len(cand_marker) > 1:
        from matplotlib.lines import Line2D

        for cand, mk in cand_marker.items():
            marks[f"candidate {cand}"] = Line2D([], [], color="k", marker=mk, ls="")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([_cell_name(c) for c in cells], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("candidate vs baseline: mean JCT difference (%)")
    ax.set_title(f"{', '.join(d['settings']['candidates'])}: paired differences, 95% bootstrap CI (test seeds)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    if marks:
        ax.legend(marks.values(), marks.keys(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def merge(parts: Sequence[ProtocolResult | Mapping]) -> ProtocolResult:
    """One result from runs of the same protocol over different suites or loads (e.g.
    one process per load): screens and cells side by side, runs and wall time summed.
    The parts must share candidates, seeds and K."""
    ds = [p.to_dict() if isinstance(p, ProtocolResult) else p for p in parts]
    if not ds:
        raise ProtocolError("nothing to merge")
    first = ds[0]["settings"]
    for d in ds[1:]:
        for k in ("candidates", "validation_seeds", "test_seeds", "top"):
            if d["settings"][k] != first[k]:
                raise ProtocolError(f"cannot merge: {k} differs ({d['settings'][k]} vs {first[k]})")
    st = json.loads(json.dumps(first))
    st["suites"] = list(dict.fromkeys(s for d in ds for s in d["settings"]["suites"]))
    for key in ("pool", "jobs"):
        for d in ds:
            st[key].update(d["settings"].get(key, {}))
    st["runs"] = sum(d["settings"].get("runs", 0) for d in ds)
    st["wall_s"] = sum(d["settings"].get("wall_s", 0.0) for d in ds)
    st["commands"] = [d["settings"].get("command", "") for d in ds]
    st["notes"] = list(dict.fromkeys(n for d in ds for n in d["settings"].get("notes", [])))
    order = {s: i for i, s in enumerate(st["suites"])}
    screens = sorted((x for d in ds for x in d["screens"]), key=lambda x: (order[x["suite"]], x["load"]))
    cells = sorted((x for d in ds for x in d["cells"]),
                   key=lambda x: (order[x["suite"]], x["load"], SUITES[x["suite"]].test_cells(x["load"]).index(x["cell"])))
    return ProtocolResult(st, screens, cells)


def write_outputs(result: ProtocolResult, out: str | Path, stem: str = "protocol") -> list[Path]:
    """``<stem>.json`` (small), ``<stem>.md`` and ``<stem>.png`` into ``out``."""
    from .metrics import dumps

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(dumps(result.to_dict()))
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths


# --------------------------------------------------------------------------- CLI
def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", type=_names, default=["synthetic"], help=f"comma list of suites: {', '.join(SUITES)}")
    p.add_argument("--policies", type=_names, default=[SERVED_NAME],
                   help=f"candidates (default {SERVED_NAME}: {SERVED.triple}); policy names as in `rlsched sim compare`")
    p.add_argument("--pool", type=_names, default=None,
                   help="the baseline pool (default: the issue's non-clairvoyant pool, each +backfill and +nobackfill)")
    p.add_argument("--scalings", type=_names, default=None,
                   help=f"scalings of the default pool (none = no scaling; default per suite, e.g. none,{','.join(POOL_SCALINGS)})")
    p.add_argument("--also", type=_names, default=None,
                   help="baselines always reported on test (default per suite: tiresias-2q on pollux)")
    p.add_argument("--clairvoyant-reference", type=_names, default=[], metavar="POLICIES",
                   help="reference rows run with true run times; labelled, never baselines")
    p.add_argument("--loads", type=_floats, default=None, help="comma list (default per suite: 0.5,1,1.5,2; pollux 0.5,1,1.5)")
    p.add_argument("--validation-seeds", type=int, default=5, help="validation seeds for the screening (default 5)")
    p.add_argument("--test-seeds", type=int, default=20, help="test seeds (default 20; >= 2)")
    p.add_argument("--top", type=int, default=3, help="K: the strongest baselines kept per cell (default 3)")
    p.add_argument("--jobs", type=int, default=None, help="jobs per trace (default synthetic/alibaba 1000)")
    p.add_argument("--procs", type=int, default=1, help="processes (default 1)")
    p.add_argument("--out", default="out/protocol", help="output folder")
    p.add_argument("--stem", default=None, help="file names (default protocol_<suites>)")
    p.add_argument("--data-dir", default=None, help="trace data folder (default: $RLSCHED_DATA_DIR)")
    p.add_argument("--recorded", default=None,
                   help="recorded Pollux runs (default: docs/results/peers_pollux.json of this tree)")
    p.add_argument("--note", action="append", default=[], help="a note printed with the tables (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="show the simulator's warnings (thousands on a loaded replay)")


def main(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .traces import TraceError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "verbose", False):
        # per-run engine warnings (dropped unfittable jobs, preemption retries) repeat for
        # every policy and seed; the protocol's own warnings stay
        logging.getLogger("rlsched.sim").setLevel(logging.ERROR)
        log.setLevel(logging.WARNING)
    recorded = args.recorded if args.recorded is not None else (default_recorded() if "pollux" in args.suite else None)
    try:
        with Progress(TextColumn("protocol"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      disable=args.quiet) as prog:
            task = prog.add_task("protocol", total=None)
            res = run_protocol(
                args.suite, candidates=args.policies, pool=args.pool, scalings=args.scalings,
                clairvoyant=args.clairvoyant_reference, also=args.also, loads=args.loads,
                validation_seeds=args.validation_seeds, test_seeds=args.test_seeds, top=args.top, jobs=args.jobs,
                procs=args.procs, data_dir=args.data_dir, recorded=recorded,
                progress=lambda n, tot: prog.update(task, completed=n, total=tot),
            )
    except (ProtocolError, TraceError, SplitError, OSError) as exc:
        print(f"rlsched eval protocol: error: {exc}", file=sys.stderr)
        return 2
    res.settings["command"] = "rlsched eval protocol " + " ".join(getattr(args, "argv", []) or [])
    res.settings["notes"] += list(getattr(args, "note", []) or [])
    paths = write_outputs(res, args.out, args.stem or "protocol_" + "_".join(args.suite))
    for c in res.cells:
        best = next((cp for cp in c["comparisons"] if cp["role"] == "best of the strongest on test" and "diff" in cp), None)
        if best:
            print(f"{_cell_name(c)}: {best['candidate']} vs {best['compared_with']} {100 * best['rel']:+.1f}% "
                  f"[{100 * best['rel_lo']:+.1f}%, {100 * best['rel_hi']:+.1f}%]{' below' if best['below'] else ''}")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def cli(argv: Sequence[str]) -> int:
    """``rlsched eval protocol ARGS``."""
    p = argparse.ArgumentParser(prog="rlsched eval protocol", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(list(argv))
    args.argv = list(argv)
    return main(args)
