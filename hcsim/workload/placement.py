"""Memory placement: which training state lives in an XPU's local memory and which spills.

The placement keeps an inventory per XPU (:class:`XpuMemory`): what the XPU
holds by kind and how much of it is local or spilled; reports read it.

Policy (paper section 3.1(2), Fig. 3 and Fig. 7). Each XPU of a data-parallel
job holds the same state; per decoder block d it is

    parameters x (weight + gradient + optimizer bytes per parameter)
    + the activations decoder d keeps from forward for backward,

and nothing else (the embedding and output layers are not simulated, as in
the paper; no workspace is reserved). Whole decoder blocks are placed in
local memory in forward order, 1, 2, ..., as long as the next block fits; the
first block that does not fit and all after it live in extended memory (a
block is not split: its vertices read either local or spilled data). Every
compute vertex of a spilled decoder, forward and backward, has that XPU in
its ``spilled_xpus``; the engine then runs it in the paper's spilled form:
copy from extended memory then compute (non-coherent, Fig. 3b) or compute in
parallel with the remote access (coherent, Fig. 3c). The optimizer step is
spilled on an XPU when it reads state (optimizer bytes per parameter > 0) and
any decoder spills there.

XPUs with the same local capacity get the same decision, and vertices share
frozenset objects: one per distinct set, so a 4096-XPU graph stays small.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import networkx as nx

from hcsim.errors import WorkloadError
from hcsim.units import format_quantity
from hcsim.workload.spec import WorkloadSpec

__all__ = ["StateBytes", "XpuMemory", "CapacityPlacement", "Placement", "training_state", "place_memory",
           "out_of_memory", "check_shared_memory"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Training state of one XPU in bytes, by kind, and per decoder block."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    decoders: int

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations

    @property
    def per_decoder(self) -> float:
        """Bytes of one decoder block (all blocks are the same)."""
        return self.total / self.decoders


@dataclass(frozen=True, slots=True, kw_only=True)
class XpuMemory:
    """What one XPU holds, in bytes: its training state by kind, and how much of it is local or spilled
    (``offloaded``: the part of ``spilled`` that offload keeps out of local memory on purpose)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    local: float
    spilled: float
    offloaded: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations

    @property
    def need(self) -> float:
        """Bytes the XPU must hold in its local memory for nothing to spill: its state less what is offloaded."""
        return self.total - self.offloaded


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPlacement:
    """The decision for every XPU of one local capacity (bytes) and batch."""

    capacity: float
    batch: int  # samples per iteration of these XPUs (with a batch_split, XPUs of one capacity differ in it)
    xpus: int
    local_decoders: int
    local_bytes: float
    spilled_bytes: float
    spilled_decoders: tuple[int, ...]
    spilled_vertices: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """What memory placement decided: the (largest) state, and per distinct local capacity (and batch) what
    spills."""

    state: StateBytes
    by_capacity: tuple[CapacityPlacement, ...]
    inventory: dict[str, XpuMemory]  # per XPU; XPUs that hold the same share one record

    def for_capacity(self, capacity: float) -> CapacityPlacement:
        for entry in self.by_capacity:
            if entry.capacity == capacity:
                return entry
        raise KeyError(capacity)


def training_state(spec: WorkloadSpec, batch: int | None = None) -> StateBytes:
    """The training state one XPU holds for `spec` (bytes by kind) at `batch` samples per iteration (None: the
    spec's batch_per_xpu; only the activations depend on it).

    >>> from hcsim.workload import load_workload_spec
    >>> state = training_state(load_workload_spec("llama2-13b"))
    >>> state.parameters == 4 * 40 * (12 * 5120**2 + 4 * 5120)  # FP32 weights of Table 4's rows
    True
    """
    parameters = spec.decoder_table().parameters * spec.model.decoders
    sizes = spec.sizes
    batch = spec.batch_per_xpu if batch is None else batch
    return StateBytes(parameters=parameters * sizes.weight, gradients=parameters * sizes.gradient,
                      optimizer=parameters * sizes.optimizer,
                      activations=spec.activation_bytes()(batch) * spec.model.decoders,
                      decoders=spec.model.decoders)


