"""The data-parallel training graph of paper Fig. 7."""

import networkx as nx
import pytest

from hcsim.errors import WorkloadError
from hcsim.workload import build_training_graph, load_workload_spec, unroll_iterations, validate_workload

H, L = 5120, 40
# Table 4's per-sample GFLOPs of one decoder: four h x h linears, self-attention, two MLP linears; backward twice
TABLE4_FWD_GFLOP = 4 * 195 + 312.5 + 2 * 780
TABLE4_BWD_GFLOP = 4 * 390 + 625 + 2 * 1560
TABLE4_DECODER_PARAMETERS = 12 * H**2 + 2 * 2 * H  # its rows' weights: 4 h^2 + 2 x 4h^2, two layer norms of 2h


def model_flops(graph):
    return sum(d["flops"] for _, d in graph.nodes(data=True) if d.get("phase") in ("fwd", "bwd"))


@pytest.mark.parametrize("fidelity", ["layer", "decoder"])
@pytest.mark.parametrize("batch", [1, 3])
def test_flops_per_sample_per_iteration_are_table4s_sum(fidelity, batch, xpus4):
    spec = load_workload_spec("llama2-13b", {"granularity": fidelity, "training.batch_per_xpu": batch})
    graph = build_training_graph(spec, xpus4)
    assert graph.graph["samples_per_iteration"] == batch
    assert model_flops(graph) / batch == pytest.approx(L * (TABLE4_FWD_GFLOP + TABLE4_BWD_GFLOP) * 1e9, rel=1e-12)


def test_fused_decoder_vertices_sum_their_layers(llama13b, xpus4):
    from dataclasses import replace

    layered = build_training_graph(replace(llama13b, granularity="layer"), xpus4)
    fused = build_training_graph(replace(llama13b, granularity="decoder"), xpus4)
    for d in (1, 17, 40):
        for phase in ("fwd", "bwd"):
            parts = [v for n, v in layered.nodes(data=True) if v.get("decoder") == d and v.get("phase") == phase]
            assert len(parts) == len(llama13b.table.layers)
            for key in ("flops", "memory_bytes"):
                assert fused.nodes[f"d{d:02d}.{phase}"][key] == pytest.approx(sum(p[key] for p in parts), rel=1e-12)


@pytest.mark.parametrize("precision, element", [("fp32", 4), ("fp16", 2), ("bf16", 2)])
def test_gradient_bytes_per_decoder_are_its_parameters_times_the_element_size(precision, element, xpus4):
    spec = load_workload_spec("llama2-13b", {"training.precision": precision})
    graph = build_training_graph(spec, xpus4)
    allreduces = [d for _, d in graph.nodes(data=True) if d["kind"] == "comm"]
    assert len(allreduces) == L
    for data in allreduces:
        assert data["bytes"] == TABLE4_DECODER_PARAMETERS * element
        assert data["collective"] == "all_reduce" and data["algorithm"] == "ring" and data["xpus"] == tuple(xpus4)
    assert graph.graph["precision"] == precision


def test_generated_llama_gradients_count_its_swiglu_mlp(xpus4):
    spec = load_workload_spec("llama2-13b", {"costs": "shape"})
    graph = build_training_graph(spec, xpus4)
    assert graph.nodes["allreduce.d01"]["bytes"] == 4 * (4 * H**2 + 3 * H * 13824 + 2 * H)


@pytest.mark.parametrize("bucket, count", [("layer", L * 8), ("decoder", L), ("model", 1)])
@pytest.mark.parametrize("fidelity", ["layer", "decoder"])
def test_every_bucket_granularity_all_reduces_every_gradient_once(bucket, count, fidelity, xpus4):
    spec = load_workload_spec("llama2-13b", {"gradients.bucket": bucket, "granularity": fidelity,
                                             "gradients.algorithm": "halving_doubling"})
    graph = build_training_graph(spec, xpus4)
    comms = [d for _, d in graph.nodes(data=True) if d["kind"] == "comm"]
    assert len(comms) == count  # layer buckets: 6 linears and 2 norms per decoder have parameters
    assert sum(d["bytes"] for d in comms) == L * TABLE4_DECODER_PARAMETERS * 4
    assert {d["algorithm"] for d in comms} == {"halving_doubling"}
    validate_workload(graph, xpus4)


