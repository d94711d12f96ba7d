import json
import math

import networkx as nx
import pytest

from hcsim.errors import WorkloadError
from hcsim.workload import (add_comm, add_compute, add_dependency, build_training_graph, load_workload, new_workload,
                            place_memory, save_workload, unroll_iterations, validate_workload)


def two_layer(xpus=("a", "b")):
    g = new_workload("two-layer")
    add_compute(g, "fwd", xpus=xpus, flops=1e9, memory_bytes=1e6, start=True)
    add_compute(g, "bwd", xpus=xpus, flops=2e9, memory_bytes=2e6)
    add_comm(g, "ar", xpus=xpus, bytes=4e6, collective="all_reduce", algorithm="ring")
    add_dependency(g, "fwd", "bwd")
    add_dependency(g, "bwd", "ar")
    add_dependency(g, "ar", "fwd", skip_first_iteration=True)
    return g


def test_a_cycle_broken_by_a_skip_edge_is_valid():
    validate_workload(two_layer(), ["a", "b"])


@pytest.mark.parametrize("mutate, message", [
    (lambda g: g.nodes["fwd"].update(kind="memory"), r"'fwd': kind must be 'compute' or 'comm'"),
    (lambda g: g.nodes["bwd"].update(xpus=()), r"'bwd': runs on no XPU"),
    (lambda g: g.nodes["bwd"].update(flops=-1.0), r"'bwd': flops must be a finite number >= 0, got -1.0"),
    (lambda g: g.nodes["bwd"].update(memory_bytes=math.nan), r"'bwd': memory_bytes must be a finite number"),
    (lambda g: g.nodes["ar"].update(bytes=math.inf), r"'ar': bytes must be a finite number"),
    (lambda g: g.nodes["ar"].update(bytes=True), r"'ar': bytes must be a finite number"),
    (lambda g: g.nodes["ar"].update(collective="allreduce"), r"'ar': collective 'allreduce' is not one of"),
    (lambda g: g.nodes["ar"].update(collective="p2p", groups=(("a",),)), r"'ar': a p2p transfer names two different XPUs"),
    (lambda g: g.nodes["ar"].update(groups=(("a", "b"), ("b",)), xpus=("a", "b", "b")), r"'ar': groups must be disjoint"),
    (lambda g: g.edges["fwd", "bwd"].update(wait="same"), r"edge 'fwd' -> 'bwd': wait must be one of xpu, group, all"),
    (lambda g: g.edges["fwd", "bwd"].update(wait="group"), r"edge 'fwd' -> 'bwd': wait 'group' needs a communication"),
    (lambda g: g.nodes["fwd"].update(start=False), r"no start vertex"),
    (lambda g: g.nodes["fwd"].update(spilled_xpus=frozenset({"z"})), r"'fwd': spilled_xpus names XPUs it does not run on"),
    (lambda g: g.edges["ar", "fwd"].update(skip_first_iteration=False),
     r"cycle with no skip_first_iteration edge .*: (fwd -> bwd -> ar -> fwd|bwd -> ar -> fwd -> bwd|ar -> fwd -> bwd -> ar)"),
    (lambda g: add_compute(g, "orphan", xpus=["a"], flops=1), r"'orphan': its units on 1 XPUs \(a\) wait for nothing"),
    (lambda g: (add_compute(g, "c", xpus=["c"], flops=1), add_dependency(g, "fwd", "c")),
     r"edge 'fwd' -> 'c': wait 'xpu' between vertices that share no XPU connects nothing"),
])
def test_every_validation_error_names_the_vertex(mutate, message):
    graph = two_layer()
    mutate(graph)
    with pytest.raises(WorkloadError, match=message):
        validate_workload(graph, ["a", "b", "c"])


def test_vertices_on_xpus_the_platform_lacks_are_named():
    with pytest.raises(WorkloadError, match=r"'fwd': placed on XPUs the platform does not have: 'b'"):
        validate_workload(two_layer(), ["a"])


def test_all_problems_are_reported_at_once():
    graph = two_layer()
    graph.nodes["fwd"]["flops"] = -1.0
    graph.nodes["ar"]["collective"] = "gossip"
    with pytest.raises(WorkloadError) as err:
        validate_workload(graph)
    assert "'fwd': flops" in str(err.value) and "'ar': collective 'gossip'" in str(err.value)


