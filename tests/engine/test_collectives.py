"""Collective algorithms: schedule invariants, closed forms, and flow fidelity against step fidelity.

The simulations chain many collectives in one workload, each behind a barrier
(a zero-FLOP compute vertex on an XPU outside the group, which waits for every
rank of the collective before and releases every rank of the next), so one
fresh process measures a whole table; a collective's time is its last rank's
end minus its first rank's start, read from the trace.
"""

import math

import networkx as nx
import pytest

from hcsim.engine.collectives import (Algorithm, Step, algorithms, get_algorithm, hierarchical_time, register,
                                      server_groups)
from hcsim.engine.api import RunOptions
from hcsim.errors import ConfigError
from hcsim.platform import build_platform, load_platform_spec
from hcsim.platform.builders import single_switch
from hcsim.platform.devices import builtin_catalog
from hcsim.platform.topology import add_link, add_xpu
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, new_workload
from cases import A, B, _durations  # tests/engine is on sys.path

H100 = builtin_catalog()["H100"]
SIZES = (1e6, 3.3e8)


# ---- closed forms (n ranks, S bytes, α, B) ---------------------------------------------------------------------

def ring_all_reduce(n, s, chunks=None):
    return 2 * (n - 1) * A + 2 * (n - 1) / n * s / B


def one_pass(n, s, chunks=None):  # coherent ring, ring reduce-scatter / all-gather, pairwise all-to-all
    return (n - 1) * A + (n - 1) / n * s / B


def halving_doubling(n, s, chunks=None):
    return 2 * math.log2(n) * A + 2 * (n - 1) / n * s / B


def halving_or_doubling(n, s, chunks=None):
    return math.log2(n) * A + (n - 1) / n * s / B


def double_binary_tree(n, s, chunks):
    depth = round(math.log2(n + 1)) - 1  # n = 2^(D+1) - 1
    return 2 * (depth + chunks - 1) * (A + s / (chunks * B))


def pipelined_ring_broadcast(n, s, chunks):
    return (n + chunks - 2) * (A + s / (chunks * B))


def binomial_broadcast(n, s, chunks=None):
    return math.ceil(math.log2(n)) * (A + s / B)


def hierarchical(g, m, s):
    return 2 * (g - 1) * A + 2 * (g - 1) / g * s / B + 2 * (m - 1) * A + 2 * (m - 1) / (m * g) * s / B


CASES = [  # collective, algorithm, closed form, group sizes
    ("all_reduce", "ring", ring_all_reduce, (3, 8, 16)),
    ("all_reduce", "coherent_ring", one_pass, (3, 8, 16)),
    ("all_reduce", "halving_doubling", halving_doubling, (2, 8, 16)),
    ("all_reduce", "double_binary_tree", double_binary_tree, (3, 7, 15)),
    ("reduce_scatter", "ring", one_pass, (3, 8, 16)),
    ("reduce_scatter", "halving_doubling", halving_or_doubling, (2, 8, 16)),
    ("all_gather", "ring", one_pass, (3, 8, 16)),
    ("all_gather", "halving_doubling", halving_or_doubling, (2, 8, 16)),
    ("all_to_all", "pairwise", one_pass, (3, 8, 16)),
    ("broadcast", "ring", pipelined_ring_broadcast, (3, 8, 16)),
    ("broadcast", "binomial_tree", binomial_broadcast, (3, 8, 16)),
    ("p2p", "direct", lambda n, s, c=None: A + s / B, (2,)),
]
HIERARCHICAL = [(4, 2), (2, 4), (4, 4)]  # (ranks per server, servers)


def _closed_form_table():
    """{n: [(name, collective, algorithm, size, expected)]} for single-switch groups of n ranks."""
    table: dict[int, list] = {}
    for collective, name, form, sizes in CASES:
        for n in sizes:
            for size in SIZES:
                algorithm = get_algorithm(collective, name, n, size)
                expected = form(n, size, getattr(algorithm, "chunks", None))
                table.setdefault(n, []).append((f"{collective}.{name}.{size:g}", collective, name, size, expected))
    return table


TABLE = _closed_form_table()


