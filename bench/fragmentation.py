"""FGD's fragmentation experiment on the Alibaba GPU 2023 trace.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC'23, §6: pods of the ``openb`` trace arrive
one by one (trace order, or shuffled with a seeded Generator; the list repeats when it
runs out) and are placed, never leaving, until the arrived GPU demand reaches
``max_arrived`` times the cluster's GPU capacity; a pod that fits nowhere is dropped and
counted. After every arrival we record

* the *unallocated GPU share*: idle GPU capacity (milli-GPU) / cluster GPU capacity;
* the *fragmentation share*: FGD's expected fragmentation ``Σ_n F_n(M)``
  (:func:`rlsched.core.fgd.fragmentation`, target workload ``M`` = the trace's GPU pod
  requests, GPU and CPU, :func:`target_workload`) / cluster GPU capacity;

against the arrived workload (cumulative GPU demand / capacity). An ideal packer leaves
``max(0, 1 − arrived)`` unallocated; the excess is capacity lost to fragmentation.

GPU sharing is modelled per GPU: a pod with ``num_gpu == 1`` and ``gpu_milli < 1000``
takes ``gpu_milli`` of one GPU; other GPU pods take ``num_gpu`` whole GPUs; every pod
also takes CPU and memory, and ``gpu_spec`` restricts GPU models. Policies:

``random``   a uniformly random feasible node, a random feasible GPU on it;
``bestfit``  the node left with the least resources (free GPU share + free CPU share),
             the tightest GPU on it;
``packing``  GPU packing: a partly used GPU that fits (tightest) first, then a GPU on a
             node already in use (the fullest), then an idle node;
``fgd``      the node and GPU whose fragmentation grows least (FGD), ties broken as
             ``bestfit``.

A separate experiment with its own cluster model (GPU sharing per GPU), so it lives
beside the benchmarks, not in the simulator.

Run: ``python bench/fragmentation.py --out docs/fgd`` (data folder from
``--data-dir`` or ``RLSCHED_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from rlsched.core.fgd import MILLI, Workload, fragmentation
from rlsched.sim.traces import TraceError

__all__ = [
    "POLICIES",
    "Nodes",
    "Pods",
    "TraceError",
    "Curve",
    "load_openb",
    "run",
    "experiment",
    "value_at",
    "target_workload",
    "subsample",
    "main",
]

POLICIES = ("random", "bestfit", "packing", "fgd")
DATA_SUBDIR = "alibaba-gpu-2023"


@dataclass(frozen=True)
class Nodes:
    name: np.ndarray
    gpus: np.ndarray
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    model: np.ndarray

    def __len__(self) -> int:
        return len(self.gpus)

    def take(self, idx: np.ndarray) -> "Nodes":
        return Nodes(*(getattr(self, f)[idx] for f in ("name", "gpus", "cpu_milli", "memory_mib", "model")))


@dataclass(frozen=True)
class Pods:
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    #: allowed GPU models per pod, None = any
    models: tuple[frozenset[str] | None, ...]

    def __len__(self) -> int:
        return len(self.num_gpu)

    @property
    def demand_milli(self) -> np.ndarray:
        """GPU demand of each pod in milli-GPU (0 for CPU-only pods)."""
        return np.where(self.num_gpu == 1, self.gpu_milli, self.num_gpu * MILLI).astype(np.int64)


def _read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(columns) - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: missing columns {sorted(missing)}")
        return list(reader)


def _int(path: Path, line: int, row: dict, key: str, lo: int = 0, hi: int | None = None) -> int:
    try:
        v = int(float(row[key]))
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: {key}={row.get(key)!r} is not a number") from None
    if v < lo or (hi is not None and v > hi):
        raise TraceError(f"{path}:{line}: {key}={v} out of range")
    return v


def load_openb(data_dir: str | os.PathLike, pods: str = "default") -> tuple[Nodes, Pods]:
    """GPU nodes and pods of the openb trace (``openb_pod_list_<pods>.csv``)."""
    base = Path(data_dir)
    if (base / DATA_SUBDIR).is_dir():
        base = base / DATA_SUBDIR
    npath = base / "openb_node_list_gpu_node.csv"
    rows = _read_csv(npath, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    nodes = Nodes(
        np.array([r["sn"] for r in rows]),
        np.array([_int(npath, k + 2, r, "gpu", 0, 64) for k, r in enumerate(rows)], dtype=np.int64),
        np.array([_int(npath, k + 2, r, "cpu_milli") for k, r in enumerate(rows)], dtype=np.int64),
        np.array([_int(npath, k + 2, r, "memory_mib") for k, r in enumerate(rows)], dtype=np.int64),
        np.array([r["model"] for r in rows]),
    )
    ppath = base / f"openb_pod_list_{pods}.csv"
    rows = _read_csv(ppath, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"))
    num = np.array([_int(ppath, k + 2, r, "num_gpu", 0, 64) for k, r in enumerate(rows)], dtype=np.int64)
    milli = np.array([_int(ppath, k + 2, r, "gpu_milli", 0, MILLI) for k, r in enumerate(rows)], dtype=np.int64)
    bad = np.flatnonzero((num > 1) & (milli != MILLI) | (num == 1) & (milli == 0))
    if len(bad):
        raise TraceError(f"{ppath}:{bad[0] + 2}: num_gpu={num[bad[0]]} with gpu_milli={milli[bad[0]]}")
    spec = tuple(frozenset(r["gpu_spec"].split("|")) if r["gpu_spec"].strip() else None for r in rows)
    pods_ = Pods(
        np.array([_int(ppath, k + 2, r, "cpu_milli") for k, r in enumerate(rows)], dtype=np.int64),
        np.array([_int(ppath, k + 2, r, "memory_mib") for k, r in enumerate(rows)], dtype=np.int64),
        num,
        milli,
        spec,
    )
    return nodes, pods_


class SharedCluster:
    """Per-GPU free milli-GPU, CPU and memory of every node (GPU sharing)."""

    def __init__(self, nodes: Nodes, workload: Workload) -> None:
        self.nodes = nodes
        self.workload = workload
        #: whether fragmentation counts CPU (the workload has classes with CPU demand)
        self.cpu_aware = bool((workload.cpu_milli > 0).any())
        width = max(int(nodes.gpus.max()), 1)
        self.valid = np.arange(width) < nodes.gpus[:, None]
        self.free = np.where(self.valid, MILLI, 0).astype(np.int64)
        self.cpu_free = nodes.cpu_milli.astype(np.int64).copy()
        self.mem_free = nodes.memory_mib.astype(np.int64).copy()
        self.capacity = int(nodes.gpus.sum()) * MILLI
        self.models = {m: np.asarray(nodes.model == m) for m in np.unique(nodes.model).tolist()}
        n = len(nodes)
        self.frag = np.zeros(n)  # F_n(M) per node
        self.full = np.zeros(n, dtype=np.int64)  # idle GPUs per node
        self.max_free = np.zeros(n, dtype=np.int64)  # largest free share per node
        self.node_free = np.zeros(n, dtype=np.int64)  # free milli-GPU per node
        self._refresh(np.arange(n))

    def _refresh(self, idx: np.ndarray) -> None:
        rows = self.free[idx]
        self.frag[idx] = fragmentation(rows, self.workload, self.cpu_free[idx] if self.cpu_aware else None)
        self.full[idx] = (rows == MILLI).sum(axis=-1)
        self.max_free[idx] = rows.max(axis=-1)
        self.node_free[idx] = rows.sum(axis=-1)

    @property
    def unallocated(self) -> float:
        return float(self.node_free.sum()) / self.capacity

    @property
    def fragmented(self) -> float:
        return float(self.frag.sum()) / self.capacity

    def feasible(self, pods: Pods, p: int) -> np.ndarray:
        ok = (self.cpu_free >= pods.cpu_milli[p]) & (self.mem_free >= pods.memory_mib[p])
        allowed = pods.models[p]
        if allowed is not None:
            m = np.zeros(len(ok), dtype=bool)
            for name in allowed:
                if name in self.models:
                    m |= self.models[name]
            ok &= m
        k, d = int(pods.num_gpu[p]), int(pods.gpu_milli[p])
        if k == 1 and d < MILLI:
            ok &= self.max_free >= d
        elif k >= 1:
            ok &= self.full >= k
        return ok

    def whole_gpus(self, n: int, k: int) -> list[int]:
        return np.flatnonzero(self.free[n] == MILLI)[:k].tolist()

    def assign(self, pods: Pods, p: int, n: int, gpus: Sequence[int]) -> None:
        k, d = int(pods.num_gpu[p]), int(pods.gpu_milli[p])
        take = d if k == 1 else MILLI
        for g in gpus:
            if not self.valid[n, g] or self.free[n, g] < take:
                raise ValueError(f"node {n} GPU {g}: cannot take {take} milli")
            self.free[n, g] -= take
        self.cpu_free[n] -= pods.cpu_milli[p]
        self.mem_free[n] -= pods.memory_mib[p]
        self._refresh(np.array([n]))


def _leftover(c: SharedCluster, nodes: np.ndarray, pods: Pods, p: int, gpu_taken: np.ndarray) -> np.ndarray:
    """Best-fit node score: free GPU share + free CPU share left after the pod."""
    cap_g = np.maximum(c.nodes.gpus[nodes] * MILLI, 1)
    cap_c = np.maximum(c.nodes.cpu_milli[nodes], 1)
    return (c.node_free[nodes] - gpu_taken) / cap_g + (c.cpu_free[nodes] - pods.cpu_milli[p]) / cap_c


def _sharing_options(c: SharedCluster, ok: np.ndarray, d: int, dedupe: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(node, GPU) pairs that can take a ``d``-milli share; GPUs of one node with the
    same free share are interchangeable, so only the lowest-index one is kept."""
    n, g = np.nonzero((c.free >= d) & c.valid & ok[:, None])
    if not dedupe:
        return n, g
    _, first = np.unique(n * (MILLI + 1) + c.free[n, g], return_index=True)
    first.sort()
    return n[first], g[first]


