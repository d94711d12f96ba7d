"""Coherent systems as they ship (issue 37): gh200, gb200-nvl72 and cxl-pool, their devices, structure in
closed form, routes, one capacity per shared memory, and one clear error per bad value."""

import math
from collections import Counter

import pytest

from hcsim.errors import ConfigError, WorkloadError
from hcsim.platform import build_platform, load_platform_spec, route_bandwidth, route_latency
from hcsim.platform.devices import builtin_catalog, load_cpu_catalog
from hcsim.platform.devices import BUILTIN_CATALOG
from hcsim.platform.routes import shortest_routes
from hcsim.platform.topology import xpus
from hcsim.workload.placement import XpuMemory, check_shared_memory


def _kinds(graph):
    return Counter(f"switch/{d['role']}" if d["kind"] == "switch" else d["kind"] for _, d in graph.nodes(data=True))


def test_catalog_has_the_shipping_devices_and_grace():
    catalog = builtin_catalog()
    assert catalog["GB200"].flops("bf16") == 2.5e15 and catalog["GB200"].flops("fp8") == 5e15
    assert catalog["GB200"].memory_bandwidth == 8e12
    assert catalog["GH200"].flops("bf16") == catalog["H100"].flops("bf16") and catalog["GH200"].memory == 96 * 2**30
    assert catalog["B200"].flops("bf16") == 2.25e15
    grace = load_cpu_catalog(BUILTIN_CATALOG)["Grace"]
    assert (grace.flops, grace.memory, grace.memory_bandwidth) == (7.1e12, 480e9, 512e9)


@pytest.mark.parametrize("name, count", [("gh200", 4), ("gh200", 37), ("gb200-nvl72", 72), ("gb200-nvl72", 150)])
def test_superchip_structure_in_closed_form(name, count):
    spec = load_platform_spec(name)
    chip = spec.superchip
    graph = build_platform(spec, count)
    assert graph.graph["coherent"] and spec.coherent and spec.spill == "allow"
    domains = math.ceil(count / chip.gpus)
    superchips = sum(math.ceil(min(chip.gpus, count - d * chip.gpus) / chip.gpus_per_superchip) for d in range(domains))
    kinds = _kinds(graph)
    assert kinds["xpu"] == count and kinds["nic"] == count and kinds["cpu"] == superchips
    assert kinds["memory"] == count + superchips  # HBM + one LPDDR5X per Grace
    c2c = [(u, v) for u, v, k in graph.edges(data="kind") if k == "c2c"]
    assert len(c2c) == count
    for x in xpus(graph):
        memory = graph.nodes[x]["extended_memory"]
        assert graph.nodes[memory]["role"] == "dram" and graph.nodes[memory]["capacity"] == 480e9
        route = shortest_routes(graph, x, [memory])[memory]
        kinds_on = [graph.edges[a, b]["kind"] for a, b in zip(route, route[1:])]
        assert kinds_on == ["c2c", "dram"]  # the Grace's memory over the coherent link
        assert route_bandwidth(graph, route) == spec.links["c2c"].bandwidth
    if chip.nvlink == "switch":
        assert kinds["switch/xpu"] == domains
    else:  # every pair of a domain's GPUs joined
        links = sum(1 for _, _, k in graph.edges(data="kind") if k == "xpu_link")
        assert links == sum(math.comb(min(chip.gpus, count - d * chip.gpus), 2) for d in range(domains))


def test_gb200_nvl72_one_nvlink_domain_per_rack():
    spec = load_platform_spec("gb200-nvl72")
    graph = build_platform(spec, 144)
    route = shortest_routes(graph, "xpu0", ["xpu71", "xpu72"])
    assert route["xpu71"] == ["xpu0", "n0.nvsw", "xpu71"]  # 72 GPUs in one NVLink switch domain
    assert route_bandwidth(graph, route["xpu71"]) == 900e9  # 1.8 TB/s both directions together
    assert "n0.nic0" in route["xpu72"]  # the next rack over InfiniBand, from the GPU's own NIC
    assert graph.nodes["xpu0"]["extended_memory"] == graph.nodes["xpu1"]["extended_memory"]  # one Grace, 2 GPUs


def test_gh200_quad_node_mesh_and_rdma_through_grace():
    graph = build_platform(load_platform_spec("gh200"), 8)
    route = shortest_routes(graph, "xpu0", ["xpu3", "xpu4"])
    assert route["xpu3"] == ["xpu0", "xpu3"]
    assert route["xpu4"][:3] == ["xpu0", "n0.cpu0", "n0.nic0"]  # the NIC on the Grace's PCIe: RDMA crosses C2C
    assert route_latency(graph, route["xpu3"]) == pytest.approx(100e-9)


def test_cxl_pool_is_one_memory_shared_by_its_hosts_through_one_switch():
    spec = load_platform_spec("cxl-pool")
    pool, port = spec.pool, spec.links["cxl"]
    graph = build_platform(spec, 8 * 8 + 8)  # one whole pool of 8 hosts and one host of the next
    assert graph.graph["coherent"] and spec.spill == "allow"
    memories = sorted(n for n, d in graph.nodes(data=True) if d.get("role") == "cxl_type3")
    assert memories == ["pool0.mem", "pool1.mem"]
    assert graph.nodes["pool0.mem"]["capacity"] == pool.hosts * pool.capacity_per_host == 4.096e12
    assert graph.nodes["pool0.mem"]["owner"] is None
    assert {graph.nodes[x]["extended_memory"] for x in xpus(graph)[:64]} == {"pool0.mem"}
    assert graph.nodes["xpu64"]["extended_memory"] == "pool1.mem"
    assert graph.edges["pool0.sw", "pool0.mem"]["bandwidth"] == pool.device_ports * port.bandwidth
    assert graph.edges["n0.cpu0", "pool0.sw"]["bandwidth"] == pool.cpu_ports * port.bandwidth
    route = shortest_routes(graph, "xpu0", ["pool0.mem", "xpu8"])
    assert route["pool0.mem"][-3:] == ["n0.cpu0", "pool0.sw", "pool0.mem"]
    assert route_latency(graph, route["pool0.mem"][-3:]) == pytest.approx(2 * 125e-9)  # CPU to pool: 250 ns
    assert "pool0.sw" not in route["xpu8"]  # the CXL switch carries no host-to-host traffic


