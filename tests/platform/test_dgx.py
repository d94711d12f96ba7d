"""DGX-A100 and DGX-H100 clusters: structure in closed form, link figures from the spec, routes, errors."""

import math
from collections import Counter

import pytest

from hcsim.errors import ConfigError
from hcsim.platform import build_platform, compile_platform, load_platform_spec, route_bandwidth, route_latency
from hcsim.platform.pairs import hybrid_parallel_pairs
from hcsim.platform.topology import xpus


@pytest.fixture(scope="module")
def specs():
    return {name: load_platform_spec(name) for name in ("dgx-a100", "dgx-h100")}


@pytest.fixture(scope="module")
def graphs(specs):
    cache = {}

    def get(name, count):
        if (name, count) not in cache:
            cache[name, count] = build_platform(specs[name], count)
        return cache[name, count]

    return get


def _kinds(graph):
    """Nodes by kind, switches by role (``switch/pcie``)."""
    return Counter(f"switch/{d['role']}" if d["kind"] == "switch" else d["kind"] for _, d in graph.nodes(data=True))


def _expected_levels(nics: int, leaves: int, radix: int) -> int:
    """Levels of the fat tree: groups of radix/2 children until at most radix remain, then one top."""
    levels, children = 1, leaves
    while children > 1:
        levels += 1
        children = 1 if children <= radix else math.ceil(children / (radix // 2))
    return levels


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("count", [8, 64, 1024, 16384])
def test_structure_in_closed_form(specs, graphs, name, count):
    spec = specs[name]
    graph = graphs(name, count)
    node, fabric = spec.dgx.node, spec.dgx.fabric
    nodes = math.ceil(count / node.gpus)
    kinds = _kinds(graph)
    assert kinds["xpu"] == count and kinds["nic"] == count  # one NIC per GPU
    assert kinds["cpu"] == node.cpus * nodes and kinds["memory"] == count + node.cpus * nodes  # HBM + DRAM
    assert kinds["switch/pcie"] == count + math.ceil(count / node.gpus_per_uplink)  # a switch per GPU + uplinks
    assert kinds["switch/xpu"] == nodes  # the NVSwitch
    servers = {d["server"] for _, d in graph.nodes(data=True) if d.get("kind") == "xpu"}
    assert len(servers) == nodes
    down, radix = fabric.down_ports, fabric.switch_radix
    if fabric.topology == "fat_tree":
        leaves = math.ceil(count / down)
    else:  # a leaf per rail and scalable unit of radix/2 nodes
        leaves = min(node.gpus, count) * math.ceil(nodes / down)
    levels = graph.graph["ib_switches"]
    assert levels[1] == leaves == sum(1 for _, d in graph.nodes(data=True) if d.get("level") == 1 and d.get("role") == "ib")
    assert len(levels) == _expected_levels(count, leaves, radix)
    if len(levels) > 1:
        assert levels[len(levels)] == math.ceil(count / radix)  # the top switches: radix ports each, all down
    # capacity of L levels: radix x (radix/2)^(L-1) NICs
    assert count <= radix * down ** (len(levels) - 1)


def test_switch_counts_at_16384_gpus(graphs):
    assert graphs("dgx-h100", 16384).graph["ib_switches"] == {1: 512, 2: 512, 3: 256}  # 64-port NDR: 3 levels
    # 40-port HDR: 3 levels reach 40 x 20^2 = 16,000 NICs, so 16,384 take a fourth
    assert graphs("dgx-a100", 16384).graph["ib_switches"] == {1: 820, 2: 820, 3: 820, 4: 410}


@pytest.mark.parametrize("name, count", [("dgx-a100", 1024), ("dgx-h100", 4096), ("dgx-h100", 16384)])
def test_the_fat_tree_is_non_blocking(graphs, specs, name, count):
    """Every switch link up carries the NIC bandwidth of everything below it; no leaf or top is over its ports."""
    graph, links, fabric = graphs(name, count), specs[name].links, specs[name].dgx.fabric
    for switch, data in graph.nodes(data=True):
        if data.get("role") != "ib":
            continue
        up = [m for m in graph[switch] if graph.nodes[m].get("level", 0) > data["level"]]
        below = [m for m in graph[switch] if m not in up]
        assert len(up) <= 1 and len(below) <= fabric.switch_radix
        if data["level"] == 1:
            assert len(below) <= fabric.down_ports
        for m in up:
            assert graph.edges[switch, m]["bandwidth"] == data["nics"] * links["ib"].bandwidth
            assert data["nics"] * links["ib"].bandwidth >= data["nics"] * links["nic_to_leaf"].bandwidth


def test_rail_optimised_leaves_hold_one_rail_of_one_scalable_unit(graphs, specs):
    graph, down = graphs("dgx-h100", 1024), specs["dgx-h100"].dgx.fabric.down_ports
    for leaf, data in graph.nodes(data=True):
        if data.get("role") == "ib" and data["level"] == 1:
            nics = [m for m in graph[leaf] if graph.nodes[m]["kind"] == "nic"]
            rails = {nic.rsplit("nic", 1)[1] for nic in nics}
            units = {int(nic.split(".")[0][1:]) // down for nic in nics}
            assert len(rails) == 1 and len(units) == 1 and len(nics) == down


def test_fat_tree_key_switches_to_leaves_in_node_order(graphs):
    graph = build_platform(load_platform_spec("dgx-h100", {"fabric.topology": "fat_tree"}), 64)
    assert sorted(m for m in graph["ib1.0"] if graph.nodes[m]["kind"] == "nic") == \
        sorted(f"n{k}.nic{i}" for k in range(4) for i in range(8))


@pytest.mark.parametrize("name, nvlink, nic, pcie, dram", [
    ("dgx-a100", 300e9, 25e9, 32e9, 204.8e9), ("dgx-h100", 450e9, 50e9, 64e9, 307.2e9)])
def test_link_figures_come_from_the_spec(graphs, specs, name, nvlink, nic, pcie, dram):
    spec, graph = specs[name], graphs(name, 64)
    assert (spec.links["xpu_link"].bandwidth, spec.links["nic_to_leaf"].bandwidth) == (nvlink, nic)
    assert (spec.links["pcie"].bandwidth, spec.links["dram"].bandwidth) == (pcie, dram)
    device = spec.catalog[spec.devices[0]]
    assert graph.edges["xpu9", "n1.nvsw"]["bandwidth"] == nvlink
    assert graph.edges["n1.nic1", "n1.pcie1"]["bandwidth"] == pcie
    assert graph.edges["xpu9", "xpu9.hbm"]["bandwidth"] == device.memory_bandwidth
    assert graph.nodes["xpu9.hbm"]["capacity"] == device.memory
    nic_links = [graph.edges[e] for e in graph.edges("n1.nic1") if graph.nodes[e[1]]["kind"] == "switch"
                 and graph.nodes[e[1]]["role"] == "ib"]
    assert [(d["bandwidth"], d["kind"]) for d in nic_links] == [(nic, "ib")]
    assert graph.nodes["xpu9"]["extended_memory"] == "n1.dram0" and graph.nodes["xpu13"]["extended_memory"] == "n1.dram1"
    assert graph.nodes["xpu13"]["host_memory"] == "n1.dram1"
    assert graph.nodes["n1.dram0"]["capacity"] == 2**40 and graph.edges["n1.cpu0", "n1.dram0"]["bandwidth"] == dram


def test_routes_nvlink_inside_a_node_own_nic_between_nodes(graphs, specs):
    graph, links = graphs("dgx-h100", 64), specs["dgx-h100"].links
    routes = compile_platform(graph, [("xpu0", "xpu5"), ("xpu3", "xpu11"), ("xpu3", "n0.dram0")]).routes
    assert routes["xpu0", "xpu5"] == ["xpu0", "n0.nvsw", "xpu5"]
    assert routes["xpu3", "xpu11"] == ["xpu3", "n0.pcie3", "n0.nic3", "ib1.3", "n1.nic3", "n1.pcie3", "xpu11"]
    assert route_latency(graph, routes["xpu3", "xpu11"]) == pytest.approx(
        4 * links["pcie"].latency + 2 * links["nic_to_leaf"].latency, rel=1e-12)
    assert route_bandwidth(graph, routes["xpu3", "xpu11"]) == links["nic_to_leaf"].bandwidth
    assert routes["xpu3", "n0.dram0"] == ["xpu3", "n0.pcie3", "n0.up1", "n0.cpu0", "n0.dram0"]


def test_hybrid_parallel_pairs_stay_on_their_rail(graphs):
    """tp = 8: pipeline neighbours and DP rings pair GPU i of one node with GPU i of another."""
    graph = graphs("dgx-h100", 1024)
    pairs = hybrid_parallel_pairs(graph, 8, 4)
    order = {x: i for i, x in enumerate(xpus(graph))}
    routes = compile_platform(graph, pairs).routes
    for (src, dst), route in routes.items():
        if src in order and dst in order and graph.nodes[src]["server"] != graph.nodes[dst]["server"]:
            assert order[src] % 8 == order[dst] % 8
            assert route[2].endswith(f"nic{order[src] % 8}") and route[-3].endswith(f"nic{order[dst] % 8}")


@pytest.mark.parametrize("overrides, message", [
    ({"node.gpus_per_uplink": 3}, r"dgx-h100.yaml: node: gpus \(8\) must split into uplinks"),
    ({"fabric.switch_radix": 63}, r"fabric.switch_radix: must be an even number >= 4"),
    ({"fabric.topology": "torus"}, r"fabric.topology: 'torus' is not one of fat_tree, rail_optimized"),
    ({"links.ib.bandwidth": "400Gb/s"}, r"links.ib.bandwidth: cannot read .400Gb/s. as a bandwidth"),
    ({"links.nic_to_leaf": None}, r"links.nic_to_leaf.bandwidth: is required"),
    ({"node.sockets": 2}, r"node.sockets: unknown key"),
])
def test_spec_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_platform_spec("dgx-h100", overrides)


def test_a_partial_last_node(graphs):
    graph = build_platform(load_platform_spec("dgx-a100"), 12)
    assert _kinds(graph)["xpu"] == 12 and _kinds(graph)["nic"] == 12
    assert sorted(x for x in graph if graph.nodes[x].get("server") == "n1" and graph.nodes[x]["kind"] == "xpu") == \
        ["xpu10", "xpu11", "xpu8", "xpu9"]


def test_a_dgx_platform_has_no_cxl_links_to_set():
    """A scenario's CXL figures default to the platform's own (none here); setting them on a DGX spec is refused."""
    from hcsim.run.scenario import Scenario

    assert "links.cxl.bandwidth" not in Scenario(platform="dgx-h100").platform_settings()
    with pytest.raises(ConfigError, match=r"dgx-h100.yaml: links.cxl: unknown key"):
        load_platform_spec("dgx-h100", {"links.cxl.bandwidth": "64GB/s"})
