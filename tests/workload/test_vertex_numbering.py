"""The vertex numbering and first-iteration order (hcsim.workload.graph.number_vertices, order.cpp) against
networkx's own algorithms on random graphs: the numbers are the order vertices were added, each edge's
successor, skip_first_iteration and wait are read as networkx holds them, and the order is networkx's
lexicographical topological sort by str(name) (stable) or Kahn's first come, first served."""

import random

import networkx as nx
import pytest

from hcsim.workload.graph import WAITS, first_iteration_order, number_vertices


def _random_graph(seed: int, names) -> nx.DiGraph:
    """A DAG over `names` (shuffled insertion order) plus skip_first_iteration back edges, random waits."""
    rng = random.Random(seed)
    rank = {name: i for i, name in enumerate(names)}  # edges go up this rank: acyclic
    graph = nx.DiGraph()
    for name in rng.sample(names, len(names)):
        graph.add_node(name)
    for _ in range(3 * len(names)):
        u, v = rng.sample(names, 2)
        if rank[u] > rank[v]:
            u, v = v, u
        graph.add_edge(u, v, wait=rng.choice(WAITS), skip_first_iteration=False)
    for _ in range(len(names) // 4):
        u, v = rng.sample(names, 2)  # a back edge: may close a cycle, skipped in iteration 1
        if not graph.has_edge(u, v):
            graph.add_edge(u, v, wait="xpu", skip_first_iteration=True)
    return graph


def _first_iteration_edges(graph: nx.DiGraph) -> nx.DiGraph:
    first = nx.DiGraph()
    first.add_nodes_from(graph)
    first.add_edges_from((u, v) for u, v, skip in graph.edges(data="skip_first_iteration") if not skip)
    return first


@pytest.mark.parametrize("seed", range(8))
def test_the_stable_order_is_networkxs_lexicographical_topological_sort(seed):
    names = [f"v{i}.mb{i % 7}" for i in range(300)]
    graph = _random_graph(seed, names)
    expected = list(nx.lexicographical_topological_sort(_first_iteration_edges(graph), key=str))
    assert first_iteration_order(graph, stable=True) == expected


@pytest.mark.parametrize("seed", range(4))
def test_names_that_are_not_strings_order_by_their_str(seed):
    names = list(range(200))  # str order: 0, 1, 10, 100, 101, ...
    graph = _random_graph(seed, names)
    expected = list(nx.lexicographical_topological_sort(_first_iteration_edges(graph), key=str))
    assert first_iteration_order(graph, stable=True) == expected


@pytest.mark.parametrize("seed", range(4))
def test_first_come_first_served_is_kahns_queue(seed):
    graph = _random_graph(seed, [f"n{i}" for i in range(200)])
    first = _first_iteration_edges(graph)
    indegree = dict(first.in_degree())
    ready = [v for v in first if indegree[v] == 0]
    for v in ready:  # grows as vertices become ready, successors in adjacency order
        for w in first.successors(v):
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    assert first_iteration_order(graph) == ready


def test_numbers_and_edges_are_networkxs():
    graph = _random_graph(1, [f"n{i}" for i in range(100)])
    numbering = number_vertices(graph)
    assert numbering.names == list(graph)
    number = {name: k for k, name in enumerate(numbering.names)}
    edges = []
    for k, name in enumerate(numbering.names):
        for e in range(numbering.start[k], numbering.start[k + 1]):
            flag = numbering.flags[e]
            edges.append((name, numbering.names[numbering.successor[e]], bool(flag & 1), WAITS[flag >> 1]))
    assert edges == [(u, v, d["skip_first_iteration"], d["wait"]) for u, v, d in graph.edges(data=True)]
    position = numbering.position()
    assert [position[number[name]] for name in numbering.ordered_names()] == list(range(len(graph)))


def test_a_cycle_of_first_iteration_edges_leaves_its_vertices_out():
    graph = nx.DiGraph()
    graph.add_edge("a", "b", wait="xpu")
    graph.add_edge("b", "c", wait="xpu")
    graph.add_edge("c", "b", wait="xpu")  # b <-> c: neither can start
    graph.add_edge("c", "d", wait="other")  # not a wait of WAITS: code 3, left to validation
    numbering = number_vertices(graph)
    assert numbering.ordered_names() == ["a"]
    assert list(numbering.position()) == [0, -1, -1, -1]
    assert numbering.flags[-1] >> 1 == 3