def choose(policy: str, c: SharedCluster, pods: Pods, p: int, rng: np.random.Generator) -> tuple[int, list[int]] | None:
    """(node, GPUs) for pod ``p`` under ``policy``, or None when no node can take it."""
    ok = c.feasible(pods, p)
    if not ok.any():
        return None
    k, d = int(pods.num_gpu[p]), int(pods.gpu_milli[p])
    sharing = k == 1 and d < MILLI
    demand = d if sharing else k * MILLI
    if sharing:
        n, g = _sharing_options(c, ok, d, dedupe=policy != "random")
    else:
        n = np.flatnonzero(ok)
        g = None
    if policy == "random":
        if sharing:
            r = int(rng.integers(len(n)))
            return int(n[r]), [int(g[r])]
        node = int(n[rng.integers(len(n))])
        gpus = np.flatnonzero(c.free[node] == MILLI)
        return node, sorted(rng.choice(gpus, size=k, replace=False).tolist()) if k else []
    if policy == "bestfit":
        score = _leftover(c, n, pods, p, demand)
        if sharing:
            order = np.lexsort((g, n, c.free[n, g], score))  # tightest node, then tightest GPU
            r = int(order[0])
            return int(n[r]), [int(g[r])]
        node = int(n[np.lexsort((n, score))[0]])
        return node, c.whole_gpus(node, k)
    if policy == "packing":
        in_use = c.node_free[n] < c.nodes.gpus[n] * MILLI
        if sharing:
            partial = c.free[n, g] < MILLI
            # tier 0: a partly used GPU (tightest); 1: a node in use (fullest); 2: idle node
            tier = np.where(partial, 0, np.where(in_use, 1, 2))
            key = np.where(tier == 0, c.free[n, g], c.node_free[n])
            r = int(np.lexsort((g, n, key, tier))[0])
            return int(n[r]), [int(g[r])]
        tier = np.where(in_use, 1, 2)
        node = int(n[np.lexsort((n, c.node_free[n], tier))[0]])
        return node, c.whole_gpus(node, k)
    if policy == "fgd":
        if sharing:
            rows = c.free[n].copy()
            rows[np.arange(len(n)), g] -= d
        else:
            rows = c.free[n].copy()
            if k:
                idle = rows == MILLI
                rows[idle & (np.cumsum(idle, axis=1) <= k)] = 0
        cpu = c.cpu_free[n] - pods.cpu_milli[p] if c.cpu_aware else None
        delta = fragmentation(rows, c.workload, cpu) - c.frag[n]
        tie = _leftover(c, n, pods, p, demand)
        r = int(np.lexsort((g if g is not None else n, n, tie, np.round(delta, 6)))[0])
        node = int(n[r])
        return node, ([int(g[r])] if sharing else c.whole_gpus(node, k))
    raise ValueError(f"unknown fragmentation policy {policy!r}; known: {', '.join(POLICIES)}")


