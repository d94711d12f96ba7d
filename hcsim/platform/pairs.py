"""Host pairs a simulation typically uses, for the compiler (routes are emitted only for these)."""

from __future__ import annotations

from itertools import permutations

import networkx as nx

from hcsim.errors import ConfigError
from hcsim.platform.topology import xpus as ordered_xpus

__all__ = ["memory_pairs", "ring_pairs", "data_parallel_pairs", "hybrid_parallel_pairs"]


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


def hybrid_parallel_pairs(graph: nx.Graph, tp: int, pp: int) -> list[tuple[str, str]]:
    """The pairs of a tensor x pipeline x data parallel run over every XPU, in Megatron-LM's rank order.

    Rank r is the r-th XPU in rack, server order; tensor-parallel ranks are
    adjacent, then data-parallel, then pipeline (Megatron-LM's default
    ``tp-dp-pp`` order): rank = t + tp x (d + dp x s). Pairs: memory pairs,
    every ordered pair inside a TP group, pipeline neighbours (stage s and
    s + 1, same t and d) both ways, and a ring over each DP group.

    Raises
    ------
    ConfigError
        if tp x pp does not divide the XPU count.

    >>> g = nx.Graph()
    >>> g.add_nodes_from((f"x{i}", {"kind": "xpu"}) for i in range(4))
    >>> sorted(hybrid_parallel_pairs(g, 2, 2))
    [('x0', 'x1'), ('x0', 'x2'), ('x1', 'x0'), ('x1', 'x3'), ('x2', 'x0'), ('x2', 'x3'), ('x3', 'x1'), ('x3', 'x2')]
    """
    ranks = ordered_xpus(graph)
    if tp < 1 or pp < 1 or len(ranks) % (tp * pp):
        raise ConfigError(f"hybrid_parallel_pairs: tp x pp = {tp} x {pp} must divide the {len(ranks)} XPUs")
    dp = len(ranks) // (tp * pp)
    pairs = memory_pairs(graph)
    for first in range(0, len(ranks), tp):
        pairs += permutations(ranks[first : first + tp], 2)
    stage = tp * dp
    for r in range(len(ranks) - stage):
        pairs += [(ranks[r], ranks[r + stage]), (ranks[r + stage], ranks[r])]
    for s in range(pp):
        for t in range(tp):
            pairs += ring_pairs(graph, [ranks[t + tp * (d + dp * s)] for d in range(dp)])
    return list(dict.fromkeys(pairs))