def test_unrolled_two_iterations_follow_the_back_edge_from_iteration_2():
    runs = unroll_iterations(two_layer(), 2)
    assert nx.is_directed_acyclic_graph(runs)
    assert list(runs.predecessors(("fwd", 1))) == []
    assert list(runs.predecessors(("fwd", 2))) == [("ar", 1)]
    assert list(nx.topological_sort(runs)) == [(n, k) for k in (1, 2) for n in ("fwd", "bwd", "ar")]


def test_json_round_trip_of_a_placed_training_graph(tmp_path, llama13b, xpus4):
    graph = build_training_graph(llama13b, xpus4)
    place_memory(graph, {x: (80 if x < "xpu2" else 32) * 2**30 for x in xpus4}, llama13b)
    path = tmp_path / "graph.json"
    save_workload(graph, path)
    loaded = load_workload(path, xpus4)
    assert loaded.graph == graph.graph
    assert dict(loaded.nodes(data=True)) == dict(graph.nodes(data=True))
    assert sorted(loaded.edges(data=True)) == sorted(graph.edges(data=True))
    assert all(isinstance(d["xpus"], tuple) for _, d in loaded.nodes(data=True))
    spilled = {d["spilled_xpus"] for _, d in loaded.nodes(data=True) if d["kind"] == "compute"}
    assert all(isinstance(s, frozenset) for s in spilled)
    groups = {id(d["xpus"]) for _, d in loaded.nodes(data=True)}
    assert len(groups) == 1  # one shared tuple for the whole data-parallel group


def test_graphs_from_other_tools_load_with_defaults(tmp_path):
    """Edges under 'links' (networkx < 3.4), no start flag on most vertices, no skip flag on plain edges."""
    data = {"directed": True, "multigraph": False, "graph": {"name": "mine"},
            "nodes": [{"id": "c", "kind": "compute", "xpus": ["a"], "flops": 5, "memory_bytes": 0, "start": True},
                      {"id": "t", "kind": "comm", "xpus": ["a", "b"], "bytes": 10, "collective": "p2p"}],
            "links": [{"source": "c", "target": "t"}]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    graph = load_workload(path)
    assert graph.nodes["t"]["start"] is False and graph.edges["c", "t"]["skip_first_iteration"] is False
    assert graph.nodes["c"]["spilled_xpus"] == frozenset()


def test_a_graph_file_that_leaves_out_directed_and_multigraph_loads_as_a_plain_directed_graph(tmp_path):
    """networkx's reader builds a multigraph where "multigraph" is left out; hcsim's graphs are never one."""
    data = {"graph": {"name": "mine"}, "edges": [{"source": "c", "target": "t"}],
            "nodes": [{"id": "c", "kind": "compute", "xpus": ["a"], "flops": 5, "memory_bytes": 0, "start": True},
                      {"id": "t", "kind": "comm", "xpus": ["a", "b"], "bytes": 10, "collective": "p2p"}]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    graph = load_workload(path)
    assert graph.is_directed() and not graph.is_multigraph()
    assert list(graph.edges) == [("c", "t")]


@pytest.mark.parametrize("text, message", [
    ("not json", r"not a node-link workload graph"),
    ("[1, 2]", r"not a node-link workload graph"),
    (json.dumps({"directed": True, "graph": {}, "edges": [],
                 "nodes": [{"id": "c", "kind": "compute", "xpus": "a", "flops": 1, "start": True}]}),
     r"'c': xpus must be a list of XPU names"),
    (json.dumps({"directed": True, "graph": {}, "edges": [],
                 "nodes": [{"id": "c", "kind": "compute", "xpus": ["a"], "flops": -1, "start": True}]}),
     r"'c': flops must be a finite number >= 0"),
])
def test_loading_a_bad_file_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load_workload(path)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1s"])
def test_duration_must_be_finite_seconds(bad):
    graph = new_workload("w")
    add_compute(graph, "c", xpus=["x"], flops=0.0, start=True)
    graph.nodes["c"]["duration"] = bad  # as a hand-edited graph file may have it
    with pytest.raises(WorkloadError, match=r"vertex 'c': duration must be a finite number >= 0"):
        validate_workload(graph)


def test_duration_and_chunks_survive_a_save_and_load(tmp_path):
    graph = new_workload("w")
    add_compute(graph, "c", xpus=["x", "y"], flops=0.0, duration=2e-3, start=True)
    add_comm(graph, "ar", xpus=["x", "y"], bytes=1e6, collective="all_reduce", chunks=4)
    add_dependency(graph, "c", "ar")
    save_workload(graph, tmp_path / "g.json")
    loaded = load_workload(tmp_path / "g.json")
    assert loaded.nodes["c"]["duration"] == 2e-3 and loaded.nodes["ar"]["chunks"] == 4
