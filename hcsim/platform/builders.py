"""Builders: pure functions from parameters to platform graphs.

Every builder returns a new ``networkx.Graph`` following the attribute
contract of :mod:`hcsim.platform.topology` and never touches disk or SimGrid.
"""

from __future__ import annotations

import networkx as nx

from hcsim.platform.devices import Device
from hcsim.platform.topology import add_link, add_xpu

__all__ = ["single_switch"]


def single_switch(n: int, device: Device, xpu_link_bandwidth: float = 900e9,
                  xpu_link_latency: float = 100e-9, hbm_latency: float = 100e-9) -> nx.Graph:
    """`n` XPUs of `device` on one XPU switch, each with its HBM.

    Parameters
    ----------
    n : number of XPUs (>= 1), named ``xpu0`` .. ``xpu{n-1}``.
    device : the catalog device of every XPU.
    xpu_link_bandwidth : B/s per direction of each XPU-to-switch link (Table 5 XPU_link: 900 GB/s).
    xpu_link_latency : s, of each XPU-to-switch link (Table 5 XPU_link: 100 ns).
    hbm_latency : s, of each XPU-to-HBM link (the link's bandwidth is the
        device's memory bandwidth).

    Returns
    -------
    networkx.Graph
        switch ``xswitch``; XPU ``xpu{i}`` with ``rack=0``, ``server="s0"``;
        HBM ``xpu{i}.hbm``; no extended memory.

    >>> from hcsim.platform.devices import builtin_catalog
    >>> g = single_switch(4, builtin_catalog()["H100"])
    >>> sorted(k for _, k in g.nodes(data="kind")).count("xpu")
    4
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        from hcsim.errors import ConfigError

        raise ConfigError(f"single_switch: n must be an integer >= 1, got {n!r}")
    graph = nx.Graph(name=f"single-switch-{n}x{device.name}", coherent=False)
    graph.add_node("xswitch", kind="switch", role="xpu", rack=0, server="s0")
    for i in range(n):
        name = f"xpu{i}"
        add_xpu(graph, name, device, hbm_latency=hbm_latency, rack=0, server="s0")
        add_link(graph, name, "xswitch", bandwidth=xpu_link_bandwidth, latency=xpu_link_latency, kind="xpu_link")
    return graph
