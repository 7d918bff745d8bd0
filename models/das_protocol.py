"""DAS on the evaluation protocol of issue 16: validation choice and test judgement.

``python -m rlsched.models.das_protocol --split validation|test ...`` runs, for every cell
(a workload at one offered load) and every seed of the split, the heuristic pool, the DAS
candidates and the references in the simulator, and writes per-run rows plus paired
bootstrap 95% intervals (:func:`rlsched.sim.protocol.paired_bootstrap`) of each DAS
candidate against each heuristic and against the best heuristic of the cell.

Cells:

* ``synthetic``: ``synthetic:medium,jobs=1000,load=L,runtime_sigma=1.5`` — heavy-tailed
  run times (log-normal, shape 1.5: mean 3.1 x the median), 64 nodes x 8 GPUs; one trace
  per seed of the split (:func:`rlsched.sim.protocol.seeds`).
* ``alibaba``: ``alibaba2023:default,nodes=100,load=L`` — the real Alibaba 2023 pods
  replayed on 100 of its nodes with arrivals compressed to offered load ``L``. The replay
  is deterministic (a seed changes nothing), so it is one run per system, and its paired
  bootstrap resamples the *jobs* (each job's JCT under both systems), which says how
  much the mean rests on a few jobs, not how it would vary over other traces.

Systems: the pool (all non-clairvoyant) ``fifo``, ``drf``, ``tiresias`` orderings with the
``topology`` placement, each with and without backfill; DAS candidates
``NAME=MODEL[@TH1:TH2...]`` (ordering ``das`` + placement ``das-agent`` of that model file;
``@`` overrides the model's attained-service thresholds, ``@-`` switches them off); the
ablation ``las-drf`` (the same attained-service queues with DRF inside instead of the
learned ordering, and topology placement; not in the pool); and the references, never
baselines: ``srtf/topology`` run clairvoyant (it sees the true run times) and the lower
bound ``ideal`` (every job starts on arrival at its ideal placement).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from rlsched.core import make_ordering, make_placement
from rlsched.core.das_agent import DASAgentPlacement, DASOrdering
from rlsched.core.ordering import DRF, Tiresias
from rlsched.sim import SimConfig, Simulator, compute_metrics
from rlsched.sim.protocol import paired_bootstrap, seeds

__all__ = ["POOL", "CELLS", "LASDRF", "run_cell", "summarize", "render", "main"]

#: the heuristic pool judged against (ordering/placement[+backfill]), all non-clairvoyant
POOL = tuple(f"{o}/topology{b}" for o in ("fifo", "drf", "tiresias") for b in ("", "+backfill"))
#: reference rows (never baselines)
CLAIRVOYANT = "srtf/topology (clairvoyant reference)"
IDEAL = "lower bound (start on arrival, ideal placement)"
ABLATION = "las-drf/topology (ablation)"

CELLS = {
    "synthetic": "synthetic:medium,jobs=1000,load={load:g},runtime_sigma=1.5",
    "alibaba": "alibaba2023:default,nodes=100,load={load:g}",
}


class LASDRF(Tiresias):
    """Ablation: attained-service queues (Tiresias' discretized LAS with the given
    thresholds) and DRF's dominant share inside a queue, where DAS puts its learned
    ordering. Preemptive across queues, as Tiresias."""

    name = "las-drf"

    def __init__(self, thresholds=(3600.0, 36000.0)) -> None:
        super().__init__(thresholds)
        self._drf = DRF()

    def _keys(self, pending, state):
        return [(self.queue_of(j, state.time),) + k for j, k in zip(pending, self._drf._keys(pending, state))]


def _sim(trace, ordering, placement, seed: int, *, backfill: bool = False, clairvoyant: bool = False) -> dict:
    sim = Simulator(trace.jobs, trace.topology, ordering=ordering, placement=placement, seed=seed,
                    config=SimConfig(backfill=backfill, clairvoyant=clairvoyant, record_series=False))
    res = sim.run()
    m = compute_metrics(res)
    recs = sorted(res.records, key=lambda r: r.id)
    return {"jct_mean": float(m["jct_mean"]), "fee_total": float(m["fee_total"]),
            "jcts": [float(r.jct) for r in recs], "ideal_mean": float(np.mean([r.ideal_runtime for r in recs]))}


def parse_candidate(text: str) -> tuple[str, Path, tuple[float, ...] | None, str]:
    """``NAME=MODEL[@TH1:TH2|@-][#PLACEMENT]`` -> (name, model path, thresholds override
    or None, placement: ``das-agent`` (the model's own) unless a core placement is named)."""
    name, _, rest = text.partition("=")
    if not name or not rest:
        raise ValueError(f"candidate must be NAME=MODEL[@TH1:TH2|@-][#PLACEMENT], got {text!r}")
    rest, _, placement = rest.partition("#")
    model, _, th = rest.partition("@")
    over = None if not th else (() if th == "-" else tuple(float(x) for x in th.split(":")))
    return name, Path(model), over, placement or "das-agent"


def run_cell(trace, seed: int, candidates, *, pool=POOL, references: bool = True, ablation: bool = True,
             done: frozenset = frozenset()) -> dict[str, dict]:
    """Every system on one trace but those in ``done``: ``{system: metrics}``."""
    out: dict[str, dict] = {}
    ideal = None
    pool = [h for h in pool if h not in done]
    candidates = [c for c in candidates if c[0] not in done]
    references = references and CLAIRVOYANT not in done
    ablation = ablation and ABLATION not in done
    for h in pool:
        base, bf = h.replace("+backfill", ""), h.endswith("+backfill")
        o, p = base.split("/")
        m = _sim(trace, make_ordering(o), make_placement(p), seed, backfill=bf)
        ideal = m["ideal_mean"]
        out[h] = m
    for name, model, over, pname in candidates:
        ordering = DASOrdering(model, las_thresholds=over)
        placement = DASAgentPlacement(model) if pname == "das-agent" else make_placement(pname)
        reason = ordering.fallback_reason or getattr(placement, "fallback_reason", None)
        if reason:
            raise RuntimeError(f"candidate {name}: model {model} does not load: {reason}")
        out[name] = _sim(trace, ordering, placement, seed)
    if ablation:
        out[ABLATION] = _sim(trace, LASDRF(), make_placement("topology"), seed)
    if references:
        out[CLAIRVOYANT] = _sim(trace, make_ordering("srtf"), make_placement("topology"), seed, clairvoyant=True)
        if ideal is None:
            ideal = out[CLAIRVOYANT]["ideal_mean"]
        out[IDEAL] = {"jct_mean": ideal, "fee_total": float("nan"), "jcts": [], "ideal_mean": ideal}
    return out


def summarize(rows: list[dict], learned: list[str], pool=POOL) -> list[dict]:
    """Per cell and load: the best heuristic (lowest mean JCT over the runs) and each
    learned system's paired bootstrap against it and against every pool member."""
    out = []
    for cell, load in sorted({(r["cell"], r["load"]) for r in rows}):
        sel = [r for r in rows if r["cell"] == cell and r["load"] == load]
        seeds_ = sorted({r["seed"] for r in sel})
        by = {(r["system"], r["seed"]): r for r in sel}
        mean = {s: float(np.mean([by[(s, k)]["jct_mean"] for k in seeds_])) for s in {r["system"] for r in sel}}
        best = min(pool, key=lambda s: mean[s])
        per_job = len(seeds_) == 1

        def vec(s):
            return by[(s, seeds_[0])]["jcts"] if per_job else [by[(s, k)]["jct_mean"] for k in seeds_]

        line = {"cell": cell, "load": load, "n": len(vec(best)), "unit": "job" if per_job else "seed",
                "seeds": seeds_, "mean_jct": mean, "best_heuristic": best, "vs_best": {}, "vs_pool": {}}
        # resampling thousands of jobs: 2,000 resamples keep it to seconds
        bs = {"resamples": 2_000} if per_job else {}
        for s in learned + ([ABLATION] if ABLATION in mean else []) + ([CLAIRVOYANT] if CLAIRVOYANT in mean else []):
            if s not in mean:
                continue
            line["vs_best"][s] = paired_bootstrap(vec(s), vec(best), **bs).to_dict()
            line["vs_pool"][s] = {h: paired_bootstrap(vec(s), vec(h), **bs).to_dict() for h in pool}
        out.append(line)
    return out


def _ci(d: dict) -> str:
    return f"{d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]"


def render(summary: list[dict], system: str) -> str:
    """Markdown table of ``system`` against the best heuristic of every cell, with the
    ablation and the references (relative change of mean JCT, paired bootstrap 95% CI)."""
    head = ("| cell | load | n | best heuristic (mean JCT s) | DAS mean JCT s | DAS vs best [95% CI] | 10% target | "
            "las-drf ablation vs best | srtf clairvoyant ref. vs best | lower bound vs best | share of the gap to the bound DAS closes |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for line in summary:
        if system not in line["vs_best"]:
            continue
        best = line["best_heuristic"]
        mb = line["mean_jct"][best]
        d = line["vs_best"][system]
        if max(abs(d["rel_lo"]), abs(d["rel_hi"])) < 5e-4:
            met = "equal"
        else:
            met = "met" if d["rel"] <= -0.10 and d["diff_hi"] < 0 else ("below, CI < 0" if d["diff_hi"] < 0 else ("above, CI > 0" if d["diff_lo"] > 0 else "not separated"))
        abl = _ci(line["vs_best"][ABLATION]) if ABLATION in line["vs_best"] else "—"
        clv = _ci(line["vs_best"][CLAIRVOYANT]) if CLAIRVOYANT in line["vs_best"] else "—"
        lb = line["mean_jct"].get(IDEAL)
        lbs = f"{lb / mb - 1:+.1%}" if lb else "—"
        # where DAS stands between the best heuristic (0%) and the bound (100%); only
        # where the bound leaves at least 1% of room
        gap = f"{(mb - d['mean_a']) / (mb - lb):.0%}" if lb and mb - lb >= 0.01 * mb else "— (no room)"
        rows.append(f"| {line['cell']} | {line['load']:g} | {line['n']} {line['unit']}s | {best} ({mb:,.0f}) | {d['mean_a']:,.0f} | "
                    f"{_ci(d)} | {met} | {abl} | {clv} | {lbs} | {gap} |")
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsched.models.das_protocol", description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("validation", "test"), required=True)
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the split per synthetic cell")
    ap.add_argument("--loads", default="1.0,1.5,2.0")
    ap.add_argument("--cells", default="synthetic,alibaba")
    ap.add_argument("--candidate", action="append", default=[], help="NAME=MODEL[@TH1:TH2|@-] (repeatable)")
    ap.add_argument("--no-references", action="store_true")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--no-pool", action="store_true", help="run only the candidates (merge the pool's runs later)")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--merge", type=Path, action="append", default=[], help="earlier output whose runs are reused (same split)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file of rows and summaries")
    args = ap.parse_args(argv)
    from rlsched.sim.traces import default_topology, load_trace

    cands = [parse_candidate(c) for c in args.candidate]
    rows: list[dict] = []
    for f in args.merge:
        old = json.loads(f.read_text())  # an output, or its .rows.json
        if old["split"] != args.split:
            raise SystemExit(f"{f}: split {old['split']!r}, not {args.split!r}")
        rows.extend(old["rows"])
    t0 = time.time()
    for cell in [c.strip() for c in args.cells.split(",") if c.strip()]:
        for load in [float(x) for x in args.loads.split(",")]:
            spec = CELLS[cell].format(load=load)
            ss = seeds(args.split, args.seeds) if cell == "synthetic" else [seeds(args.split, 1)[0]]
            for seed in ss:
                tr = load_trace(spec, seed=seed, data_dir=args.data_dir) if cell == "alibaba" else load_trace(spec, seed=seed)
                if tr.topology is None:
                    tr.topology = default_topology(tr.jobs)
                done = frozenset(r["system"] for r in rows if (r["cell"], r["load"], r["seed"]) == (cell, load, seed))
                res = run_cell(tr, seed, cands, references=not args.no_references, ablation=not args.no_ablation, done=done,
                               pool=() if args.no_pool else POOL)
                for system, m in res.items():
                    rows.append({"cell": cell, "load": load, "spec": spec, "seed": seed, "system": system, **m})
                # the rows so far, after every trace: a stopped run loses none of them
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.with_suffix(".rows.json").write_text(json.dumps({"split": args.split, "rows": rows}) + "\n")
                print(f"[{time.time() - t0:6.0f}s] {cell} load {load:g} seed {seed}: "
                      + ", ".join(f"{k.split(' ')[0]} {v['jct_mean']:.0f}" for k, v in res.items()), flush=True)
    learned = sorted({r["system"] for r in rows} - set(POOL) - {CLAIRVOYANT, IDEAL, ABLATION})
    summary = summarize(rows, learned) if not args.no_pool else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"split": args.split, "candidates": [[n, str(m), o, p] for n, m, o, p in cands],
                                    "summary": summary, "rows": rows}, indent=1) + "\n")
    for line in summary:
        print(f"{line['cell']} load {line['load']:g} (n={line['n']} {line['unit']}s): best heuristic {line['best_heuristic']} "
              f"{line['mean_jct'][line['best_heuristic']]:.0f} s")
        for s, d in line["vs_best"].items():
            print(f"   {s:45s} {d['mean_a']:8.0f} s  {d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]")
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
