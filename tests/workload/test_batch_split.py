"""batch_split: the largest-remainder rule, the graphs an even and an uneven split build, memory per share, and
one clear error per invalid split (pure, no SimGrid)."""

import random

import pytest

from hcsim.errors import ConfigError
from hcsim.run.scenario import Scenario, load_scenario
from hcsim.workload import build_training_graph, load_workload_spec, place_memory, validate_workload
from hcsim.workload.hybrid import Parallelism, block_costs, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.placement import training_state
from hcsim.workload.split import largest_remainder, resolve_batch_split

SHAPE = {"model.decoders": 4, "model.hidden": 64, "model.heads": 4, "model.ffn": 256, "model.sequence": 32,
         "model.vocabulary": 0, "training.precision": "fp16", "training.optimizer_flops_per_parameter": 0}


def spec(**overrides):
    return load_workload_spec("gpt3-175b", {**SHAPE, **overrides})


def hybrid(par: Parallelism):
    xpus = [f"x{i}" for i in range(par.tp * par.pp * par.dp)]
    graph = build_hybrid_graph(spec(), par, ParallelLayout(xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp}))
    validate_workload(graph, xpus)
    return graph


def same_graph(a, b) -> bool:
    """Equal graphs, vertex and edge order included (the executor's event order follows it)."""
    return (a.graph == b.graph and list(a.nodes(data=True)) == list(b.nodes(data=True))
            and list(a.edges(data=True)) == list(b.edges(data=True)))


def flops_per_xpu(graph, phases=("fwd", "bwd")) -> dict[str, float]:
    total: dict[str, float] = {}
    for _, d in graph.nodes(data=True):
        if d["kind"] == "compute" and d.get("phase") in phases:
            for x in d["xpus"]:
                total[x] = total.get(x, 0.0) + d["flops"]
    return total


# ---- the rule -----------------------------------------------------------------------------------------

def test_largest_remainder_sums_exactly_and_stays_within_one_of_each_exact_share():
    rng = random.Random(16)
    for _ in range(500):
        weights = [rng.uniform(0.1, 10.0) for _ in range(rng.randint(1, 9))]
        total = rng.randint(0, 200)
        parts = largest_remainder(total, weights)
        assert sum(parts) == total
        for part, w in zip(parts, weights):
            assert abs(part - total * w / sum(weights)) < 1


def test_largest_remainder_is_hamilton_s_method_with_ties_to_the_lower_index():
    assert largest_remainder(8, [3, 1]) == (6, 2)
    assert largest_remainder(12, [4, 1]) == (10, 2)  # 9.6 and 2.4: the larger remainder gets the unit left
    assert largest_remainder(10, [3, 1]) == (8, 2)  # 7.5 and 2.5: a tie, the first replica
    assert largest_remainder(10, [1, 3]) == (3, 7)  # 2.5 and 7.5
    assert largest_remainder(16, [67e12, 19.5e12]) == (12, 4)  # H100 and A100 at FP32: 12.39 and 3.61


# ---- even is today's graph ----------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
def test_an_explicit_even_split_builds_the_graph_of_no_split(schedule, v):
    par = dict(tp=2, pp=2, dp=2, global_batch=8, schedule=schedule, virtual_stages=v)
    assert same_graph(hybrid(Parallelism(**par)), hybrid(Parallelism(**par, batch_split=(4, 4))))


def test_equal_batches_build_the_paper_s_graph_of_no_split():
    xpus = [f"x{i}" for i in range(4)]
    workload = spec(**{"training.batch_per_xpu": 3})
    assert same_graph(build_training_graph(workload, xpus), build_training_graph(workload, xpus, batches={x: 3 for x in xpus}))


# ---- uneven: the hybrid graph ---------------------------------------------------------------------------