@pytest.mark.parametrize("fidelity", ["step", "flow"])
@pytest.mark.parametrize("n", sorted(TABLE))
def test_every_algorithm_matches_its_closed_form_on_one_switch(n, fidelity):
    rows = TABLE[n]
    platform = single_switch(n + 1, H100)  # xpu{n} holds the barriers
    group = [f"xpu{i}" for i in range(n)]
    measured = _durations(platform, group, [row[:4] for row in rows], f"xpu{n}", fidelity)
    wrong = []
    for name, collective, algorithm, _, expected in rows:
        if not math.isclose(measured[name], expected, rel_tol=1e-6):
            wrong.append(f"{name}: {measured[name]!r} s, closed form {expected!r} s")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_hierarchical_matches_its_closed_form(fidelity):
    items, expected = [], {}
    for g, m in HIERARCHICAL:
        for size in SIZES:
            name = f"h{g}x{m}.{size:g}"
            items.append((name, g, m, size))
            expected[name] = hierarchical(g, m, size)
    wrong = []
    for g, m in sorted({(g, m) for _, g, m, _ in items}):
        n = g * m
        platform = single_switch(n + 1, H100)
        for i in range(n):
            platform.nodes[f"xpu{i}"]["server"] = f"s{i // g}"  # m servers of g XPUs on one switch
        group = [f"xpu{i}" for i in range(n)]
        mine = [(name, "all_reduce", "hierarchical", size) for name, gg, mm, size in items if (gg, mm) == (g, m)]
        for name, seconds in _durations(platform, group, mine, f"xpu{n}", fidelity).items():
            if not math.isclose(seconds, expected[name], rel_tol=1e-6):
                wrong.append(f"{name}: {seconds!r} s, closed form {expected[name]!r} s")
    assert not wrong, "\n".join(wrong)


# ---- chunks ---------------------------------------------------------------------------------------------------

CHUNKS = 3


@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_chunked_algorithms_match_their_closed_forms_on_one_switch(fidelity):
    """C chunks: a pipelined algorithm's form with C as its chunk count; any other C·T(S/C) (chunk after chunk,
    every chunk paying the latencies again)."""
    n, size = 8, 3.3e8
    items, expected = [], {}
    for collective, name, form, _ in CASES:
        ranks = 2 if collective == "p2p" else (7 if name == "double_binary_tree" else n)
        pipelined = get_algorithm(collective, name, ranks, size).pipelined
        key = f"{collective}.{name}"
        items.append((key, collective, name, size, CHUNKS))
        expected[key] = form(ranks, size, CHUNKS) if pipelined else CHUNKS * form(ranks, size / CHUNKS, None)
    wrong = []
    for ranks in sorted({2, 7, n}):
        mine = [item for item in items if (2 if item[1] == "p2p" else 7 if item[2] == "double_binary_tree" else n) == ranks]
        measured = _durations(single_switch(ranks + 1, H100), [f"xpu{i}" for i in range(ranks)], mine,
                              f"xpu{ranks}", fidelity)
        wrong += [f"{key}: {measured[key]!r} s, closed form {expected[key]!r} s"
                  for key, *_ in mine if not math.isclose(measured[key], expected[key], rel_tol=1e-6)]
    assert not wrong, "\n".join(wrong)


def _two_level(g, m, intra_bw, intra_lat, inter_bw, inter_lat):
    """m servers of g XPUs: a switch per server, and rings across servers (XPU j of server i linked directly to
    XPU j of server i+1), so intra-server and inter-server transfers never share a link."""
    graph = nx.Graph(name=f"two-level-{g}x{m}", coherent=False)
    for i in range(m):
        graph.add_node(f"sw{i}", kind="switch", role="xpu", rack=0, server=f"s{i}")
        for j in range(g):
            add_xpu(graph, f"xpu{i * g + j}", H100, hbm_latency=100e-9, rack=0, server=f"s{i}")
            add_link(graph, f"xpu{i * g + j}", f"sw{i}", bandwidth=intra_bw, latency=intra_lat, kind="xpu_link")
    for i in range(m if m > 2 else m - 1):
        for j in range(g):
            add_link(graph, f"xpu{i * g + j}", f"xpu{(i + 1) % m * g + j}", bandwidth=inter_bw, latency=inter_lat,
                     kind="eth")
    return graph