def place_memory(graph: nx.DiGraph, capacities: dict[str, float], spec: WorkloadSpec,
                 extended: dict[str, float] | None = None, batches: dict[str, int] | None = None) -> Placement:
    """Set every compute vertex's ``spilled_xpus`` and return what was decided.

    Parameters
    ----------
    graph : a training graph built from `spec` (vertices carry ``decoder``).
    capacities : local memory capacity in bytes of every XPU of the graph.
    spec : the workload the graph was built from.
    extended : optional extended memory capacity in bytes per XPU (math.inf for
        unbounded, 0 for none); XPUs it does not name are unbounded.
    batches : optional samples per iteration of each XPU, as the graph was built with (a batch_split); an
        XPU's activations are those of its batch. None: the spec's batch_per_xpu everywhere.

    Raises
    ------
    WorkloadError
        if an XPU of the graph has no capacity, or its spilled state does not
        fit its extended memory (naming the XPU and the sizes).
    """
    xpus = sorted({x for _, group in graph.nodes(data="xpus") for x in group})
    missing = [x for x in xpus if x not in capacities]
    if missing:
        raise WorkloadError(f"memory placement: no local memory capacity for XPUs {', '.join(missing[:5])}")
    batch_of = {x: spec.batch_per_xpu if batches is None else batches[x] for x in xpus}
    states = {b: training_state(spec, b) for b in sorted(set(batch_of.values()))}
    uneven = len(states) > 1  # then compute vertices run on some XPUs only: spilled sets keep to them
    decoders = spec.model.decoders
    local_of = {}  # (capacity, batch) -> local decoders
    for capacity, b in sorted({(capacities[x], batch_of[x]) for x in xpus}):
        block = states[b].per_decoder
        local_of[capacity, b] = decoders if block == 0 else min(decoders, int(math.floor(capacity / block)))
    local = {x: local_of[capacities[x], batch_of[x]] for x in xpus}
    if extended is not None:
        for x in xpus:
            state = states[batch_of[x]]
            spilled = (decoders - local[x]) * state.per_decoder
            room = extended.get(x, math.inf)
            if spilled > room:
                raise WorkloadError(
                    f"workload {spec.name!r} does not fit even with spilling on XPU {x!r}: state "
                    f"{format_quantity(state.total, 'B')}, local memory {format_quantity(capacities[x], 'B')} holds "
                    f"{local[x]} of {decoders} decoders, {format_quantity(spilled, 'B')} spill but its extended memory "
                    f"holds {format_quantity(room, 'B')}. Fix: more extended memory (the platform's capacity key: "
                    f"cxl.type3_capacity on paper-cxl, pool.capacity_per_host on cxl-pool), a smaller batch, or "
                    f"recomputation")
    shared: dict[tuple, frozenset] = {}
    batches_of: dict[int, frozenset] = {}  # id of a vertex's xpus tuple -> the batches its XPUs process

    def spilled_on(condition, members: tuple[str, ...]) -> frozenset:
        """The frozenset of `members` (every XPU unless the split is uneven) whose local-decoder count satisfies
        `condition`, shared by key."""
        key = tuple(k for k in sorted(set(local_of.values())) if condition(k))
        scope = id(members) if uneven else None
        if (key, scope) not in shared:
            within = members if uneven else xpus
            shared[key, scope] = frozenset(x for x in within if local[x] in key) if key else frozenset()
        return shared[key, scope]

    spilled_by_key: dict[tuple, list[str]] = {key: [] for key in local_of}
    reads_state = spec.optimizer_bytes_per_parameter > 0
    for name, data in graph.nodes(data=True):
        if data.get("kind") != "compute":
            continue
        d = data.get("decoder", 0)
        members = data["xpus"]
        if d:
            data["spilled_xpus"] = spilled_on(lambda k, d=d: k < d, members)
        elif data.get("phase") == "optimizer" and reads_state:
            data["spilled_xpus"] = spilled_on(lambda k: k < decoders, members)
        else:
            data["spilled_xpus"] = spilled_on(lambda k: False, members)
        runs_on = batches_of.setdefault(id(members), frozenset(batch_of[x] for x in members))
        for (capacity, b), k in local_of.items():
            if b in runs_on and ((d and k < d) or (not d and data["spilled_xpus"] and k < decoders)):
                spilled_by_key[capacity, b].append(name)
    entries, records = [], {}
    for (capacity, b), k in sorted(local_of.items()):
        state = states[b]
        block = state.per_decoder
        records[capacity, b] = XpuMemory(parameters=state.parameters, gradients=state.gradients,
                                         optimizer=state.optimizer, activations=state.activations,
                                         local=k * block, spilled=(decoders - k) * block)
        entries.append(CapacityPlacement(
            capacity=capacity, batch=b, xpus=sum(1 for x in xpus if (capacities[x], batch_of[x]) == (capacity, b)),
            local_decoders=k, local_bytes=k * block, spilled_bytes=(decoders - k) * block,
            spilled_decoders=tuple(range(k + 1, decoders + 1)), spilled_vertices=tuple(spilled_by_key[capacity, b])))
    return Placement(state=max(states.values(), key=lambda state: state.total), by_capacity=tuple(entries),
                     inventory={x: records[capacities[x], batch_of[x]] for x in xpus})


