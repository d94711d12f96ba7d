"""Transfers on the DGX platforms against their closed form: latency + size / bandwidth, figures from the spec.

Each case runs in a fresh process (one SimGrid Engine per process, ever).
"""

import math

import pytest

from hcsim.platform import build_platform, load_platform_spec
from hcsim.run.simulation import simulate_graphs
from hcsim.workload import add_comm, new_workload

SIZE = 5e8  # bytes


def _one_transfer(graph, src, dst):
    workload = new_workload("p2p")
    add_comm(workload, "send", xpus=[src, dst], bytes=SIZE, collective="p2p", start=True)
    return simulate_graphs(graph, workload)["iteration_ends"][0]


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
def test_nvlink_inside_a_node(name):
    spec = load_platform_spec(name)
    nvlink = spec.links["xpu_link"]
    expected = 2 * nvlink.latency + SIZE / nvlink.bandwidth  # GPU -> NVSwitch -> GPU
    assert math.isclose(_one_transfer(build_platform(spec, 16), "xpu0", "xpu5"), expected, rel_tol=1e-9)


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
def test_infiniband_between_two_nodes(name):
    """GPU -> its PCIe switch -> its NIC -> leaf -> NIC -> PCIe switch -> GPU; the NIC link is the bottleneck."""
    spec = load_platform_spec(name)
    pcie, nic = spec.links["pcie"], spec.links["nic_to_leaf"]
    assert nic.bandwidth < pcie.bandwidth
    expected = 4 * pcie.latency + 2 * nic.latency + SIZE / nic.bandwidth
    assert math.isclose(_one_transfer(build_platform(spec, 16), "xpu2", "xpu10"), expected, rel_tol=1e-9)


def test_infiniband_across_the_fat_tree():
    """dgx-a100 at 64 GPUs: 20 NICs per leaf, so n0.nic0 and n7.nic0 meet at the top: two switch links more."""
    spec = load_platform_spec("dgx-a100")
    pcie, nic, ib = spec.links["pcie"], spec.links["nic_to_leaf"], spec.links["ib"]
    expected = 4 * pcie.latency + 2 * nic.latency + 2 * ib.latency + SIZE / nic.bandwidth
    assert math.isclose(_one_transfer(build_platform(spec, 64), "xpu0", "xpu56"), expected, rel_tol=1e-9)