def test_a_shared_memory_is_one_capacity():
    one = XpuMemory(parameters=0, gradients=0, optimizer=0, activations=3e12, local=1e12, spilled=2e12)
    homes = {x: ("pool0.mem", 3e12) for x in ("xpu0", "xpu1")}
    check_shared_memory({"xpu0": one}, homes)  # alone it fits
    with pytest.raises(WorkloadError, match=r"memory 'pool0\.mem' is shared by 2 XPUs .* holds 3 TB, less than "
                                            r"the 4 TB .*pool\.capacity_per_host"):
        check_shared_memory({"xpu0": one, "xpu1": one}, homes)
    offloaded = XpuMemory(parameters=0, gradients=0, optimizer=1e12, activations=0, local=0, spilled=1e12,
                          offloaded=1e12)
    check_shared_memory({"xpu0": offloaded, "xpu1": offloaded}, homes, {x: ("n0.dram0", 2e12) for x in homes})
    with pytest.raises(WorkloadError, match=r"memory 'n0\.dram0'"):
        check_shared_memory({"xpu0": offloaded, "xpu1": offloaded}, homes, {x: ("n0.dram0", 1.5e12) for x in homes})


@pytest.mark.parametrize("name, override, message", [
    ("gh200", {"node.superchips": 0}, r"gh200\.yaml: node\.superchips: must be >= 1"),
    ("gh200", {"node.cpu": "Graze"}, r"node\.cpu: unknown CPU 'Graze' \(did you mean 'Grace'\?\)"),
    ("gh200", {"node.nvlink": "ring"}, r"node\.nvlink: 'ring' is not one of switch, mesh"),
    ("gh200", {"node.nic_attach": "nvswitch"}, r"node\.nic_attach: 'nvswitch' is not one of cpu, gpu"),
    ("gh200", {"links.c2c.bandwidth": "0GB/s"}, r"links\.c2c\.bandwidth: must be > 0"),
    ("gh200", {"links.c2c.latency": "fast"}, r"links\.c2c\.latency"),
    ("gb200-nvl72", {"node.gpus_per_superchip": 1.5}, r"node\.gpus_per_superchip: expected an integer"),
    ("gb200-nvl72", {"node.bogus": 1}, r"node\.bogus: unknown key"),
    ("cxl-pool", {"pool.capacity_per_host": "0GB"}, r"pool\.capacity_per_host: must be > 0"),
    ("cxl-pool", {"pool.hosts": 0}, r"pool\.hosts: must be >= 1"),
    ("cxl-pool", {"pool.device_ports": "8"}, r"pool\.device_ports: expected an integer"),
    ("cxl-pool", {"pool.capacity_per_host": 512}, r"pool\.capacity_per_host: 512 has no unit"),
    ("cxl-pool", {"links.cxl.latency": "0ns"}, r"links\.cxl\.latency: must be > 0"),
])
def test_bad_values_get_one_clear_error(name, override, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_platform_spec(name, override)
    assert len(str(err.value).splitlines()) == 1, str(err.value)


def test_scenario_cxl_keys_set_the_pool_port():
    spec = load_platform_spec("cxl-pool", {"links.cxl.bandwidth": "64GB/s"})
    graph = build_platform(spec, 8)
    assert graph.edges["pool0.sw", "pool0.mem"]["bandwidth"] == 8 * 64e9


def _simulate(tmp_path, *settings):
    import json
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "-q", "simulate", "--out", str(out),
                           *[arg for s in settings for arg in ("--set", s)]],
                          capture_output=True, text=True, timeout=300)
    return done, (json.loads((out / "result.json").read_text()) if done.returncode == 0 else None)


@pytest.mark.parametrize("name, count", [("gh200", 8), ("gb200-nvl72", 144)])
def test_superchips_simulate_every_xpu_on_the_engine_core(tmp_path, name, count):
    done, result = _simulate(tmp_path, f"platform={name}", f"xpus={count}")
    assert done.returncode == 0, done.stderr
    assert result["engine"] == "core" and result["coherent"] is True and result["xpus"] == count
    assert result["iteration_time_s"] > 0


def test_a_cxl_pool_refuses_what_does_not_fit_naming_it_and_simulates_what_does(tmp_path):
    done, _ = _simulate(tmp_path, "platform=cxl-pool", "xpus=16")
    assert done.returncode == 2
    assert "memory 'pool0.mem' is shared by 16 XPUs" in done.stderr and "4.096 TB" in done.stderr
    done, result = _simulate(tmp_path, "platform=cxl-pool", "xpus=16",
                             "platform_overrides.pool.capacity_per_host=1TB")
    assert done.returncode == 0, done.stderr
    assert result["engine"] == "core" and result["coherent"] is True
