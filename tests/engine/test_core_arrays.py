"""The core's input arrays follow from the workload graph alone: not from the order its vertices and edges were
added to it (hcsim.engine.core.workload reads networkx's dicts in that order, where they lie in memory, and lays
the arrays out in the executor's order), and alike vertices share their rows."""

import random

import networkx as nx
import pytest

from cases import fast_switch, hybrid_spec
from hcsim.engine.api import RunOptions, host_pairs
from hcsim.engine.core.workload import build_arrays, pair_bytes
from hcsim.engine.rules import WorkloadRules
from hcsim.platform import compile_platform
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout

PLANS = {
    "1f1b, tp 2 x pp 2 x dp 2": Parallelism(tp=2, pp=2, dp=2, global_batch=8, recompute="full"),
    "interleaved, zero 1": Parallelism(tp=2, pp=2, dp=2, global_batch=8, schedule="interleaved", virtual_stages=2,
                                       zero=1),
}


def _graph(par: Parallelism) -> tuple[nx.Graph, nx.DiGraph]:
    n = par.tp * par.pp * par.dp
    xpus = [f"xpu{i}" for i in range(n)]
    return fast_switch(n), build_hybrid_graph(hybrid_spec(), par, ParallelLayout(
        xpus, {"tp": par.tp, "pp": par.pp, "dp": par.dp}))


def _layout(platform, graph):
    compiled = compile_platform(platform, host_pairs(platform, graph), graph.graph["precision"])
    rules = WorkloadRules(platform, graph, compiled.routes, RunOptions(collective_model="step"))
    arrays, sources = build_arrays(rules, {x: i for i, x in enumerate(rules.xpus)})
    return rules, arrays, sources


def _shuffled(graph: nx.DiGraph, seed: int) -> nx.DiGraph:
    """The same graph with its vertices and edges added in another order."""
    nodes, edges = list(graph.nodes(data=True)), list(graph.edges(data=True))
    random.Random(seed).shuffle(nodes)
    random.Random(seed + 1).shuffle(edges)
    copy = nx.DiGraph(**graph.graph)
    copy.add_nodes_from(nodes)
    copy.add_edges_from(edges)
    return copy


@pytest.mark.parametrize("plan", PLANS)
def test_the_arrays_do_not_depend_on_the_order_the_graph_was_built_in(plan):
    platform, graph = _graph(PLANS[plan])
    rules, arrays, sources = _layout(platform, graph)
    for seed in (1, 2):
        other_rules, other, other_sources = _layout(platform, _shuffled(graph, seed))
        assert other_rules.order == rules.order
        assert {name: values.tolist() for name, values in other.items()} == \
            {name: values.tolist() for name, values in arrays.items()}
        assert pair_bytes(other_rules, other_sources, other["v_job"]) == pair_bytes(rules, sources, arrays["v_job"])


@pytest.mark.parametrize("plan", PLANS)
def test_alike_vertices_share_their_rows(plan):
    """One micro-batch's vertices repeat in every other: the tables of rows do not grow with micro-batches."""
    par = PLANS[plan]
    sizes = {}
    for batch in (par.global_batch, 4 * par.global_batch):
        platform, graph = _graph(Parallelism(**{**par.__dict__, "global_batch": batch}))
        rules, arrays, _ = _layout(platform, graph)
        sizes[batch] = {name: len(arrays[name]) for name in ("u_xpu", "u_flops", "u_required", "u_group", "b_unit",
                                                             "g_size")}
        assert len(set(map(id, rules.shapes))) < len(rules.shapes) / 10
    assert sizes[par.global_batch] == sizes[4 * par.global_batch]


def _refusal(arrays, rules) -> str:
    """The core's ValueError for `arrays` (it checks them before it starts an Engine: none is started here)."""
    from array import array

    from hcsim.engine import core

    module, n = core.load(), len(rules.xpus)
    started = module.engine_started()  # True when an earlier test ran a simulation in this process
    with pytest.raises(ValueError) as refused:
        module.run_workload({}, list(rules.xpus), arrays, 1, n, array("d", [0.0]), array("d", [0.0]) * (n * 64),
                            array("d", [0.0]) * (n * 64), array("i", [0]) * rules.total_instances, None, None, None,
                            array("d", [0.0]), array("i", [0]), None)
    assert module.engine_started() == started
    return str(refused.value)


def test_the_core_refuses_group_tables_that_do_not_fit_their_vertices():
    platform, graph = _graph(PLANS["1f1b, tp 2 x pp 2 x dp 2"])
    rules, arrays, _ = _layout(platform, graph)
    collectives = [v for v, kind in enumerate(arrays["v_kind"]) if kind]
    beyond = {**arrays, "g_offset": arrays["g_offset"][:]}
    beyond["g_offset"][arrays["v_gtab"][collectives[0]]] = rules.offsets[-1]  # a group past its vertex's units
    assert "g_offset and g_size" in _refusal(beyond, rules)
    reused = {**arrays, "v_group0": arrays["v_group0"][:]}
    reused["v_group0"][collectives[1]] = arrays["v_group0"][collectives[0]]  # two vertices' groups, one number
    assert "is a number an earlier vertex's group has" in _refusal(reused, rules)