@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_hierarchical_chunks_pipeline_across_phases(fidelity):
    """Chunk k+1's reduce-scatter inside the servers runs beside chunk k's all-reduce across them, on a platform
    whose intra- and inter-server links are separate: hierarchical_time (the lock steps, each as long as its
    slowest transfer), which is 2a·t_i + b·t_e for one chunk and (2Ca - Cb)·t_i + Cb·max(t_i, t_e) for b <= a;
    faster than one chunk whenever both phases have steps."""
    intra_bw, intra_lat, inter_bw, inter_lat = 900e9, 100e-9, 50e9, 1e-6
    size = 6.4e8
    wrong = []
    for g, m in ((4, 2), (2, 4), (4, 3)):
        platform = _two_level(g, m, intra_bw, intra_lat, inter_bw, inter_lat)
        items = [(f"h{c}", "all_reduce", "hierarchical", size, c) for c in (1, 2, 5)]
        # the barrier XPU hangs off server 0's switch (its compute vertices move no bytes)
        add_xpu(platform, f"xpu{g * m}", H100, hbm_latency=100e-9, rack=0, server="s0")
        add_link(platform, f"xpu{g * m}", "sw0", bandwidth=intra_bw, latency=intra_lat, kind="xpu_link")
        measured = _durations(platform, [f"xpu{i}" for i in range(g * m)], items, f"xpu{g * m}", fidelity)
        a, b = g - 1, 2 * (m - 1)
        for _, _, _, _, c in items:
            t_i = 2 * intra_lat + size / (g * c) / intra_bw
            t_e = inter_lat + size / (g * m * c) / inter_bw
            expected = hierarchical_time(g, m, c, t_i, t_e)
            if c == 1:
                assert math.isclose(expected, 2 * a * t_i + b * t_e)
            elif b <= a:
                assert math.isclose(expected, (2 * c * a - c * b) * t_i + c * b * max(t_i, t_e))
            if not math.isclose(measured[f"h{c}"], expected, rel_tol=1e-6):
                wrong.append(f"g={g} m={m} C={c}: {measured[f'h{c}']!r} s, expected {expected!r} s")
        assert measured["h2"] < measured["h1"]
    assert not wrong, "\n".join(wrong)


def _servers_with_nics(g, m, intra_bw, intra_lat, nic_bw, nic_lat):
    """m servers of g XPUs: a switch per server, and every XPU its own NIC link to one core switch (a DGX's
    rail NICs on a non-blocking fabric)."""
    graph = nx.Graph(name=f"nics-{g}x{m}", coherent=False)
    graph.add_node("core", kind="switch", role="tor", rack=0)
    for i in range(m):
        graph.add_node(f"sw{i}", kind="switch", role="xpu", rack=0, server=f"s{i}")
        for j in range(g):
            x = f"xpu{i * g + j}"
            add_xpu(graph, x, H100, hbm_latency=100e-9, rack=0, server=f"s{i}")
            add_link(graph, x, f"sw{i}", bandwidth=intra_bw, latency=intra_lat, kind="xpu_link")
            add_link(graph, x, "core", bandwidth=nic_bw, latency=nic_lat, kind="eth")
    return graph


@pytest.mark.parametrize("fidelity", ["step", "flow"])
def test_nccl_channel_rings_cross_servers_through_every_nic(fidelity):
    """A group of m servers x g ranks: the plain ring crosses each server boundary through one NIC, so every
    step is S/n over one NIC: 2(n-1)(2α_nic + S/(n·B_nic)); NCCL's g channel rings cross through g different
    NICs at once, each with S/(n·g): 2(n-1)(2α_nic + S/(n·g·B_nic)). Inside one server both are the plain ring."""
    g, m, size = 4, 2, 4e8
    intra_bw, intra_lat, nic_bw, nic_lat = 900e9, 100e-9, 25e9, 1e-6
    n = g * m
    platform = _servers_with_nics(g, m, intra_bw, intra_lat, nic_bw, nic_lat)
    add_xpu(platform, f"xpu{n}", H100, hbm_latency=100e-9, rack=0, server="s0")  # the barrier XPU
    add_link(platform, f"xpu{n}", "sw0", bandwidth=intra_bw, latency=intra_lat, kind="xpu_link")
    items = [(f"{name}.{c}", c, name, size) for name in ("ring", "nccl") for c in ("all_reduce", "all_gather")]
    measured = _durations(platform, [f"xpu{i}" for i in range(n)], items, f"xpu{n}", fidelity)
    for collective, rounds in (("all_reduce", 2), ("all_gather", 1)):
        steps = rounds * (n - 1)
        assert measured[f"ring.{collective}"] == pytest.approx(steps * (2 * nic_lat + size / (n * nic_bw)), rel=1e-6)
        assert measured[f"nccl.{collective}"] == pytest.approx(steps * (2 * nic_lat + size / (n * g * nic_bw)),
                                                               rel=1e-6)
    inside = _durations(platform, [f"xpu{i}" for i in range(g)], items, f"xpu{n}", fidelity)
    assert inside["nccl.all_reduce"] == pytest.approx(inside["ring.all_reduce"], rel=1e-12)


