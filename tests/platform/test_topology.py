"""Validation: every problem reported at once, each naming its node or link."""

import math

import networkx as nx
import pytest

from hcsim.errors import ConfigError, TopologyError
from hcsim.platform import build_platform, load_platform_spec, single_switch, validate_topology
from hcsim.platform.topology import add_link, add_memory

EXPLICIT = """
name: tiny
device_catalog: []
links:
  hbm: {latency: 100ns}
topology:
  nodes:
    - {name: sw, kind: switch}
    - {name: a, kind: xpu, device: H100, extended_memory: pool}
    - {name: b, kind: xpu, device: V100}
    - {name: pool, kind: memory, capacity: 1TiB, role: cxl_type3}
  links:
    - {ends: [a, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
    - {ends: [b, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
    - {ends: [pool, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
routes:
  - [a, sw, pool]
"""


def _spec(tmp_path, text):
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return load_platform_spec(path)


def test_explicit_topology_builds(tmp_path):
    graph = build_platform(_spec(tmp_path, EXPLICIT))
    assert graph.nodes["a"]["extended_memory"] == "pool" and graph.nodes["a.hbm"]["role"] == "hbm"
    assert graph.graph["routes"] == {("a", "pool"): ["a", "sw", "pool"]}
    assert graph.graph["coherent"] is True


def test_every_validation_error_at_once(tmp_path):
    broken = (EXPLICIT
              .replace("{name: b, kind: xpu, device: V100}", "{name: b, kind: xpu, device: V100}\n"
                       "    - {name: sw, kind: switch}\n    - {name: lonely, kind: xpu, device: A100}\n"
                       "    - {name: nocap, kind: memory, role: dram}")
              .replace("{ends: [a, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}",
                       "{ends: [a, sw], latency: 200ns, kind: cxl}")
              .replace("{ends: [b, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}",
                       "{ends: [b, sw], bandwidth: -1GB/s, latency: 0ns, kind: cxl}")
              .replace("{ends: [pool, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}",
                       "{ends: [pool, sw], bandwidth: 0GB/s, latency: -3ns, kind: cxl}\n"
                       "    - {ends: [nocap, sw], bandwidth: 1GB/s, latency: 1ns, kind: dram}"))
    with pytest.raises(TopologyError) as info:
        build_platform(_spec(tmp_path, broken))
    message = str(info.value)
    for expected in ["node 'sw': duplicate name",
                     "link 'a'--'sw': bandwidth must be a positive B/s, got None",
                     "link 'b'--'sw': bandwidth must be a positive B/s, got -1000000000.0",
                     "link 'b'--'sw': latency must be > 0 s",
                     "link 'pool'--'sw': bandwidth must be a positive B/s, got 0.0",
                     "link 'pool'--'sw': latency must be > 0 s",
                     "memory 'nocap': capacity must be > 0 bytes or unbounded",
                     "'lonely'"]:
        assert expected in message, expected
    assert "cannot reach their peers" in message


def test_unknown_device_in_an_explicit_spec(tmp_path):
    with pytest.raises(ConfigError, match=r"topology.nodes\[2\].device: 'V1000' is not one of .*did you mean 'V100'"):
        _spec(tmp_path, EXPLICIT.replace("device: V100", "device: V1000"))


def test_unknown_device_in_a_graph(catalog):
    graph = single_switch(2, catalog["H100"])
    graph.nodes["xpu1"]["device"] = "TPU-v9"
    with pytest.raises(TopologyError, match=r"xpu 'xpu1': unknown device 'TPU-v9'"):
        validate_topology(graph, catalog)


def test_xpu_that_cannot_reach_its_memory(catalog):
    graph = single_switch(2, catalog["H100"])
    add_memory(graph, "far", capacity=math.inf, role="cxl_type3", owner="xpu0")
    graph.nodes["xpu0"]["extended_memory"] = "far"
    with pytest.raises(TopologyError, match=r"xpu 'xpu0': cannot reach its extended_memory 'far'"):
        validate_topology(graph, catalog)
    graph.nodes["xpu0"]["extended_memory"] = "missing"
    with pytest.raises(TopologyError, match=r"xpu 'xpu0': extended_memory 'missing' is not a memory node"):
        validate_topology(graph, catalog)


def test_routes_do_not_cross_xpus_so_a_chain_through_one_is_unreachable(catalog):
    graph = single_switch(2, catalog["H100"])
    graph.add_node("xpu9", kind="xpu", device="H100", fp32_flops=1.0, fp16_flops=1.0, local_memory="xpu1.hbm")
    add_link(graph, "xpu9", "xpu1", bandwidth=1e9, latency=1e-9, kind="xpu_link")
    with pytest.raises(TopologyError) as info:
        validate_topology(graph, catalog)
    assert "xpu 'xpu9': cannot reach its local_memory 'xpu1.hbm'" in str(info.value)
    assert "'xpu9' cannot reach their peers" in str(info.value)
    graph.nodes["xpu1"]["transit"] = True  # a direct-connect topology: XPUs forward
    validate_topology(graph, catalog)


@pytest.mark.parametrize("latency", [0.0, -1e-9, math.nan, None])
def test_zero_or_negative_latency(catalog, latency):
    graph = single_switch(2, catalog["H100"])
    graph.edges["xpu0", "xswitch"]["latency"] = latency
    with pytest.raises(TopologyError, match=r"link 'xpu0'--'xswitch': latency must be > 0 s"):
        validate_topology(graph)


def test_unknown_node_and_link_kinds():
    graph = nx.Graph(name="odd")
    graph.add_node("r", kind="router")
    graph.add_node("s", kind="switch")
    graph.add_edge("r", "s", bandwidth=1.0, latency=1.0, kind="wifi")
    with pytest.raises(TopologyError) as info:
        validate_topology(graph)
    assert "node 'r': unknown kind 'router'" in str(info.value)
    assert "link 'r'--'s': kind 'wifi' is not one of" in str(info.value)
