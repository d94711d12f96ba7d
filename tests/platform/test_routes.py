"""Routes: least latency, then largest bottleneck; only through transit nodes; user routes win."""

import random

import networkx as nx
import pytest

from hcsim.errors import ConfigError, TopologyError
from hcsim.platform import build_platform, load_platform_spec, route_bandwidth, route_latency, shortest_routes
from hcsim.platform.pairs import data_parallel_pairs
from hcsim.platform.topology import is_transit

PCIE, ETH, CXL, XPU_LINK, DRAM = 250e-9, 5e-6, 200e-9, 100e-9, 100e-9


def _route(graph, src, dst):
    return shortest_routes(graph, src, [dst])[dst]


def test_closed_form_latencies(cxl_4096, traditional_4096):
    # same server: over the XPU switch, in both topologies
    for graph in (cxl_4096, traditional_4096):
        assert route_latency(graph, _route(graph, "xpu0", "xpu5")) == pytest.approx(2 * XPU_LINK)
    # traditional, other server of the rack: PCIe, NIC, ToR, NIC, PCIe
    route = _route(traditional_4096, "xpu7", "xpu8")
    assert route_latency(traditional_4096, route) == pytest.approx(4 * PCIE + 2 * ETH)
    # traditional, other rack: through the core switch
    route = _route(traditional_4096, "xpu127", "xpu128")
    assert "core" in route and route_latency(traditional_4096, route) == pytest.approx(4 * PCIE + 4 * ETH)
    assert route_bandwidth(traditional_4096, route) == 12.5e9
    # coherent: gradient traffic between servers takes the CXL fabric, not Ethernet
    route = _route(cxl_4096, "xpu7", "xpu8")  # same leaf switch (16 XPUs per leaf)
    assert route_latency(cxl_4096, route) == pytest.approx(2 * CXL)
    route = _route(cxl_4096, "xpu15", "xpu16")  # two leaves of one rack
    assert route_latency(cxl_4096, route) == pytest.approx(4 * CXL)
    route = _route(cxl_4096, "xpu127", "xpu128")  # two racks: leaf, rack switch, spine, rack switch, leaf
    assert route_latency(cxl_4096, route) == pytest.approx(6 * CXL)
    assert {cxl_4096.edges[u, v]["kind"] for u, v in zip(route, route[1:])} == {"cxl"}
    # extended memory: the CPU's DRAM over PCIe, or the XPU's own Type 3 over its leaf switch
    assert route_latency(traditional_4096, _route(traditional_4096, "xpu6", "r0s0.dram1")) == pytest.approx(2 * PCIE + DRAM)
    assert _route(cxl_4096, "xpu6", "xpu6.cxl") == ["xpu6", "r0.cxl1.0", "xpu6.cxl"]


def test_routes_cross_only_transit_nodes_or_an_owner(cxl_4096):
    graph = build_platform(load_platform_spec("paper-cxl", {"xpus": 256}))
    pairs = data_parallel_pairs(graph) + [("xpu3.hbm", "xpu200.hbm"), ("xpu9.cxl", "xpu100")]
    for src, dst in pairs:
        route = _route(graph, src, dst)
        for before, node, after in zip(route, route[1:], route[2:]):
            data = graph.nodes[node]
            assert is_transit(data) or node in (graph.nodes[before].get("owner"), graph.nodes[after].get("owner"))


def _reference_latency(graph, src, dst):
    """networkx's Dijkstra on the graph without the non-transit nodes other than the ends and their owners."""
    keep = {n for n, d in graph.nodes(data=True) if is_transit(d)} | {src, dst}
    keep |= {graph.nodes[n].get("owner") for n in (src, dst)} - {None}
    return nx.dijkstra_path_length(graph.subgraph(keep), src, dst, weight="latency")


@pytest.mark.parametrize("fixture", ["cxl_4096", "traditional_4096"])
def test_routes_are_networkx_shortest_paths_on_sampled_pairs(fixture, request):
    graph = request.getfixturevalue(fixture)
    # pairs with an XPU at one end (the coherent fabric joins XPUs and their expanders, not CPUs)
    hosts = sorted(n for n, d in graph.nodes(data=True) if d["kind"] in ("xpu", "memory", "cpu"))
    accelerators = sorted(n for n, d in graph.nodes(data=True) if d["kind"] == "xpu")
    rng = random.Random(7)
    for src, dst in (rng.sample([rng.choice(accelerators), rng.choice(hosts)], 2) for _ in range(16)):
        route = _route(graph, src, dst)
        assert route[0] == src and route[-1] == dst and all(graph.has_edge(u, v) for u, v in zip(route, route[1:]))
        assert route_latency(graph, route) == pytest.approx(_reference_latency(graph, src, dst), rel=1e-12)


