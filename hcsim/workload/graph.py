"""The workload graph: what runs where, and in which order (paper Table 3).

A workload is a ``networkx.DiGraph`` that may contain cycles (training
repeats). To stay small at thousands of XPUs, a vertex is *replicated*: it
names the XPUs it runs on and stands for one instance per XPU (SPMD, as data
parallel training is). Units are SI: FLOP, bytes.

Graph attributes
    name : str; precision : "fp32" | "fp16" | "bf16" (picks the XPU FLOP/s);
    samples_per_iteration : int, samples one XPU processes per iteration
    (its batch; throughput counts batches as the paper does).

Vertex attributes
    kind : "compute" | "comm".
    xpus : tuple of XPU names. A compute vertex runs once on each of them; a
        collective runs over all of them as its group; a point-to-point
        transfer is ``(src, dst)``.
    start : bool, the vertex is in the initial running set (paper Fig. 5).
    label : optional str for reports (``decoder3.fwd.linear_k``).
    phase, decoder : optional, set by the training-graph builder
        (:mod:`hcsim.workload.training`): "fwd" | "bwd" | "allreduce" |
        "optimizer", and the decoder number (1..L; 0 for none). Any other
        attribute is kept and ignored.
    compute: flops (per XPU), memory_bytes (per XPU, read by the computation),
        spilled_xpus : frozenset of the XPUs on which the vertex's data lives in
        extended memory (set by memory placement; empty when all is local).
    comm: bytes (the buffer each rank contributes: S of the closed forms);
        collective : one of COLLECTIVES; algorithm : optional algorithm name.

Edge attributes
    skip_first_iteration : bool, the dependency does not hold in iteration 1
        (the back edge that closes the training loop).

Dependencies between instances: for an edge u -> v, the instance of v on XPU
x waits for the instance of u on x when both run on x; an instance of v on an
XPU that u does not run on waits for nothing from u, unless u and v share no
XPU at all, in which case every instance of v waits for every instance of u.
Run k of an instance waits for run k of its predecessors (run k-1 across a
``skip_first_iteration`` edge, nothing when k = 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from hcsim.errors import WorkloadError

__all__ = ["COLLECTIVES", "PRECISIONS", "new_workload", "add_compute", "add_comm", "add_dependency",
           "validate_workload", "save_workload", "load_workload", "unroll_iterations"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p")
PRECISIONS = ("fp32", "fp16", "bf16")


def new_workload(name: str, *, precision: str = "fp32", samples_per_iteration: int = 1) -> nx.DiGraph:
    """An empty workload graph."""
    return nx.DiGraph(name=name, precision=precision, samples_per_iteration=samples_per_iteration)


def add_compute(graph: nx.DiGraph, name: str, *, xpus, flops: float, memory_bytes: float = 0.0,
                start: bool = False, label: str | None = None) -> str:
    """Add a compute vertex replicated on `xpus`; returns its name."""
    graph.add_node(name, kind="compute", xpus=tuple(xpus), flops=float(flops), memory_bytes=float(memory_bytes),
                   spilled_xpus=frozenset(), start=start, label=label or name)
    return name


def add_comm(graph: nx.DiGraph, name: str, *, xpus, bytes: float, collective: str,
             algorithm: str | None = None, start: bool = False, label: str | None = None) -> str:
    """Add a communication vertex over `xpus` (the group, or ``(src, dst)``); returns its name."""
    graph.add_node(name, kind="comm", xpus=tuple(xpus), bytes=float(bytes), collective=collective,
                   algorithm=algorithm, start=start, label=label or name)
    return name


def add_dependency(graph: nx.DiGraph, before: str, after: str, *, skip_first_iteration: bool = False) -> None:
    """`after` waits for `before` (from iteration 2 on when `skip_first_iteration`)."""
    graph.add_edge(before, after, skip_first_iteration=skip_first_iteration)


def validate_workload(graph: nx.DiGraph, platform_xpus=None) -> None:
    """Check a workload before any run; raise one WorkloadError listing every problem.

    Checks: vertex kinds and sizes (non-negative, finite), XPUs that exist on
    the platform (when `platform_xpus` is given), collectives and p2p shape,
    at least one start vertex, that every cycle is broken by a
    ``skip_first_iteration`` edge (otherwise its vertices can never run), and
    that every vertex is a start vertex or reachable from one over edges that
    hold in iteration 1 (otherwise it never becomes ready).
    """
    known = set(platform_xpus) if platform_xpus is not None else None
    problems = []
    missing_by_group: dict = {}  # groups are shared tuples: check each distinct one once
    for name, data in graph.nodes(data=True):
        problems += _vertex_problems(name, data, known, missing_by_group)
    if not any(data.get("start") for _, data in graph.nodes(data=True)) and graph.number_of_nodes():
        problems.append("no start vertex: mark the first vertices of an iteration with start: true")
    first_iteration = nx.DiGraph((u, v) for u, v, skip in graph.edges(data="skip_first_iteration") if not skip)
    try:
        cycle = nx.find_cycle(first_iteration)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        names = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        problems.append(f"cycle with no skip_first_iteration edge (these vertices can never start): {names}")
    starts = [n for n, start in graph.nodes(data="start") if start]
    if starts and not cycle:
        first_iteration.add_nodes_from(graph.nodes)
        reached = set(starts).union(*(nx.descendants(first_iteration, n) for n in starts))
        stranded = sorted((n for n in graph.nodes if n not in reached), key=str)
        if stranded:
            problems.append(f"{len(stranded)} vertices are neither start vertices nor reachable from one in iteration 1 "
                            f"(they never become ready): {', '.join(map(str, stranded[:5]))}"
                            f"{', ...' if len(stranded) > 5 else ''}. Fix: mark them start: true or add a dependency")
    if problems:
        raise WorkloadError(f"workload {graph.graph.get('name', '?')!r} is invalid:\n  " + "\n  ".join(problems))


def _vertex_problems(name, data, known, missing_by_group) -> list[str]:
    kind = data.get("kind")
    if kind not in ("compute", "comm"):
        return [f"vertex {name!r}: kind must be 'compute' or 'comm', got {kind!r}"]
    problems = []
    xpus = data.get("xpus") or ()
    if not xpus:
        problems.append(f"vertex {name!r}: runs on no XPU (xpus is empty)")
    if known is not None:
        key = id(xpus)
        if key not in missing_by_group:
            missing_by_group[key] = (xpus, [x for x in xpus if x not in known])  # keep xpus alive: ids stay unique
        missing = missing_by_group[key][1]
        if missing:
            problems.append(f"vertex {name!r}: placed on XPUs the platform does not have: {', '.join(map(repr, missing[:5]))}")
    sizes = ("flops", "memory_bytes") if kind == "compute" else ("bytes",)
    for key in sizes:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            problems.append(f"vertex {name!r}: {key} must be a finite number >= 0, got {value!r}")
    if kind == "compute":
        spilled = data.get("spilled_xpus") or ()
        strays = set(spilled) - set(xpus) if spilled else ()
        if strays:
            problems.append(f"vertex {name!r}: spilled_xpus names XPUs it does not run on: "
                            f"{', '.join(map(repr, sorted(strays)[:5]))}")
    if kind == "comm":
        collective = data.get("collective")
        if collective not in COLLECTIVES:
            problems.append(f"vertex {name!r}: collective {collective!r} is not one of {', '.join(COLLECTIVES)}")
        elif collective == "p2p" and len(xpus) != 2:
            problems.append(f"vertex {name!r}: a p2p transfer names exactly two XPUs (src, dst), got {len(xpus)}")
    return problems


def unroll_iterations(graph: nx.DiGraph, iterations: int) -> nx.DiGraph:
    """The acyclic graph of vertex runs ``(name, k)`` for k = 1..iterations, per the semantics above.

    An edge u -> v gives (u, k) -> (v, k), or (u, k-1) -> (v, k) when it skips the
    first iteration (nothing for k = 1). Replication is not expanded: one node
    stands for every instance of a run. Useful to check dependencies and orders.

    >>> g = new_workload("loop")
    >>> _ = add_compute(g, "a", xpus=["x"], flops=1, start=True); _ = add_compute(g, "b", xpus=["x"], flops=1)
    >>> add_dependency(g, "a", "b"); add_dependency(g, "b", "a", skip_first_iteration=True)
    >>> sorted(unroll_iterations(g, 2).edges)
    [(('a', 1), ('b', 1)), (('a', 2), ('b', 2)), (('b', 1), ('a', 2))]
    """
    runs = nx.DiGraph()
    for k in range(1, iterations + 1):
        runs.add_nodes_from((name, k) for name in graph.nodes)
        for u, v, skip in graph.edges(data="skip_first_iteration"):
            if not skip:
                runs.add_edge((u, k), (v, k))
            elif k > 1:
                runs.add_edge((u, k - 1), (v, k))
    return runs


def save_workload(graph: nx.DiGraph, path: str | Path) -> None:
    """Write the graph as networkx node-link JSON (tuples and sets become lists)."""
    data = nx.node_link_data(graph, edges="edges")
    for node in data["nodes"]:
        for key, value in node.items():
            if isinstance(value, (tuple, frozenset, set)):
                node[key] = sorted(value) if isinstance(value, (frozenset, set)) else list(value)
    Path(path).write_text(json.dumps(data, indent=1))


def load_workload(path: str | Path, platform_xpus=None) -> nx.DiGraph:
    """Read a graph written by :func:`save_workload` (or by the user's own tools) and validate it.

    Accepts the edge list under ``edges`` or under ``links`` (older networkx).
    Equal ``xpus`` and ``spilled_xpus`` values are shared between vertices, so
    a graph over thousands of XPUs costs one tuple per distinct group.
    """
    try:
        data = json.loads(Path(path).read_text())
        key = "links" if isinstance(data, dict) and "edges" not in data and "links" in data else "edges"
        graph = nx.node_link_graph(data, directed=True, edges=key)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, nx.NetworkXError) as err:
        raise WorkloadError(f"{path}: not a node-link workload graph: {err}") from err
    shared: dict = {}
    problems = []
    for name, node in graph.nodes(data=True):
        for key, kind in (("xpus", tuple), ("spilled_xpus", frozenset)):
            value = node.get(key) or ()
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                problems.append(f"vertex {name!r}: {key} must be a list of XPU names, got {value!r}")
                value = ()
            if key == "xpus" or node.get("kind") == "compute":
                value = kind(value)
                node[key] = shared.setdefault((kind, value), value)
        node.setdefault("start", False)
    if problems:
        raise WorkloadError(f"{path}: " + "; ".join(problems[:10]))
    for _, _, edge in graph.edges(data=True):
        edge.setdefault("skip_first_iteration", False)
    validate_workload(graph, platform_xpus)
    return graph
