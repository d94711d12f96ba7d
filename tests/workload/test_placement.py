"""Memory placement: what fits in local memory, what spills, and which vertices read spilled data."""

import math
from dataclasses import replace

import pytest

from hcsim.errors import WorkloadError
from hcsim.workload import build_training_graph, place_memory, training_state

H, S, A, F, L = 5120, 4096, 40, 13824, 40
GiB, TiB = 2**30, 2**40
PARAMETERS = L * (12 * H**2 + 4 * H)  # Table 4's rows
# FP32 LLaMA2-13B activations per decoder and sample (SwiGLU, RMSNorm, no dropout): inputs of the norms,
# QKV, Q, K, V, output projection; MLP input, gate, up and down inputs; softmax output a*s^2
ACTIVATIONS = 4 * (S * H * (2 + 5 + 1) + 3 * S * F + A * S * S)


def spilled_decoders(graph):
    return {d["decoder"]: d["spilled_xpus"] for _, d in graph.nodes(data=True) if d["kind"] == "compute" and d["decoder"]}


def test_state_of_llama2_13b_in_fp32(llama13b):
    state = training_state(llama13b)
    assert (state.parameters, state.gradients, state.optimizer) == (4 * PARAMETERS, 4 * PARAMETERS, 8 * PARAMETERS)
    assert state.activations == L * ACTIVATIONS
    assert state.total > 2 * 80 * GiB  # the paper's point: far more than an H100 holds


def test_nothing_spills_on_a_1tib_device(llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    placement = place_memory(graph, {x: TiB for x in xpus4}, llama13b)
    assert all(not d.get("spilled_xpus") for _, d in graph.nodes(data=True))
    entry = placement.for_capacity(TiB)
    assert entry.local_decoders == L and entry.spilled_bytes == 0 and entry.spilled_vertices == ()


def test_an_80gib_h100_holds_the_first_decoders_that_fit(llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    placement = place_memory(graph, {x: 80 * GiB for x in xpus4}, llama13b)
    block = 16 * PARAMETERS / L + ACTIVATIONS
    local = math.floor(80 * GiB / block)
    assert 0 < local < L
    entry = placement.for_capacity(80 * GiB)
    assert entry.local_decoders == local and entry.xpus == 4
    assert entry.local_bytes + entry.spilled_bytes == pytest.approx(training_state(llama13b).total)
    assert entry.local_bytes <= 80 * GiB < entry.local_bytes + block
    for d, spilled in spilled_decoders(graph).items():
        assert spilled == (frozenset(xpus4) if d > local else frozenset())
    assert len(entry.spilled_vertices) == 2 * (L - local)  # the fused forward and backward of each
    assert graph.nodes["optimizer"]["spilled_xpus"] == frozenset()  # Table 4's backward reads the state


def test_mixed_capacities_decide_per_capacity_and_share_sets(llama13b):
    xpus = [f"xpu{i}" for i in range(8)]
    capacities = {x: (80 if i < 4 else 32) * GiB for i, x in enumerate(xpus)}
    spec = replace(llama13b, granularity="layer")
    graph = build_training_graph(spec, xpus)
    placement = place_memory(graph, capacities, spec)
    small, big = placement.by_capacity
    assert small.local_decoders < big.local_decoders
    sets = {id(d["spilled_xpus"]) for _, d in graph.nodes(data=True) if d["kind"] == "compute"}
    assert len(sets) == 3  # nothing, the small XPUs, all XPUs
    for d, spilled in spilled_decoders(graph).items():
        expected = set()
        if d > small.local_decoders:
            expected |= set(xpus[4:])
        if d > big.local_decoders:
            expected |= set(xpus[:4])
        assert spilled == expected


def test_placement_is_the_same_at_both_fidelities(llama13b, xpus4):
    capacities = {x: 80 * GiB for x in xpus4}
    fused = build_training_graph(llama13b, xpus4)
    layered = build_training_graph(replace(llama13b, granularity="layer"), xpus4)
    place_memory(fused, capacities, llama13b)
    place_memory(layered, capacities, llama13b)
    assert spilled_decoders(fused) == spilled_decoders(layered)


def test_an_optimizer_that_reads_state_spills_with_it(llama13b, xpus4):
    spec = replace(llama13b, optimizer_bytes_per_parameter=16)
    graph = build_training_graph(spec, xpus4)
    place_memory(graph, {x: 80 * GiB for x in xpus4}, spec)
    assert graph.nodes["optimizer"]["spilled_xpus"] == frozenset(xpus4)


def test_recomputation_and_precision_shrink_the_spill(llama13b, xpus4):
    def local(spec):
        graph = build_training_graph(spec, xpus4)
        return place_memory(graph, {x: 80 * GiB for x in xpus4}, spec).by_capacity[0].local_decoders

    base = local(llama13b)
    assert local(replace(llama13b, recomputation="selective")) > base
    assert local(replace(llama13b, recomputation="full")) > local(replace(llama13b, recomputation="selective"))
    assert local(replace(llama13b, precision="bf16")) > base  # same 16 B state, half the activations


def test_spilled_state_must_fit_a_finite_extended_memory(llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    capacities = {x: 80 * GiB for x in xpus4}
    entry = place_memory(graph, capacities, llama13b).by_capacity[0]
    place_memory(graph, capacities, llama13b, extended={x: entry.spilled_bytes for x in xpus4})
    place_memory(graph, capacities, llama13b, extended={"xpu0": math.inf})
    with pytest.raises(WorkloadError, match=r"does not fit even with spilling on XPU 'xpu2'.*extended memory holds"):
        place_memory(graph, capacities, llama13b, extended={"xpu2": entry.spilled_bytes * 0.99})


def test_every_xpu_needs_a_capacity(llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    with pytest.raises(WorkloadError, match="no local memory capacity for XPUs xpu3"):
        place_memory(graph, {x: TiB for x in xpus4[:3]}, llama13b)


def test_the_inventory_holds_each_xpus_state_split_into_local_and_spilled(llama13b, xpus4):
    """Data parallelism: every XPU holds the whole state; local + spilled = state; XPUs of one capacity share a record."""
    graph = build_training_graph(llama13b, xpus4)
    capacities = {x: (80 if x < "xpu2" else 32) * 2**30 for x in xpus4}
    placement = place_memory(graph, capacities, llama13b)
    state = placement.state
    for x in xpus4:
        held = placement.inventory[x]
        assert held.total == state.total
        assert held.local + held.spilled == pytest.approx(state.total, rel=1e-12)
        assert held.local <= capacities[x]
    assert placement.inventory["xpu0"] is placement.inventory["xpu1"]
    assert placement.inventory["xpu2"].spilled > placement.inventory["xpu0"].spilled