@pytest.mark.parametrize("collective,name", [("all_reduce", "ring"), ("all_reduce", "halving_doubling"),
                                             ("all_reduce", "hierarchical"), ("all_reduce", "double_binary_tree"),
                                             ("all_to_all", "pairwise"), ("broadcast", "ring")])
def test_chunked_schedules_carry_every_byte(collective, name):
    """(Their sends and receives line up: test_every_send_is_received_in_the_same_step.)"""
    n, size = 16, 1e8
    groups = [list(range(i, i + 4)) for i in range(0, n, 4)]
    plain = get_algorithm(collective, name, n, size, groups)
    chunked = get_algorithm(collective, name, n, size, groups, chunks=4)
    assert chunked.chunks == 4 and chunked.name == name and chunked.pairs() == plain.pairs()
    flows = chunked.flows()
    assert flows.keys() == plain.flows().keys()
    assert all(math.isclose(flows[p], plain.flows()[p]) for p in flows)  # chunking moves the same bytes
    total = sum(b for r in range(n) for lane in range(chunked.lanes) for i in range(chunked.lane_steps(r, lane))
                for _, b in chunked.lane_step(r, i, lane).sends)
    assert math.isclose(total, sum(plain.flows().values()))
    phases = chunked.flow_phases()
    if phases is not None:
        by_pair: dict = {}
        for phase in phases:
            for pair, b in phase.transfers:
                by_pair[pair] = by_pair.get(pair, 0.0) + b
        assert by_pair.keys() == flows.keys() and all(math.isclose(by_pair[p], flows[p]) for p in flows)


def test_chunks_must_be_a_positive_integer():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match=r"chunks must be an integer >= 1"):
            get_algorithm("all_reduce", "ring", 4, 1e6, chunks=bad)


# ---- schedule invariants (no simulation) --------------------------------------------------------------------------

ALL = [(c, name) for c, names in algorithms().items() for name in names]


def _sizes_for(collective, name):
    if name == "halving_doubling":
        return (2, 4, 16, 64)
    if collective == "p2p":
        return (2,)
    return (2, 3, 7, 8, 12, 64)


@pytest.mark.parametrize("chunks", [None, 3])
@pytest.mark.parametrize("collective,name", ALL)
def test_every_send_is_received_in_the_same_step(collective, name, chunks):
    for n in _sizes_for(collective, name):
        groups = [list(range(i, min(n, i + 4))) for i in range(0, n, 4)] if n % 4 == 0 else None
        algorithm = get_algorithm(collective, name, n, 1e8, groups, chunks)
        for lane in range(algorithm.lanes):
            ends = range(algorithm.endpoints)  # the ranks, and a region's memory device
            for index in range(max(algorithm.lane_steps(r, lane) for r in ends)):
                sent = sorted((r, dst) for r in ends if index < algorithm.lane_steps(r, lane)
                              for dst, _ in algorithm.lane_step(r, index, lane).sends)
                received = sorted((src, r) for r in ends if index < algorithm.lane_steps(r, lane)
                                  for src in algorithm.lane_step(r, index, lane).recvs)
                assert sent == received, f"{collective}.{name} n={n} lane {lane} step {index}"
                assert all(src != dst for src, dst in sent)


@pytest.mark.parametrize("collective,name,per_rank", [
    ("all_reduce", "ring", lambda n, s: 2 * (n - 1) / n * s),
    ("all_reduce", "coherent_ring", lambda n, s: (n - 1) / n * s),
    ("all_reduce", "halving_doubling", lambda n, s: 2 * (n - 1) / n * s),
    ("all_reduce", "hierarchical", lambda n, s: 2 * (n - 1) / n * s),  # one server: the ring
    ("all_reduce", "nvls", lambda n, s: (n + 1) / n * s),  # to the switch and back: S + S/n
    ("reduce_scatter", "ring", lambda n, s: (n - 1) / n * s),
    ("all_gather", "halving_doubling", lambda n, s: (n - 1) / n * s),
    ("all_to_all", "pairwise", lambda n, s: (n - 1) / n * s),
])
def test_bytes_each_rank_sends(collective, name, per_rank):
    n, size = 16, 1.6e9
    algorithm = get_algorithm(collective, name, n, size)
    for rank in range(n):
        sent = sum(b for i in range(algorithm.steps(rank)) for _, b in algorithm.step(rank, i).sends)
        assert math.isclose(sent, per_rank(n, size))


