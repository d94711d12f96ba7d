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
from dataclasses import dataclass

import networkx as nx

from hcsim.errors import WorkloadError
from hcsim.units import format_quantity
from hcsim.workload.spec import WorkloadSpec

__all__ = ["StateBytes", "XpuMemory", "CapacityPlacement", "Placement", "training_state", "place_memory"]


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
    """What one XPU holds, in bytes: its training state by kind, and how much of it is local or spilled."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    local: float
    spilled: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPlacement:
    """The decision for every XPU of one local capacity (bytes)."""

    capacity: float
    xpus: int
    local_decoders: int
    local_bytes: float
    spilled_bytes: float
    spilled_decoders: tuple[int, ...]
    spilled_vertices: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """What memory placement decided: the state, and per distinct local capacity what spills."""

    state: StateBytes
    by_capacity: tuple[CapacityPlacement, ...]
    inventory: dict[str, XpuMemory]  # per XPU; XPUs that hold the same share one record

    def for_capacity(self, capacity: float) -> CapacityPlacement:
        for entry in self.by_capacity:
            if entry.capacity == capacity:
                return entry
        raise KeyError(capacity)


def training_state(spec: WorkloadSpec) -> StateBytes:
    """The training state one XPU holds for `spec` (bytes by kind).

    >>> from hcsim.workload import load_workload_spec
    >>> state = training_state(load_workload_spec("llama2-13b"))
    >>> state.parameters == 4 * 40 * (12 * 5120**2 + 4 * 5120)  # FP32 weights of Table 4's rows
    True
    """
    parameters = spec.decoder_table().parameters * spec.model.decoders
    sizes = spec.sizes
    return StateBytes(parameters=parameters * sizes.weight, gradients=parameters * sizes.gradient,
                      optimizer=parameters * sizes.optimizer,
                      activations=spec.activation_bytes()(spec.batch_per_xpu) * spec.model.decoders,
                      decoders=spec.model.decoders)


def place_memory(graph: nx.DiGraph, capacities: dict[str, float], spec: WorkloadSpec,
                 extended: dict[str, float] | None = None) -> Placement:
    """Set every compute vertex's ``spilled_xpus`` and return what was decided.

    Parameters
    ----------
    graph : a training graph built from `spec` (vertices carry ``decoder``).
    capacities : local memory capacity in bytes of every XPU of the graph.
    spec : the workload the graph was built from.
    extended : optional extended memory capacity in bytes per XPU (math.inf for
        unbounded, 0 for none); XPUs it does not name are unbounded.

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
    state = training_state(spec)
    block = state.per_decoder
    decoders = state.decoders
    local_of = {}  # capacity -> local decoders
    for capacity in sorted({capacities[x] for x in xpus}):
        local_of[capacity] = decoders if block == 0 else min(decoders, int(math.floor(capacity / block)))
    local = {x: local_of[capacities[x]] for x in xpus}
    if extended is not None:
        for x in xpus:
            spilled = (decoders - local[x]) * block
            room = extended.get(x, math.inf)
            if spilled > room:
                raise WorkloadError(
                    f"workload {spec.name!r} does not fit even with spilling on XPU {x!r}: state "
                    f"{format_quantity(state.total, 'B')}, local memory {format_quantity(capacities[x], 'B')} holds "
                    f"{local[x]} of {decoders} decoders, {format_quantity(spilled, 'B')} spill but its extended memory "
                    f"holds {format_quantity(room, 'B')}. Fix: more extended memory, a smaller batch, or recomputation")
    shared: dict[tuple, frozenset] = {}

    def spilled_on(condition) -> frozenset:
        """The frozenset of XPUs whose local-decoder count satisfies `condition`, shared by key."""
        key = tuple(k for k in sorted(set(local_of.values())) if condition(k))
        if key not in shared:
            shared[key] = frozenset(x for x in xpus if local[x] in key) if key else frozenset()
        return shared[key]

    spilled_by_count: dict[int, list[str]] = {k: [] for k in set(local_of.values())}
    reads_state = spec.optimizer_bytes_per_parameter > 0
    for name, data in graph.nodes(data=True):
        if data.get("kind") != "compute":
            continue
        d = data.get("decoder", 0)
        if d:
            data["spilled_xpus"] = spilled_on(lambda k, d=d: k < d)
        elif data.get("phase") == "optimizer" and reads_state:
            data["spilled_xpus"] = spilled_on(lambda k: k < decoders)
        else:
            data["spilled_xpus"] = spilled_on(lambda k: False)
        for k in spilled_by_count:
            if (d and k < d) or (not d and data["spilled_xpus"] and k < decoders):
                spilled_by_count[k].append(name)
    entries, records = [], {}
    for capacity, k in sorted(local_of.items()):
        records[capacity] = XpuMemory(parameters=state.parameters, gradients=state.gradients,
                                      optimizer=state.optimizer, activations=state.activations,
                                      local=k * block, spilled=(decoders - k) * block)
        entries.append(CapacityPlacement(
            capacity=capacity, xpus=sum(1 for x in xpus if capacities[x] == capacity), local_decoders=k,
            local_bytes=k * block, spilled_bytes=(decoders - k) * block,
            spilled_decoders=tuple(range(k + 1, decoders + 1)), spilled_vertices=tuple(spilled_by_count[k])))
    return Placement(state=state, by_capacity=tuple(entries),
                     inventory={x: records[capacities[x]] for x in xpus})