@pytest.mark.parametrize("pp, schedule", [(1, "1f1b"), (2, "1f1b"), (2, "gpipe"), (2, "zb-h1")])
def test_each_replica_computes_its_micro_batches_and_the_gradients_are_reduced_as_before(pp, schedule):
    """tp 2, dp 3, split 2/7/15 of 24 micro-batches: every XPU of replica r does count_r x the FLOPs of one
    micro-batch on its stage; the gradient all-reduces keep their names, groups and bytes; the job's FLOPs
    and samples are those of the even split."""
    even = Parallelism(tp=2, pp=pp, dp=3, global_batch=24, schedule=schedule)
    split = (2, 7, 15)
    graph = hybrid(Parallelism(tp=2, pp=pp, dp=3, global_batch=24, schedule=schedule, batch_split=split))
    plain = hybrid(even)
    attn, mlp = block_costs(spec(), 1, 2)
    per_micro_batch = 4 // pp * (attn.fwd_flops + attn.bwd_flops + mlp.fwd_flops + mlp.bwd_flops)
    layout = ParallelLayout([f"x{i}" for i in range(6 * pp)], {"tp": 2, "pp": pp, "dp": 3})
    for x, flops in flops_per_xpu(graph).items():
        assert flops == pytest.approx(split[layout.coordinates(x)["dp"]] * per_micro_batch, rel=1e-12)
    grads = {n: (d["groups"], d["bytes"]) for n, d in graph.nodes(data=True) if d.get("phase") == "allreduce"}
    assert grads == {n: (d["groups"], d["bytes"]) for n, d in plain.nodes(data=True) if d.get("phase") == "allreduce"}
    for key in ("model_flops", "global_samples", "samples_per_iteration"):
        assert graph.graph[key] == pytest.approx(plain.graph[key], rel=1e-12)
    assert graph.graph["batch_split"] == [2, 7, 15] and graph.graph["batch_split_unit"] == "micro-batches"
    if pp > 1:  # one activation and one gradient transfer per boundary and micro-batch of each class
        p2p = [d for _, d in graph.nodes(data=True) if d.get("phase") == "p2p"]
        assert len(p2p) == 2 * (pp - 1) * sum(split)
        assert all(len(d["groups"]) == 2 for d in p2p)  # each class is one replica here: its two TP ranks


def test_a_replica_s_gradient_collective_waits_only_for_its_own_backward():
    """Each replica class's last backward pass feeds the all-reduce with wait "xpu": an XPU joins as soon
    as its own replica is done."""
    graph = hybrid(Parallelism(dp=2, global_batch=8, batch_split=(6, 2)))
    name = next(n for n, d in graph.nodes(data=True) if d.get("phase") == "allreduce")
    feeders = {tuple(graph.nodes[u]["xpus"]): graph.edges[u, name]["wait"] for u in graph.predecessors(name)}
    assert feeders == {("x0",): "xpu", ("x1",): "xpu"}


def test_memory_holds_each_replica_s_activations_in_flight():
    """GPipe keeps all of a replica's micro-batches in flight: the replica with more holds more activations."""
    from hcsim.workload.hybrid import place_hybrid_memory

    par = Parallelism(pp=2, dp=2, global_batch=8, schedule="gpipe", batch_split=(6, 2))
    graph = hybrid(par)
    layout = ParallelLayout([f"x{i}" for i in range(4)], {"pp": 2, "dp": 2})
    placement = place_hybrid_memory(graph, spec(), par, layout, {x: 1e15 for x in layout.xpus}, {})
    held = placement.inventory
    assert held["x0"].activations == pytest.approx(3 * held["x1"].activations, rel=1e-12)  # 6 / 2 micro-batches
    assert held["x0"].parameters == held["x1"].parameters


# ---- uneven: the paper's data-parallel graph ------------------------------------------------------------

def test_the_paper_s_graph_scales_each_xpu_s_flops_and_activation_bytes_by_its_samples():
    workload = spec(**{"training.batch_per_xpu": 4})
    xpus = [f"x{i}" for i in range(4)]
    batches = {"x0": 7, "x1": 7, "x2": 1, "x3": 1}
    graph = build_training_graph(workload, xpus, batches=batches)
    validate_workload(graph, xpus)
    table = workload.decoder_table()
    for x, flops in flops_per_xpu(graph).items():
        b = batches[x]
        assert flops == pytest.approx(4 * sum(layer.fwd_flops(b) + layer.bwd_flops(b) for layer in table.layers))
    plain = build_training_graph(workload, xpus)
    grads = {n: (d["groups"], d["bytes"]) for n, d in graph.nodes(data=True) if d.get("phase") == "allreduce"}
    assert grads == {n: (d["groups"], d["bytes"]) for n, d in plain.nodes(data=True) if d.get("phase") == "allreduce"}
    assert graph.graph["model_flops"] == pytest.approx(plain.graph["model_flops"], rel=1e-12)
    assert graph.graph["batch_split"] == [7, 7, 1, 1] and graph.graph["batch_split_unit"] == "samples"
    placement = place_memory(graph, {x: 1e15 for x in xpus}, workload, batches=batches)
    assert placement.inventory["x0"].activations == training_state(workload, 7).activations
    assert placement.inventory["x3"].activations == training_state(workload, 1).activations


