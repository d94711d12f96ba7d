"""Chakra execution traces: traces written here with the schema's messages, imported, and run.

The traces are written with hcsim's own message classes (the published schema's field numbers), one file
per rank, as ASTRA-sim reads them.
"""

import json
import math

import pytest

from hcsim.errors import WorkloadError
from hcsim.workload.chakra import (COLLECTIVE_TYPES, NODE_TYPES, GlobalMetadata, Node, attribute, import_chakra,
                                   read_trace, write_trace)

COMP, COLL, SEND, RECV = (NODE_TYPES[k] for k in ("COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"))
ALL_REDUCE, ALL_GATHER = COLLECTIVE_TYPES["ALL_REDUCE"], COLLECTIVE_TYPES["ALL_GATHER"]


def comp(node_id, micros=0, deps=(), ctrl=(), num_ops=None, tensor_size=None, name=""):
    attrs = []
    if num_ops is not None:
        attrs.append(attribute("num_ops", int64_val=num_ops))
    if tensor_size is not None:
        attrs.append(attribute("tensor_size", uint64_val=tensor_size))
    return Node(id=node_id, name=name or f"comp{node_id}", type=COMP, duration_micros=micros, data_deps=deps,
                ctrl_deps=ctrl, attr=attrs)


def coll(node_id, size, kind=ALL_REDUCE, deps=(), ctrl=(), group=None):
    attrs = [attribute("comm_type", int64_val=kind), attribute("comm_size", int64_val=size)]
    if group is not None:
        attrs.append(attribute("pg_name", string_val=group))
    return Node(id=node_id, name=f"coll{node_id}", type=COLL, data_deps=deps, ctrl_deps=ctrl, attr=attrs)


def p2p(node_id, send, peer, size, tag=0, deps=(), ctrl=()):
    attrs = [attribute("comm_dst" if send else "comm_src", int32_val=peer), attribute("comm_size", int64_val=size),
             attribute("comm_tag", int32_val=tag)]
    return Node(id=node_id, name=f"{'send' if send else 'recv'}{node_id}", type=SEND if send else RECV,
                data_deps=deps, ctrl_deps=ctrl, attr=attrs)


def write(folder, ranks, groups=None):
    """Write rank files folder/t.<rank>.et from {rank: [nodes]}; returns the prefix."""
    for rank, nodes in ranks.items():
        write_trace(folder / f"t.{rank}.et", nodes)
    if groups is not None:
        (folder / "t.groups.json").write_text(json.dumps(groups))
    return folder / "t"


def data_parallel(ranks, layers=3, micros=1500, size=634_000_000):
    """Per rank: per layer a compute node, then an all-reduce of its gradients (data_deps on the compute)."""
    trace = {}
    for rank in range(ranks):
        nodes, previous = [], ()
        for layer in range(layers):
            nodes.append(comp(2 * layer, micros, deps=previous))
            nodes.append(coll(2 * layer + 1, size, deps=(2 * layer,)))
            previous = (2 * layer,)
        trace[rank] = nodes
    return trace


def test_a_trace_round_trips_through_the_wire_format(tmp_path):
    nodes = [comp(7, 12, deps=(3,), ctrl=(4,), num_ops=10**12, tensor_size=2**30), coll(9, 5, group="g")]
    write_trace(tmp_path / "x.0.et", nodes)
    metadata, back = read_trace(tmp_path / "x.0.et")
    assert isinstance(metadata, GlobalMetadata) and metadata.version
    assert [n.SerializeToString() for n in back] == [n.SerializeToString() for n in nodes]
    assert list(back[0].data_deps) == [3] and list(back[0].ctrl_deps) == [4] and back[0].duration_micros == 12


def test_data_parallel_trace_becomes_per_rank_compute_and_one_all_reduce_per_layer(tmp_path):
    prefix = write(tmp_path, data_parallel(4))
    graph = import_chakra(prefix)
    ranks = tuple(f"rank{r}" for r in range(4))
    collectives = sorted(n for n, d in graph.nodes(data=True) if d["kind"] == "comm")
    assert collectives == ["coll.all.0", "coll.all.1", "coll.all.2"]
    for name in collectives:
        data = graph.nodes[name]
        assert data["xpus"] == ranks and data["bytes"] == 634e6 and data["collective"] == "all_reduce"
    layer = graph.nodes["rank2.n2"]
    assert layer["xpus"] == ("rank2",) and math.isclose(layer["duration"], 1.5e-3)
    assert graph.has_edge("rank2.n0", "coll.all.0") and graph.has_edge("rank2.n0", "rank2.n2")
    assert graph.nodes["rank2.n0"]["start"] and not graph.nodes["rank2.n2"]["start"]
    # one iteration per trace: each rank's last nodes (here every all-reduce: nothing waits for them) feed its
    # first ones in the next iteration
    assert all(graph.edges[f"coll.all.{k}", "rank2.n0"]["skip_first_iteration"] for k in range(3))
    assert not graph.has_edge("rank2.n4", "rank2.n0")


