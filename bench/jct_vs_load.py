"""Mean JCT against load on the published Pollux workloads: one line per policy.

Reads what the runs wrote — ``rlsched eval protocol`` JSON (its published-workload rows:
the candidate and its baselines, ``tiresias-2q`` among them) and ``bench/peers.py`` JSON
(``pollux-paper``, the released ``pollux``) — and the paper's published Pollux figures
(:data:`bench.peers.PUBLISHED`), and plots the mean over workloads 1–8 at each load.
A policy measured on fewer than the 8 workloads at a load is left out at that load
(the released Pollux: workloads 1, 3 and 6 only), so every point is a mean over the
same workloads.

    python bench/jct_vs_load.py --protocol docs/results/protocol_goodput_1x.json \\
        --protocol docs/results/protocol_goodput_05_15x.json --peers docs/results/pollux_paper_1x.json \\
        --peers docs/results/pollux_paper_recorded.json --out docs/results/jct_vs_load.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_published import gather  # noqa: E402
from peers import PUBLISHED  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", action="append", default=[])
    ap.add_argument("--candidate", default="goodput")
    ap.add_argument("--peers", action="append", default=[])
    ap.add_argument("--policies", default="goodput,pollux-paper,tiresias-2q,pollux")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = gather(args.protocol, args.peers)
    if args.protocol and not any(args.candidate in pols for pols in rows.values()):
        raise SystemExit(f"no published rows of {args.candidate!r} in the protocol outputs")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    table = {}
    for pol in args.policies.split(","):
        pts = [(load, float(np.mean(list(rows[load][pol].values())))) for load in sorted(rows)
               if len(rows[load].get(pol, {})) == 8]
        if pts:
            table[pol] = dict(pts)
            ax.plot(*zip(*pts), marker="o", label=pol + (" (released, ours: 8 workloads)" if pol == "pollux" else ""))
    pub = sorted((load, v) for (pol, load), v in PUBLISHED.items() if pol == "pollux")
    ax.plot(*zip(*pub), marker="x", linestyle="--", color="grey", label="Pollux, published (OSDI'21)")
    table["pollux (published)"] = dict(pub)
    ax.set_xlabel("load (x the published workloads' arrival rate)")
    ax.set_ylabel("mean JCT over workloads 1-8 (s)")
    ax.set_title("Pollux OSDI'21 workloads, 16 x 4 GPUs, interval engine")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    out.with_suffix(".json").write_text(json.dumps({"mean_jct": table, "protocol": args.protocol, "peers": args.peers},
                                                   indent=1))
    for pol, pts in table.items():
        print(f"{pol:>22}: " + ", ".join(f"{load:g}x {v:,.0f} s" for load, v in sorted(pts.items())))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
