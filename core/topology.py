"""GPU cluster topology: a tree block -> rack -> node, with GPUs per node.

The one cluster description shared by the simulator, the fake nodes of the integration
tests and the extender (which rebuilds it from node labels); it knows no Kubernetes
objects. Link levels, fine to coarse: ``NVLINK``, ``NODE``, ``RACK``, ``BLOCK``,
``CLUSTER``; a job communicates at the slowest level its workers span.
Details: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable, Mapping

# node labels belong to the Kubernetes contract (import them from rlsched.core.contract)
from .contract import (
    DEFAULT_TOPOLOGY_LEVELS,
    LABEL_BLOCK,
    LABEL_GPU_CLIQUE,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRESENT,
    LABEL_GPU_PRICE,
    LABEL_GPU_PRODUCT,
    LABEL_HOSTNAME,
    LABEL_NVLINK_DOMAIN_SIZE,
    LABEL_RACK,
)

__all__ = ["Level", "Bandwidth", "NodeSpec", "Topology", "node_labels"]


class Level(IntEnum):
    """How far apart two GPUs (or a job's workers) are; larger is slower."""

    NVLINK = 0
    NODE = 1
    RACK = 2
    BLOCK = 3
    CLUSTER = 4


@dataclass(frozen=True)
class Bandwidth:
    """Link bandwidth per level, in gigabytes per second.

    Defaults are round figures for a DGX-class cluster: NVLink 3 (300 GB/s), PCIe 4
    x16 (32 GB/s), 200 Gb/s rack NICs, 2:1 and 4:1 oversubscribed upper layers.
    """

    nvlink: float = 300.0
    node: float = 32.0
    rack: float = 25.0
    block: float = 12.5
    cluster: float = 6.25

    def at(self, level: Level) -> float:
        return (self.nvlink, self.node, self.rack, self.block, self.cluster)[int(level)]

    def __post_init__(self) -> None:
        values = (self.nvlink, self.node, self.rack, self.block, self.cluster)
        if any(v <= 0 for v in values):
            raise ValueError(f"bandwidths must be positive, got {values}")


# Price per GPU-hour (USD, on-demand cloud list prices rounded) used for the fee
# metric. Unknown models cost DEFAULT_GPU_PRICE.
GPU_PRICES: dict[str, float] = {
    "A100": 3.0,
    "H100": 4.5,
    "V100": 2.5,
    "V100M16": 2.3,
    "V100M32": 2.5,
    "P100": 1.5,
    "T4": 0.5,
    "A10": 1.0,
    "G2": 1.2,
    "G3": 2.0,
}
DEFAULT_GPU_PRICE = 2.0


@dataclass(frozen=True)
class NodeSpec:
    """A node as built: its place in the tree and its GPUs."""

    name: str
    gpus: int
    gpu_model: str = "A100"
    rack: str = "rack-0"
    block: str = "block-0"
    nvlink_domain_size: int = 8
    clique: str = ""
    cpu_milli: int = 96_000
    memory_mib: int = 786_432

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name must not be empty")
        if self.gpus < 0:
            raise ValueError(f"node {self.name}: gpus must be >= 0, got {self.gpus}")
        if self.nvlink_domain_size < 0:
            raise ValueError(f"node {self.name}: nvlink_domain_size must be >= 0")

    @property
    def price_per_gpu_hour(self) -> float:
        return GPU_PRICES.get(self.gpu_model, DEFAULT_GPU_PRICE)


@dataclass
class Topology:
    """An immutable-by-convention list of nodes plus the bandwidth per level.

    Node order is meaningful: it is the "first" in FirstFit and the index used by the
    simulator's arrays.
    """

    nodes: list[NodeSpec]
    bandwidth: Bandwidth = field(default_factory=Bandwidth)

    def __post_init__(self) -> None:
        self.index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in self.index:
                raise ValueError(f"duplicate node name {n.name!r}")
            self.index[n.name] = i
        self.racks = sorted({n.rack for n in self.nodes})
        self.blocks = sorted({n.block for n in self.nodes})
        self.rack_of = [n.rack for n in self.nodes]
        self.block_of = [n.block for n in self.nodes]

    # ------------------------------------------------------------------ builders
    @classmethod
    def uniform(
        cls,
        nodes: int,
        gpus_per_node: int = 8,
        racks: int = 1,
        blocks: int = 1,
        gpu_model: str = "A100",
        nvlink_domain_size: int | None = None,
        bandwidth: Bandwidth | None = None,
        prefix: str = "node",
    ) -> "Topology":
        """``nodes`` nodes spread evenly over ``racks`` racks and ``blocks`` blocks."""
        if nodes < 1 or racks < 1 or blocks < 1:
            raise ValueError("nodes, racks and blocks must be >= 1")
        if racks < blocks:
            raise ValueError("need at least one rack per block")
        if nodes < racks:
            raise ValueError("need at least one node per rack")
        dom = gpus_per_node if nvlink_domain_size is None else nvlink_domain_size
        width = len(str(nodes - 1))
        specs = []
        for i in range(nodes):
            r = i * racks // nodes
            b = r * blocks // racks
            specs.append(
                NodeSpec(
                    name=f"{prefix}-{i:0{width}d}",
                    gpus=gpus_per_node,
                    gpu_model=gpu_model,
                    rack=f"rack-{r}",
                    block=f"block-{b}",
                    nvlink_domain_size=dom,
                )
            )
        return cls(specs, bandwidth or Bandwidth())

    @classmethod
    def from_dict(cls, spec: Mapping) -> "Topology":
        """Build from a cluster description (the YAML/JSON shape of :meth:`to_dict`).

        Either ``{"nodes": [{name, gpus, gpu_model, rack, block, ...}, ...]}`` or the
        uniform form ``{"uniform": {nodes, gpus_per_node, racks, blocks, ...}}``;
        optional ``bandwidth: {nvlink, node, rack, block, cluster}`` in GB/s.
        """
        if not isinstance(spec, Mapping):
            raise ValueError("cluster description must be a mapping")
        bw = Bandwidth(**spec.get("bandwidth", {}))
        if "uniform" in spec:
            return cls.uniform(**dict(spec["uniform"]), bandwidth=bw)
        if "nodes" not in spec:
            raise ValueError("cluster description needs 'nodes' or 'uniform'")
        allowed = set(NodeSpec.__dataclass_fields__)
        nodes = []
        for i, n in enumerate(spec["nodes"]):
            unknown = set(n) - allowed
            if unknown:
                raise ValueError(f"node #{i}: unknown keys {sorted(unknown)}")
            nodes.append(NodeSpec(**n))
        return cls(nodes, bw)

    def to_dict(self) -> dict:
        return {
            "bandwidth": self.bandwidth.__dict__.copy(),
            "nodes": [n.__dict__.copy() for n in self.nodes],
        }

    @classmethod
    def from_labels(
        cls,
        nodes: Iterable[tuple[str, Mapping[str, str], int] | tuple[str, Mapping[str, str], int, int, int]],
        levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS,
        bandwidth: Bandwidth | None = None,
    ) -> "Topology":
        """Rebuild a topology from ``(name, labels, gpu_capacity)`` of Kubernetes nodes,
        or ``(name, labels, gpu_capacity, cpu_milli, memory_mib)`` where what the nodes
        offer pods in CPU and memory counts (:class:`NodeSpec`'s defaults otherwise).

        ``levels`` are node-label keys coarse to fine, Kueue-style; the last is the
        hostname level. Missing labels put a node in a rack/block of its own so an
        unlabelled node never looks close to another one.
        """
        if len(levels) < 1:
            raise ValueError("need at least the hostname topology level")
        block_key = levels[-3] if len(levels) >= 3 else None
        rack_key = levels[-2] if len(levels) >= 2 else None
        specs = []
        for name, labels, gpus, *offers in nodes:
            rack = labels.get(rack_key, "") if rack_key else ""
            block = labels.get(block_key, "") if block_key else ""
            rack = rack or f"~{name}"
            block = block or f"~{rack}"
            try:
                dom = int(labels.get(LABEL_NVLINK_DOMAIN_SIZE, gpus))
            except ValueError:
                dom = gpus
            specs.append(
                NodeSpec(
                    name=name,
                    gpus=int(gpus),
                    gpu_model=labels.get(LABEL_GPU_PRODUCT, "unknown"),
                    rack=rack,
                    block=block,
                    nvlink_domain_size=max(0, dom),
                    clique=labels.get(LABEL_GPU_CLIQUE, ""),
                    **(dict(cpu_milli=int(offers[0]), memory_mib=int(offers[1])) if offers else {}),
                )
            )
        return cls(specs, bandwidth or Bandwidth())

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def node(self, name: str) -> NodeSpec:
        return self.nodes[self.index[name]]

    def pair_level(self, a: int, b: int) -> Level:
        """Level of the link between nodes ``a`` and ``b`` (indices)."""
        if a == b:
            return Level.NODE
        na, nb = self.nodes[a], self.nodes[b]
        if na.clique and na.clique == nb.clique:
            return Level.NVLINK
        if na.rack == nb.rack:
            return Level.RACK
        if na.block == nb.block:
            return Level.BLOCK
        return Level.CLUSTER

    def span_level(self, gpus_on_node: Mapping[int, int]) -> Level:
        """Slowest level spanned by a job with ``gpus_on_node[node_index] = count``.

        One node: NVLINK when the job's GPUs fit one NVLink island of that node (the
        device plugin allocates topology-aware), NODE otherwise. Several nodes: NVLINK
        when all share one multi-node NVLink clique, else RACK / BLOCK / CLUSTER.
        """
        idx = [i for i, c in gpus_on_node.items() if c > 0]
        if not idx:
            return Level.NVLINK
        if len(idx) == 1:
            i = idx[0]
            dom = self.nodes[i].nvlink_domain_size
            return Level.NVLINK if gpus_on_node[i] <= max(dom, 1) else Level.NODE
        first = self.nodes[idx[0]]
        if first.clique and all(self.nodes[i].clique == first.clique for i in idx):
            return Level.NVLINK
        if all(self.rack_of[i] == first.rack for i in idx):
            return Level.RACK
        if all(self.block_of[i] == first.block for i in idx):
            return Level.BLOCK
        return Level.CLUSTER

    def with_bandwidth(self, bandwidth: Bandwidth) -> "Topology":
        return Topology(list(self.nodes), bandwidth)

    def subset(self, names: Iterable[str]) -> "Topology":
        keep = set(names)
        return Topology([n for n in self.nodes if n.name in keep], self.bandwidth)


def node_labels(node: NodeSpec) -> dict[str, str]:
    """Kubernetes labels of a node: topology levels plus GPU Feature Discovery labels."""
    labels = {
        LABEL_BLOCK: node.block,
        LABEL_RACK: node.rack,
        LABEL_HOSTNAME: node.name,
        LABEL_GPU_COUNT: str(node.gpus),
        LABEL_GPU_PRODUCT: node.gpu_model,
        LABEL_NVLINK_DOMAIN_SIZE: str(node.nvlink_domain_size),
        LABEL_GPU_PRICE: f"{node.price_per_gpu_hour:g}",
        LABEL_GPU_PRESENT: "true",
    }
    if node.clique:
        labels[LABEL_GPU_CLIQUE] = node.clique
    return labels
