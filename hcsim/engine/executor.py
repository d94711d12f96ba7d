"""The event-driven executor of paper Fig. 5, on SimGrid.

All start vertices enter the running set; when a vertex instance completes,
each successor instance whose dependencies are met for its next run starts.
Compute instances are executions on their XPU (FLOPs / FLOP/s, paper eq. 1, or
the vertex's measured ``duration``: an execution of duration x FLOP/s)
beside a memory access (a transfer from the memory where the data lives to
the XPU, latency + size/bandwidth, paper eq. 2); communication instances are
collective algorithms made of transfers (:mod:`hcsim.engine.collectives`).

Memory forms (paper Fig. 3, DESIGN.md): local data -> compute alongside the
HBM access; spilled data on a coherent system -> compute alongside the access
to extended memory (bound by the slower); spilled data without coherence ->
copy from extended memory first, then compute alongside the HBM access.

All mutable state of a run lives in one Executor; ``run()`` returns plain data.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import networkx as nx

from hcsim.engine.options import COMM_KIND, RunOptions, RunResult
from hcsim.engine.backend import Backend
from hcsim.engine.collectives import FlowPhase, get_algorithm, server_groups
from hcsim.engine.trace import TraceRecorder
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import route_bandwidth, route_latency
from hcsim.workload.graph import first_iteration_order

__all__ = ["Executor", "memory_form", "form_transfers", "check_link_loads"]

log = logging.getLogger(__name__)


class _Edge:
    """One dependency as the executor follows it: the vertex at the other end, the skip flag, the wait rule."""

    __slots__ = ("vertex", "skip", "wait", "same_rank")

    def __init__(self, vertex: "_Vertex", skip: int, wait: str, same_rank: bool):
        self.vertex, self.skip, self.wait = vertex, skip, wait
        self.same_rank = same_rank  # an xpu wait between vertices on the same XPUs: unit r waits for unit r


class _Vertex:
    """A workload vertex and its units (one per XPU: a compute instance or a collective's member)."""

    __slots__ = ("name", "index", "kind", "xpus", "pos", "data", "preds", "succs", "offset", "required", "groups",
                 "group_of", "group_offsets", "algorithms", "group_counts", "on_xpu", "recompute", "comm_kind")

    def __init__(self, name, index, data, pos, offset, xpus):
        self.name, self.index, self.data = name, index, data
        self.kind = data["kind"]
        self.on_xpu = self.kind == "compute" and data.get("host") != "cpu"  # its instances keep their XPU busy
        self.recompute = data.get("phase") == "recompute"
        self.comm_kind = COMM_KIND.get(data.get("phase"), "other")  # of a communication vertex, for the breakdown
        self.xpus = xpus  # data["xpus"], or an equal tuple: one per distinct value (caches key on its id)
        self.pos = pos  # xpu -> unit index, shared by vertices with the same xpus
        self.offset = offset
        self.preds: list[_Edge] = []
        self.succs: list[_Edge] = []
        self.required = None  # (run 1, later runs) when every unit waits for the same count
        self.group_counts: dict = {}  # (pred index, group) -> units of pred in the group (wait "group")

    def group(self, unit: int) -> tuple[str, ...]:
        """The group (XPU names) of a communication vertex's unit."""
        return self.groups[self.group_of[unit]]

    def group_span(self, unit: int) -> tuple[int, int]:
        """The units [first, end) of the group of a communication vertex's unit."""
        group = self.group_of[unit]
        first = self.group_offsets[group]
        return first, first + len(self.groups[group])


@dataclass(slots=True)
class _Clock:
    """What one XPU is doing, for the breakdown: open compute instances and collectives, and time so far."""

    computing: int = 0
    communicating: int = 0
    waiting: int = 0  # collectives this XPU has joined whose peers have not all arrived
    since: float = 0.0
    busy: float = 0.0  # s with a compute instance open (computing or stalled on memory)
    comm: float = 0.0  # s in a collective whose group has all arrived, with no compute open
    idle: float = 0.0  # s with neither: waiting for a dependency, for peers, or a pipeline bubble
    idle_peers: float = 0.0  # the part of idle spent in a collective waiting for its peers
    open_kinds: list = field(default_factory=list)  # the kinds of the open collectives, in the order they opened
    comm_by: dict = field(default_factory=dict)  # kind -> s of comm, each span to the earliest open collective's

    def advance(self, now: float, computing: int = 0, communicating: int = 0, kind: str = "other",
                waiting: int = 0) -> None:
        """Account the time up to `now`, then count instances in (+1) or out (-1) (a collective of `kind`)."""
        span = now - self.since
        if self.computing:
            self.busy += span
        elif self.communicating:
            self.comm += span
            first = self.open_kinds[0]
            self.comm_by[first] = self.comm_by.get(first, 0.0) + span
        else:
            self.idle += span
            if self.waiting:
                self.idle_peers += span
        self.since = now
        self.computing += computing
        self.communicating += communicating
        self.waiting += waiting
        if communicating > 0:
            self.open_kinds.append(kind)
        elif communicating < 0:
            self.open_kinds.remove(kind)

    def snapshot(self) -> dict[str, float]:
        return {"busy": self.busy, "comm": self.comm, "idle": self.idle, "idle_peers": self.idle_peers,
                **{f"comm_{kind}": seconds for kind, seconds in self.comm_by.items()}}


class Executor:
    """Runs a workload graph on a compiled platform for some iterations."""

    def __init__(self, platform: nx.Graph, workload: nx.DiGraph, routes: dict, backend: Backend, options: RunOptions,
                 progress=None, order=None):
        """`progress`, if given, is called with the number of vertex runs done since its last call. `order`, if
        given, is `workload`'s vertices in :func:`_stable_order`'s order (validate_workload returns it), not
        computed again."""
        self.progress = progress
        self.platform, self.workload, self.routes = platform, workload, routes
        self.nodes = dict(platform.nodes(data=True))  # name -> attributes: a plain dict is faster per look-up
        self.backend, self.options = backend, options
        self.precision = workload.graph.get("precision", "fp32")
        self.fidelity_used: dict[str, str] = {}
        self._algorithm_cache: dict = {}
        # (collective, algorithm name, bytes, chunks, groups) -> a vertex's groups, group_of, group_offsets,
        # algorithms and fidelities: read-only, shared by alike vertices
        self._collective_cache: dict = {}
        self._server_cache: dict = {}
        self._closed_forms: dict = {}  # (algorithm id, group) -> ([(XPU pair, bytes)], seconds) of an analytic one
        self._path_cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._link_factors: dict[tuple[str, str], object] = {}  # (src, dst) -> LinkFactors (roofline)
        self._call_latency: dict[tuple[int, int], float] = {}  # (vertex, group) -> s per call (roofline)
        self.vertices = self._index_vertices(order)
        self.total_instances = sum(len(v.xpus) for v in self.vertices)
        self.done_runs = [0] * self.total_instances
        self.running = [False] * self.total_instances
        self.arrivals: dict[tuple[int, int], int] = defaultdict(int)
        self.completed_in_run: dict[int, int] = defaultdict(int)
        self.iteration_ends: list[float] = []
        # per XPU: compute, memory stall, and the part of compute that recomputes activations (s)
        self.busy: dict[str, list[float]] = {x: [0.0, 0.0, 0.0] for xpus in dict.fromkeys(v.xpus for v in self.vertices)
                                             for x in xpus}  # each distinct xpus tuple once, in vertex order
        self.clocks: dict[str, _Clock] = {x: _Clock() for x in self.busy}
        self.first_iteration: dict[str, tuple] | None = None  # per XPU at the end of iteration 1
        self.trace = TraceRecorder(options.trace_xpus, options.trace_iterations) if options.trace_xpus else None
        self.collective_state: dict[tuple[int, int, int], "_CollectiveRun"] = {}
        self.representative = self._representatives() if options.xpu_sampling == "representative" else {}
        if self.trace is not None:
            self.trace.follow(self.representative, list(self.busy))
        self.followed: dict[tuple[int, str, int], tuple[float, float, float]] = {}  # (vertex, rep, run) ->
        # (compute s, stall s, s it took): the representative's run
        self.following: dict[tuple[int, str, int], list[tuple[int, float]]] = defaultdict(list)
        self.immediate: deque = deque()
        self.draining = False
        self.pair_bytes: dict[tuple[str, str], float] = defaultdict(float)  # (src, dst) -> bytes moved

    # ---- set-up -------------------------------------------------------------------------------------------

    def _index_vertices(self, order=None) -> list[_Vertex]:
        graph = self.workload
        if order is None or len(order) != len(graph):
            order = _stable_order(graph)
        positions: dict[tuple, tuple] = {}  # xpus -> (the first equal tuple, xpu -> unit index), shared
        vertices, by_name, offset = [], {}, 0
        nodes = graph._node  # networkx's own attribute dicts: no view per vertex
        for index, name in enumerate(order):
            data = nodes[name]
            shared = positions.get(data["xpus"])
            if shared is None:
                xpus = data["xpus"]
                shared = positions[xpus] = (xpus, {x: i for i, x in enumerate(xpus)})
            vertex = _Vertex(name, index, data, shared[1], offset, shared[0])
            offset += len(data["xpus"])
            vertices.append(vertex)
            by_name[name] = vertex
        for u, edges in graph._succ.items():  # graph.edges(data=True), without its views
            before = by_name[u]
            for v, data in edges.items():
                after = by_name[v]
                skip = int(bool(data["skip_first_iteration"]))
                same_rank = data["wait"] == "xpu" and before.pos is after.pos
                after.preds.append(_Edge(before, skip, data["wait"], same_rank))
                before.succs.append(_Edge(after, skip, data["wait"], same_rank))
        for vertex in vertices:
            if len(vertex.succs) > 1:
                vertex.succs.sort(key=lambda edge: edge.vertex.index)
            if vertex.kind == "comm":
                self._prepare_collective(vertex)
        for vertex in vertices:
            vertex.required = self._uniform_requirement(vertex)
        return vertices

    def _uniform_requirement(self, vertex: _Vertex) -> tuple[int, int] | None:
        """(run 1, later runs) predecessor completions, when every unit of `vertex` needs the same."""
        counts = [0, 0]
        for edge in vertex.preds:
            pred = edge.vertex
            if edge.wait == "all":
                n = len(pred.xpus)
            elif pred.pos is vertex.pos or pred.pos.keys() == vertex.pos.keys():
                n = 1 if edge.wait == "xpu" else None
                if edge.wait == "group":
                    sizes = {len(g) for g in (vertex.groups if vertex.kind == "comm" else pred.groups)}
                    n = sizes.pop() if len(sizes) == 1 else None
            else:
                n = None
            if n is None:
                return None
            counts[1] += n
            if not edge.skip:
                counts[0] += n
        return counts[0], counts[1]

    def _prepare_collective(self, vertex: _Vertex) -> None:
        data = vertex.data
        collective = data["collective"]
        name = data.get("algorithm") or ("direct" if collective == "p2p" else None)
        alike = (collective, name, data["bytes"], data.get("chunks"), data["groups"])
        known = self._collective_cache.get(alike)
        if known is not None:  # alike vertices (one per layer and micro-batch) share their groups' set-up
            vertex.groups, vertex.group_of, vertex.group_offsets, vertex.algorithms, fidelity = known
            self.fidelity_used[vertex.name] = fidelity
            return
        vertex.groups = data["groups"]
        vertex.group_of, vertex.group_offsets, vertex.algorithms = [], [], []
        fidelities = set()
        for g, group in enumerate(vertex.groups):
            vertex.group_offsets.append(len(vertex.group_of))
            vertex.group_of += [g] * len(group)
            servers, shape = self._servers(group)
            key = (collective, name, len(group), data["bytes"], shape, data.get("chunks"))
            if key not in self._algorithm_cache:  # alike groups share one algorithm and its flow phases
                algorithm = get_algorithm(collective, name, len(group), data["bytes"], servers, data.get("chunks"))
                fidelity = self.options.collective_model
                if fidelity == "auto":
                    fidelity = "step" if len(group) <= self.options.step_limit else "flow"
                phases = algorithm.flow_phases() if fidelity == "flow" else None
                if fidelity == "flow" and phases is None:  # no aggregated model: the step schedule stands in
                    fidelity = "step"
                self._algorithm_cache[key] = (algorithm, fidelity, phases)
            algorithm, fidelity, phases = self._algorithm_cache[key]
            if self.options.local_collectives == "analytic" and len(servers) == 1:
                analytic = phases or algorithm.flow_phases()
                if analytic is not None:  # one delay: the flow model's closed form on uncontended routes
                    key = (id(algorithm), group)
                    if key not in self._closed_forms:  # its traffic as (XPU pair, bytes), and its seconds
                        traffic = [((group[s], group[d]), size)
                                   for phase in analytic for (s, d), size in phase.transfers]
                        self._closed_forms[key] = (traffic, self._closed_form(group, analytic))
                    fidelity, phases = "analytic", self._closed_forms[key]
            vertex.algorithms.append((algorithm, fidelity, phases))
            fidelities.add(fidelity)
        self.fidelity_used[vertex.name] = "/".join(sorted(fidelities))
        self._collective_cache[alike] = (vertex.groups, vertex.group_of, vertex.group_offsets, vertex.algorithms,
                                       self.fidelity_used[vertex.name])

    def _servers(self, group: tuple[str, ...]) -> tuple[list[list[int]], tuple]:
        """server_groups of a group and the same as a hashable key; groups are shared tuples, so each
        distinct one is computed once."""
        key = id(group)
        if key not in self._server_cache:
            servers = server_groups(self.platform, group)
            self._server_cache[key] = (group, servers, tuple(map(tuple, servers)))  # keep group alive: ids stay unique
        return self._server_cache[key][1:]

    def _closed_form(self, group: tuple[str, ...], phases: list[FlowPhase]) -> float:
        """Seconds a collective's flow phases take over `group` when no other traffic shares their links."""
        lanes: dict[int, float] = defaultdict(float)
        for phase in phases:
            if phase.transfers:
                pairs = [(group[s], group[d]) for (s, d), _ in phase.transfers]
                durations = [self.access_time(src, dst, self.wire_bytes(src, dst, size))
                             for (src, dst), (_, size) in zip(pairs, phase.transfers)]
                lanes[phase.lane] += phase_time(phase, durations, [self.latency(*pair) for pair in pairs])
        return max(lanes.values(), default=0.0)

    # ---- dependencies -------------------------------------------------------------------------------------

    def _required(self, vertex: _Vertex, rank: int, run: int) -> int:
        """How many predecessor completions unit `rank` of `vertex` needs for `run`."""
        if vertex.required is not None:
            return vertex.required[run > 1]
        xpu = vertex.xpus[rank]
        count = 0
        for edge in vertex.preds:
            if run == 1 and edge.skip:
                continue
            pred = edge.vertex
            if edge.wait == "all":
                count += len(pred.xpus)
            elif edge.wait == "xpu":
                count += xpu in pred.pos
            elif vertex.kind == "comm":  # a collective member waits for pred's units in its group
                count += self._group_count(vertex, pred, vertex.group_of[rank])
            else:  # a compute waits for its XPU's whole group of pred
                count += len(pred.group(pred.pos[xpu])) if xpu in pred.pos else 0
        return count

    def _group_count(self, vertex: _Vertex, pred: _Vertex, group: int) -> int:
        key = (pred.index, group)
        if key not in vertex.group_counts:
            vertex.group_counts[key] = sum(x in pred.pos for x in vertex.groups[group])
        return vertex.group_counts[key]

    def _waiting_units(self, edge: _Edge, pred: _Vertex, xpu: str):
        """The units of edge.vertex that a completion of `pred`'s unit on `xpu` counts for."""
        succ = edge.vertex
        if edge.wait == "all":
            return range(len(succ.xpus))
        if edge.wait == "xpu":
            return (succ.pos[xpu],) if xpu in succ.pos else ()
        if succ.kind == "comm":
            return range(*succ.group_span(succ.pos[xpu])) if xpu in succ.pos else ()
        return [succ.pos[x] for x in pred.group(pred.pos[xpu]) if x in succ.pos]

    # The methods below run once per unit and run: they read the clock once per event and follow a same-rank
    # successor directly, on purpose (hot path), in the order of events the rules give.
    def _notify(self, vertex: _Vertex, rank: int, run: int) -> None:
        key = (vertex.offset + rank, run)
        count = self.arrivals[key] + 1
        self.arrivals[key] = count
        if count == self._required(vertex, rank, run):
            self._try_start(vertex, rank)

    def _try_start(self, vertex: _Vertex, rank: int) -> None:
        instance = vertex.offset + rank
        if self.running[instance]:
            return
        run = self.done_runs[instance] + 1
        if run > self.options.iterations:
            return
        needed = self._required(vertex, rank, run)
        if needed and self.arrivals.get((instance, run), 0) < needed:
            return
        self.arrivals.pop((instance, run), None)
        self.running[instance] = True
        xpu = vertex.xpus[rank]
        if vertex.kind == "compute":
            data = vertex.data
            now = self.backend.now()
            if vertex.on_xpu:  # else the XPU waits (idle) while its host CPU computes
                self.clocks[xpu].advance(now, computing=1)
            form = memory_form(self.nodes, data, xpu, self.options.coherent)
            self._count_reads(vertex, xpu, form)
            if xpu in self.representative and vertex.on_xpu and not data.get("move"):
                self._follow(vertex, rank, run, now)  # offload traffic and CPU steps run on every XPU: they share CPUs
            else:
                self._start_compute(vertex, rank, run, form)
        else:
            self._rank_ready(vertex, rank, run)

    def _complete(self, vertex: _Vertex, rank: int, run: int, start: float) -> None:
        instance = vertex.offset + rank
        self.running[instance] = False
        self.done_runs[instance] = run
        now = self.backend.now()
        xpu = vertex.xpus[rank]
        if vertex.on_xpu:
            self.clocks[xpu].advance(now, computing=-1)
        if self.trace is not None:
            self.trace.vertex(run, xpu, vertex.name, vertex.kind, start, now)
        done = self.completed_in_run[run] + 1
        self.completed_in_run[run] = done
        if self.progress is not None and done % 4096 == 0:
            self.progress(4096)
        if done == self.total_instances:
            self._iteration_ended(now)
        iterations = self.options.iterations
        for edge in vertex.succs:
            target = run + edge.skip
            if target > iterations:
                continue
            if edge.same_rank:
                self._notify(edge.vertex, rank, target)
            else:
                succ = edge.vertex
                for unit in self._waiting_units(edge, vertex, xpu):
                    self._notify(succ, unit, target)
        if run < iterations:
            self._try_start(vertex, rank)

    # ---- where the time goes ------------------------------------------------------------------------------

    def _iteration_ended(self, now: float) -> None:
        self.iteration_ends.append(now)
        if len(self.iteration_ends) == 1:
            self.first_iteration = {x: self._times(x, now) for x in self.clocks}

    def _before_window(self, xpu: str, start: float, compute: float, stall: float, recompute: bool) -> None:
        """A compute instance ending now that began before the measured window (the first iteration's end):
        its compute and stall are counted in proportion to its time on each side, the part before the window
        given to the first iteration (core/executor.cpp: WorkloadRun::before_window)."""
        if not self.iteration_ends or start >= self.iteration_ends[0]:
            return
        now = self.backend.now()
        share = (self.iteration_ends[0] - start) / (now - start)
        busy, comm, idle, first_compute, first_stall, parts = self.first_iteration[xpu]
        parts = {**parts, "recompute": parts["recompute"] + (compute * share if recompute else 0.0)}
        self.first_iteration[xpu] = (busy, comm, idle, first_compute + compute * share, first_stall + stall * share,
                                     parts)

    def _times(self, xpu: str, now: float) -> tuple[float, float, float, float, float, dict[str, float]]:
        clock = self.clocks[xpu]
        clock.advance(now)
        return (clock.busy, clock.comm, clock.idle, *self.busy[xpu][:2],
                {**clock.snapshot(), "recompute": self.busy[xpu][2]})

    def xpu_times(self) -> dict[str, dict[str, float]]:
        """Per XPU, seconds per iteration over the measured iterations (2.. when there are several, else 1):
        compute, memory stall, exposed communication and idle, which add up to the iteration time; and their
        parts: ``comm_KIND_s`` per kind of communication (:data:`COMM_KIND`: tp, cp, pp, dp, ep, offload,
        other; they add up to comm_s), ``idle_peers_s`` (waiting in a collective for its peers) and
        ``idle_bubble_s`` (the rest of idle_s: waiting for a dependency, the pipeline bubble), and
        ``recompute_s`` (the part of compute_s that recomputes activations)."""
        ends = self.iteration_ends
        measured = len(ends) - 1 if len(ends) > 1 else 1
        table = {}
        for xpu in self.clocks:
            busy, comm, idle, compute, stall, parts = self._times(xpu, ends[-1])
            if len(ends) > 1:
                first = self.first_iteration[xpu]
                busy, comm, idle, compute = busy - first[0], comm - first[1], idle - first[2], compute - first[3]
                parts = {key: value - first[5].get(key, 0.0) for key, value in parts.items()}
            compute = min(compute, busy)  # instances overlapping on one XPU: compute no longer than busy
            table[xpu] = {"compute_s": compute / measured, "memory_stall_s": (busy - compute) / measured,
                          "comm_s": comm / measured, "idle_s": idle / measured,
                          "idle_peers_s": parts["idle_peers"] / measured,
                          "idle_bubble_s": (idle - parts["idle_peers"]) / measured,
                          "recompute_s": min(parts["recompute"], compute) / measured,
                          **{f"{key}_s": value / measured for key, value in parts.items() if key.startswith("comm_")}}
        return table

    # ---- compute instances --------------------------------------------------------------------------------

    def _start_compute(self, vertex: _Vertex, rank: int, run: int, form: tuple[str | None, str]) -> None:
        data, xpu = vertex.data, vertex.xpus[rank]
        node = self.nodes[xpu]
        start = self.backend.now()
        local = node["local_memory"]
        size = data["memory_bytes"]
        flops, compute_time = self.compute_cost(xpu, data)
        tracing = self.trace is not None and self.trace.wants(xpu, run)

        def finish():
            elapsed = self.backend.now() - start
            stall = max(0.0, elapsed - compute_time)
            busy = self.busy[xpu]
            busy[0] += compute_time
            busy[1] += stall
            if vertex.recompute:
                busy[2] += compute_time
            self._before_window(xpu, start, compute_time, stall, vertex.recompute)
            self._complete(vertex, rank, run, start)
            if self.representative:
                self._release_followers(vertex, xpu, run, compute_time, stall, elapsed)

        def compute_beside(memory, then):
            if memory == local and self.options.local_access == "analytic" and flops > 0 and size > 0:
                if compute_time >= self.access_time(local, xpu, size):
                    self.backend.execute(xpu, flops, then)
                else:
                    self._transfer(local, xpu, size, then, tracing, run, f"{vertex.name}.read")
                return
            parts = [p for p in (flops > 0, size > 0) if p]
            if not parts:
                then()
                return
            pending = [len(parts)]

            def part_done():
                pending[0] -= 1
                if pending[0] == 0:
                    then()

            if flops > 0:
                self.backend.execute(xpu, flops, part_done)
            if size > 0:
                self._transfer(memory, xpu, size, part_done, tracing, run, f"{vertex.name}.read")

        copy_from, memory = form
        if data.get("move"):  # an offload copy: memory_bytes from copy_from to memory, nothing computed
            self._transfer(copy_from, memory, size, finish, tracing, run, f"{vertex.name}.move")
        elif data.get("host") == "cpu":  # on the CPU that owns the XPU's host memory, beside reading it
            cpu = self.nodes[memory]["owner"]
            pending = [2]

            def part():  # not the XPU's compute: its clock shows the wait as idle
                pending[0] -= 1
                if not pending[0]:
                    self._complete(vertex, rank, run, start)

            self.backend.execute(cpu, flops, part)
            if size > 0:
                self._transfer(memory, cpu, size, part, tracing, run, f"{vertex.name}.read")
            else:
                part()
        elif copy_from is not None and size > 0:
            self._transfer(copy_from, xpu, size, lambda: compute_beside(memory, finish), tracing, run,
                           f"{vertex.name}.copy")
        else:
            compute_beside(memory, finish)

    def compute_cost(self, xpu: str, data: dict) -> tuple[float, float]:
        """(FLOPs the host executes, compute time in s) of compute vertex `data` (its attributes) on `xpu`.

        The time is FLOPs / peak FLOP/s at the run's precision, the vertex's measured ``duration`` (on any
        device), or the kernel model's (roofline), times the XPU's ``slowdown`` (a straggler's factor,
        :mod:`hcsim.platform.topology`; not on an offloaded CPU step or a move, which are not its compute);
        the FLOPs are what takes that time at the host's speed (SimGrid's host speed is the peak FLOP/s,
        :mod:`hcsim.platform.compile`). The one rule of both engines (:mod:`hcsim.engine.core.workload`)."""
        node = self.nodes[xpu]
        speed = peak_flops(node, self.precision)
        duration = data.get("duration")  # a measured time replaces FLOPs / FLOP/s, on any device
        flops = data["flops"] if duration is None else duration * speed
        compute_time = flops / speed
        model = self.options.compute_model
        if model is not None and duration is None and data.get("ops") and node["kind"] == "xpu":  # roofline
            # FP8 training runs all but its GEMMs in BF16: the kernel model takes the BF16 peak (hcsim.workload.ops)
            kernel_peak = peak_flops(node, "bf16") if self.precision == "fp8" else speed
            compute_time = model.time(data["ops"], node["device"], kernel_peak, self._path(node["local_memory"], xpu)[1])
            flops = compute_time * speed
        slowdown = node.get("slowdown", 1.0)
        if slowdown != 1.0 and data.get("host") != "cpu" and not data.get("move"):
            flops, compute_time = flops * slowdown, compute_time * slowdown
        return flops, compute_time

    def _count_reads(self, vertex: _Vertex, xpu: str, form: tuple[str | None, str]) -> None:
        """Add the memory bytes this instance moves (analytic reads and representative XPUs' followers
        included) to the link-load accounting."""
        size = vertex.data["memory_bytes"]
        if size <= 0:
            return
        for pair in form_transfers(self.nodes, vertex.data, xpu, form):
            self.pair_bytes[pair] += size

    def link_bytes(self) -> dict[tuple[str, str], float]:
        """Bytes through each link direction (u, v), from the pairs' routes."""
        loads: dict[tuple[str, str], float] = defaultdict(float)
        for pair, size in self.pair_bytes.items():
            route = self.routes[pair]
            for link in zip(route, route[1:]):
                loads[link] += size
        return dict(loads)

    def _transfer(self, src: str, dst: str, size: float, then, tracing: bool, run: int, label: str) -> None:
        if not tracing:
            self.backend.transfer(src, dst, size, then)
            return
        start = self.backend.now()

        def done():
            self.trace.transfer(run, src, dst, label, size, start, self.backend.now())
            then()

        self.backend.transfer(src, dst, size, done)

    # ---- collectives --------------------------------------------------------------------------------------

    def _rank_ready(self, vertex: _Vertex, unit: int, run: int) -> None:
        group = vertex.group_of[unit]
        key = (vertex.index, group, run)
        state = self.collective_state.get(key)
        if state is None:
            state = self.collective_state[key] = _CollectiveRun(self, vertex, group, run)
        state.ready(unit - vertex.group_offsets[group])

    def collective_done(self, vertex: _Vertex, group: int, run: int) -> None:
        self.collective_state.pop((vertex.index, group, run), None)

    # ---- representative XPUs ------------------------------------------------------------------------------

    def _representatives(self) -> dict[str, str]:
        """Follower XPU -> its representative: the first XPU of each class of alike XPUs.

        Alike: same device, speed and slowdown (a straggler's), the same compute vertices, the same memory paths and spilled
        vertices, and the same collective paths in and out (so an XPU whose incoming ring transfer
        shares its memory link is not represented by one whose transfer arrives over the XPU switch).
        An XPU whose memory traffic could slow other traffic down, or be slowed down by it
        (:meth:`_shared_memory_xpus`), is alike no other: it is simulated, so a follower's dropped
        traffic never shares a link with anything (the mode is exact, not an approximation)."""
        compute = [v for v in self.vertices if v.kind == "compute"]
        nodes = self.nodes
        traffic: dict[str, set] = defaultdict(set)
        collective_links: set[tuple[str, str]] = set()  # link directions that collective traffic crosses
        seen = set()  # (algorithm, group) ids: vertices share both (one per layer and micro-batch, alike)
        for vertex in self.vertices:
            if vertex.kind == "comm":
                for group, (algorithm, _, _) in zip(vertex.groups, vertex.algorithms):
                    if (id(algorithm), id(group)) in seen:
                        continue
                    seen.add((id(algorithm), id(group)))
                    for s, d in algorithm.pairs():
                        src, dst = group[s], group[d]
                        traffic[src].add(("out", self._path(src, dst)))
                        traffic[dst].add(("in", self._path(src, dst)))
                        route = self.routes[src, dst]
                        collective_links.update(zip(route, route[1:]))
        shared = self._shared_memory_xpus(collective_links)
        placements = list({(id(v.xpus), id(v.data["spilled_xpus"])): (v.pos, v.data["spilled_xpus"])
                           for v in compute}.values())  # vertices share these: test each distinct pair once
        first: dict[tuple, str] = {}
        followers = {}
        for xpu in dict.fromkeys(x for v in compute for x in v.xpus):
            node = nodes[xpu]
            paths = tuple(self._path(node[key], xpu) if (node[key], xpu) in self.routes else None
                          for key in ("local_memory", "extended_memory"))
            runs = tuple((xpu in pos, xpu in spilled) for pos, spilled in placements)
            key = (node["device"], peak_flops(node, self.precision), node.get("slowdown", 1.0), paths, tuple(sorted(traffic[xpu])), runs,
                   xpu if xpu in shared else None)
            rep = first.setdefault(key, xpu)
            if rep != xpu:
                followers[xpu] = rep
        return followers

    def _shared_memory_xpus(self, collective_links: set[tuple[str, str]]) -> set[str]:
        """The XPUs whose followed memory traffic (the reads and copies of their compute vertices) crosses a
        link direction that other traffic may need at the same time: one that collective traffic
        (`collective_links`), an offload copy or a CPU step also crosses, or one whose memory users' routes
        could together carry more than its bandwidth (two DGX GPUs spilling over one PCIe uplink). A
        follower's memory traffic is not simulated; on every other link it has no effect on anyone (max-min
        sharing never saturates a link whose flows are bounded elsewhere to less than its bandwidth, as four
        XPUs' 128 GB/s PCIe links under the paper's 512 GB/s CPU link), and it takes its representative's
        time. Each XPU computes one vertex at a time, so it has one memory flow at a time, at most its
        route's bottleneck bandwidth."""
        nodes, routes, edges = self.nodes, self.routes, self.platform.edges

        def links(pair):
            route = routes.get(pair, ())
            return zip(route, route[1:])

        always = set(collective_links)  # link directions of traffic that runs on every XPU
        users: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)  # link -> {XPU: its flow's bound}
        forms = set()
        for vertex in self.vertices:
            data = vertex.data
            if vertex.kind != "compute" or data["memory_bytes"] <= 0:
                continue
            key = (id(vertex.xpus), id(data["spilled_xpus"]), data.get("offload"), data.get("move"), data.get("host"))
            if key in forms:  # vertices share these: each distinct placement once
                continue
            forms.add(key)
            followed = vertex.on_xpu and not data.get("move")
            for xpu in vertex.xpus:
                for pair in form_transfers(nodes, data, xpu, memory_form(nodes, data, xpu, self.options.coherent)):
                    if not followed:
                        always.update(links(pair))
                        continue
                    if pair not in routes:
                        continue
                    bound = self._path(*pair)[1]
                    for link in links(pair):
                        flows = users[link]
                        flows[xpu] = max(flows.get(xpu, 0.0), bound)
        shared = set()
        for link, flows in users.items():
            if link in always or (len(flows) > 1 and sum(flows.values()) > edges[link]["bandwidth"] * (1 + 1e-12)):
                shared.update(flows)
        return shared

    def _follow(self, vertex: _Vertex, rank: int, run: int, now: float) -> None:
        key = (vertex.index, self.representative[vertex.xpus[rank]], run)
        if key not in self.followed:
            self.following[key].append((rank, now))
            return
        compute, stall, took = self.followed[key]
        if took > 0:  # its representative's run ended before it was ready: it takes as long, from now
            self.backend.delay(took, lambda: self._followed(vertex, rank, run, now, compute, stall))
        else:
            self._followed(vertex, rank, run, now, compute, stall)

    def _followed(self, vertex: _Vertex, rank: int, run: int, start: float, compute: float, stall: float) -> None:
        self.immediate.append((vertex, rank, run, start, (compute, stall)))
        self._drain()

    def _release_followers(self, vertex: _Vertex, rep: str, run: int, compute: float, stall: float,
                           took: float) -> None:
        key = (vertex.index, rep, run)
        self.followed[key] = (compute, stall, took)
        for rank, start in self.following.pop(key, ()):  # ready while it ran: they end with it (lockstep)
            self.immediate.append((vertex, rank, run, start, (compute, stall)))
        self._drain()

    def _drain(self) -> None:
        """Complete followers iteratively (a chain of them would otherwise recurse deeply)."""
        if self.draining:
            return
        self.draining = True
        while self.immediate:
            vertex, rank, run, start, (compute, stall) = self.immediate.popleft()
            busy = self.busy[vertex.xpus[rank]]
            busy[0] += compute
            busy[1] += stall
            if vertex.recompute:
                busy[2] += compute
            self._before_window(vertex.xpus[rank], start, compute, stall, vertex.recompute)
            self._complete(vertex, rank, run, start)
        self.draining = False

    # ---- run ----------------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        wall = time.perf_counter()
        for vertex in self.vertices:
            if vertex.data.get("start"):
                for rank in range(len(vertex.xpus)):
                    if self._required(vertex, rank, 1) == 0:
                        self._try_start(vertex, rank)
        self.backend.run()
        iterations, done = self.options.iterations, self.done_runs
        unfinished = [] if min(done, default=iterations) == iterations else [
            v.name for v in self.vertices if any(d < iterations for d in done[v.offset:v.offset + len(v.xpus)])]
        if unfinished:
            from hcsim.errors import SimulationError

            raise SimulationError(f"the run stopped with vertices that never completed every iteration "
                                  f"(a dependency that is never met): {', '.join(unfinished[:5])}")
        link_bytes = self.link_bytes()
        check_link_loads(self.platform, link_bytes, self.iteration_ends[-1] if self.iteration_ends else 0.0)
        return RunResult(iteration_ends=list(self.iteration_ends), activities=self.backend.activities,
                         busy=self.busy, wall_time_s=time.perf_counter() - wall, trace=self.trace,
                         collective_fidelity=self.fidelity_used, link_bytes=link_bytes,
                         xpu_times=self.xpu_times(), representatives=dict(self.representative))

    def latency(self, src: str, dst: str) -> float:
        return self._path(src, dst)[0]

    def wire_bytes(self, src: str, dst: str, size: float) -> float:
        """The bytes a collective's transfer of `size` bytes src -> dst takes link time for: `size` in the peak
        model, size / bandwidth_factor of its link kind in the roofline model (NCCL below line rate)."""
        if self.options.compute_model is None:
            return size
        return size / self.link_factors(src, dst).bandwidth_factor

    def link_factors(self, src: str, dst: str):
        """The roofline LinkFactors of the route src -> dst: those of its bottleneck link's kind."""
        key = (src, dst)
        if key not in self._link_factors:
            route = self.routes[key]
            edges = self.platform.edges
            slowest = min(zip(route, route[1:]), key=lambda link: edges[link]["bandwidth"])
            self._link_factors[key] = self.options.compute_model.link(edges[slowest]["kind"])
        return self._link_factors[key]

    def access_time(self, src: str, dst: str, size: float) -> float:
        """Latency + size / bottleneck bandwidth of an uncontended transfer, in s."""
        latency, bandwidth = self._path(src, dst)
        return latency + size / bandwidth

    def _path(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bottleneck B/s) of the compiled route src -> dst."""
        key = (src, dst)
        if key not in self._path_cache:
            route = self.routes[key]
            self._path_cache[key] = (route_latency(self.platform, route), route_bandwidth(self.platform, route))
        return self._path_cache[key]


class _CollectiveRun:
    """One run of one group of one collective vertex: the group's ranks join as they become ready."""

    def __init__(self, executor: Executor, vertex: _Vertex, group: int, run: int):
        self.executor, self.vertex, self.run = executor, vertex, run
        self.group, self.members, self.offset = group, vertex.groups[group], vertex.group_offsets[group]
        self.algorithm, self.fidelity, self.phases = vertex.algorithms[group]  # analytic: phases is (traffic, s)
        self.start = {}
        if self.fidelity == "step":  # the step schedule's state, which the other fidelities never touch
            self.step = {}  # (rank, lane) -> its current step index
            self.current = {}
            self.sends_left = {}
            self.lanes_left = {}
            self.arrived: dict[tuple[int, int, int], int] = defaultdict(int)  # (rank, lane, step) -> receives
        self.finished = 0
        self.active: set[int] = set()  # ranks counted as communicating on their XPU's clock
        self.finished_ranks: set[int] = set()

    def xpu(self, rank: int) -> str:
        return self.members[rank]

    def ready(self, rank: int) -> None:
        executor = self.executor
        now = self.start[rank] = executor.backend.now()
        everyone = len(self.start) == self.algorithm.ranks
        clocks = executor.clocks
        kind = self.vertex.comm_kind
        if everyone:  # waiting for peers ends
            for other, xpu in enumerate(self.members):
                waited = -1 if other != rank else 0  # the others were waiting for this one
                if other not in self.finished_ranks:
                    self.active.add(other)
                    clocks[xpu].advance(now, communicating=1, kind=kind, waiting=waited)
                elif waited:
                    clocks[xpu].advance(now, waiting=waited)
        else:
            clocks[self.members[rank]].advance(now, waiting=1)
        if self.fidelity == "step":  # each rank sets off on its own
            self.lanes_left[rank] = self.algorithm.lanes
            for lane in range(self.algorithm.lanes):
                self.step[rank, lane] = -1
                self._advance(rank, lane)
        elif not everyone:
            return
        elif self.fidelity == "flow":
            self._start_flows()
        else:  # analytic
            traffic, seconds = self.phases
            pair_bytes = executor.pair_bytes
            for pair, size in traffic:
                pair_bytes[pair] += size
            executor.backend.delay(seconds, self._flows_done)

    # step fidelity: a rank's lane starts step s+1 once its step s sends are done and its receives arrived
    def _advance(self, rank: int, lane: int) -> None:
        key = (rank, lane)
        while True:
            index = self.step[key] + 1
            if index >= self.algorithm.lane_steps(rank, lane):
                self.step[key] = math.inf
                self.lanes_left[rank] -= 1
                if self.lanes_left[rank] == 0:
                    self._finish(rank)
                return
            step = self.algorithm.lane_step(rank, index, lane)
            self.step[key] = index
            self.current[key] = step
            self.sends_left[key] = len(step.sends)
            for dst, size in step.sends:
                self._send(rank, dst, lane, index, size)
            if not self._step_complete(key):
                return

    def _step_complete(self, key: tuple[int, int]) -> bool:
        return self.sends_left[key] == 0 and self.arrived[(*key, self.step[key])] >= len(self.current[key].recvs)

    def _send(self, rank: int, dst: int, lane: int, index: int, size: float) -> None:
        def done():
            self.sends_left[rank, lane] -= 1
            self.arrived[dst, lane, index] += 1
            for key in ((rank, lane), (dst, lane)):
                if self.step.get(key) == index and self._step_complete(key):
                    self._advance(*key)

        self._transfer(rank, dst, size, done)

    def _transfer(self, src: int, dst: int, size: float, then) -> None:
        executor, source, target = self.executor, self.xpu(src), self.xpu(dst)
        executor.pair_bytes[source, target] += size
        tracing = executor.trace is not None and executor.trace.wants(source, self.run)
        executor._transfer(source, target, executor.wire_bytes(source, target, size), then, tracing, self.run,
                           self.vertex.name)

    def _finish(self, rank: int) -> None:
        executor = self.executor
        if executor.options.compute_model is not None:  # roofline: the call's latency after its last transfer
            latency = self.call_latency()
            if latency > 0:
                executor.backend.delay(latency, lambda: self._finished(rank))
                return
        self._finished(rank)

    def call_latency(self) -> float:
        """The per-call latency of this group's collective: the largest of its transfers' link kinds."""
        cache, key = self.executor._call_latency, (self.vertex.index, self.group)
        if key not in cache:
            cache[key] = max((self.executor.link_factors(self.xpu(s), self.xpu(d)).call_latency
                              for s, d in self.algorithm.pairs()), default=0.0)
        return cache[key]

    def _finished(self, rank: int) -> None:
        self.finished += 1
        self.finished_ranks.add(rank)
        if rank in self.active:
            self.executor.clocks[self.members[rank]].advance(self.executor.backend.now(), communicating=-1,
                                                             kind=self.vertex.comm_kind)
        self.executor._complete(self.vertex, self.offset + rank, self.run, self.start[rank])
        if self.finished == self.algorithm.ranks:
            self.executor.collective_done(self.vertex, self.group, self.run)

    # flow fidelity: each lane's phases (Algorithm.flow_phases) one after the other, the lanes side by side;
    # a phase ends when FlowPhase's rule says, from its transfers' measured durations
    def _start_flows(self) -> None:
        lanes: dict[int, list[FlowPhase]] = defaultdict(list)
        for phase in self.phases:
            if phase.transfers:
                lanes[phase.lane].append(phase)
        self.lanes_busy = len(lanes)
        if not lanes:
            self._flows_done()
        for phases in lanes.values():
            self._next_phase(phases, 0)

    def _flows_done(self) -> None:
        for rank in range(self.algorithm.ranks):
            self._finish(rank)

    def _next_phase(self, phases: list[FlowPhase], index: int) -> None:
        if index == len(phases):
            self.lanes_busy -= 1
            if self.lanes_busy == 0:
                self._flows_done()
            return
        executor, phase = self.executor, phases[index]
        begin = executor.backend.now()
        durations = [0.0] * len(phase.transfers)
        left = [len(phase.transfers)]

        def flow_done(i):
            durations[i] = executor.backend.now() - begin
            left[0] -= 1
            if left[0] == 0:
                extra = begin + self._phase_time(phase, durations) - executor.backend.now()
                if extra > 0:
                    executor.backend.delay(extra, lambda: self._next_phase(phases, index + 1))
                else:
                    self._next_phase(phases, index + 1)

        for i, ((src, dst), size) in enumerate(phase.transfers):
            self._transfer(src, dst, size, lambda i=i: flow_done(i))

    def _phase_time(self, phase: FlowPhase, durations: list[float]) -> float:
        return phase_time(phase, durations, [self.executor.latency(self.xpu(s), self.xpu(d))
                                             for (s, d), _ in phase.transfers])