@dataclass
class Curve:
    """One run: state after each arrival."""

    policy: str
    arrived: np.ndarray
    unallocated: np.ndarray
    fragmented: np.ndarray
    failed: int
    first_failure: float | None
    #: fragmentation share of the empty cluster
    initial_fragmented: float = 0.0

    def at(self, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unallocated, fragmented) after the last arrival at or below each grid point."""
        idx = np.searchsorted(self.arrived, grid, side="right") - 1
        un = np.where(idx >= 0, self.unallocated[np.maximum(idx, 0)], 1.0)
        fr = np.where(idx >= 0, self.fragmented[np.maximum(idx, 0)], self.initial_fragmented)
        return un, fr


def arrival_order(n_pods: int, demand: np.ndarray, capacity: int, max_arrived: float,
                  rng: np.random.Generator | None) -> np.ndarray:
    """Pod indices in arrival order, repeating the (re-shuffled) list until the arrived
    demand reaches ``max_arrived × capacity``."""
    if demand.sum() <= 0:
        raise ValueError("the pod list asks for no GPUs")
    target = max_arrived * capacity
    chunks, total = [], 0.0
    while total < target:
        order = rng.permutation(n_pods) if rng is not None else np.arange(n_pods)
        cum = total + np.cumsum(demand[order])
        stop = int(np.searchsorted(cum, target, side="left")) + 1
        chunks.append(order[:stop])
        total = float(cum[min(stop, len(order)) - 1])
    return np.concatenate(chunks)


def target_workload(pods: Pods, cpu_aware: bool = True) -> Workload:
    """The trace's GPU pods as FGD's target workload: one class per distinct (GPU, CPU)
    request, weighted by frequency. CPU-only pods are left out: for them every free GPU
    is a fragment, a constant offset that changes no decision."""
    gpu = pods.demand_milli > 0
    return Workload.from_requests(pods.demand_milli[gpu], pods.cpu_milli[gpu] if cpu_aware else None)


def run(
    nodes: Nodes,
    pods: Pods,
    policy: str,
    *,
    rng: np.random.Generator,
    shuffle: bool = True,
    max_arrived: float = 1.3,
    workload: Workload | None = None,
    cpu_aware: bool = True,
    progress: bool = False,
) -> Curve:
    """Place arriving pods with ``policy`` until ``max_arrived`` of capacity arrived."""
    if policy not in POLICIES:
        raise ValueError(f"unknown fragmentation policy {policy!r}; known: {', '.join(POLICIES)}")
    if max_arrived <= 0:
        raise ValueError("max_arrived must be > 0")
    demand = pods.demand_milli
    if workload is None:
        workload = target_workload(pods, cpu_aware)
    wl = workload
    c = SharedCluster(nodes, wl)
    frag0 = c.fragmented
    order = arrival_order(len(pods), demand, c.capacity, max_arrived, rng if shuffle else None)
    arrived = np.cumsum(demand[order]) / c.capacity
    un = np.empty(len(order))
    fr = np.empty(len(order))
    failed, first = 0, None
    it = order
    if progress:
        from tqdm import tqdm

        it = tqdm(order, desc=policy, unit="pod", leave=False, mininterval=1.0)
    for t, p in enumerate(it):
        pick = choose(policy, c, pods, int(p), rng)
        if pick is None:
            failed += 1
            if first is None:
                first = float(arrived[t])
        else:
            c.assign(pods, int(p), *pick)
        un[t] = c.unallocated
        fr[t] = c.fragmented
    return Curve(policy, arrived, un, fr, failed, first, frag0)


def experiment(
    nodes: Nodes,
    pods: Pods,
    *,
    policies: Sequence[str] = POLICIES,
    seed: int = 0,
    repeats: int = 1,
    max_arrived: float = 1.3,
    grid_step: float = 0.01,
    progress: bool = False,
) -> dict:
    """Mean curves over ``repeats`` shuffled arrival orders (seeds ``seed + r``)."""
    grid = np.round(np.arange(0.0, max_arrived + 1e-9, grid_step), 6)
    out: dict = {"arrived": grid.tolist(), "nodes": int(len(nodes)), "gpus": int(nodes.gpus.sum()),
                 "pods": int(len(pods)), "repeats": repeats, "seed": seed, "policies": {}}
    for name in policies:
        uns, frs, failed, first = [], [], [], []
        for r in range(repeats):
            curve = run(nodes, pods, name, rng=np.random.default_rng(seed + r), max_arrived=max_arrived,
                        progress=progress)
            u, f = curve.at(grid)
            uns.append(u)
            frs.append(f)
            failed.append(curve.failed)
            first.append(curve.first_failure)
        out["policies"][name] = {
            "unallocated": np.mean(uns, axis=0).round(6).tolist(),
            "fragmented": np.mean(frs, axis=0).round(6).tolist(),
            "failed_pods": failed,
            "first_failure_arrived": first,
        }
    return out


def value_at(result: dict, policy: str, metric: str, arrived: float) -> float:
    """A curve's value at the grid point nearest ``arrived``."""
    k = int(np.argmin(np.abs(np.asarray(result["arrived"]) - arrived)))
    return float(result["policies"][policy][metric][k])


