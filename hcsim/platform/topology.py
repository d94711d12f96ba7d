"""The platform graph: what a computing system is made of (paper Table 2).

A platform is an undirected ``networkx.Graph`` (links are full duplex). Units
are SI base units: bytes, seconds, FLOP/s, bytes/s.

Graph attributes
    name : str, a label for reports.
    coherent : bool, True when XPUs reach their extended memory and each other
        over a cache-coherent (CXL) fabric.
    routes : optional dict ``{(src, dst): [node, ...]}`` of user routes that
        win over the computed shortest paths.
    ib_switches : optional dict ``{level: count}``, the physical switches of
        an InfiniBand fat tree per level (DGX platforms; 1 = leaves).

Node attributes (``kind`` first)
    kind : "switch" | "xpu" | "cpu" | "memory" | "nic"
    server, rack : optional str / int, where the node sits (ring order, traces,
        and the compiler's grouping of hosts into SimGrid zones).
    server_only : optional bool, a transit node that forwards only traffic from
        or to its own ``server`` (as NICs do; a pooled-CXL switch:
        :mod:`hcsim.platform.routes`).
    transit : optional bool, whether routes may pass *through* the node.
        Default: switches, NICs and CPUs forward (a CPU's root complex joins
        its PCIe switch, UPI and DRAM); XPUs and memories are endpoints only.
        Set it on XPUs for direct-connect topologies (rings, tori).
    switch: role : "pcie" | "xpu" | "tor" | "core" | "cxl" | "ib" (informative);
            level : CXL and InfiniBand switches, 1 for leaves, +1 per level above;
            switches, nics : InfiniBand fat-tree groups: how many physical
            switches the node stands for, and the NICs below it
            (:func:`hcsim.platform.builders.add_fat_tree`).
    xpu: device : catalog name; peak_flops : {precision: dense peak FLOP/s} for the
         precisions the device has (read it with
         :func:`hcsim.platform.devices.peak_flops`); fp32_flops, fp16_flops :
         FLOP/s, the same figures under their older names;
         local_memory : name of its HBM memory node;
         extended_memory : name of the memory node it spills to, or None;
         host_memory : optional, the DRAM of the CPU it is attached to (CPU
         offload copies there, and an offloaded optimizer step runs on the DRAM's owner);
         slowdown : optional float > 0, a straggler's factor: its compute takes
         this many times as long (FLOPs / peak, a measured duration or a kernel
         time alike; :meth:`hcsim.engine.rules.WorkloadRules.compute_cost`);
         absent: 1 (the scenario keys stragglers and straggler_spread set it).
    cpu: flops : FLOP/s (0 when it only hosts memory and PCIe).
    memory: capacity : bytes (math.inf for unbounded);
            role : "hbm" | "dram" | "cxl_type3" | "cxl_type2";
            owner : the host whose private memory it is (an XPU's HBM and CXL
            Type 3 expander, a CPU's DRAM), or None for a shared pool.

Edge attributes
    bandwidth : B/s per direction; latency : s (> 0: SimGrid's CM02 starves
    flows that share a link with a zero-latency route);
    kind : "pcie" | "upi" | "xpu_link" | "eth" | "ib" (InfiniBand) | "cxl" | "hbm" | "dram" |
        "c2c" (NVLink-C2C: a superchip's GPU to its CPU, cache coherent).
"""

from __future__ import annotations

import math
from collections import Counter

import networkx as nx

from hcsim.errors import TopologyError, invalid
from hcsim.platform.devices import PRECISIONS

__all__ = [
    "NODE_KINDS", "LINK_KINDS", "HOST_KINDS", "MEMORY_ROLES", "add_link", "add_xpu", "add_memory",
    "xpus", "validate_topology", "host_nodes", "is_transit", "natural_key",
]

NODE_KINDS = ("switch", "xpu", "cpu", "memory", "nic")
LINK_KINDS = ("pcie", "upi", "xpu_link", "eth", "ib", "cxl", "hbm", "dram", "c2c")
HOST_KINDS = ("xpu", "cpu", "memory")  # become SimGrid hosts; the others only carry links
ENDPOINT_KINDS = ("xpu", "memory")  # routes do not cross these unless the node says transit=True
MEMORY_ROLES = ("hbm", "dram", "cxl_type3", "cxl_type2")


def add_link(graph: nx.Graph, u: str, v: str, *, bandwidth: float, latency: float, kind: str) -> None:
    """Add a full-duplex link; `bandwidth` in B/s per direction, `latency` in s."""
    graph.add_edge(u, v, bandwidth=bandwidth, latency=latency, kind=kind)


def add_xpu(graph: nx.Graph, name: str, device, *, hbm_latency: float, **where) -> None:
    """Add an XPU of catalog `device` with its HBM memory node and the link between them."""
    memory = f"{name}.hbm"
    graph.add_node(name, kind="xpu", device=device.name, peak_flops=dict(device.peaks), fp32_flops=device.fp32_flops,
                   fp16_flops=device.fp16_flops, local_memory=memory, extended_memory=None, **where)
    graph.add_node(memory, kind="memory", capacity=device.memory, role="hbm", owner=name, **where)
    add_link(graph, name, memory, bandwidth=device.memory_bandwidth, latency=hbm_latency, kind="hbm")


def add_memory(graph: nx.Graph, name: str, *, capacity: float, role: str, owner: str | None, **where) -> None:
    """Add a memory node of `capacity` bytes (math.inf for unbounded)."""
    graph.add_node(name, kind="memory", capacity=capacity, role=role, owner=owner, **where)