def phase_time(phase: FlowPhase, durations: list[float], latencies: list[float]) -> float:
    """How long `phase` lasts by FlowPhase's rule, given its transfers' durations and route latencies (s)."""
    k = phase.steps
    step, fill, last = [], [], []
    for i in range(len(phase.transfers)):
        alpha = latencies[i]
        step.append(alpha + (durations[i] - alpha) / k)
        feeds = phase.feeds[i] if phase.feeds else ()
        fill.append(max((fill[f] + step[f] for f in feeds), default=0.0))
        last.append(max(max((last[f] for f in feeds), default=0.0) + step[i], fill[i] + k * step[i]))
    return max(last)


def check_link_loads(platform: nx.Graph, link_bytes: dict[tuple[str, str], float], seconds: float) -> None:
    """Raise RuntimeError (a bug, not a user's error) if a link direction carried more bytes than its bandwidth
    allows in `seconds` of simulated time: a mean utilization above 100 % means some traffic was counted that
    was never simulated, or simulated without its link (the representative XPUs' followers once did this)."""
    for (u, v), size in link_bytes.items():
        edge = platform.edges[u, v]
        capacity = edge["bandwidth"] * seconds
        if size > capacity * (1 + 1e-9):
            raise RuntimeError(f"internal error: link {u} -> {v} ({edge['kind']}, {edge['bandwidth']:.4g} B/s) carried "
                               f"{size:.6g} B in {seconds:.6g} s of simulated time, {size / capacity:.1%} of what it "
                               f"can carry: traffic was counted that was not simulated. This is a bug in hcsim; "
                               f"please report it with the scenario")


