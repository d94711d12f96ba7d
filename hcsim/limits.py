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

Physical ranges (:data:`PHYSICAL_RANGES`): each quantity a spec, a scenario or a trace gives is refused
outside the range a real system can have (a link of 1e-30 B/s or a latency of 1e9 s makes a run that
reports a meaningless number), with the range in the message. Declared once, per quantity, and checked at
the boundary where the value is read (:class:`hcsim.config.Fields`, the Chakra reader, graph JSON).

Set the environment variable ``HCSIM_NO_LIMITS=1`` to run beyond them anyway.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager

from hcsim.errors import ConfigError

__all__ = ["collector_paused", "PHYSICAL_RANGES", "check_range", "MAX_GLOBAL_BATCH", "MAX_SWEEP_POINTS", "MAX_GRAPH_VERTICES", "MAX_VERTEX_RUNS", "MAX_PLATFORM_XPUS", "MAX_ROUTE_PAIRS", "MAX_COMPONENTS", "graph_vertices",
           "check_run_cost", "check_limit"]

MAX_GRAPH_VERTICES = 4_000_000  # Korthikanti's 1T rows: 2.0 M vertices, 2.3 GB peak on the engine core
MAX_VERTEX_RUNS = 500_000_000  # estimated for Llama-3 405B on 131,072 H100 (pp 16, 16 micro-batches a pipeline): 479 M
MAX_PLATFORM_XPUS = 131_072
MAX_ROUTE_PAIRS = 2_000_000
MAX_COMPONENTS = 4096
MAX_GLOBAL_BATCH = 10_000_000  # samples per iteration (the largest published runs use a few thousand)
MAX_SWEEP_POINTS = 100_000  # points of one sweep's grid

# quantity -> (lowest, highest, unit): what a real system can have. Zero and negatives pass here (each spec's
# own rule refuses them where it must); a value > 0 outside is refused, its range in the message. SI units.
PHYSICAL_RANGES: dict[str, tuple[float, float, str]] = {
    "bandwidth": (1e3, 1e14, "B/s"),      # 1 kB/s (a slow serial link) to 100 TB/s (beyond any HBM)
    "time": (0.0, 1.0, "s"),              # a latency or per-call overhead: 0 to 1 s
    "size": (1.0, 1e17, "B"),             # a capacity or buffer: 1 B to 100 PB
    "flops": (1e3, 1e18, "FLOP/s"),       # a device's peak: 1 kFLOP/s to 1 EFLOP/s
    "flop": (0.0, 1e21, "FLOP"),          # one vertex's work: up to 1 ZFLOP
    "duration": (0.0, 1e6, "s"),          # one measured kernel or vertex: up to about 11 days
    "sequence": (1, 10_000_000, "tokens"),
    "hidden": (1, 1_000_000, ""),
    "heads": (1, 100_000, ""),
    "ffn": (1, 10_000_000, ""),
    "vocabulary": (0, 100_000_000, "tokens"),
    "experts": (1, 100_000, ""),
    "batch_per_xpu": (1, 1_000_000, "samples"),
    "slowdown": (0.01, 100.0, "x"),       # a straggler's compute: 100x faster (a stand-in) to 100x slower (failing)
}


def check_range(value: float, quantity: str, where: str, text: object = None) -> str | None:
    """The problem of `value` (of `quantity`, a key of PHYSICAL_RANGES) outside its physical range, as
    ``WHERE: ...`` (None when inside, <= 0, or HCSIM_NO_LIMITS is set). `text` is the value as the user wrote it."""
    low, high, unit = PHYSICAL_RANGES[quantity]
    if value <= 0 or low <= value <= high or os.environ.get("HCSIM_NO_LIMITS"):  # <= 0: the spec's own rule
        return None
    from hcsim.errors import brief
    from hcsim.units import format_quantity

    def shown(x: float) -> str:
        if unit == "s" and x >= 1000:
            return f"{x:,.0f} s"
        if unit in ("B/s", "s", "B", "FLOP/s", "FLOP"):
            return format_quantity(x, unit)
        if unit == "x":  # a factor
            return f"{x:g}x"
        return f"{x:,.0f}{' ' + unit if unit else ''}"

    given = brief(text) if text is not None else shown(value)
    return (f"{where}: {given} is outside the physical range of a {quantity}, {shown(low)} to {shown(high)} "
            f"(hcsim.limits); check the value and its unit, or set HCSIM_NO_LIMITS=1 to run it anyway")


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


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for a while: setting up a big run (its graphs, the Executor, the
    arrays) makes millions of objects that all stay alive (vertices and their edges refer to each other), and
    each full collection walks every one of them: about 40 % of the Executor's set-up and half of the hybrid
    graph's build at 1024 XPUs. The collector's state is restored after.

    What was made meanwhile is then moved to the oldest generation without a walk (gc.freeze, then gc.unfreeze,
    unless something else froze objects): re-enabled as it was, the collector walked every object the pause had
    made in its next collections, young then middle then old (3.4 s after the graphs of GPT-3 175B at pp 32 on
    512 XPUs, all of them still alive). Garbage among them waits for a full collection, as any long-lived
    object's does."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