@pytest.mark.parametrize("n", [7, 8, 15, 16])
def test_double_binary_tree_trees_are_complementary(n):
    """Each tree has n-1 edges, each carrying S/2 up and S/2 down; no rank is inner in both trees."""
    size = 1e9
    tree = get_algorithm("all_reduce", "double_binary_tree", n, size)
    flows = tree.flows()
    assert sum(flows.values()) == pytest.approx(2 * 2 * (n - 1) * size / 2)
    senders: dict[int, set[int]] = {}
    for src, dst in flows:
        senders.setdefault(dst, set()).add(src)
    # a rank hears from its children (reduce) and its parent (broadcast) in each tree: inner in one tree
    # (2 children + parent) and a leaf in the other (parent) makes at most 4
    assert max(len(s) for s in senders.values()) <= 4


AGGREGATED = [(c, name) for c, name in ALL if name != "double_binary_tree"]


@pytest.mark.parametrize("collective,name", AGGREGATED)
def test_flow_phases_carry_every_byte(collective, name):
    n = 16 if collective != "p2p" else 2
    algorithm = get_algorithm(collective, name, n, 1e8, [list(range(i, i + 4)) for i in range(0, n, 4)])
    by_pair: dict[tuple[int, int], float] = {}
    lock_steps = [0] * algorithm.lanes
    for phase in algorithm.flow_phases():
        assert phase.steps >= 1
        assert all(f < i for i, feeds in enumerate(phase.feeds) for f in feeds), "a transfer fed by a later one"
        lock_steps[phase.lane] += 0 if phase.feeds else phase.steps
        for pair, size in phase.transfers:
            by_pair[pair] = by_pair.get(pair, 0.0) + size
    flows = algorithm.flows()
    assert by_pair.keys() == flows.keys()
    assert all(math.isclose(by_pair[p], flows[p]) for p in flows)
    if not any(phase.feeds for phase in algorithm.flow_phases()):  # lock-step phases stand for every sending step
        for lane in range(algorithm.lanes):  # of their lane; lanes run side by side
            ends = range(algorithm.endpoints)
            steps = [algorithm.lane_steps(r, lane) for r in ends]
            assert lock_steps[lane] == sum(1 for i in range(max(steps))
                                           if any(i < steps[r] and algorithm.lane_step(r, i, lane).sends
                                                  for r in ends))


def test_the_double_binary_tree_runs_its_step_schedule_at_flow_fidelity():
    """No aggregated model of the tree held 1% (collectives.py); `flow` must say it ran steps instead."""
    assert get_algorithm("all_reduce", "double_binary_tree", 16, 1e8).flow_phases() is None
    graph = new_workload("tree")
    add_comm(graph, "tree", xpus=[f"xpu{i}" for i in range(4)], bytes=1e8, collective="all_reduce",
             algorithm="double_binary_tree", start=True)
    result = simulate_graphs(single_switch(4, H100), graph, RunOptions(collective_model="flow", iterations=1))
    assert result["collective_fidelity"] == {"tree": "step"}


def test_halving_doubling_needs_a_power_of_two():
    with pytest.raises(ConfigError, match=r"halving_doubling all_reduce: needs a power-of-two group, got 12 ranks"):
        get_algorithm("all_reduce", "halving_doubling", 12, 1e6)


def test_hierarchical_needs_equal_servers():
    with pytest.raises(ConfigError, match=r"hierarchical all_reduce needs the same number of ranks"):
        get_algorithm("all_reduce", "hierarchical", 6, 1e6, [[0, 1, 2, 3], [4, 5]])


def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"all_reduce algorithm 'nope': not registered; known: .*coherent_ring"):
        get_algorithm("all_reduce", "nope", 4, 1e6)


def test_defaults_and_server_groups():
    assert get_algorithm("all_reduce", None, 4, 1.0).name == "ring"
    assert get_algorithm("all_to_all", None, 4, 1.0).name == "pairwise"
    platform = build_platform(load_platform_spec("paper-traditional", {}), xpus=16)
    assert server_groups(platform, [f"xpu{i}" for i in range(16)]) == [list(range(8)), list(range(8, 16))]