def test_two_unrolled_iterations_have_the_dependencies_of_fig7(llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    validate_workload(graph, xpus4)
    assert [n for n, s in graph.nodes(data="start") if s] == ["d01.fwd"]
    runs = unroll_iterations(graph, 2)
    assert nx.is_directed_acyclic_graph(runs)
    fwd = [f"d{d:02d}.fwd" for d in range(1, L + 1)]
    bwd = [f"d{d:02d}.bwd" for d in range(L, 0, -1)]
    for k in (1, 2):
        # forward 1..40 then backward 40..1, one chain
        chain = fwd + bwd
        for before, after in zip(chain, chain[1:]):
            assert runs.has_edge((before, k), (after, k))
        # each decoder's all-reduce starts after its backward and overlaps the rest of the backward pass
        for d in range(1, L + 1):
            before = {(f"d{d:02d}.bwd", k)} | ({(f"allreduce.d{d + 1:02d}", k)} if d < L else set())
            assert set(runs.predecessors((f"allreduce.d{d:02d}", k))) == before
            if d > 1:
                assert not nx.has_path(runs, (f"allreduce.d{d:02d}", k), (f"d{d - 1:02d}.bwd", k))
        # the optimizer waits for every all-reduce (through the in-order chain of all-reduces)
        assert all(nx.has_path(runs, (f"allreduce.d{d:02d}", k), ("optimizer", k)) for d in range(1, L + 1))
    # the back edge: skipped in iteration 1, the update gates iteration 2's first forward
    assert list(runs.predecessors(("d01.fwd", 1))) == []
    assert list(runs.predecessors(("d01.fwd", 2))) == [("optimizer", 1)]
    assert graph.edges["optimizer", "d01.fwd"]["skip_first_iteration"]
    assert sum(skip for *_, skip in graph.edges(data="skip_first_iteration")) == 1


def test_all_reduces_in_order_or_concurrent(xpus4):
    ordered = build_training_graph(load_workload_spec("llama2-13b"), xpus4)
    free = build_training_graph(load_workload_spec("llama2-13b", {"gradients.in_order": False}), xpus4)
    assert ordered.has_edge("allreduce.d40", "allreduce.d39")
    assert not free.has_edge("allreduce.d40", "allreduce.d39")
    assert set(free.predecessors("optimizer")) == {f"allreduce.d{d:02d}" for d in range(1, L + 1)}


def test_vertex_counts_at_both_fidelities(xpus4):
    layers = 15  # Table 4 rows
    decoder = build_training_graph(load_workload_spec("llama2-13b", {"granularity": "decoder"}), xpus4)
    layer = build_training_graph(load_workload_spec("llama2-13b", {"granularity": "layer"}), xpus4)
    assert decoder.number_of_nodes() == 2 * L + L + 1
    assert layer.number_of_nodes() == 2 * L * layers + L + 1


def test_every_vertex_shares_one_xpu_tuple(llama13b):
    xpus = [f"xpu{i}" for i in range(64)]
    graph = build_training_graph(llama13b, xpus)
    assert len({id(group) for _, group in graph.nodes(data="xpus")}) == 1


def test_optimizer_step_costs(llama13b, xpus4):
    from dataclasses import replace

    spec = replace(llama13b, optimizer_flops_per_parameter=10, optimizer_bytes_per_parameter=16)
    graph = build_training_graph(spec, xpus4)
    assert graph.nodes["optimizer"]["flops"] == 10 * L * TABLE4_DECODER_PARAMETERS
    assert graph.nodes["optimizer"]["memory_bytes"] == 16 * L * TABLE4_DECODER_PARAMETERS


@pytest.mark.parametrize("xpus, message", [([], "no XPUs"), (["a", "b", "a"], "more than once: a")])
def test_bad_xpu_lists_are_refused(llama13b, xpus, message):
    with pytest.raises(WorkloadError, match=message):
        build_training_graph(llama13b, xpus)


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-13b", "llama2-70b", "gpt3-175b"])
def test_every_shipped_workload_builds_a_valid_graph(name):
    spec = load_workload_spec(name, {"granularity": "layer"})
    graph = build_training_graph(spec, ["x0", "x1"])
    validate_workload(graph, ["x0", "x1"])