def test_spilled_sets_keep_to_the_xpus_of_each_share():
    """A small local memory: the XPUs with 7 samples spill more decoders than those with 1; every vertex's
    spilled XPUs are among its own."""
    workload = spec(**{"training.batch_per_xpu": 4})
    xpus = [f"x{i}" for i in range(4)]
    batches = {"x0": 7, "x1": 7, "x2": 1, "x3": 1}
    graph = build_training_graph(workload, xpus, batches=batches)
    small = 2.5 * training_state(workload, 7).per_decoder  # 2 decoders at batch 7, more at batch 1
    placement = place_memory(graph, {x: small for x in xpus}, workload, batches=batches)
    assert placement.inventory["x0"].spilled > placement.inventory["x2"].spilled
    for _, d in graph.nodes(data=True):
        if d["kind"] == "compute":
            assert d["spilled_xpus"] <= set(d["xpus"])
    validate_workload(graph, xpus)


# ---- errors: one clear message each ---------------------------------------------------------------------

@pytest.mark.parametrize("split, message", [
    ((3, 4, 1), r"batch_split: \[3, 4, 1\] gives 3 DP replicas, the run has 2; valid: a list of 2 positive "
                r"integers \(one per DP replica\) summing to 8 micro-batches \(global_batch / micro_batch = 8 / 1\)"),
    ((3, 4), r"batch_split: \[3, 4\] sums to 7 micro-batches, the run has 8; valid: a list of 2 positive"),
    ((0, 8), r"batch_split: \[0, 8\] has 0, not a positive integer .*; valid: a list of 2 positive"),
    ((-1, 9), r"batch_split: \[-1, 9\] has -1, not a positive integer"),
])
def test_an_invalid_list_says_what_is_wrong_and_what_is_valid(split, message):
    with pytest.raises(ConfigError, match=message):
        Parallelism(dp=2, global_batch=8, batch_split=split)


def test_a_non_positive_count_is_refused_at_the_scenario_boundary_too():
    with pytest.raises(ConfigError, match=r"batch_split: expected one of even, proportional or a non-empty tuple of "
                                          r"integers >= 1, got \(0, 8\)"):
        Scenario(batch_split=(0, 8))
    with pytest.raises(ConfigError, match=r"batch_split: expected even or proportional, or a list of positive "
                                          r"integers, one per DP replica .* got \[0, 8\]"):
        load_scenario(None, ["batch_split=[0, 8]"])
    with pytest.raises(ConfigError, match=r"batch_split: .* got 'uneven'"):
        load_scenario(None, ["batch_split=uneven"])


@pytest.mark.parametrize("par, message", [
    (dict(tp=2, ep=2, dp=2, global_batch=16), r"batch_split: an uneven split with ep: 2 is not modelled"),
    (dict(dp=2, global_batch=8, zero=3), r"batch_split: an uneven split with zero: 3 is not modelled.*valid: zero: "
                                         r"0, 1 or 2, or batch_split: even"),
    (dict(pp=2, dp=2, global_batch=8, schedule="interleaved", virtual_stages=2),
     r"batch_split: \[3, 5\] gives a replica 3 micro-batches, which its schedule cannot run \(schedule: interleaved "
     r"needs micro-batches \(3\) to be a multiple of pp \(2\)"),
])
def test_what_an_uneven_split_cannot_run_with_is_refused(par, message):
    with pytest.raises(ConfigError, match=message):
        Parallelism(**par, batch_split=(3, 5))


def test_a_proportional_split_that_leaves_a_replica_nothing_is_refused():
    """67:1 over 2 samples: 1.97 and 0.03, the unit left over goes to the larger remainder (0.97)."""
    with pytest.raises(ConfigError, match=r"batch_split: proportional gives DP replica 1 \(A100, 1 TFLOP/s\) none "
                                          r"of the 2 samples \(b x n\); valid: a larger batch"):
        resolve_batch_split("proportional", [67e12, 1e12], 2, "samples", "b x n", ["H100", "A100"])
