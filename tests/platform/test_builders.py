"""Builders: the paper's Fig. 6 topologies at full scale, partial and mixed builds, single_switch."""

import math
from collections import Counter

import pytest

from hcsim.errors import ConfigError
from hcsim.platform import build_platform, load_platform_spec, single_switch, validate_topology, xpus


def _count(graph, kind, role=None):
    return sum(1 for _, d in graph.nodes(data=True) if d["kind"] == kind and (role is None or d.get("role") == role))


def _cxl_switches(racks, xpus_per_rack, per_leaf, radix):
    """Closed form of the CXL cascade: leaves per rack, `radix`-ary levels per rack, then across racks."""
    def levels(n):
        total = 0
        while n > 1:
            n = math.ceil(n / radix)
            total += n
        return total

    leaves = math.ceil(xpus_per_rack / per_leaf)
    return racks * (leaves + levels(leaves)) + levels(racks)


@pytest.mark.parametrize("fixture", ["traditional_4096", "cxl_4096"])
def test_paper_structure_at_4096(fixture, request):
    graph = request.getfixturevalue(fixture)
    # paper 3.1: 32 ToRs x 16 servers x 8 XPUs; 2 CPUs, 2 PCIe switches, 1 XPU switch per server; one core switch
    assert _count(graph, "xpu") == 4096
    assert _count(graph, "switch", "tor") == 32
    assert _count(graph, "switch", "core") == 1
    assert _count(graph, "cpu") == 1024
    assert _count(graph, "switch", "pcie") == 1024
    assert _count(graph, "switch", "xpu") == 512
    servers = Counter(graph.nodes[x]["server"] for x in xpus(graph))
    assert len(servers) == 512 and set(servers.values()) == {8}
    racks = Counter(graph.nodes[x]["rack"] for x in xpus(graph))
    assert len(racks) == 32 and set(racks.values()) == {128}
    assert _count(graph, "memory", "hbm") == 4096
    assert _count(graph, "memory", "dram") == 1024
    for tor in (n for n, d in graph.nodes(data=True) if d.get("role") == "tor"):
        assert "core" in graph[tor] and graph.edges[tor, "core"]["kind"] == "eth"
        assert sum(1 for n in graph[tor] if graph.nodes[n]["kind"] == "nic") == 16 * 2  # one NIC per PCIe switch
    for cpu in (n for n, d in graph.nodes(data=True) if d["kind"] == "cpu"):
        kinds = Counter(graph.edges[cpu, n]["kind"] for n in graph[cpu])
        assert kinds == {"upi": 1, "pcie": 1, "dram": 1}
        switch = next(n for n in graph[cpu] if graph.nodes[n].get("role") == "pcie")
        assert sum(1 for n in graph[switch] if graph.nodes[n]["kind"] == "xpu") == 4
        assert graph.edges[cpu, switch]["bandwidth"] == 4 * graph.edges[switch, next(
            n for n in graph[switch] if graph.nodes[n]["kind"] == "xpu")]["bandwidth"]  # 4 PCIe links
    coherent = fixture == "cxl_4096"
    assert graph.graph["coherent"] is coherent
    if coherent:
        assert _count(graph, "memory", "cxl_type3") == 4096
        assert _count(graph, "switch", "cxl") == _cxl_switches(32, 128, 16, 32)
    else:
        assert _count(graph, "memory", "cxl_type3") == 0 and _count(graph, "switch", "cxl") == 0
        assert not any(k == "cxl" for _, _, k in graph.edges(data="kind"))


