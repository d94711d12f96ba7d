"""The executor's set-up rules for one workload graph on one platform: what the C++ core runs.

The executor of paper Fig. 5 runs in the C++ core (``hcsim/engine/core/executor.cpp``): start vertices enter
the running set; when a vertex instance completes, each successor instance whose dependencies are met for
its next run starts. Compute instances are executions on their XPU (FLOPs / FLOP/s, paper eq. 1, or the
vertex's measured ``duration``, or the kernel model's time) beside a memory access (a transfer from the
memory where the data lives to the XPU, latency + size/bandwidth, paper eq. 2); communication instances are
collective algorithms made of transfers (:mod:`hcsim.engine.collectives`).

This module holds the rules that follow from the graph and the platform alone, each once, and
:mod:`hcsim.engine.core.workload` turns them into the core's arrays: the vertices in a stable order with
their units (one per XPU) and edges; how many predecessor completions each unit needs per run
(:meth:`WorkloadRules.required_count`) and which units a completion counts for
(:meth:`WorkloadRules.waiting_units`); each collective's algorithm, fidelity (step, flow, analytic) and flow
phases; a compute unit's FLOPs and time (:meth:`WorkloadRules.compute_cost`) and memory form
(:func:`memory_form`: paper Fig. 3: local data -> compute alongside the HBM access; spilled data on a
coherent system -> compute alongside the access to extended memory, bound by the slower; spilled data
without coherence -> copy from extended memory first, then compute alongside the HBM access); route
latencies and the bytes a transfer takes link time for (:meth:`WorkloadRules.wire_bytes`).
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from itertools import accumulate, chain
from operator import attrgetter, itemgetter

import networkx as nx

from hcsim.engine.collectives import FlowPhase, endpoint_hosts, get_algorithm, nccl_alternatives, server_groups
from hcsim.engine.compute_model import lowest_clocks
from hcsim.engine.options import RunOptions
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import route_bandwidth, route_latency
from hcsim.workload.graph import number_vertices

__all__ = ["WorkloadRules", "Shape", "memory_form", "form_transfers", "check_link_loads"]


class Shape:
    """What a vertex's dependency and collective rules follow from, shared by alike vertices (one per layer and
    micro-batch): its kind and units (one per XPU: a compute instance or a collective's member) and, for a
    collective, its groups with their algorithms and fidelities. Vertices themselves are not objects: a
    million-vertex graph has a few hundred shapes."""

    __slots__ = ("kind", "xpus", "pos", "groups", "group_of", "group_offsets", "algorithms", "fidelity")

    def __init__(self, kind: str, xpus: tuple[str, ...], pos: dict[str, int]):
        self.kind = kind
        self.xpus = xpus  # the vertex's xpus, or an equal tuple: one per distinct value (caches key on its id)
        self.pos = pos  # xpu -> unit index, shared by shapes with the same xpus
        self.groups = self.group_of = self.group_offsets = self.algorithms = self.fidelity = None

    def group(self, unit: int) -> tuple[str, ...]:
        """The group (XPU names) of a communication vertex's unit."""
        return self.groups[self.group_of[unit]]

    def group_span(self, unit: int) -> tuple[int, int]:
        """The units [first, end) of the group of a communication vertex's unit."""
        group = self.group_of[unit]
        first = self.group_offsets[group]
        return first, first + len(self.groups[group])


class WorkloadRules:
    """A workload graph's vertices, edges and collectives on a compiled platform, with the rules that follow
    from them (module docstring); no run state: the core keeps its own.

    The vertices are `order` (names, the executor's order) with `shapes` (each vertex's :class:`Shape`) and
    `offsets` (vertex i's units are [offsets[i], offsets[i + 1])); `numbering` is the graph's
    :class:`~hcsim.workload.graph.VertexNumbering` and `position` each number's place in `order`."""

    def __init__(self, platform: nx.Graph, workload: nx.DiGraph, routes: dict, options: RunOptions):
        self.platform, self.workload, self.routes = platform, workload, routes
        self.nodes = dict(platform.nodes(data=True))  # name -> attributes: a plain dict is faster per look-up
        self.options = options
        self.precision = workload.graph.get("precision", "fp32")
        self._algorithm_cache: dict = {}
        self._positions: dict[tuple, tuple] = {}  # xpus -> (the first equal tuple, xpu -> unit index)
        self._compute_shapes: dict[tuple, Shape] = {}  # xpus -> the Shape of compute vertices on them
        # (collective, algorithm name, bytes, chunks, groups) -> the Shape of alike collective vertices
        self._collective_shapes: dict[tuple, Shape] = {}
        self._shapes_by_id: dict[tuple, tuple] = {}  # the keys above with a tuple's id for the tuple -> (it, Shape)
        self._group_counts: dict = {}  # (pred's pos id, vertex's groups id, group) -> pred's units in the group
        self._server_cache: dict = {}
        self._closed_forms: dict = {}  # (algorithm id, group) -> ([(XPU pair, bytes)], seconds) of an analytic one
        self._path_cache: dict[tuple[str, str], tuple[float, float]] = {}
        self._gemm_clocks: dict[tuple[int, str], float] | None = None  # (job, device) -> clock (gemm_clock)
        self._link_factors: dict[tuple[str, str], object] = {}  # (src, dst) -> LinkFactors (roofline)
        self._protocols: dict = {}  # (algorithm id, group) -> (its NCCL protocol or None, the algorithm)
        self._endpoints: dict = {}  # (algorithm id, group) -> (its endpoints' hosts, the algorithm)
        self.numbering = number_vertices(workload)  # topological over first-iteration edges, ties by name
        if len(self.numbering.order) < len(workload):
            raise nx.NetworkXUnfeasible("the first-iteration edges have a cycle")
        self.order: list = self.numbering.ordered_names()
        self.position = self.numbering.position()
        # each vertex's Shape from networkx's own dicts where the vertices lie (no views), then in the order
        shapes = list(map(self.shape, workload._node.values()))
        self.shapes: list[Shape] = list(map(shapes.__getitem__, self.numbering.order))
        self.offsets = array("q", [0])
        self.offsets.extend(accumulate(map(len, map(attrgetter("xpus"), self.shapes))))
        self.total_instances = self.offsets[-1]
        # collective vertex -> step | flow | analytic (joined by /); a compute vertex's shape has none
        self.fidelity_used = dict(filter(itemgetter(1), zip(self.order, map(attrgetter("fidelity"), self.shapes))))
        # the XPUs that run units, in clock order: each distinct xpus tuple once, in vertex order
        self.xpus: list[str] = list(dict.fromkeys(chain.from_iterable(dict.fromkeys(
            shape.xpus for shape in dict.fromkeys(self.shapes)))))

    def shape(self, data: dict) -> Shape:
        """The Shape of a vertex with attributes `data` (made on first use, then shared by alike vertices)."""
        compute = data["kind"] == "compute"
        tuples = data["xpus"] if compute else data["groups"]  # a builder's shared tuple: known by its id first
        if compute:
            key = (id(tuples),)
        else:
            collective = data["collective"]
            name = data.get("algorithm") or ("direct" if collective == "p2p" else None)
            key = (collective, name, data["bytes"], data.get("chunks"), id(tuples))
        known = self._shapes_by_id.get(key)  # the id is the tuple's while the entry keeps it alive
        if known is not None:
            return known[1]
        if compute:
            shape = self._compute_shapes.get(tuples)
            if shape is None:
                shape = self._compute_shapes[tuples] = Shape("compute", *self._position(tuples))
        else:
            alike = (*key[:-1], tuples)
            shape = self._collective_shapes.get(alike)
            if shape is None:  # alike vertices (one per layer and micro-batch) share their groups' set-up
                shape = self._collective_shapes[alike] = Shape("comm", *self._position(data["xpus"]))
                self._prepare_collective(shape, data, collective, name)
        self._shapes_by_id[key] = (tuples, shape)  # keeps the tuple alive: its id stays unique
        return shape

    def _position(self, xpus: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int]]:
        shared = self._positions.get(xpus)
        if shared is None:
            shared = self._positions[xpus] = (xpus, {x: i for i, x in enumerate(xpus)})
        return shared

    def required(self, shape: Shape, preds: list[tuple[int, str, Shape]]) -> tuple[int, int] | None:
        """(run 1, later runs) predecessor completions when every unit of a vertex of `shape` with predecessors
        `preds` ((skip, wait, the predecessor's Shape) per edge) needs the same; None when units differ."""
        counts = [0, 0]
        for skip, wait, pred in preds:
            if wait == "all":
                n = len(pred.xpus)
            elif pred.pos is shape.pos or pred.pos.keys() == shape.pos.keys():
                n = 1 if wait == "xpu" else None
                if wait == "group":
                    sizes = {len(g) for g in (shape.groups if shape.kind == "comm" else pred.groups)}
                    n = sizes.pop() if len(sizes) == 1 else None
            else:
                n = None
            if n is None:
                return None
            counts[1] += n
            if not skip:
                counts[0] += n
        return counts[0], counts[1]

    def _prepare_collective(self, shape: Shape, data: dict, collective: str, name: str | None) -> None:
        shape.groups = data["groups"]
        shape.group_of, shape.group_offsets, shape.algorithms = [], [], []
        fidelities = set()
        for g, group in enumerate(shape.groups):
            shape.group_offsets.append(len(shape.group_of))
            shape.group_of += [g] * len(group)
            servers, placement = self._servers(group)
            alternatives = nccl_alternatives(collective, name, servers)
            alternatives = alternatives if alternatives and self._nvls_domain(group) else ()
            key = (collective, name, len(group), data["bytes"], placement, data.get("chunks"), alternatives)
            if key not in self._algorithm_cache:  # alike groups share one algorithm and its flow phases
                algorithm = get_algorithm(collective, name, len(group), data["bytes"], servers, data.get("chunks"))
                for other in alternatives:  # NCCL's pick inside an NVLink SHARP domain: the lowest estimate
                    candidate = get_algorithm(collective, other, len(group), data["bytes"], servers, data.get("chunks"))
                    if self.estimated_time(candidate, group) < self.estimated_time(algorithm, group):
                        algorithm = candidate
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
                    if key not in self._closed_forms:  # its traffic as (host pair, bytes), and its seconds
                        ends = self.endpoints(algorithm, group)
                        traffic = [((ends[s], ends[d]), size)
                                   for phase in analytic for (s, d), size in phase.transfers]
                        self._closed_forms[key] = (traffic, self._closed_form(ends, analytic,
                                                                              self.protocol(algorithm, group)))
                    fidelity, phases = "analytic", self._closed_forms[key]
            shape.algorithms.append((algorithm, fidelity, phases))
            fidelities.add(fidelity)
        shape.fidelity = "/".join(sorted(fidelities))

    def _nvls_domain(self, group: tuple[str, ...]) -> bool:
        """Whether `group`'s routes are one link domain with NVLink SHARP factors (NCCL runs NVLS all-reduce
        inside one node of Hopper or later GPUs on NVSwitch: tuning.cc, search.cc); False at the peak model.
        Reads the routes from the group's first rank (host_pairs adds every pair of a possible nvls)."""
        if self.options.compute_model is None or len(group) < 2:
            return False
        links = {self.link_factors(group[0], x) for x in group[1:]}
        return len(links) == 1 and next(iter(links)).nvls is not None

    def _servers(self, group: tuple[str, ...]) -> tuple[list[list[int]], tuple]:
        """server_groups of a group and the same as a hashable key; groups are shared tuples, so each
        distinct one is computed once."""
        key = id(group)
        if key not in self._server_cache:
            servers = server_groups(self.platform, group)
            self._server_cache[key] = (group, servers, tuple(map(tuple, servers)))  # keep group alive: ids stay unique
        return self._server_cache[key][1:]

    def _closed_form(self, group: tuple[str, ...], phases: list[FlowPhase], protocol=None) -> float:
        """Seconds a collective's flow phases take over `group` (the hosts of its endpoints: :meth:`endpoints`)
        when no other traffic shares their links, its transfers at `protocol`'s factors (:meth:`protocol`; None:
        their links')."""
        lanes: dict[int, float] = defaultdict(float)
        for phase in phases:
            if phase.transfers:
                pairs = [(group[s], group[d]) for (s, d), _ in phase.transfers]
                wires = [self.wire_bytes(src, dst, size, protocol) for (src, dst), (_, size) in zip(pairs, phase.transfers)]
                lanes[phase.lane] += _phase_time(phase, self._together(pairs, wires),
                                                 [self.latency(*pair) for pair in pairs])
        return max(lanes.values(), default=0.0)

    def _together(self, pairs: list[tuple[str, str]], wires: list[float]) -> list[float]:
        """Each transfer's time, s, when a phase's transfers run at once on otherwise idle links: its route latency
        + the most loaded of its links' wire bytes (every transfer of the phase crossing that link direction) /
        that link's bandwidth. One transfer per link gives latency + bytes / bottleneck; transfers that share a
        link alike (nvls, coherent_memory: every rank's link carries n-1 of them) share it as max-min does."""
        edges, loads = self.platform.edges, defaultdict(float)
        routes = [list(zip(self.routes[pair], self.routes[pair][1:])) for pair in pairs]
        for links, wire in zip(routes, wires):
            for link in links:
                loads[link] += wire
        return [self.latency(*pair) + max(loads[link] / edges[link]["bandwidth"] for link in links)
                for pair, links in zip(pairs, routes)]

    # ---- dependencies -------------------------------------------------------------------------------------

    def required_count(self, shape: Shape, preds: list[tuple[int, str, Shape]], rank: int, run: int) -> int:
        """How many predecessor completions unit `rank` of a vertex of `shape` with predecessors `preds` ((skip,
        wait, the predecessor's Shape) per edge) needs for `run`."""
        xpu = shape.xpus[rank]
        count = 0
        for skip, wait, pred in preds:
            if run == 1 and skip:
                continue
            if wait == "all":
                count += len(pred.xpus)
            elif wait == "xpu":
                count += xpu in pred.pos
            elif shape.kind == "comm":  # a collective member waits for pred's units in its group
                count += self._group_count(shape, pred, shape.group_of[rank])
            else:  # a compute waits for its XPU's whole group of pred
                count += len(pred.group(pred.pos[xpu])) if xpu in pred.pos else 0
        return count

    def _group_count(self, shape: Shape, pred: Shape, group: int) -> int:
        key = (id(pred.pos), id(shape.groups), group)  # both kept alive by their shapes: ids stay unique
        if key not in self._group_counts:
            self._group_counts[key] = sum(x in pred.pos for x in shape.groups[group])
        return self._group_counts[key]

    def waiting_units(self, wait: str, succ: Shape, pred: Shape, xpu: str):
        """The units of a vertex of Shape `succ` that a completion of a `wait` predecessor's unit on `xpu` counts
        for (the predecessor's Shape `pred`)."""
        if wait == "all":
            return range(len(succ.xpus))
        if wait == "xpu":
            return (succ.pos[xpu],) if xpu in succ.pos else ()
        if succ.kind == "comm":
            return range(*succ.group_span(succ.pos[xpu])) if xpu in succ.pos else ()
        return [succ.pos[x] for x in pred.group(pred.pos[xpu]) if x in succ.pos]

    # The methods below run once per unit and run: they read the clock once per event and follow a same-rank
    # successor directly, on purpose (hot path), in the order of events the rules give.

    def compute_cost(self, xpu: str, data: dict) -> tuple[float, float]:
        """(FLOPs the host executes, compute time in s) of compute vertex `data` (its attributes) on `xpu`.

        The time is FLOPs / peak FLOP/s at the run's precision, the vertex's measured ``duration`` (on any
        device), or the kernel model's (roofline), times the XPU's ``slowdown`` (a straggler's factor,
        :mod:`hcsim.platform.topology`; not on an offloaded CPU step or a move, which are not its compute);
        the FLOPs are what takes that time at the host's speed (SimGrid's host speed is the peak FLOP/s,
        :mod:`hcsim.platform.compile`)."""
        node = self.nodes[xpu]
        precision = data.get("precision", self.precision)  # a job's own, where jobs differ (hcsim.run.jobs)
        speed = peak_flops(node, precision)
        duration = data.get("duration")  # a measured time replaces FLOPs / FLOP/s, on any device
        flops = data["flops"] if duration is None else duration * speed
        compute_time = flops / speed
        model = self.options.compute_model
        if self._kernel_timed(node, data):
            compute_time = model.time(data["ops"], node["device"], *self._kernel_rates(xpu, precision),
                                      clock=self.gemm_clock(xpu, data))
            flops = compute_time * speed
        if precision != self.precision:  # the host runs at the graph's precision's peak (platform.compile)
            flops = compute_time * peak_flops(node, self.precision)
        slowdown = node.get("slowdown", 1.0)
        if slowdown != 1.0 and data.get("host") != "cpu" and not data.get("move"):
            flops, compute_time = flops * slowdown, compute_time * slowdown
        return flops, compute_time


    def _kernel_timed(self, node: dict, data: dict) -> bool:
        """Whether the kernel model times compute vertex `data` on XPU `node`: GPU kernels; an offloaded optimizer
        step on the host CPU (host: cpu) runs its FLOPs at the CPU's speed beside its DRAM reads, as at the peak
        model, and a measured ``duration`` is taken as it is."""
        return (self.options.compute_model is not None and data.get("duration") is None and bool(data.get("ops"))
                and node["kind"] == "xpu" and data.get("host") != "cpu")

    def _kernel_rates(self, xpu: str, precision: str) -> tuple[float, float]:
        """(peak FLOP/s, local memory B/s) the kernel model times a compute unit on `xpu` at: FP8 training runs
        all but its GEMMs in BF16, so the BF16 peak (hcsim.workload.ops)."""
        node = self.nodes[xpu]
        return peak_flops(node, "bf16" if precision == "fp8" else precision), self.path(node["local_memory"], xpu)[1]

    def gemm_clock(self, xpu: str, data: dict) -> float:
        """The fraction of their clock compute-bound GEMMs keep on `xpu` under its power limit
        (:meth:`DeviceFactors.sustained_clock`), by the GEMMs' share of the kernel-model time of the compute
        vertices of compute vertex `data`'s job on that device: the limit holds the mean power over a window
        of many kernels (tens of milliseconds: a layer's and more), so the share is the job's, not one
        vertex's; a GPU's idle and communication time is not counted (the share is of its compute)."""
        return self._sustained_clocks().get((data.get("job", 0), self.nodes[xpu]["device"]), 1.0)

    def gemm_clocks(self, job: int) -> dict[str, float]:
        """Device -> the clock job `job`'s compute-bound GEMMs keep under its power limit, where below 1 (none
        without the kernel model): what the run reports."""
        return lowest_clocks((device, clock) for (j, device), clock in self._sustained_clocks().items() if j == job)

    def _sustained_clocks(self) -> dict[tuple[int, str], float]:
        """(job, device) -> the GEMMs' clock, for the devices with a power limit (:meth:`gemm_clock`): one pass
        over the compute vertices the kernel model times, each counted once per XPU it runs on; made once."""
        if self._gemm_clocks is not None:
            return self._gemm_clocks
        model, parts = self.options.compute_model, {}
        for shape, name in zip(self.shapes, self.order):
            data = self.workload._node[name]
            node = self.nodes[shape.xpus[0]] if shape.kind == "compute" else None
            if node is None or not self._kernel_timed(node, data) or not model.device(node["device"]).power_gemm:
                continue
            rates = self._kernel_rates(shape.xpus[0], data.get("precision", self.precision))
            gemm, span = model.gemm_share(data["ops"], node["device"], *rates)  # kept per ops: alike vertices share
            gemms, spans = parts.setdefault((data.get("job", 0), node["device"]), ([], []))
            gemms.append(gemm * len(shape.xpus))
            spans.append(span * len(shape.xpus))
        self._gemm_clocks = {key: model.device(key[1]).job_clock(gemms, spans) for key, (gemms, spans) in parts.items()}
        return self._gemm_clocks

    def call_latency(self, algorithm, group: tuple[str, ...]) -> float:
        """The kernel model's per-call latency of a collective over `group`, paid after a rank's last transfer:
        across servers in NCCL's Simple protocol, NCCL's (:meth:`_network_latency`); else its protocol's base +
        steps x per-step latency (:meth:`protocol`), or, over links of several kinds inside a server, the
        largest of their call latencies; 0 at the peak model."""
        if self.options.compute_model is None:
            return 0.0
        servers, _ = self._servers(group)
        protocol = self.protocol(algorithm, group)
        if len(servers) > 1 and not algorithm.region and (protocol is None or protocol.name == "Simple"):
            return self._network_latency(algorithm, group, servers)
        if protocol is not None:
            return protocol.latency(_steps(algorithm))
        ends = self.endpoints(algorithm, group)
        return max((self.link_factors(ends[s], ends[d]).call_latency for s, d in algorithm.pairs()), default=0.0)

    def _network_latency(self, algorithm, group: tuple[str, ...], servers: list[list[int]]) -> float:
        """NCCL's latency (its tuning model, src/graph/tuning.cc, Simple protocol) of a collective over n ranks
        on N > 1 servers: the largest base latency of its links' kinds, and for each step of its schedule the
        per-step latency of the links it crosses. Of a ring's steps, steps x (N - 1)/(n - 1) cross servers (an
        all-reduce's 2(N - 1), a reduce-scatter's or all-gather's N - 1), the rest stay inside one; an
        all-to-all's sends leave at once: one step across.

        NCCL runs the algorithm of least estimated time: an all-reduce may run its tree (2((n/N - 1) steps
        inside + floor(log2 N) across), at 0.92 of the ring's bus bandwidth), a reduce-scatter or all-gather
        over one rank a server PAT (:data:`NCCL_PAT`). The ring's transfers are what is simulated, so the other
        algorithm's latency is charged with its extra transfer time (uncontended) when NCCL would pick it."""
        pairs = sorted(algorithm.pairs())
        server = {rank: i for i, ranks in enumerate(servers) for rank in ranks}
        factors = {(s, d): self.link_factors(group[s], group[d]) for s, d in pairs}
        crossing_pairs = [pair for pair in pairs if server[pair[0]] != server[pair[1]]]
        base = max((f.call_latency for f in factors.values()), default=0.0)
        across = max((factors[pair].step_latency for pair in crossing_pairs), default=0.0)
        inside = max((f.step_latency for (s, d), f in factors.items() if server[s] == server[d]), default=0.0)
        if algorithm.collective == "all_to_all":
            return base + across
        n, nodes, steps = len(group), len(servers), _steps(algorithm)
        crossing = steps * (nodes - 1) / (n - 1)
        ring = base + (steps - crossing) * inside + crossing * across
        if algorithm.collective == "all_reduce":  # tree: S up and down at 0.92 of the bus bandwidth
            other = (base + 2 * ((n / nodes - 1) * inside + math.floor(math.log2(nodes)) * across),
                     n / (n - 1) / NCCL_TREE_BANDWIDTH)
        elif algorithm.collective in ("reduce_scatter", "all_gather") and nodes == n:
            other = (NCCL_PAT["base"] + math.floor(math.log2(nodes)) * across / NCCL_PAT["log_divisor"]
                     + n * NCCL_PAT["per_rank"], n / (n - 1) / NCCL_PAT["bandwidth"])
        else:
            return ring
        if not crossing_pairs:  # a schedule with no transfer between the servers: nothing to compare
            return ring
        ring_transfers = _busiest_bytes(algorithm) / min(
            self.path(group[s], group[d])[1] * factors[s, d].bandwidth_factor for s, d in crossing_pairs)
        latency, slower = other
        return min(ring, latency + ring_transfers * (slower - 1))

    def endpoints(self, algorithm, group: tuple[str, ...]) -> tuple[str, ...]:
        """The hosts of `algorithm`'s endpoints over `group` (:func:`hcsim.engine.collectives.endpoint_hosts`):
        `group` itself, or with the region's memory device after it."""
        if not algorithm.region:
            return group
        key = (id(algorithm), group)
        if key not in self._endpoints:
            self._endpoints[key] = (endpoint_hosts(self.platform, algorithm, group), algorithm)  # ids stay unique
        return self._endpoints[key][0]

    def protocol(self, algorithm, group: tuple[str, ...]):
        """The NCCL protocol (compute_model.Protocol) a collective runs over `group` in the roofline model: the
        fastest for its size (LinkFactors.fastest) when all its transfers' routes have the same link factors
        (one NVLink domain, NCCL's intra-node model); None at the peak model and over links of several kinds
        (each transfer then at its own link's Simple factors)."""
        if self.options.compute_model is None:
            return None
        key = (id(algorithm), group)
        if key not in self._protocols:
            ends = self.endpoints(algorithm, group)
            pairs = [(ends[s], ends[d]) for s, d in sorted(algorithm.pairs())]
            links = {self.link_factors(*pair) for pair in pairs}
            chosen = None
            if len(links) == 1:
                (link,) = links
                simple_only = not link.protocols and algorithm.name != "nvls"
                chosen = link.simple if simple_only else link.fastest(
                    algorithm.name == "nvls", _steps(algorithm), _busiest_bytes(algorithm),
                    min(self.path(*pair)[1] for pair in pairs))
            self._protocols[key] = (chosen, algorithm)  # keep the algorithm alive: ids stay unique
        return self._protocols[key][0]

    def estimated_time(self, algorithm, group: tuple[str, ...]) -> float:
        """NCCL's estimate of the collective over `group` (roofline, one link domain: :meth:`protocol`) with the
        route latency hcsim charges each step beside it, s: what picks nvls or the ring (rules' caller)."""
        ends = self.endpoints(algorithm, group)
        pairs = [(ends[s], ends[d]) for s, d in sorted(algorithm.pairs())]
        steps = _steps(algorithm)
        return self.protocol(algorithm, group).time(steps, _busiest_bytes(algorithm),
                                                    min(self.path(*pair)[1] for pair in pairs)) \
            + steps * max(self.path(*pair)[0] for pair in pairs)

    def latency(self, src: str, dst: str) -> float:
        return self.path(src, dst)[0]

    def wire_bytes(self, src: str, dst: str, size: float, protocol=None) -> float:
        """The bytes a collective's transfer of `size` bytes src -> dst takes link time for: `size` in the peak
        model, size / bandwidth_factor in the roofline model (NCCL below line rate): the collective's
        `protocol`'s (:meth:`protocol`), else that of the transfer's own link kind."""
        if self.options.compute_model is None:
            return size
        return size / (protocol or self.link_factors(src, dst)).bandwidth_factor

    def link_factors(self, src: str, dst: str):
        """The roofline LinkFactors of the route src -> dst: those of its bottleneck link's kind, for the device
        of the XPUs at both ends (a mixed pair: the kind's own)."""
        key = (src, dst)
        if key not in self._link_factors:
            self._link_factors[key] = self.options.compute_model.route_link(self.platform, self.routes[key])
        return self._link_factors[key]

    def access_time(self, src: str, dst: str, size: float) -> float:
        """Latency + size / bottleneck bandwidth of an uncontended transfer, in s."""
        latency, bandwidth = self.path(src, dst)
        return latency + size / bandwidth

    def path(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bottleneck B/s) of the compiled route src -> dst."""
        key = (src, dst)
        if key not in self._path_cache:
            route = self.routes[key]
            self._path_cache[key] = (route_latency(self.platform, route), route_bandwidth(self.platform, route))
        return self._path_cache[key]


NCCL_TREE_BANDWIDTH = 0.92
"""NCCL's tree all-reduce bus bandwidth over its ring's (tuning.cc: busBw * .92)."""
NCCL_PAT = {"base": 8.0e-6, "log_divisor": 3.5, "per_rank": 2.8e-6, "bandwidth": 0.75}
"""NCCL's PAT reduce-scatter and all-gather (one rank a node; tuning.cc): base 8 us, log2(N) x the network step /
3.5, 2.8 us a rank, 0.75 of the ring's bus bandwidth with no ring conversion (n/(n - 1) of its time more)."""


def _steps(algorithm) -> int:
    """Steps of a collective's schedule on its longest lane (rank 0's: every schedule here pads its ranks alike):
    what NCCL's per-step latency is charged for (a ring all-reduce 2(n-1), nvls 1)."""
    return max((algorithm.lane_steps(0, lane) for lane in range(algorithm.lanes)), default=0)


def _busiest_bytes(algorithm) -> float:
    """Bytes the busiest rank of a collective sends (its flow phases', else its schedule's): the size NCCL's
    estimate divides by the bandwidth (a ring all-reduce 2(n-1)/n x S)."""
    sent: dict[int, float] = defaultdict(float)
    phases = algorithm.flow_phases()
    pairs = ((pair, size) for phase in phases for pair, size in phase.transfers) if phases is not None \
        else algorithm.flows().items()
    for (src, _), size in pairs:
        sent[src] += size
    return max(sent.values(), default=0.0)


def _phase_time(phase: FlowPhase, durations: list[float], latencies: list[float]) -> float:
    """How long `phase` lasts by FlowPhase's rule, given its transfers' durations and route latencies (s): the
    analytic closed form's; the core applies the same rule to measured durations (executor.cpp)."""
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
    was never simulated, or simulated without its link."""
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

