"""Pair a protocol candidate with peers measured by ``bench/peers.py``, per workload.

``rlsched eval protocol`` pairs a candidate with its baselines on the published
workloads, but a slow peer (``pollux-paper``: 2–6 min a workload) is measured once by
``bench/peers.py`` rather than inside every protocol run. This reads both outputs and
gives the paired per-workload difference candidate − peer on the published workloads
of each load, with the percentile bootstrap 95% interval of
:func:`rlsched.sim.protocol.paired_bootstrap` (absolute and relative), plus the
per-workload table — the elastic-never-worse-than-rigid check reads it.

    python bench/paired_published.py --protocol out/protocol/protocol_goodput_1x.json \\
        --peers out/peers_pp_1x.json --candidate goodput --out docs/results/goodput_vs_peers.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlsched.sim.protocol import paired_bootstrap


def candidate_rows(protocol: dict, candidate: str) -> dict[float, dict[str, float]]:
    """load -> {"workload-N": mean JCT} of every policy row on the published workloads."""
    out: dict[float, dict[str, dict[str, float]]] = {}
    for cell in protocol["cells"]:
        if cell["cell"] != "published":
            continue
        for row in cell["rows"]:
            out.setdefault(float(cell["load"]), {})[row["policy"]] = dict(row["per_unit"])
    if not any(candidate in rows for rows in out.values()):
        raise SystemExit(f"no published rows of {candidate!r} in the protocol output")
    return out


def peer_rows(peers: dict) -> dict[float, dict[str, dict[str, float]]]:
    out: dict[float, dict[str, dict[str, float]]] = {}
    for r in peers["runs"]:
        if r.get("generated"):
            continue
        out.setdefault(float(r["load"]), {}).setdefault(r["policy"], {})[f"workload-{r['workload']}"] = r["jct_mean"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", action="append", required=True, help="rlsched eval protocol JSON (repeatable)")
    ap.add_argument("--peers", action="append", required=True, help="bench/peers.py JSON (repeatable)")
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows: dict[float, dict[str, dict[str, float]]] = {}
    for p in args.protocol:
        for load, pols in candidate_rows(json.loads(Path(p).read_text()), args.candidate).items():
            rows.setdefault(load, {}).update(pols)
    for p in args.peers:
        for load, pols in peer_rows(json.loads(Path(p).read_text())).items():
            for pol, per in pols.items():
                rows.setdefault(load, {}).setdefault(pol, {}).update(per)
    result = []
    for load in sorted(rows):
        cand = rows[load].get(args.candidate)
        if not cand:
            continue
        for pol, per in sorted(rows[load].items()):
            if pol == args.candidate:
                continue
            units = sorted(set(cand) & set(per), key=lambda u: int(u.split("-")[-1]))
            if len(units) < 2:
                continue
            d = paired_bootstrap([cand[u] for u in units], [per[u] for u in units], seed=args.seed)
            result.append({"load": load, "candidate": args.candidate, "peer": pol, "units": units,
                           "candidate_jct": [cand[u] for u in units], "peer_jct": [per[u] for u in units],
                           "at_or_below_on_every_unit": all(cand[u] <= per[u] for u in units), **d.to_dict()})
            print(f"{load:g}x {args.candidate} - {pol}: n={d.n} {d.mean_a:,.0f} vs {d.mean_b:,.0f} s, "
                  f"diff {d.diff:,.0f} [{d.diff_lo:,.0f}, {d.diff_hi:,.0f}] s, rel {100 * d.rel:+.1f}% "
                  f"[{100 * d.rel_lo:+.1f}%, {100 * d.rel_hi:+.1f}%]")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"protocol": args.protocol, "peers": args.peers, "pairs": result}, indent=1))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