def test_num_ops_time_a_node_without_a_duration(tmp_path):
    prefix = write(tmp_path, {0: [comp(0, num_ops=3 * 10**12, tensor_size=10**9)], 1: [comp(0, 40)]})
    graph = import_chakra(prefix)
    assert graph.nodes["rank0.n0"].get("duration") is None and graph.nodes["rank0.n0"]["flops"] == 3e12
    assert graph.nodes["rank0.n0"]["memory_bytes"] == 1e9 and math.isclose(graph.nodes["rank1.n0"]["duration"], 4e-5)


def test_collectives_over_subgroups_and_both_dependency_kinds(tmp_path):
    """Two tensor-parallel groups of 2 all-gather (pg_name), then everybody all-reduces; ctrl_deps and
    data_deps both order nodes."""
    trace = {r: [comp(0, 10), coll(1, 1000, ALL_GATHER, deps=(0,), group=f"tp{r // 2}"),
                 comp(2, 20, ctrl=(1,)), coll(3, 4000, deps=(2,))] for r in range(4)}
    graph = import_chakra(write(tmp_path, trace, {"tp0": [0, 1], "tp1": [2, 3]}))
    assert graph.nodes["coll.tp0.0"]["xpus"] == ("rank0", "rank1")
    assert graph.nodes["coll.tp1.0"]["xpus"] == ("rank2", "rank3")
    assert graph.nodes["coll.tp1.0"]["collective"] == "all_gather"
    assert graph.nodes["coll.all.0"]["xpus"] == tuple(f"rank{r}" for r in range(4))
    assert graph.has_edge("rank3.n0", "coll.tp1.0")  # data_deps
    assert graph.has_edge("coll.tp1.0", "rank3.n2")  # ctrl_deps
    assert not graph.has_edge("coll.tp0.0", "rank3.n2")


def test_send_and_receive_pairs_become_point_to_point_vertices(tmp_path):
    """Rank 0 computes and sends twice to rank 1 (tags 5 and 6); rank 1 computes after each receive."""
    trace = {0: [comp(0, 10), p2p(1, True, 1, 100, tag=5, deps=(0,)), p2p(2, True, 1, 200, tag=6, ctrl=(1,))],
             1: [p2p(10, False, 0, 200, tag=6), p2p(11, False, 0, 100, tag=5), comp(12, 30, deps=(11,), ctrl=(10,))]}
    graph = import_chakra(write(tmp_path, trace))
    first, second = graph.nodes["p2p.0.1.5.0"], graph.nodes["p2p.0.1.6.0"]
    assert first["xpus"] == ("rank0", "rank1") and first["bytes"] == 100 and first["collective"] == "p2p"
    assert second["bytes"] == 200
    assert graph.has_edge("rank0.n0", "p2p.0.1.5.0") and graph.has_edge("p2p.0.1.5.0", "p2p.0.1.6.0")
    assert graph.has_edge("p2p.0.1.5.0", "rank1.n12") and graph.has_edge("p2p.0.1.6.0", "rank1.n12")


