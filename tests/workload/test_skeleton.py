from hcsim.workload import skeleton_graph, validate_workload


def test_skeleton_is_one_compute_then_one_allreduce_over_all_xpus():
    xpus = [f"xpu{i}" for i in range(4)]
    graph = skeleton_graph(xpus, flops=2e12, allreduce_bytes=3e9, algorithm="ring")
    validate_workload(graph, xpus)
    compute, allreduce = graph.nodes["compute"], graph.nodes["allreduce"]
    assert compute["kind"] == "compute" and compute["start"] and compute["xpus"] == tuple(xpus)
    assert compute["flops"] == 2e12 and compute["spilled_xpus"] == frozenset()
    assert allreduce["kind"] == "comm" and not allreduce["start"] and allreduce["xpus"] == tuple(xpus)
    assert allreduce["collective"] == "all_reduce" and allreduce["algorithm"] == "ring" and allreduce["bytes"] == 3e9
    assert list(graph.edges(data="skip_first_iteration")) == [("compute", "allreduce", False)]