def xpus(graph: nx.Graph) -> list[str]:
    """The XPU nodes in a stable order: by rack, server, then name."""
    nodes = [n for n, k in graph.nodes(data="kind") if k == "xpu"]
    return sorted(nodes, key=lambda n: _placement_key(graph, n))


def host_nodes(graph: nx.Graph) -> list[str]:
    """Nodes that become SimGrid hosts (XPUs, CPUs, memories), sorted by name."""
    return sorted(n for n, k in graph.nodes(data="kind") if k in HOST_KINDS)


def is_transit(data: dict) -> bool:
    """Whether routes may pass through a node with attributes `data` (see ``transit`` above)."""
    return data.get("transit", data.get("kind") not in ENDPOINT_KINDS)


def _placement_key(graph: nx.Graph, node: str):
    data = graph.nodes[node]
    return (data.get("rack", 0), natural_key(str(data.get("server", ""))), natural_key(node))


def natural_key(name: str) -> list:
    """Sort key that puts xpu2 before xpu10 (numbers in a name compared as numbers).

    >>> sorted(["xpu10", "xpu2", "xpu1"], key=natural_key)
    ['xpu1', 'xpu2', 'xpu10']
    """
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def validate_topology(graph: nx.Graph, catalog=None) -> None:
    """Check a platform graph; raise one TopologyError listing every problem.

    Checks: known node kinds and devices (when a `catalog` mapping is given),
    positive finite bandwidth and positive latency on every link, memory
    capacity present and positive, every XPU's memories existing and reachable,
    every XPU reaching every other XPU.
    """
    problems: list[str] = []
    for node, data in graph.nodes(data=True):
        problems += _node_problems(graph, node, data, catalog)
    for u, v, data in graph.edges(data=True):
        problems += _link_problems(*sorted((u, v)), data)
    problems += _reachability_problems(graph)
    if problems:
        raise TopologyError(invalid(f"platform {graph.graph.get('name', '?')!r}", problems))


def _node_problems(graph, node, data, catalog) -> list[str]:
    kind = data.get("kind")
    if kind not in NODE_KINDS:
        return [f"node {node!r}: unknown kind {kind!r}; valid: {', '.join(NODE_KINDS)}"]
    problems = []
    if kind == "xpu":
        device = data.get("device")
        if catalog is not None and device not in catalog:
            problems.append(f"xpu {node!r}: unknown device {device!r}; known: {', '.join(sorted(catalog))}")
        for key in ("fp32_flops", "fp16_flops"):
            if not _positive(data.get(key)):
                problems.append(f"xpu {node!r}: {key} must be a positive FLOP/s, got {data.get(key)!r}")
        peaks = data.get("peak_flops", {})
        if not isinstance(peaks, dict) or not all(p in PRECISIONS and _positive(v) for p, v in peaks.items()):
            problems.append(f"xpu {node!r}: peak_flops must map precisions ({', '.join(PRECISIONS)}) to positive "
                            f"FLOP/s, got {peaks!r}")
        for key in ("local_memory", "extended_memory"):
            memory = data.get(key)
            if memory is not None and graph.nodes.get(memory, {}).get("kind") != "memory":
                problems.append(f"xpu {node!r}: {key} {memory!r} is not a memory node of this platform")
        if data.get("local_memory") is None:
            problems.append(f"xpu {node!r}: has no local_memory")
    elif kind == "memory":
        capacity = data.get("capacity")
        if capacity is None or not (capacity > 0):
            problems.append(f"memory {node!r}: capacity must be > 0 bytes or unbounded (inf), got {capacity!r}")
        if data.get("role") not in MEMORY_ROLES:
            problems.append(f"memory {node!r}: role {data.get('role')!r} is not one of {', '.join(MEMORY_ROLES)}")
    return problems


def _link_problems(u, v, data) -> list[str]:
    problems = []
    if not _positive(data.get("bandwidth")):
        problems.append(f"link {u!r}--{v!r}: bandwidth must be a positive B/s, got {data.get('bandwidth')!r}")
    latency = data.get("latency")
    if not (isinstance(latency, (int, float)) and latency > 0 and math.isfinite(latency)):
        problems.append(f"link {u!r}--{v!r}: latency must be > 0 s (CM02 starves flows sharing a zero-latency route), got {latency!r}")
    if data.get("kind") not in LINK_KINDS:
        problems.append(f"link {u!r}--{v!r}: kind {data.get('kind')!r} is not one of {', '.join(LINK_KINDS)}")
    return problems


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _reachability_problems(graph: nx.Graph) -> list[str]:
    """XPUs that cannot reach their memories or their peers, through transit nodes only."""
    transit = [n for n, data in graph.nodes(data=True) if is_transit(data)]
    component = {n: i for i, comp in enumerate(nx.connected_components(graph.subgraph(transit))) for n in comp}

    def reach(node) -> set:
        if node in component:
            return {component[node]}
        return {component[m] for m in graph[node] if m in component}

    def reaches(a, b) -> bool:
        return graph.has_edge(a, b) or bool(reach(a) & reach(b))

    problems = []
    accelerators = xpus(graph)
    for xpu in accelerators:
        for key in ("local_memory", "extended_memory"):
            memory = graph.nodes[xpu].get(key)
            if memory in graph and not reaches(xpu, memory):
                problems.append(f"xpu {xpu!r}: cannot reach its {key} {memory!r}")
    groups = Counter(c for x in accelerators for c in reach(x))
    if len(accelerators) > 1:
        main = groups.most_common(1)[0][0] if groups else None
        stray = [x for x in accelerators if main not in reach(x)]
        if stray:
            problems.append(f"xpus {', '.join(map(repr, stray[:5]))}{' ...' if len(stray) > 5 else ''} "
                            "cannot reach their peers")
    return problems