def test_every_xpu_has_its_memories(cxl_4096, traditional_4096):
    for xpu in xpus(cxl_4096):
        data = cxl_4096.nodes[xpu]
        hbm, t3 = data["local_memory"], data["extended_memory"]
        assert cxl_4096.nodes[hbm]["owner"] == xpu and cxl_4096.nodes[t3]["owner"] == xpu
        assert cxl_4096.nodes[t3]["role"] == "cxl_type3" and math.isinf(cxl_4096.nodes[t3]["capacity"])
        (leaf,) = cxl_4096[t3]  # its own link to the XPU's leaf CXL switch: no other XPU's traffic on it
        assert leaf in cxl_4096[xpu] and cxl_4096.nodes[leaf]["role"] == "cxl"
        assert cxl_4096.edges[xpu, hbm]["bandwidth"] == 3.35e12
    for xpu in xpus(traditional_4096):
        dram = traditional_4096.nodes[xpu]["extended_memory"]
        cpu = traditional_4096.nodes[dram]["owner"]
        switch = next(n for n in traditional_4096[xpu] if traditional_4096.nodes[n].get("role") == "pcie")
        assert traditional_4096.has_edge(cpu, switch)  # the DRAM of the CPU above the XPU's PCIe switch


def test_table5_links_are_the_defaults(cxl_4096):
    expected = {"upi": (62.4e9, 100e-9), "xpu_link": (900e9, 100e-9), "cxl": (128e9, 200e-9)}
    for u, v, data in cxl_4096.edges(data=True):
        if data["kind"] in expected:
            assert (data["bandwidth"], data["latency"]) == expected[data["kind"]]
        if data["kind"] == "eth":
            assert (data["bandwidth"], data["latency"]) == (12.5e9, 5e-6)


def test_mixed_build_puts_one_device_per_rack():
    spec = load_platform_spec("paper-cxl", {"xpus": 1024, "devices": ["H100", "A100", "V100"]})
    graph = build_platform(spec)
    by_rack = {}
    for xpu in xpus(graph):
        by_rack.setdefault(graph.nodes[xpu]["rack"], set()).add(graph.nodes[xpu]["device"])
    assert len(by_rack) == 8
    for rack, devices in by_rack.items():
        assert devices == {("H100", "A100", "V100")[rack % 3]}


@pytest.mark.parametrize("count, servers, racks", [(8, 1, 1), (12, 2, 1), (128, 16, 1), (200, 25, 2)])
def test_partial_builds_hold_only_what_is_needed(cxl_spec, count, servers, racks):
    graph = build_platform(cxl_spec, count)
    assert _count(graph, "xpu") == count
    assert len({graph.nodes[x]["server"] for x in xpus(graph)}) == servers
    assert _count(graph, "switch", "tor") == racks
    assert _count(graph, "memory", "cxl_type3") == count
    assert [int(x[3:]) for x in xpus(graph)] == list(range(count))  # names follow rack, server order


@pytest.mark.parametrize("count", [0, 4097, -1, 2.5, True])
def test_xpus_beyond_the_spec_is_an_error_naming_the_field(cxl_spec, count):
    with pytest.raises(ConfigError, match=r"paper-cxl\.yaml: xpus: "):
        build_platform(cxl_spec, count)


def test_the_spec_can_grow_beyond_4096():
    spec = load_platform_spec("paper-cxl", {"xpus": 8192})
    graph = build_platform(spec)
    assert _count(graph, "switch", "tor") == 64
    assert _count(graph, "switch", "cxl") == _cxl_switches(64, 128, 16, 32)


def test_type3_attached_to_its_xpu():
    graph = build_platform(load_platform_spec("paper-cxl", {"xpus": 16, "cxl.type3_attach": "xpu"}))
    for xpu in xpus(graph):
        assert list(graph[graph.nodes[xpu]["extended_memory"]]) == [xpu]


def test_single_switch(catalog):
    graph = single_switch(4, catalog["A100"])
    validate_topology(graph, catalog)
    assert _count(graph, "xpu") == 4 and _count(graph, "switch") == 1
    assert {graph.edges[x, "xswitch"]["bandwidth"] for x in xpus(graph)} == {900e9}
    assert {graph.edges[x, f"{x}.hbm"]["bandwidth"] for x in xpus(graph)} == {catalog["A100"].memory_bandwidth}
    with pytest.raises(ConfigError, match="n must be"):
        single_switch(0, catalog["A100"])
