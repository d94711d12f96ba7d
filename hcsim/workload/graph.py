"""The workload graph: what runs where, and in which order (paper Table 3).

A workload is a ``networkx.DiGraph`` that may contain cycles (training
repeats). To stay small at thousands of XPUs, one vertex stands for many
*instances*: a compute vertex runs once on each of its XPUs, and a
communication vertex runs its collective once in each of its groups (one
vertex is the tensor-parallel all-reduce of every TP group at once). Units
are SI: FLOP, bytes, seconds. Format version 2 (:data:`FORMAT_VERSION`);
files of version 1 (no ``format_version``) are converted on load.

Graph attributes
    name : str; precision : one of PRECISIONS (picks the XPU FLOP/s);
    format_version : 2;
    samples_per_iteration : int, samples one data-parallel replica processes per
        iteration (throughput counts batches as the paper does; the mean with a batch_split);
    optional, set by the builders and read by reports: ``layout`` (a
    :class:`~hcsim.workload.layout.ParallelLayout` as a mapping), ``global_samples``
    (samples per iteration of the whole job), ``tokens_per_sample``,
    ``model_flops`` (FLOP of one iteration of the whole job, counted as
    Megatron-LM counts them, for MFU), ``batch_split`` (an uneven split's count per
    data-parallel replica, in ``batch_split_unit``: "micro-batches" or "samples").

Vertex attributes
    kind : "compute" | "comm".
    start : bool, the vertex's instances are in the initial running set (paper Fig. 5).
    label : optional str for reports (``decoder3.fwd.linear_k``).
    Any other attribute (``phase``, ``decoder``, ``stage``, ``chunk``, ``micro_batch``, ``step`` set
    by the training-graph builders) is kept and ignored by the engine.
    compute:
        xpus : tuple of XPU names; one instance per XPU.
        flops : FLOP per instance; memory_bytes : bytes per instance, read by the computation;
        duration : optional seconds per instance (a measured kernel time): it
            replaces flops / FLOP/s;
        spilled_xpus : frozenset of the XPUs on which the vertex's data lives in
            extended memory (set by memory placement; empty when all is local).
        offload : optional "cpu" | "cxl", where offloaded data lives: "cpu" is the
            XPU's host DRAM (platform ``host_memory``; spilled data is copied from
            it first, coherent platform or not), "cxl" its extended memory.
        host : optional "cpu": the instance computes on the CPU that owns the XPU's
            host memory, reading memory_bytes from it (the XPU waits, idle).
        move : optional "in" | "out": the instance computes nothing and copies
            memory_bytes from its offload memory to the XPU (in) or back (out).
    comm:
        groups : tuple of disjoint tuples of XPU names; the collective runs
            independently in each group (ranks in that order); for
            ``collective: "p2p"`` each group is one ``(src, dst)`` pair.
        xpus : every member of every group, in group order (derived; the
            vertex's units, one per member XPU).
        bytes : the buffer each rank contributes (S of the closed forms);
        collective : one of COLLECTIVES; algorithm : optional algorithm name;
        chunks : optional int >= 1, the message split into that many chunks
            (pipelined or one after the other: :mod:`hcsim.engine.collectives`).

Edge attributes
    wait : which instance of the successor waits for which of the predecessor
        (WAITS, never inferred). A *unit* is a vertex on one XPU: a compute
        instance, or one member of a collective's group.

        - ``"xpu"``: v's unit on XPU x waits for u's unit on x (compute after
          compute on the same XPU; a collective member after its own XPU's
          compute; a compute after its own XPU's part of a collective). v's
          units on XPUs u does not run on wait for nothing from u.
        - ``"group"``: v's unit on x waits for every unit of u in x's group: v's
          group when v is a communication vertex (a collective member after every
          member's compute, or a p2p receiver after its sender's part of the
          collective before), else u's (a compute after its whole group's
          collective has ended).
        - ``"all"``: every unit of v waits for every unit of u (a barrier).
    skip_first_iteration : bool, the dependency does not hold in iteration 1
        (the back edge that closes the training loop).

Run k of a unit waits for run k of its predecessors' units (run k-1 across a
``skip_first_iteration`` edge, nothing when k = 1) and for its own run k-1.
Only the units of start vertices may have no predecessor in iteration 1; a
unit of any other vertex that would have none is an error (it would start at
t = 0 and run ahead of its iteration).

Example: two XPUs, a forward and a backward pass, a gradient all-reduce, and
the back edge that makes iteration k+1 wait for iteration k's gradients:

>>> g = new_workload("tiny")
>>> _ = add_compute(g, "fwd", xpus=["x0", "x1"], flops=1e12, start=True)
>>> _ = add_compute(g, "bwd", xpus=["x0", "x1"], flops=2e12)
>>> _ = add_comm(g, "grads", groups=[["x0", "x1"]], bytes=1e9, collective="all_reduce")
>>> add_dependency(g, "fwd", "bwd"); add_dependency(g, "bwd", "grads")
>>> add_dependency(g, "grads", "fwd", skip_first_iteration=True)
>>> validate_workload(g, ["x0", "x1"])  # no problem: the vertices, in the executor's order
['fwd', 'bwd', 'grads']
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import networkx as nx

from hcsim.errors import ConfigError, WorkloadError, brief, invalid

__all__ = ["COLLECTIVES", "PRECISIONS", "WAITS", "FORMAT_VERSION", "new_workload", "add_compute", "add_comm", "covered_xpus",
           "add_alike", "add_dependency", "validate_workload", "save_workload", "load_workload", "unroll_iterations",
           "VertexNumbering", "number_vertices", "first_iteration_order"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")  # fp8: Transformer Engine's recipe (hcsim.workload.model)
WAITS = ("xpu", "group", "all")
FORMAT_VERSION = 2
NOTHING_SPILLED = frozenset()  # one for every vertex whose data is all local (frozenset() is a new set each call)


def new_workload(name: str, *, precision: str = "fp32", samples_per_iteration: int = 1, **attributes) -> nx.DiGraph:
    """An empty workload graph (format version 2); `attributes` are further graph attributes."""
    return nx.DiGraph(name=name, precision=precision, samples_per_iteration=samples_per_iteration,
                      format_version=FORMAT_VERSION, **attributes)


def add_compute(graph: nx.DiGraph, name: str, *, xpus: Iterable[str], flops: float, memory_bytes: float = 0.0,
                duration: float | None = None, start: bool = False, label: str | None = None, **attributes) -> str:
    """Add a compute vertex with one instance on each of `xpus`; returns its name.

    `duration` (s), when given, is the instance's compute time instead of flops / FLOP/s; `attributes` are
    further vertex attributes (``phase``, ``stage``, ``ops``, ...)."""
    data = {"kind": "compute", "xpus": tuple(xpus), "flops": float(flops), "memory_bytes": float(memory_bytes),
            "spilled_xpus": NOTHING_SPILLED, "start": start, "label": label or name}
    if duration is not None:
        data["duration"] = float(duration)
    data.update(attributes)
    _add_vertex(graph, name, data)
    return name


def add_comm(graph: nx.DiGraph, name: str, *, bytes: float, collective: str, groups: Iterable[Sequence[str]] | None = None,
             pairs: Iterable[tuple[str, str]] | None = None, xpus: Sequence[str] | None = None,
             algorithm: str | None = None, start: bool = False, label: str | None = None,
             chunks: int | None = None, members: tuple[str, ...] | None = None, **attributes) -> str:
    """Add a communication vertex; returns its name.

    Give its `groups` (disjoint; the collective runs in each), its p2p `pairs`
    ``(src, dst)``, or `xpus` for a single group (a single pair for p2p). `chunks` splits the message
    into that many chunks (:func:`hcsim.engine.collectives.get_algorithm`); None: the algorithm's default.
    `members`: the vertex's ``xpus`` (every member of every group, in group order) where the caller holds them
    as one shared tuple, and its groups as a tuple of tuples (a builder's, shared per axis and stage);
    `attributes` are further vertex attributes (``phase``, ``stage``, ...)."""
    if (groups is None) + (pairs is None) + (xpus is None) != 2:
        raise WorkloadError(f"vertex {name!r}: give exactly one of groups, pairs or xpus")
    if xpus is not None:
        members_of = (tuple(xpus),)
    else:
        given = groups if groups is not None else pairs
        shared = type(given) is tuple and (members is not None or all(type(g) is tuple for g in given))
        members_of = given if shared else tuple(tuple(g) for g in given)  # a builder's tuples as they are
    data = {"kind": "comm", "groups": members_of, "xpus": members or _members(members_of), "bytes": float(bytes),
            "collective": collective, "algorithm": algorithm, "start": start, "label": label or name}
    if chunks is not None:
        data["chunks"] = chunks
    data.update(attributes)
    _add_vertex(graph, name, data)
    return name


def add_alike(graph: nx.DiGraph, name: str, like: dict, **changes) -> str:
    """Add vertex `name` with the attributes `like` (another vertex's, as add_compute or add_comm made them) but
    its label, and `changes`: builders repeat one vertex per layer and micro-batch. Returns its name."""
    data = like.copy()
    data["label"] = name
    data.update(changes)
    _add_vertex(graph, name, data)
    return name


def _add_vertex(graph: nx.DiGraph, name: str, data: dict) -> None:
    """networkx's add_node(name, **data) without its copy of the attributes: builders add a million vertices."""
    adjacency = {}
    if type(graph) is not nx.DiGraph or name is None or graph._succ.setdefault(name, adjacency) is not adjacency:
        graph.add_node(name, **data)  # networkx's own way (an update, its error for None, a subclass's factories)
        return
    graph._pred[name] = {}
    graph._node[name] = data
    if getattr(graph, "__networkx_cache__", None):  # what networkx's add_node does last (its _clear_cache)
        graph.__networkx_cache__.clear()


def add_dependency(graph: nx.DiGraph, before: str, after: str, *, wait: str = "xpu",
                   skip_first_iteration: bool = False) -> None:
    """`after` waits for `before` by rule `wait` (WAITS; from iteration 2 on when `skip_first_iteration`)."""
    if wait not in WAITS:
        raise WorkloadError(f"edge {before!r} -> {after!r}: wait must be one of {', '.join(WAITS)}, got {wait!r}")
    edges = graph._succ.get(before)
    preds = graph._pred.get(after)
    if edges is None or preds is None or after in edges or type(graph) is not nx.DiGraph:
        graph.add_edge(before, after, wait=wait, skip_first_iteration=skip_first_iteration)
        return
    # networkx's add_edge for a new edge between existing vertices, without its copy of the attributes
    edges[after] = preds[before] = {"wait": wait, "skip_first_iteration": skip_first_iteration}
    if getattr(graph, "__networkx_cache__", None):  # what networkx's add_edge does last (its _clear_cache)
        graph.__networkx_cache__.clear()


def _members(groups: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    return groups[0] if len(groups) == 1 else tuple(chain.from_iterable(groups))


def validate_workload(graph: nx.DiGraph, platform_xpus=None) -> list:
    """Check a workload before any run; raise one WorkloadError listing every problem.

    Checks: vertex kinds and sizes (non-negative, finite), XPUs that exist on
    the platform (when `platform_xpus` is given), groups disjoint and p2p pairs
    of two, every edge's wait rule (an ``xpu`` edge between vertices that share
    no XPU connects nothing; ``group`` needs a communication vertex), at least
    one start vertex, every cycle broken by a ``skip_first_iteration`` edge, and
    every unit of a non-start vertex waiting for something in iteration 1
    (otherwise it would start at t = 0, or never).

    Returns the vertices in the order the cycle check found, ``first_iteration_order(graph, stable=True)``:
    the executor's order (hcsim.run.prepare hands it on, so a million-vertex graph is ordered once).
    """
    known = set(platform_xpus) if platform_xpus is not None else None
    problems = graph_problems(graph)
    if not graph.number_of_nodes():
        problems.append("no vertices: a workload runs at least one compute or communication vertex")
    missing_by_group: dict = {}  # groups are shared tuples: check each distinct one once
    for name, data in graph.nodes(data=True):
        problems += _vertex_problems(name, data, known, missing_by_group)
    well_formed = not problems  # the edge rules and coverage need well-formed vertices
    if well_formed:
        nodes = graph._node  # networkx's own dicts, in graph.edges' order: no view per edge
        for u, edges in graph._succ.items():
            before = nodes[u]
            for v, data in edges.items():
                after = nodes[v]
                if data.get("wait") == "xpu" and before["xpus"] is after["xpus"]:
                    continue  # alike vertices on the same XPUs (most edges): nothing to find
                problems += _edge_problems(graph, u, v, data)
    if not any(data.get("start") for _, data in graph.nodes(data=True)) and graph.number_of_nodes():
        problems.append("no start vertex: mark the first vertices of an iteration with start: true")
    cycle, order = None, first_iteration_order(graph, stable=True)
    if len(order) < len(graph):  # a cycle; find_cycle only to name it
        cycle = nx.find_cycle(nx.DiGraph((u, v) for u, v, skip in graph.edges(data="skip_first_iteration")
                                         if not skip))
    if cycle:
        names = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        problems.append(f"cycle with no skip_first_iteration edge (these vertices can never start): {names}")
    if not problems:
        problems += _coverage_problems(graph)
    if problems:
        raise WorkloadError(invalid(f"workload {brief(graph.graph.get('name', '?'))}", problems))
    return order


@dataclass(frozen=True, slots=True)
class VertexNumbering:
    """A workload graph's vertices numbered in the order they were added (networkx's own order), its edges by
    number and the first-iteration order: what the engine's set-up reads instead of looking each vertex up by
    name in million-entry dicts (:func:`number_vertices`)."""

    names: list  # vertex k's name is names[k]
    order: array  # "i": the numbers in the executor's order (the vertices on or after a cycle left out)
    start: array  # "q": vertex k's edges are [start[k], start[k + 1]), in its networkx adjacency's order
    successor: array  # "i": each edge's successor's number
    flags: bytes  # each edge's skip_first_iteration (bit 0) and its wait's index in WAITS (<< 1; 3: not in WAITS)

    def ordered_names(self) -> list:
        return list(map(self.names.__getitem__, self.order))

    def position(self) -> array:
        """Each number's place in `order` ("i"; -1 for a vertex left out)."""
        position = array("i", [-1]) * len(self.names)
        for place, k in enumerate(self.order):
            position[k] = place
        return position


def number_vertices(graph: nx.DiGraph, stable: bool = True) -> VertexNumbering:
    """`graph`'s :class:`VertexNumbering`, from one pass over networkx's adjacency dicts in C++ (the extension
    hcsim.workload._order, ``order.cpp``). The order is Kahn's algorithm on the first-iteration edges (not
    skip_first_iteration); `stable`: the ready vertex least by str(name) first (networkx's
    lexicographical_topological_sort with key=str; names alike as strings by the order they were added), else
    first come, first served."""
    order, start, successor, flags = extension().number_graph(graph._succ, stable)  # networkx's own adjacency
    return VertexNumbering(list(graph._succ), typed_array("i", order), typed_array("q", start),
                           typed_array("i", successor), flags)


def extension():
    """The vertex numbering's C++ extension (hcsim.workload._order), or one error that says how to build it."""
    try:
        from hcsim.workload import _order
    except ImportError as err:
        raise ConfigError(f"workload graph: the vertex numbering's extension hcsim.workload._order is not built or "
                          f"does not load ({err}). Fix: make core (scripts/build_core.py builds it beside the engine "
                          f"core)") from None
    return _order


def typed_array(code: str, data: bytes) -> array:
    """An array of typecode `code` over the bytes the extension returns (its machine's layout)."""
    values = array(code)
    values.frombytes(data)
    return values


def first_iteration_order(graph: nx.DiGraph, stable: bool = False) -> list:
    """The vertices in a topological order of the first-iteration edges (not skip_first_iteration), by Kahn's
    algorithm (:func:`number_vertices`); the vertices on or after a cycle are left out. `stable`: ties by name
    (networkx's lexicographical_topological_sort with key=str)."""
    return number_vertices(graph, stable).ordered_names()


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
            missing_by_group[key] = (xpus, [] if known.issuperset(xpus)  # keep xpus alive: ids stay unique
                                     else [x for x in xpus if x not in known])
        missing = missing_by_group[key][1]
        if missing:
            problems.append(f"vertex {name!r}: placed on XPUs the platform does not have: {', '.join(map(repr, missing[:5]))}")
    sizes = ("flops", "memory_bytes") if kind == "compute" else ("bytes",)
    if kind == "compute" and "duration" in data:
        sizes += ("duration",)
    for key in sizes:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            problems.append(f"vertex {name!r}: {key} must be a finite number >= 0, got {value!r}")
    if kind == "compute":
        key = ("twice", id(xpus))  # vertices share their xpus tuples: check each distinct one once
        if key not in missing_by_group:
            missing_by_group[key] = (xpus, len(set(xpus)) != len(xpus))
        if missing_by_group[key][1]:
            problems.append(f"vertex {name!r}: xpus lists an XPU more than once")
        spilled = data.get("spilled_xpus") or ()
        strays = set(spilled) - set(xpus) if spilled else ()
        if strays:
            problems.append(f"vertex {name!r}: spilled_xpus names XPUs it does not run on: "
                            f"{', '.join(map(repr, sorted(strays)[:5]))}")
    else:
        problems += _comm_problems(name, data)
        groups = data.get("groups") or ()
        key = ("members", id(xpus), id(groups))  # vertices share both tuples: check each distinct pair once
        if key not in missing_by_group:
            members = _members(tuple(map(tuple, groups))) if groups else ()
            missing_by_group[key] = (xpus, groups, tuple(xpus) != members and members)
        members = missing_by_group[key][2]
        if members:
            problems.append(f"vertex {name!r}: xpus must be its groups' members in group order "
                            f"({', '.join(members[:8])}{', ...' if len(members) > 8 else ''}), got "
                            f"{', '.join(tuple(xpus)[:8])}{', ...' if len(xpus) > 8 else ''}; leave xpus out: "
                            f"it follows from groups")
    return problems


def _comm_problems(name, data) -> list[str]:
    problems = []
    collective = data.get("collective")
    groups = data.get("groups") or ()
    if "pairs" in data:
        problems.append(f"vertex {name!r}: pairs is not a vertex attribute; a communication vertex lists its "
                        f"groups (for p2p, one [src, dst] group per transfer)")
    if collective not in COLLECTIVES:
        problems.append(f"vertex {name!r}: collective {collective!r} is not one of {', '.join(COLLECTIVES)}")
    elif collective == "p2p" and any(len(pair) != 2 or pair[0] == pair[1] for pair in groups):
        problems.append(f"vertex {name!r}: a p2p transfer names two different XPUs (src, dst) per pair")
    if any(not group for group in groups):
        problems.append(f"vertex {name!r}: a group is empty")
    algorithm = data.get("algorithm")
    if algorithm is not None and not (isinstance(algorithm, str) and algorithm):
        problems.append(f"vertex {name!r}: algorithm must be the name of a collective algorithm (ring, "
                        f"coherent_ring, ..., or module:Class) or absent, got {brief(algorithm)}")
    chunks = data.get("chunks")
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1):
        problems.append(f"vertex {name!r}: chunks must be an integer >= 1 (or absent), got {chunks!r}")
    members = data.get("xpus") or ()
    if len(set(members)) != len(members):
        problems.append(f"vertex {name!r}: groups must be disjoint (an XPU is in two groups, or twice in one); "
                        f"split it into one vertex per set of disjoint groups")
    return problems


def _edge_problems(graph: nx.DiGraph, u, v, data) -> list[str]:
    wait = data.get("wait")
    if wait not in WAITS:
        return [f"edge {u!r} -> {v!r}: wait must be one of {', '.join(WAITS)}, got {wait!r}"]
    before, after = graph.nodes[u], graph.nodes[v]
    if wait == "group" and before["kind"] == after["kind"] == "compute":
        return [f"edge {u!r} -> {v!r}: wait 'group' needs a communication vertex at one end; use 'xpu' or 'all'"]
    if (wait == "xpu" and before["xpus"] is not after["xpus"] and before["xpus"] != after["xpus"]
            and set(before["xpus"]).isdisjoint(after["xpus"])):
        return [f"edge {u!r} -> {v!r}: wait 'xpu' between vertices that share no XPU connects nothing; "
                f"use wait 'all' for a barrier"]
    return []


def covered_xpus(graph: nx.DiGraph, u, v, wait: str):
    """The XPUs of v whose units wait for some unit of u over an edge u -> v with rule `wait` (None: all)."""
    before, after = graph.nodes[u], graph.nodes[v]
    if wait == "all" or before["xpus"] is after["xpus"] or before["xpus"] == after["xpus"]:
        return None
    if wait == "group" and after["kind"] == "comm":
        touched = set(before["xpus"])
        return {x for group in after["groups"] for x in group if not touched.isdisjoint(group)}
    return set(after["xpus"]).intersection(before["xpus"])


def _coverage_problems(graph: nx.DiGraph) -> list[str]:
    problems, nodes, preds = [], graph._node, graph._pred  # networkx's own dicts: no view per vertex
    for v, data in nodes.items():
        if data.get("start"):
            continue
        covered: set = set()
        for u, edge in preds[v].items():  # graph.in_edges(v)'s order
            if edge["skip_first_iteration"]:
                continue
            if edge["wait"] == "all" or nodes[u]["xpus"] is data["xpus"]:
                break  # covered_xpus: None, every unit waits
            xpus = covered_xpus(graph, u, v, edge["wait"])
            if xpus is None:
                break
            covered |= xpus
        else:
            alone = [] if covered.issuperset(data["xpus"]) else [x for x in data["xpus"] if x not in covered]
            if alone:
                problems.append(f"vertex {v!r}: its units on {len(alone)} XPUs ({', '.join(map(str, alone[:5]))}"
                                f"{', ...' if len(alone) > 5 else ''}) wait for nothing in iteration 1, and it is not "
                                f"a start vertex. Fix: add a dependency that reaches them, or mark it start: true")
    return problems


def unroll_iterations(graph: nx.DiGraph, iterations: int) -> nx.DiGraph:
    """The acyclic graph of vertex runs ``(name, k)`` for k = 1..iterations, per the semantics above.

    An edge u -> v gives (u, k) -> (v, k), or (u, k-1) -> (v, k) when it skips the
    first iteration (nothing for k = 1). Instances are not expanded: one node
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


MAX_GRAPH_BYTES = 2**30  # a node-link JSON graph file is at most 1 GiB


def save_workload(graph: nx.DiGraph, path: str | Path) -> None:
    """Write the graph as networkx node-link JSON (tuples and sets become lists)."""
    data = nx.node_link_data(graph, edges="edges")
    for node in data["nodes"]:
        for key, value in node.items():
            if isinstance(value, (frozenset, set)):
                node[key] = sorted(value)
            elif isinstance(value, tuple):
                node[key] = [list(g) if isinstance(g, tuple) else g for g in value]
    Path(path).write_text(json.dumps(data, indent=1))


def load_workload(path: str | Path, platform_xpus=None) -> nx.DiGraph:
    """Read a graph written by :func:`save_workload` (or by the user's own tools) and validate it.

    Accepts the edge list under ``edges`` or under ``links`` (older networkx).
    A file of format version 1 (hcsim before the parallel layout: no
    ``format_version``; a communication vertex has one group, its ``xpus``; edges
    have no ``wait``) is converted with version 1's rules: an edge between
    vertices that share an XPU waits per XPU, between vertices that share none
    it is a barrier. Equal ``xpus``, ``groups`` and ``spilled_xpus`` values are
    shared between vertices, so a graph over thousands of XPUs costs one tuple
    per distinct group.
    """
    from hcsim.config import read_text

    from hcsim.limits import MAX_GRAPH_VERTICES, check_limit

    text = read_text(path, MAX_GRAPH_BYTES, "a node-link JSON workload graph")
    try:
        data = json.loads(text)
    except RecursionError:
        raise WorkloadError(f"{path}: not a node-link workload graph: nested too deeply") from None
    except ValueError as err:
        raise WorkloadError(f"{path}: not a node-link workload graph: not JSON ({brief(str(err))}); write it as "
                            f"`hcsim workload export` does") from None
    key = "links" if isinstance(data, dict) and "edges" not in data and "links" in data else "edges"
    problems = _structure_problems(data, key)
    if problems:
        raise WorkloadError(problems[0].replace("WHERE", str(path)) if len(problems) == 1
                            else invalid(str(path), [p.replace("WHERE: ", "") for p in problems[:10]]))
    check_limit(len(data["nodes"]), MAX_GRAPH_VERTICES, "the workload graph's vertices", str(path),
                "a smaller graph")
    try:
        # multigraph=False: networkx builds a multigraph where the key is left out (its default), which no rule expects
        graph = nx.node_link_graph(data, directed=True, multigraph=False, edges=key)
    except (ValueError, KeyError, TypeError, AttributeError, nx.NetworkXError) as err:
        raise WorkloadError(f"{path}: not a node-link workload graph: {brief(str(err))}") from None
    version = graph.graph.get("format_version", 1)
    if version not in (1, FORMAT_VERSION):
        raise WorkloadError(f"{path}: workload graph format_version {version!r} is not one this hcsim reads "
                            f"(1 or {FORMAT_VERSION}); write it with this version's `hcsim workload export`")
    problems = _read_vertices(graph, version)
    if problems:
        raise WorkloadError(f"{path}: " + "; ".join(problems[:10]))
    for u, v, edge in graph.edges(data=True):
        edge.setdefault("skip_first_iteration", False)
        if version == 1:
            edge["wait"] = _version1_wait(graph.nodes[u], graph.nodes[v])
    graph.graph["format_version"] = FORMAT_VERSION
    try:
        validate_workload(graph, platform_xpus)
    except WorkloadError as err:
        raise WorkloadError(f"{path}: {err}") from err
    return graph


def _structure_problems(data, key: str) -> list[str]:
    """The problems of parsed node-link JSON `data` that networkx would report as raw Python errors (or not at
    all: an edge to a missing vertex adds that vertex), each as ``WHERE: ...``; the first few only."""
    form = ("; a workload graph is node-link JSON: {\"graph\": {...}, \"nodes\": [{\"id\": ..., ...}], "
            "\"edges\": [{\"source\": ..., \"target\": ...}]}")
    if not isinstance(data, dict):
        return [f"WHERE: not a node-link workload graph: expected a JSON object, got a {type(data).__name__}{form}"]
    problems = []
    nodes, edges, graph = data.get("nodes"), data.get(key, []), data.get("graph", {})
    if not isinstance(nodes, list):
        problems.append(f"WHERE: nodes: expected a list of vertices, got {brief(nodes)}{form}")
        nodes = []
    if not isinstance(edges, list):
        problems.append(f"WHERE: {key}: expected a list of edges, got {brief(edges)}{form}")
        edges = []
    if not isinstance(graph, dict):
        problems.append(f"WHERE: graph: expected an object of graph attributes, got {brief(graph)}")
    for flag, value in (("directed", True), ("multigraph", False)):  # networkx would build another kind of graph
        if data.get(flag, value) is not value:
            problems.append(f"WHERE: {flag}: must be {str(value).lower()} or left out (a workload graph is "
                            f"{'' if value else 'not '}a {flag} graph), got {brief(data[flag])}")
    ids = set()
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or "id" not in node:
            problems.append(f"WHERE: nodes[{i}]: expected an object with an \"id\", got {brief(node)}")
        elif not isinstance(node["id"], (str, int)) or isinstance(node["id"], bool):
            problems.append(f"WHERE: nodes[{i}]: id: expected a string or an integer, got {brief(node['id'])}")
        elif node["id"] in ids:
            problems.append(f"WHERE: nodes[{i}]: id {brief(node['id'])} is used by an earlier vertex; give each "
                            f"vertex its own id")
        else:
            ids.add(node["id"])
        if len(problems) >= 10:
            return problems
    for i, edge in enumerate(edges):
        if not isinstance(edge, dict) or "source" not in edge or "target" not in edge:
            problems.append(f"WHERE: {key}[{i}]: expected an object with \"source\" and \"target\", got {brief(edge)}")
            continue
        for end in ("source", "target"):
            vertex = edge[end]
            if not isinstance(vertex, (str, int)) or isinstance(vertex, bool) or vertex not in ids:
                problems.append(f"WHERE: {key}[{i}]: {end}: no vertex {brief(vertex)} in nodes; an edge joins two "
                                f"vertices of the graph")
        if len(problems) >= 10:
            break
    return problems


def graph_problems(graph: nx.DiGraph) -> list[str]:
    """The problems of a workload's graph attributes (module docstring: Graph attributes): wrongly typed,
    negative or non-finite values that would fail or mislead a report after the whole run."""
    attributes, problems = graph.graph, []

    def positive(key: str, kind, optional: bool = True) -> None:
        if key not in attributes and optional:
            return
        value = attributes.get(key)
        if isinstance(value, bool) or not isinstance(value, kind) or not (value > 0 and value != float("inf")):
            what = "an integer >= 1" if kind is int else "a finite number > 0"
            problems.append(f"graph: {key}: expected {what}, got {brief(value)}")

    if not isinstance(attributes.get("name", ""), str):
        problems.append(f"graph: name: expected a string, got {brief(attributes['name'])}")
    if attributes.get("precision", "fp32") not in PRECISIONS:
        problems.append(f"graph: precision: {brief(attributes['precision'])} is not one of {', '.join(PRECISIONS)}")
    positive("samples_per_iteration", int)
    positive("global_samples", int)
    positive("tokens_per_sample", int)
    positive("model_flops", (int, float))
    if "layout" in attributes:
        layout = attributes["layout"]
        sizes = layout.get("sizes") if isinstance(layout, dict) else None
        order = layout.get("order") if isinstance(layout, dict) else None
        if not (isinstance(sizes, dict) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                for v in sizes.values())
                and isinstance(order, (list, tuple)) and all(isinstance(axis, str) for axis in order)
                and sorted(order) == sorted(sizes)):
            problems.append(f"graph: layout: expected {{\"sizes\": {{\"tp\": 1, \"dp\": 8, ...}}, \"order\": "
                            f"[\"tp\", \"dp\", ...]}} (sizes integers >= 1, order naming each once), got "
                            f"{brief(layout)}")
    return problems


def _version1_wait(before: dict, after: dict) -> str:
    """The rule a version-1 edge meant: a barrier between vertices on disjoint XPUs, else per XPU; a
    collective that only some of its members' XPUs feed waits for its group (version 1 started the
    others at t = 0, which is the defect version 2 removes)."""
    ours, theirs = set(before["xpus"]), set(after["xpus"])
    if ours.isdisjoint(theirs):
        return "all"
    partial = not theirs <= ours
    return "group" if partial and "comm" in (before.get("kind"), after.get("kind")) else "xpu"


def _read_vertices(graph: nx.DiGraph, version: int) -> list[str]:
    """Turn the lists of a JSON graph into shared tuples and frozensets; convert version-1 vertices."""
    shared: dict = {}

    def names(name, key, value) -> tuple | None:
        if isinstance(value, str) or not isinstance(value, (list, tuple)) \
                or not all(isinstance(x, str) for x in value):
            problems.append(f"vertex {name!r}: {key} must be a list of XPU names, got {str(value)[:80]}")
            return None
        return shared.setdefault(("t", tuple(value)), tuple(value))

    problems: list[str] = []
    for name, node in graph.nodes(data=True):
        node.setdefault("start", False)
        if node.get("kind") == "comm":
            if version > 1 and "xpus" in node and not (isinstance(node["xpus"], list)
                                                       and all(isinstance(x, str) for x in node["xpus"])):
                problems.append(f"vertex {name!r}: xpus: a communication vertex's xpus are its groups' members "
                                f"(derived); leave it out, or give a list of XPU names, got {brief(node['xpus'])}")
                continue
            groups = node.get("groups") if version > 1 else [node.get("xpus") or ()]
            if not isinstance(groups, list) or not groups:
                problems.append(f"vertex {name!r}: groups must be a list of lists of XPU names, got {str(groups)[:80]}")
                continue
            members = tuple(names(name, "groups", g) or () for g in groups)
            node["groups"] = shared.setdefault(("g", members), members)
            node["xpus"] = shared.setdefault(("t", _members(members)), _members(members))
            continue
        node["xpus"] = names(name, "xpus", node.get("xpus") or ()) or ()
        if node.get("kind") == "compute":
            spilled = names(name, "spilled_xpus", node.get("spilled_xpus") or ()) or ()
            node["spilled_xpus"] = shared.setdefault(("s", frozenset(spilled)), frozenset(spilled))
    return problems