def memory_form(nodes, data: dict, xpu: str, coherent: bool) -> tuple[str | None, str]:
    """Where `xpu`'s data for a compute vertex with attributes `data` is copied from first (None: not
    copied) and where it is read from (`nodes`: the platform graph's nodes).

    Offload (vertex attributes, hcsim.workload.graph): a step on the host CPU reads its CPU's DRAM; a
    move copies between the XPU and its offload memory (the pair is (from, to)); data offloaded to the
    CPU is copied from its DRAM first, whatever the platform's coherence (DRAM is not on the CXL fabric).
    """
    node = nodes[xpu]
    if data.get("host") == "cpu":
        return None, node["host_memory"]
    move = data.get("move")
    if move:
        memory = node["host_memory"] if data.get("offload") == "cpu" else node["extended_memory"]
        return (memory, xpu) if move == "in" else (xpu, memory)
    if xpu not in data["spilled_xpus"]:
        return None, node["local_memory"]
    if data.get("offload") == "cpu":
        return node["host_memory"], node["local_memory"]
    if coherent:
        return None, node["extended_memory"]  # read in place over the fabric
    return node["extended_memory"], node["local_memory"]


def form_transfers(nodes, data: dict, xpu: str, form: tuple[str | None, str]) -> list[tuple[str, str]]:
    """The (src, dst) host pairs that move a compute instance's memory bytes in memory form `form`."""
    copy_from, memory = form
    if data.get("move"):
        return [(copy_from, memory)]
    if data.get("host") == "cpu":
        return [(memory, nodes[memory]["owner"])]
    return [(copy_from, xpu), (memory, xpu)] if copy_from is not None else [(memory, xpu)]


def _stable_order(graph: nx.DiGraph) -> list:
    """Vertices in a deterministic order: topological over first-iteration edges, ties by name."""
    order = first_iteration_order(graph, stable=True)
    if len(order) < len(graph):
        raise nx.NetworkXUnfeasible("the first-iteration edges have a cycle")
    return order
