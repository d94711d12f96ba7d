"""Host pairs a simulation typically uses, for the compiler (routes are emitted only for these)."""

from __future__ import annotations

import networkx as nx

from hcsim.platform.topology import xpus as ordered_xpus

__all__ = ["memory_pairs", "ring_pairs", "data_parallel_pairs"]


def memory_pairs(graph: nx.Graph) -> list[tuple[str, str]]:
    """Each XPU with its local and its extended memory, both directions."""
    pairs = []
    for xpu in ordered_xpus(graph):
        for key in ("local_memory", "extended_memory"):
            memory = graph.nodes[xpu].get(key)
            if memory is not None:
                pairs += [(xpu, memory), (memory, xpu)]
    return pairs


def ring_pairs(graph: nx.Graph, members: list[str] | None = None) -> list[tuple[str, str]]:
    """Neighbours of a ring over `members` (default: every XPU in rack, server order), both directions.

    >>> ring_pairs(nx.Graph(), ["a", "b", "c"])
    [('a', 'b'), ('b', 'a'), ('b', 'c'), ('c', 'b'), ('c', 'a'), ('a', 'c')]
    """
    members = ordered_xpus(graph) if members is None else list(members)
    if len(members) < 2:
        return []
    steps = zip(members, members[1:] + members[:1]) if len(members) > 2 else [(members[0], members[1])]
    return [pair for a, b in steps for pair in ((a, b), (b, a))]


def data_parallel_pairs(graph: nx.Graph) -> list[tuple[str, str]]:
    """The pairs of a data-parallel run: memory pairs plus one ring over all XPUs."""
    return memory_pairs(graph) + ring_pairs(graph)
