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

Two protocol runs of different candidates on the same seeds pair the same way: a
``--protocol PATH@OLD=NEW`` reads that file's rows of ``OLD`` alone, as ``NEW`` (an
earlier run's ``rlsched`` under the name it served then), and ``--cell`` picks the cells (the
published workloads by default; ``""`` for a suite with one cell per load, such as
synthetic)::

    python bench/paired_published.py --cell "" --candidate rlsched \\
        --protocol docs/results/protocol_synthetic_learned.json \\
        --protocol docs/results/protocol_synthetic_goodput.json@rlsched=goodput \\
        --out docs/results/synthetic_learned_vs_goodput.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from rlsched.sim.protocol import paired_bootstrap


#: two outputs agree on a figure within this (s): the protocol's JSON keeps 5 decimals
ROUNDING_S = 1e-3


def protocol_rows(protocol: dict, cell: str = "published",
                   rename: dict[str, str] | None = None) -> dict[float, dict[str, dict[str, float]]]:
    """load -> policy -> {unit: mean JCT} of every policy row in the cells named ``cell``;
    with ``rename``, only the rows of the policies it names, under their new names."""
    out: dict[float, dict[str, dict[str, float]]] = {}
    for c in protocol["cells"]:
        if c["cell"] != cell:
            continue
        for row in c["rows"]:
            if rename and row["policy"] not in rename:
                continue
            name = rename[row["policy"]] if rename else row["policy"]
            out.setdefault(float(c["load"]), {})[name] = dict(row["per_unit"])
    if not out:
        raise SystemExit(f"no cell {cell!r} in the protocol output")
    return out


def protocol_arg(text: str) -> tuple[Path, dict[str, str]]:
    """``PATH`` or ``PATH@OLD=NEW``: the file, and the rename of its rows."""
    path, sep, rename = text.rpartition("@")
    if not sep or "=" not in rename:
        return Path(text), {}
    old, _, new = rename.partition("=")
    if not old or not new:
        raise SystemExit(f"--protocol {text!r}: the rename must be OLD=NEW")
    return Path(path), {old: new}


def _unit_key(unit: str) -> tuple[str, int]:
    """Units in their number's order: workload-2 before workload-10, seed=20000 before 20001."""
    m = re.search(r"(\d+)$", unit)
    return (unit[:m.start()], int(m.group(1))) if m else (unit, -1)


def peer_rows(peers: dict) -> dict[float, dict[str, dict[str, float]]]:
    out: dict[float, dict[str, dict[str, float]]] = {}
    for r in peers["runs"]:
        if r.get("generated"):
            continue
        out.setdefault(float(r["load"]), {}).setdefault(r["policy"], {})[f"workload-{r['workload']}"] = r["jct_mean"]
    return out


def gather(protocols: list[str], peers: list[str], cell: str = "published") -> dict[float, dict[str, dict[str, float]]]:
    """load -> policy -> {unit: mean JCT} over all the outputs. A unit two outputs give
    different figures for (beyond :data:`ROUNDING_S`) is an error naming both, never a
    silent choice of the last."""
    rows: dict[float, dict[str, dict[str, float]]] = {}
    origin: dict[tuple[float, str, str], str] = {}

    def put(src: str, load: float, pol: str, per: dict[str, float]) -> None:
        have = rows.setdefault(load, {}).setdefault(pol, {})
        for unit, v in per.items():
            if unit in have and not math.isclose(have[unit], v, rel_tol=0.0, abs_tol=ROUNDING_S):
                raise SystemExit(f"{pol} at {load:g}x, {unit}: {have[unit]:,.1f} s in {origin[load, pol, unit]} "
                                 f"but {v:,.1f} s in {src}; pass only one of them")
            have[unit] = v
            origin[load, pol, unit] = src

    for p in protocols:
        path, rename = protocol_arg(p)
        for load, pols in protocol_rows(json.loads(path.read_text()), cell, rename).items():
            for pol, per in pols.items():
                put(p, load, pol, per)
    for p in peers:
        for load, pols in peer_rows(json.loads(Path(p).read_text())).items():
            for pol, per in pols.items():
                put(p, load, pol, per)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", action="append", required=True, help="rlsched eval protocol JSON (repeatable)")
    ap.add_argument("--peers", action="append", default=[], help="bench/peers.py JSON (repeatable)")
    ap.add_argument("--cell", default="published", help='the protocol cells paired ("" for one cell per load)')
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = gather(args.protocol, args.peers, args.cell)
    if not any(args.candidate in pols for pols in rows.values()):
        raise SystemExit(f"no rows of {args.candidate!r} in cell {args.cell!r} of the protocol outputs")
    result = []
    for load in sorted(rows):
        cand = rows[load].get(args.candidate)
        if not cand:
            continue
        for pol, per in sorted(rows[load].items()):
            if pol == args.candidate:
                continue
            units = sorted(set(cand) & set(per), key=_unit_key)
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