def check_shared_memory(inventory: dict[str, XpuMemory], extended: dict[str, tuple[str, float]],
                        offload: dict[str, tuple[str, float]] | None = None) -> dict[str, float]:
    """Refuse a placement whose XPUs put more in one shared memory than it holds: a CPU's DRAM under several
    XPUs, a superchip's Grace memory under its GPUs, a CXL pool under several hosts is one capacity. What they
    put in each memory beyond their HBM (memory node -> bytes) when it fits.

    Parameters
    ----------
    inventory : what each XPU holds (:attr:`Placement.inventory`); ``spilled - offloaded`` bytes go to its
        extended memory, ``offloaded`` bytes to its offload memory.
    extended : XPU -> (extended memory node, its capacity in bytes), for the XPUs that have one.
    offload : XPU -> (offload memory node, capacity in bytes) where the run offloads state (may be the
        extended memory: offload to a CXL pool), else None.

    Raises
    ------
    WorkloadError
        naming the first memory (in name order) that overflows, its capacity, what its XPUs put there, and
        the fixes.

    >>> one = XpuMemory(parameters=0, gradients=0, optimizer=0, activations=3e12, local=1e12, spilled=2e12)
    >>> check_shared_memory({"x0": one, "x1": one}, {"x0": ("pool0.mem", 5e12), "x1": ("pool0.mem", 5e12)})
    {'pool0.mem': 4000000000000.0}
    >>> check_shared_memory({"x0": one, "x1": one}, {"x0": ("pool0.mem", 3e12), "x1": ("pool0.mem", 3e12)})
    Traceback (most recent call last):
    ...
    hcsim.errors.WorkloadError: memory 'pool0.mem' is shared by 2 XPUs (x0, x1) and holds 3 TB, less than the 4 TB they spill or offload to it (2 TB on x0). Fix: a larger memory (a CXL pool: pool.capacity_per_host), fewer XPUs sharing it, more tp or pp, ZeRO, recomputation, or a smaller batch
    """
    used: dict[str, float] = {}
    capacity: dict[str, float] = {}
    users: dict[str, list[str]] = {}
    for x in inventory:  # in placement order
        held = inventory[x]
        for node_capacity, size in ((extended.get(x), held.spilled - held.offloaded),
                                    ((offload or {}).get(x), held.offloaded)):
            if node_capacity is None or not size > 0:
                continue
            node, capacity[node] = node_capacity
            used[node] = used.get(node, 0.0) + size
            users.setdefault(node, []).append(x)
    for node in sorted(used):
        if used[node] > capacity[node] * (1 + 1e-12):
            members = sorted(users[node], key=lambda x: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", x)])
            biggest = max(members, key=lambda x: inventory[x].spilled)
            raise WorkloadError(
                f"memory {node!r} is shared by {len(members)} XPUs ({', '.join(members[:4])}"
                f"{', ...' if len(members) > 4 else ''}) and holds {format_quantity(capacity[node], 'B')}, less "
                f"than the {format_quantity(used[node], 'B')} they spill or offload to it "
                f"({format_quantity(inventory[biggest].spilled, 'B')} on {biggest}). Fix: a larger memory (a CXL "
                f"pool: pool.capacity_per_host), fewer XPUs sharing it, more tp or pp, ZeRO, recomputation, or a "
                f"smaller batch")
    return used


def out_of_memory(stage: int, need: float, capacity: float, device: str) -> str | None:
    """hcsim's one memory rule: None when an XPU of pipeline `stage` holds its `need` bytes of training state in
    its `capacity` bytes of local memory, else what does not fit, as a training framework would report it.

    ``hcsim plan`` keeps the candidates for which every stage fits (:func:`hcsim.study.plan.fits`); a simulation
    stops with this text when a stage does not fit and the platform does not spill (scenario key ``spill``),
    and spills the rest to extended memory otherwise (module docstring).

    Both in GB (1e9 B, one unit family; an 80 GiB H100 holds 85.9 GB):

    >>> out_of_memory(0, 137.8e9, 80 * 2**30, "H100")
    'stage 0 needs 137.8 GB per XPU, each H100 holds 85.9 GB'
    >>> out_of_memory(1, 60e9, 80 * 2**30, "H100") is None
    True
    """
    if need <= capacity:
        return None
    return f"stage {stage} needs {need / 1e9:.1f} GB per XPU, each {device} holds {capacity / 1e9:.1f} GB"