def test_ties_on_latency_go_to_the_larger_bottleneck():
    graph = nx.Graph()
    for node in ("a", "b"):
        graph.add_node(node, kind="xpu")
    for node in ("slow", "fast"):
        graph.add_node(node, kind="switch")
    for middle, bandwidth in (("slow", 10e9), ("fast", 100e9)):
        graph.add_edge("a", middle, bandwidth=bandwidth, latency=1e-7, kind="pcie")
        graph.add_edge(middle, "b", bandwidth=bandwidth, latency=1e-7, kind="pcie")
    assert _route(graph, "a", "b") == ["a", "fast", "b"]
    graph.edges["slow", "b"]["latency"] = 0.5e-7  # less latency wins over more bandwidth
    assert _route(graph, "a", "b") == ["a", "slow", "b"]


@pytest.mark.parametrize("first", ["left", "right"])
def test_ties_on_latency_and_bottleneck_go_to_the_first_link_in_node_order(first):
    graph = nx.Graph()
    graph.add_node("a", kind="xpu")
    middles = ["left", "right"] if first == "left" else ["right", "left"]
    for node in middles:
        graph.add_node(node, kind="switch")
    graph.add_node("b", kind="xpu")
    for middle in middles:  # a's adjacency lists `first` first
        graph.add_edge("a", middle, bandwidth=10e9, latency=1e-7, kind="pcie")
    for middle in middles:
        graph.add_edge(middle, "b", bandwidth=10e9, latency=1e-7, kind="pcie")
    assert _route(graph, "a", "b") == ["a", first, "b"]


def test_one_search_answers_many_sources_as_fresh_searches_do(cxl_4096):
    """A search keeps per-node state between sources (stamped per search): the routes of one search object
    asked for many sources, twice over, are those of a new search per source."""
    from hcsim.platform.routes import RouteSearch

    hosts = sorted(n for n, d in cxl_4096.nodes(data=True) if d["kind"] in ("xpu", "memory"))
    accelerators = sorted(n for n, d in cxl_4096.nodes(data=True) if d["kind"] == "xpu")
    rng = random.Random(3)
    asks = [(rng.choice(accelerators), rng.sample(hosts, 5)) for _ in range(40)]
    search = RouteSearch(cxl_4096)
    reused = [search(src, targets) for src, targets in asks + asks]
    fresh = [shortest_routes(cxl_4096, src, targets) for src, targets in asks]
    assert reused == fresh + fresh


def test_user_routes_win(tmp_path):
    spec = load_platform_spec("paper-cxl", {"xpus": 16, "routes": [["xpu0", "r0s0.pcie0", "r0s0.nic0.0", "r0.tor",
                                                                       "r0s1.nic0.0", "r0s1.pcie0", "xpu8"]]})
    graph = build_platform(spec)
    assert _route(graph, "xpu0", "xpu8")[3] == "r0.tor"  # Ethernet, though CXL is faster
    assert _route(graph, "xpu8", "xpu0")[1] == "r0.cxl1.0"  # only the given direction is overridden
    graph.graph["routes"][("xpu0", "xpu8")] = ["xpu0", "r0.tor", "xpu8"]
    with pytest.raises(TopologyError, match=r"user route 'xpu0' -> 'xpu8': no link 'xpu0'--'r0.tor'"):
        _route(graph, "xpu0", "xpu8")


def test_unreachable_target_is_a_topology_error(catalog):
    from hcsim.platform import single_switch

    graph = single_switch(2, catalog["H100"])
    graph.add_node("island", kind="memory", capacity=1.0, role="dram", owner=None)
    with pytest.raises(TopologyError, match=r"routes from 'xpu0': no route to 'island'"):
        _route(graph, "xpu0", "island")


@pytest.mark.parametrize("policy,takes_ethernet", [("shortest", True), ("fabric", False)])
def test_xpu_traffic_policy_decides_whether_slow_cxl_gives_way_to_ethernet(policy, takes_ethernet):
    cxl = 20e-6  # per CXL link: xpu0 -> leaf -> xpu8 is 40 us, the Ethernet detour about 11 us
    spec = load_platform_spec("paper-cxl", {"xpus": 16, "links.cxl.latency": "20us", "cxl.xpu_traffic": policy})
    graph = build_platform(spec)
    route = _route(graph, "xpu0", "xpu8")
    kinds = {graph.edges[u, v]["kind"] for u, v in zip(route, route[1:])}
    assert ("eth" in kinds) == takes_ethernet
    if not takes_ethernet:
        assert route_latency(graph, route) == pytest.approx(2 * cxl)
    assert _route(graph, "xpu0", "xpu0.cxl")[-1] == "xpu0.cxl"  # memory routes are unaffected


def test_xpu_traffic_policy_is_validated():
    with pytest.raises(ConfigError, match=r"cxl.xpu_traffic: 'fabrik' is not one of shortest, fabric"):
        load_platform_spec("paper-cxl", {"cxl.xpu_traffic": "fabrik"})


def test_without_the_built_search_one_error_says_how_to_build_it(monkeypatch, cxl_4096):
    import sys

    from hcsim.errors import SimulationError
    from hcsim.platform import routes

    monkeypatch.delattr(sys.modules["hcsim.platform"], "_routes", raising=False)
    monkeypatch.setitem(sys.modules, "hcsim.platform._routes", None)  # an import of it fails
    with pytest.raises(SimulationError, match=r"^route search: its extension hcsim.platform._routes is not built.*Fix: make core"):
        routes.RouteSearch(cxl_4096)
