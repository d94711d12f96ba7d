"""The smallest workload: one compute vertex on every XPU, then one all-reduce over them.

Used by the walking skeleton (the engine's first end-to-end test): its time is
a closed form, FLOPs / FLOP/s + the all-reduce time.
"""

from __future__ import annotations

import networkx as nx

from hcsim.workload.graph import add_comm, add_compute, add_dependency, new_workload

__all__ = ["skeleton_graph"]


def skeleton_graph(xpus: list[str], flops: float, allreduce_bytes: float, algorithm: str = "ring") -> nx.DiGraph:
    """One compute vertex replicated on `xpus` (the start vertex), then one all-reduce over all of them.

    Parameters
    ----------
    xpus : XPU names (platform host names); the all-reduce group, in this order.
    flops : FLOP each XPU computes.
    allreduce_bytes : bytes each rank contributes to the all-reduce (S).
    algorithm : collective algorithm name for the engine ("ring", ...).

    >>> g = skeleton_graph(["xpu0", "xpu1"], 1e12, 1e9)
    >>> sorted(g.nodes), g.nodes["allreduce"]["xpus"]
    (['allreduce', 'compute'], ('xpu0', 'xpu1'))
    """
    graph = new_workload("skeleton")
    add_compute(graph, "compute", xpus=xpus, flops=flops, start=True)
    add_comm(graph, "allreduce", xpus=xpus, bytes=allreduce_bytes, collective="all_reduce", algorithm=algorithm)
    add_dependency(graph, "compute", "allreduce")
    return graph
