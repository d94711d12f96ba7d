"""Counts and totals of a platform graph, as plain data (for `hcsim platform show` and reports)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import networkx as nx

__all__ = ["PlatformSummary", "summarize_platform"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformSummary:
    """What a platform is made of.

    nodes : {"kind" or "kind/role": count}; links : {link kind: count};
    devices : {device name: XPU count}; fp32_flops, fp16_flops : FLOP/s summed
    over XPUs; memory : {role: bytes summed, math.inf if any is unbounded};
    avoided_links : link kinds that routes never take (``cxl.xpu_traffic: fabric``).
    """

    name: str
    coherent: bool
    nodes: dict[str, int]
    links: dict[str, int]
    devices: dict[str, int]
    fp32_flops: float
    fp16_flops: float
    memory: dict[str, float]
    avoided_links: tuple[str, ...] = ()


def summarize_platform(graph: nx.Graph) -> PlatformSummary:
    """Count nodes by kind (switches and memories by role), links by kind, XPUs by device; sum FLOP/s and memory.

    >>> from hcsim.platform import single_switch, builtin_catalog
    >>> s = summarize_platform(single_switch(2, builtin_catalog()["V100"]))
    >>> s.nodes, s.fp32_flops
    ({'memory/hbm': 2, 'switch/xpu': 1, 'xpu': 2}, 31400000000000.0)
    """
    nodes: Counter = Counter()
    devices: Counter = Counter()
    memory: dict[str, float] = {}
    fp32 = fp16 = 0.0
    for _, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind in ("switch", "memory") and data.get("role"):
            nodes[f"{kind}/{data['role']}"] += 1
        else:
            nodes[str(kind)] += 1
        if kind == "xpu":
            devices[data.get("device")] += 1
            fp32 += data.get("fp32_flops", 0.0)
            fp16 += data.get("fp16_flops", 0.0)
        elif kind == "memory":
            capacity = data.get("capacity") or 0.0
            memory[data.get("role")] = memory.get(data.get("role"), 0.0) + capacity
    links = Counter(kind for _, _, kind in graph.edges(data="kind"))
    return PlatformSummary(name=graph.graph.get("name", "?"), coherent=bool(graph.graph.get("coherent")),
                           nodes=dict(sorted(nodes.items())), links=dict(sorted(links.items())),
                           devices=dict(sorted(devices.items())), fp32_flops=fp32, fp16_flops=fp16,
                           memory={role: (math.inf if math.isinf(v) else v) for role, v in sorted(memory.items())},
                           avoided_links=tuple(graph.graph.get("avoid_links", ())))