LABELS = {"random": "Random-fit", "bestfit": "Best-fit", "packing": "GPU packing", "fgd": "FGD"}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = 100 * np.asarray(result["arrived"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, cur in result["policies"].items():
        axes[0].plot(x, 100 * np.asarray(cur["unallocated"]), label=LABELS.get(name, name))
        axes[1].plot(x, 100 * np.asarray(cur["fragmented"]), label=LABELS.get(name, name))
    axes[0].plot(x, np.maximum(0, 100 - x), "k:", lw=1, label="ideal")
    axes[0].set_ylabel("unallocated GPU (% of capacity)")
    axes[1].set_ylabel("expected fragmentation (% of capacity)")
    for ax in axes:
        ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_xlim(80, x.max())
    axes[0].set_ylim(0, 22)
    fig.suptitle(
        f"Alibaba GPU 2023 (openb): {result['nodes']} nodes, {result['gpus']} GPUs, "
        f"mean of {result['repeats']} arrival orders"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python bench/fragmentation.py", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="trace data folder (default: $RLSCHED_DATA_DIR)")
    p.add_argument("--pods", default="default", help="openb pod list name (default, gpushare40, multigpu20)")
    p.add_argument("--out", required=True, help="output folder for fragmentation.json/.png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-arrived", type=float, default=1.3)
    p.add_argument("--node-fraction", type=float, default=1.0, help="sample this share of the nodes")
    p.add_argument("--policies", default=",".join(POLICIES))
    return p


def subsample(nodes: Nodes, fraction: float, rng: np.random.Generator) -> Nodes:
    if not 0 < fraction <= 1:
        raise ValueError("node fraction must be in (0, 1]")
    if fraction == 1:
        return nodes
    k = max(1, int(round(fraction * len(nodes))))
    return nodes.take(np.sort(rng.choice(len(nodes), size=k, replace=False)))


def replot(json_path: str | os.PathLike) -> Path:
    """Redraw ``fragmentation.png`` beside a ``fragmentation.json``."""
    path = Path(json_path)
    out = path.with_suffix(".png")
    plot(json.loads(path.read_text()), out)
    return out


def cmd(args: argparse.Namespace) -> int:
    data = args.data_dir or os.environ.get("RLSCHED_DATA_DIR")
    if not data:
        print("no trace data: pass --data-dir or set RLSCHED_DATA_DIR", file=sys.stderr)
        return 2
    nodes, pods = load_openb(data, args.pods)
    nodes = subsample(nodes, args.node_fraction, np.random.default_rng(args.seed))
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    res = experiment(nodes, pods, policies=policies, seed=args.seed, repeats=args.repeats,
                     max_arrived=args.max_arrived, progress=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fragmentation.json").write_text(json.dumps(res, indent=1))
    plot(res, out / "fragmentation.png")
    print(f"{'policy':<12} {'unalloc@90%':>12} {'unalloc@100%':>13} {'unalloc@110%':>13} {'frag@90%':>9} {'failed':>7}")
    for name in res["policies"]:
        print(
            f"{LABELS.get(name, name):<12} "
            + " ".join(f"{100 * value_at(res, name, 'unallocated', a):12.2f}%" for a in (0.9, 1.0, 1.1))
            + f" {100 * value_at(res, name, 'fragmented', 0.9):8.2f}% {np.mean(res['policies'][name]['failed_pods']):7.0f}"
        )
    print(f"wrote {out / 'fragmentation.json'} and {out / 'fragmentation.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cmd(_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
