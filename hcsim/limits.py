"""Cost limits: inputs whose run would take hours or exhaust memory are refused before any work starts.

The cost of a run is estimated from the specs alone, before a graph is built:

- workload graph vertices: ``2 x decoders x vertices per decoder pass`` plus the all-reduces and the
  optimizer (times the micro-batches with pipeline parallelism); at most :data:`MAX_GRAPH_VERTICES`;
- vertex runs: ``iterations x XPUs x vertices``; at most :data:`MAX_VERTEX_RUNS` (the largest paper
  experiment, 1024 XPUs of LLaMA2-13B at layer granularity for 2 iterations, is about 3.4 M);
- XPUs built in a platform graph: at most :data:`MAX_PLATFORM_XPUS`;
- host pairs compiled into routes (``platform compile --pairs``): at most :data:`MAX_ROUTE_PAIRS`;
- components a structured platform builds per server or network (``server.cpus``, ``server.nics_per_cpu``,
  ``server.cpu_pcie_links``, ``server.xpus_per_cpu``, ``network.spines``): at most :data:`MAX_COMPONENTS` each.

Set the environment variable ``HCSIM_NO_LIMITS=1`` to run beyond them anyway.
"""

from __future__ import annotations

import os

from hcsim.errors import ConfigError

__all__ = ["MAX_GRAPH_VERTICES", "MAX_VERTEX_RUNS", "MAX_PLATFORM_XPUS", "MAX_ROUTE_PAIRS", "MAX_COMPONENTS", "graph_vertices",
           "check_run_cost", "check_limit"]

MAX_GRAPH_VERTICES = 1_000_000
MAX_VERTEX_RUNS = 200_000_000
MAX_PLATFORM_XPUS = 65_536
MAX_ROUTE_PAIRS = 2_000_000
MAX_COMPONENTS = 4096


def check_limit(estimate: float, limit: float, what: str, where: str, fix: str) -> None:
    """Raise ConfigError when `estimate` exceeds `limit` (unless HCSIM_NO_LIMITS is set), with both in the message."""
    if estimate > limit and not os.environ.get("HCSIM_NO_LIMITS"):
        raise ConfigError(f"{where}: {what} would be about {estimate:,.0f}, beyond the limit of {limit:,.0f} "
                          f"(hcsim.limits); {fix}, or set HCSIM_NO_LIMITS=1 to run it anyway")


def graph_vertices(spec) -> int:
    """Vertices of the training graph of workload `spec` (:func:`hcsim.workload.build_training_graph`), counted
    from the spec without building it."""
    decoders = spec.model.decoders
    # a mixture-of-experts model has no data-parallel decoder table (hybrid graphs only): count its hybrid
    # decoder pass, attention, MLP or experts, and their collectives
    layers = 8 if spec.model.moe else len(spec.decoder_table().layers)
    per_pass = layers if spec.granularity == "layer" else 1
    allreduces = {"decoder": decoders, "layer": decoders * layers, "model": 1}[spec.bucket]
    return 2 * decoders * per_pass + allreduces + 1


def check_run_cost(spec, xpus: int, iterations: int, where: str, micro_batches: int = 1, stages: int = 1,
                   graph_micro_batches: int | None = None) -> None:
    """Refuse a run of workload `spec` on `xpus` XPUs for `iterations` iterations beyond the limits above.

    With pipeline parallelism the graph holds each decoder pass once per micro-batch (`micro_batches`, per
    replica) and each XPU runs the vertices of one of the `stages` stages. With an uneven batch_split the
    graph holds `graph_micro_batches` passes (one set per class of replicas; the sum of their counts) while
    each XPU still runs its own replica's: `micro_batches` is then the mean.
    """
    one = graph_vertices(spec)
    check_limit(one * (graph_micro_batches or micro_batches), MAX_GRAPH_VERTICES, "the workload graph's vertices",
                where, "lower model.decoders or global_batch, or use granularity: decoder")
    vertices = one * micro_batches  # that an XPU's replica runs
    runs = float(vertices) * xpus * iterations / stages
    check_limit(runs, MAX_VERTEX_RUNS, f"the vertex runs ({vertices:,} vertices x {xpus:,} XPUs"
                + (f" / {stages} stages" if stages > 1 else "") + f" x {iterations:,} iterations)", where,
                "lower xpus, iterations or model.decoders")