class _StarBroadcast(Algorithm):
    """A user's algorithm, registered without touching the engine: rank 0 sends S to every rank at once.

    Rank 0's link carries n-1 transfers: α + (n-1)·S/B.
    """

    name, collective = "test_star", "broadcast"

    def steps(self, rank):
        return 1

    def step(self, rank, index):
        if rank == 0:
            return Step(sends=tuple((r, self.size) for r in range(1, self.ranks)), recvs=())
        return Step(sends=(), recvs=(0,))


def test_a_user_algorithm_runs_by_name(monkeypatch):
    import hcsim.engine.collectives as collectives

    with monkeypatch.context() as patch:  # registered for this test only: `hcsim list algorithms` never sees it
        patch.setattr(collectives, "_REGISTRY", dict(collectives._REGISTRY))
        register(_StarBroadcast)
        assert get_algorithm("broadcast", "test_star", 3, 1.0).name == "test_star"
    n, size = 5, 1e8
    platform = single_switch(n + 1, H100)
    seconds = _durations(platform, [f"xpu{i}" for i in range(n)], [("star", "broadcast", f"{__name__}:_StarBroadcast", size)],
                         f"xpu{n}", "step")
    assert math.isclose(seconds["star"], A + (n - 1) * size / B, rel_tol=1e-6)


class _Relay(Algorithm):
    """Rank 0 sends S to rank 1 in step 0; rank 1 sends S to rank 2 in step 1, in lane `relay_lane`.

    In one lane rank 1 forwards after its receive: 2(α + S/B). In a lane of its own rank 1's send does
    not wait (the two transfers use different directions of rank 1's link): α + S/B.
    """

    name, collective, lanes, relay_lane = "test_relay", "broadcast", 2, 1

    def lane_steps(self, rank, lane):
        return 2

    def lane_step(self, rank, index, lane):
        if lane == 0 and index == 0 and rank in (0, 1):
            return Step(sends=((1, self.size),), recvs=()) if rank == 0 else Step(sends=(), recvs=(0,))
        if lane == self.relay_lane and index == 1 and rank in (1, 2):
            return Step(sends=((2, self.size),), recvs=()) if rank == 1 else Step(sends=(), recvs=(1,))
        return Step(sends=(), recvs=())


class _OneLaneRelay(_Relay):
    name, relay_lane = "test_relay_one_lane", 0


def test_lanes_advance_independently():
    size = 1e8
    items = [("lanes", "broadcast", f"{__name__}:_Relay", size),
             ("one", "broadcast", f"{__name__}:_OneLaneRelay", size)]
    seconds = _durations(single_switch(4, H100), ["xpu0", "xpu1", "xpu2"], items, "xpu3", "step")
    assert math.isclose(seconds["lanes"], A + size / B, rel_tol=1e-6)
    assert math.isclose(seconds["one"], 2 * (A + size / B), rel_tol=1e-6)


# ---- flow fidelity against step fidelity on the paper's topologies (heterogeneous links) ------------------------

# (neither paper topology has a memory device a group shares: test_pooled_collectives compares pooled_memory's
# two models on cxl-pool)
AGREEMENT = [(c, name) for c, name in ALL if c != "p2p" and not get_algorithm(c, name, 2, 1.0).region]
AGREEMENT_SIZES = (1e6, 1e8, 1e9)


@pytest.fixture(scope="module")
def agreement():
    """{(topology, n): {name: (step s, flow s)}} for every algorithm and size, two processes per case."""
    table = {}
    for topology in ("paper-traditional", "paper-cxl"):
        for n in (16, 64):
            platform = build_platform(load_platform_spec(topology, {}), xpus=n + 1)  # xpu{n}: the barriers
            group = [f"xpu{i}" for i in range(n)]
            items = [(f"{c}.{a}.{s:g}", c, a, s) for c, a in AGREEMENT for s in AGREEMENT_SIZES]
            step = _durations(platform, group, items, f"xpu{n}", "step")
            flow = _durations(platform, group, items, f"xpu{n}", "flow")
            table[topology, n] = {name: (step[name], flow[name]) for name, *_ in items}
    return table


def _disagreements(table, keep):
    return [f"{topology} n={n} {name}: step {step!r} s, flow {flow!r} s ({flow / step - 1:+.2%})"
            for (topology, n), rows in sorted(table.items()) for name, (step, flow) in rows.items()
            if keep(name) and not math.isclose(flow, step, rel_tol=0.01)]


def test_flow_is_within_one_percent_of_step_on_the_paper_topologies(agreement):
    wrong = _disagreements(agreement, lambda name: "double_binary_tree" not in name)
    assert not wrong, "\n".join(wrong)