@pytest.mark.parametrize("trace,groups,message", [
    ({0: [comp(0, 1, deps=(9,))], 1: [comp(0, 1)]}, None, r"t\.0\.et: node 0: data_deps: no node 9 in this file"),
    ({0: [comp(0, 1, ctrl=(9,))], 1: [comp(0, 1)]}, None, r"t\.0\.et: node 0: ctrl_deps: no node 9"),
    ({0: [coll(4, 10)], 1: [coll(4, 20)]}, None, r"t\.1\.et: node 4: comm_type/comm_size: collective #0 of group "
                                                 r"'all' is ALL_REDUCE of 10 B on rank 0"),
    ({0: [coll(4, 10)], 1: [coll(4, 10), coll(5, 10)]}, None, r"t\.1\.et: node 5: pg_name: collective #1 of group "
                                                              r"'all' has no counterpart in rank 0's trace"),
    ({0: [Node(id=3, type=COLL, attr=[attribute("comm_size", int64_val=8)])], 1: [coll(3, 8)]}, None,
     r"t\.0\.et: node 3: comm_type: missing attribute"),
    ({0: [coll(1, 8, group="dp")], 1: [coll(1, 8, group="dp")]}, {"tp": [0, 1]},
     r"t\.0\.et: node 1: pg_name: communicator group 'dp' is not in the groups JSON"),
    ({0: [coll(1, 8, COLLECTIVE_TYPES["GATHER"])], 1: [coll(1, 8, COLLECTIVE_TYPES["GATHER"])]}, None,
     r"t\.0\.et: node 1: comm_type: GATHER is not supported"),
    ({0: [p2p(2, True, 1, 64, tag=3)], 1: [comp(0, 1)]}, None,
     r"t\.0\.et: node 2: comm_dst: no matching COMM_RECV_NODE \(rank 0 -> rank 1, comm_tag 3\)"),
    ({0: [p2p(2, True, 1, 64)], 1: [p2p(8, False, 0, 32)]}, None, r"t\.1\.et: node 8: comm_size: 32 B, but the "
                                                                   r"matching send \(rank 0, node 2\) sends 64 B"),
    ({0: [Node(id=1, type=NODE_TYPES["MEM_LOAD_NODE"])], 1: [comp(0, 1)]}, None,
     r"t\.0\.et: node 1: type: MEM_LOAD_NODE is not supported"),
    ({0: [comp(1, 1), comp(1, 2)], 1: [comp(0, 1)]}, None, r"t\.0\.et: node 1: id: used by an earlier node"),
])
def test_malformed_traces_name_the_file_node_and_field(tmp_path, trace, groups, message):
    with pytest.raises(WorkloadError, match=message):
        import_chakra(write(tmp_path, trace, groups))


def test_truncated_or_garbled_files_name_the_file_and_byte(tmp_path):
    prefix = write(tmp_path, data_parallel(2, layers=1))
    whole = (tmp_path / "t.1.et").read_bytes()
    (tmp_path / "t.1.et").write_bytes(whole[:-3])
    with pytest.raises(WorkloadError, match=r"t\.1\.et: message at byte \d+ claims \d+ bytes but only \d+ remain"):
        import_chakra(prefix)
    (tmp_path / "t.1.et").write_bytes(whole[:-20] + b"\x0f" * 20)
    with pytest.raises(WorkloadError, match=r"t\.1\.et: "):
        import_chakra(prefix)
    (tmp_path / "t.1.et").unlink()
    (tmp_path / "t.2.et").write_bytes(whole)
    with pytest.raises(WorkloadError, match=r"chakra:.*t: ranks 1 have no trace file"):
        import_chakra(prefix)


def test_an_imported_trace_runs_as_its_closed_form(tmp_path):
    """Per rank: compute (duration), then a ring all-reduce of S, then compute; on one switch the iteration is
    d1 + 2(n-1)α + 2(n-1)/n·S/B + d2, and the second iteration repeats it (the back edges per rank)."""
    from hcsim.engine.api import RunOptions
    from hcsim.platform.builders import single_switch
    from hcsim.platform.devices import builtin_catalog
    from hcsim.platform.topology import xpus as platform_xpus
    from hcsim.run.simulation import simulate_graphs
    from hcsim.workload.sources import place_graph

    n, size, d1, d2 = 4, 3.2e8, 2e-3, 1e-3
    trace = {r: [comp(0, int(d1 * 1e6)), coll(1, int(size), deps=(0,)), comp(2, int(d2 * 1e6), deps=(1,))]
             for r in range(n)}
    platform = single_switch(n, builtin_catalog()["H100"])
    graph, used = place_graph(import_chakra(write(tmp_path, trace)), platform_xpus(platform))
    assert used == [f"xpu{i}" for i in range(n)]
    result = simulate_graphs(platform, graph, RunOptions(iterations=2))
    period = d1 + 2 * (n - 1) * 200e-9 + 2 * (n - 1) / n * size / 900e9 + d2
    assert [round(t / period, 9) for t in result["iteration_ends"]] == [1.0, 2.0]
