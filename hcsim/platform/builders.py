"""Builders: pure functions from parameters to platform graphs.

Every builder returns a new ``networkx.Graph`` following the attribute
contract of :mod:`hcsim.platform.topology` and never touches disk or SimGrid.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx

from hcsim.errors import ConfigError, TopologyError, brief
from hcsim.platform.devices import Device
from hcsim.platform.spec import CxlSpec, LinkSpec, PlatformSpec, ServerSpec
from hcsim.platform.topology import add_link, add_memory, add_xpu, validate_topology

__all__ = ["single_switch", "build_platform", "add_spines", "add_tor", "add_server", "add_cxl_fabric",
           "explicit_topology"]


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
        raise ConfigError(f"single_switch: n must be an integer >= 1, got {n!r}")
    graph = nx.Graph(name=f"single-switch-{n}x{device.name}", coherent=False)
    graph.add_node("xswitch", kind="switch", role="xpu", rack=0, server="s0")
    for i in range(n):
        name = f"xpu{i}"
        add_xpu(graph, name, device, hbm_latency=hbm_latency, rack=0, server="s0")
        add_link(graph, name, "xswitch", bandwidth=xpu_link_bandwidth, latency=xpu_link_latency, kind="xpu_link")
    return graph


def build_platform(spec: PlatformSpec, xpus: int | None = None) -> nx.Graph:
    """Build the platform graph of `spec` holding its first `xpus` XPUs.

    A structured spec (the paper's Fig. 6 family) builds only the racks and
    servers needed for `xpus` XPUs, filled in order (the last server may be
    partly populated); an explicit spec (``topology:``) builds its nodes and
    links as listed. The graph is validated before it is returned.

    Parameters
    ----------
    spec : a spec from :func:`hcsim.platform.spec.load_platform_spec`.
    xpus : how many XPUs to build (default: ``spec.xpus``), 1 <= xpus <= spec.xpus.

    Returns
    -------
    networkx.Graph
        following :mod:`hcsim.platform.topology`; ``graph.graph["coherent"]``
        set; every XPU named ``xpu{i}`` (i in rack, server order) with ``rack``,
        ``server``, ``local_memory`` and ``extended_memory`` set.

    Raises
    ------
    ConfigError
        if `xpus` is not within 1 .. spec.xpus.
    TopologyError
        if the built graph is invalid (explicit specs: every problem at once).
    """
    from hcsim.limits import MAX_PLATFORM_XPUS, check_limit

    count = spec.xpus if xpus is None else xpus
    where = Path(spec.source).name
    if spec.topology is not None and spec.xpus == 0:
        raise ConfigError(f"{where}: topology.nodes: no node of kind xpu; an explicit topology needs at least one")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= spec.xpus:
        more = "" if spec.topology is not None else " (raise its `xpus` to build more)"
        raise ConfigError(f"{where}: xpus: cannot build {brief(count)} XPUs; the spec holds 1 to {spec.xpus}{more}")
    check_limit(count, MAX_PLATFORM_XPUS, "the XPUs to build", f"{where}: xpus", "build fewer XPUs")
    if spec.topology is not None:
        if count != spec.xpus:
            raise ConfigError(f"{Path(spec.source).name}: xpus: an explicit topology has exactly {spec.xpus} XPUs, "
                              f"cannot build {count}")
        graph = explicit_topology(spec)
    else:
        graph = _structured(spec, count)
    graph.graph["routes"] = {(route[0], route[-1]): list(route) for route in spec.routes}
    validate_topology(graph, spec.catalog)
    _check_routes(spec, graph, partial=count < spec.xpus)
    return graph


def _check_routes(spec: PlatformSpec, graph: nx.Graph, partial: bool) -> None:
    """Every user route of `spec`, checked on the built graph whether or not a run uses it.

    On a partial build (fewer XPUs than the spec holds) a route through nodes not built is skipped.
    """
    from hcsim.platform.routes import route_problems

    problems, ends = [], {}
    for i, route in enumerate(spec.routes):
        if partial and any(node not in graph for node in route):
            continue
        where = f"routes[{i}] ({route[0]} -> {route[-1]})"
        first = ends.setdefault((route[0], route[-1]), i)
        if first != i:
            problems.append(f"{where}: routes[{first}] has the same ends; give one route per pair")
        problems += [f"{where}: {problem}" for problem in route_problems(graph, list(route))]
    if problems:
        raise TopologyError(f"{Path(spec.source).name}: " + ("\n  ".join(problems) if len(problems) == 1 else
                            "invalid routes:\n  " + "\n  ".join(problems)))


def _structured(spec: PlatformSpec, count: int) -> nx.Graph:
    server, network, links = spec.server, spec.network, spec.links
    graph = nx.Graph(name=spec.name if count == spec.xpus else f"{spec.name}[{count}]", coherent=spec.coherent)
    per_rack = server.xpus * network.servers_per_rack
    racks = math.ceil(count / per_rack)
    spines = add_spines(graph, network.spines)
    placed = 0
    rack_xpus: list[list[str]] = []
    for rack in range(racks):
        tor = add_tor(graph, rack, spines, links)
        device = spec.device_of_rack(rack)
        in_rack = []
        for slot in range(network.servers_per_rack):
            if placed >= count:
                break
            n = min(server.xpus, count - placed)
            in_rack += add_server(graph, f"r{rack}s{slot}", rack=rack, first_xpu=placed, xpus=n,
                                  device=device, server=server, links=links, tor=tor)
            placed += n
        rack_xpus.append(in_rack)
    if spec.coherent:
        add_cxl_fabric(graph, rack_xpus, spec.cxl, links)
        if spec.cxl.xpu_traffic == "fabric":
            graph.graph["avoid_links"] = ("eth",)
    return graph


def add_spines(graph: nx.Graph, spines: int) -> list[str]:
    """Add the Ethernet core (L1) switches: ``core`` when there is one, else ``core0`` ..."""
    names = ["core"] if spines == 1 else [f"core{i}" for i in range(spines)]
    for name in names:
        graph.add_node(name, kind="switch", role="core")
    return names


def add_tor(graph: nx.Graph, rack: int, spines: list[str], links) -> str:
    """Add rack `rack`'s ToR switch ``r{rack}.tor``, linked to every spine by ToR_to_L1."""
    tor = f"r{rack}.tor"
    graph.add_node(tor, kind="switch", role="tor", rack=rack)
    for spine in spines:
        _link(graph, tor, spine, links["tor_to_l1"], "eth")
    return tor


def add_server(graph: nx.Graph, name: str, *, rack: int, first_xpu: int, xpus: int, device: Device,
               server: ServerSpec, links, tor: str | None) -> list[str]:
    """Add one server (the server template) and return its XPU names.

    Nodes, for server ``name`` (e.g. ``r0s3``): CPUs ``{name}.cpu{c}`` joined
    all-to-all by UPI, each with its DRAM ``{name}.dram{c}`` (owner: the CPU)
    and its PCIe switch ``{name}.pcie{c}`` (one link of ``cpu_pcie_links`` x
    PCIe bandwidth); NICs ``{name}.nic{c}.{k}`` on the PCIe switches, linked to
    `tor` by NIC_to_ToR; XPUs ``xpu{first_xpu + i}`` filling the PCIe switches
    in order, each with its HBM; the XPU switch ``{name}.xsw``. The extended
    memory of an XPU is its CPU's DRAM.
    """
    where = dict(rack=rack, server=name)
    pcie = links["pcie"]
    cpus = []
    for c in range(server.cpus):
        cpu, dram, switch = f"{name}.cpu{c}", f"{name}.dram{c}", f"{name}.pcie{c}"
        graph.add_node(cpu, kind="cpu", flops=server.cpu_flops, **where)
        add_memory(graph, dram, capacity=server.dram_capacity, role="dram", owner=cpu, **where)
        _link(graph, cpu, dram, links["dram"], "dram")
        graph.add_node(switch, kind="switch", role="pcie", **where)
        add_link(graph, cpu, switch, bandwidth=server.cpu_pcie_links * pcie.bandwidth, latency=pcie.latency, kind="pcie")
        for other in cpus:
            _link(graph, other, cpu, links["upi"], "upi")
        for k in range(server.nics_per_cpu if tor is not None else 0):
            nic = f"{name}.nic{c}.{k}"
            graph.add_node(nic, kind="nic", **where)
            _link(graph, switch, nic, pcie, "pcie")
            _link(graph, nic, tor, links["nic_to_tor"], "eth")
        cpus.append(cpu)
    names = []
    if server.xpu_switch and xpus > 0:
        graph.add_node(f"{name}.xsw", kind="switch", role="xpu", **where)
    hbm = links["hbm"]
    for i in range(xpus):
        xpu, c = f"xpu{first_xpu + i}", i // server.xpus_per_cpu
        add_xpu(graph, xpu, device, hbm_latency=hbm.latency, **where)
        if hbm.bandwidth is not None:
            graph.edges[xpu, f"{xpu}.hbm"]["bandwidth"] = hbm.bandwidth
        graph.nodes[xpu]["extended_memory"] = f"{name}.dram{c}"
        _link(graph, xpu, f"{name}.pcie{c}", pcie, "pcie")
        if server.xpu_switch:
            _link(graph, xpu, f"{name}.xsw", links["xpu_link"], "xpu_link")
        names.append(xpu)
    return names


def add_cxl_fabric(graph: nx.Graph, rack_xpus: list[list[str]], cxl: CxlSpec, links) -> list[str]:
    """Join every XPU by a CXL fabric and give each its own CXL Type 3 expander.

    Per rack, leaf switches ``r{rack}.cxl1.{i}`` take `cxl.xpus_per_leaf`
    XPUs each (a leaf never spans racks); switches cascade, `cxl.radix`
    children per parent (``r{rack}.cxl{level}.{i}``), until one tops the
    rack; the rack tops cascade the same way (``cxl{level}.{i}``) until one
    tops the fabric. A level with a single node gets no parent. Every link is a
    CXL_link. The Type 3 expander of XPU ``x`` is ``x.cxl`` (role cxl_type3,
    owner x) on its own CXL link to x's leaf switch (`type3_attach: switch`)
    or to x itself (`xpu`); it becomes x's extended memory.

    Returns the switches of the fabric's top level (one).
    """
    link = links["cxl"]
    tops = []
    for rack, members in enumerate(rack_xpus):
        leaves = []
        for i in range(0, len(members), cxl.xpus_per_leaf):
            leaf = f"r{rack}.cxl1.{i // cxl.xpus_per_leaf}"
            graph.add_node(leaf, kind="switch", role="cxl", rack=rack, level=1)
            leaves.append(leaf)
            for xpu in members[i : i + cxl.xpus_per_leaf]:
                _link(graph, xpu, leaf, link, "cxl")
                expander = f"{xpu}.cxl"
                add_memory(graph, expander, capacity=cxl.type3_capacity, role="cxl_type3", owner=xpu,
                           rack=rack, server=graph.nodes[xpu]["server"])
                _link(graph, expander, leaf if cxl.type3_attach == "switch" else xpu, link, "cxl")
                graph.nodes[xpu]["extended_memory"] = expander
        tops += _cascade(graph, leaves, cxl.radix, link, prefix=f"r{rack}.cxl", level=1, rack=rack)
    return _cascade(graph, tops, cxl.radix, link, prefix="cxl", level=_level(graph, tops), rack=None)


def _cascade(graph, children: list[str], radix: int, link: LinkSpec, *, prefix: str, level: int, rack) -> list[str]:
    """Add parent levels of `radix` children each until one node remains; return that level."""
    while len(children) > 1:
        level += 1
        parents = []
        for i in range(0, len(children), radix):
            parent = f"{prefix}{level}.{i // radix}"
            graph.add_node(parent, kind="switch", role="cxl", level=level,
                           **({"rack": rack} if rack is not None else {}))
            for child in children[i : i + radix]:
                _link(graph, child, parent, link, "cxl")
            parents.append(parent)
        children = parents
    return children


def _level(graph, nodes: list[str]) -> int:
    return max((graph.nodes[n].get("level", 1) for n in nodes), default=1)


def _link(graph: nx.Graph, u: str, v: str, spec: LinkSpec, kind: str) -> None:
    add_link(graph, u, v, bandwidth=spec.bandwidth, latency=spec.latency, kind=kind)


def explicit_topology(spec: PlatformSpec) -> nx.Graph:
    """Build the graph of an explicit (``topology:``) spec; duplicates and dangling links are TopologyErrors."""
    problems: list[str] = []
    graph = nx.Graph(name=spec.name, coherent=any(e.kind == "cxl" for e in spec.topology.links))
    hbm = spec.links.get("hbm")
    seen: set[str] = set()
    for node in spec.topology.nodes:
        if node.name in seen:
            problems.append(f"node {node.name!r}: duplicate name")
            continue
        seen.add(node.name)
        attributes = dict(node.attributes)
        if node.kind == "xpu":
            device = spec.catalog.get(attributes.pop("device", None) or "")
            extended = attributes.pop("extended_memory", None)
            if device is None:
                continue  # reported by the spec reader (unknown device)
            if hbm is None:
                problems.append(f"xpu {node.name!r}: needs links.hbm.latency for its HBM link")
                continue
            add_xpu(graph, node.name, device, hbm_latency=hbm.latency, **attributes)
            if hbm.bandwidth is not None:
                graph.edges[node.name, f"{node.name}.hbm"]["bandwidth"] = hbm.bandwidth
            graph.nodes[node.name]["extended_memory"] = extended
            seen.add(f"{node.name}.hbm")
        else:
            graph.add_node(node.name, kind=node.kind, **attributes)
    for edge in spec.topology.links:
        for end in (edge.u, edge.v):
            if end not in graph:
                problems.append(f"link {edge.u!r}--{edge.v!r}: no node {end!r}")
        if graph.has_edge(edge.u, edge.v):
            problems.append(f"link {edge.u!r}--{edge.v!r}: duplicate link")
        if edge.u in graph and edge.v in graph and not graph.has_edge(edge.u, edge.v):
            graph.add_edge(edge.u, edge.v, bandwidth=edge.bandwidth, latency=edge.latency, kind=edge.kind)
    try:
        validate_topology(graph, spec.catalog)
    except TopologyError as err:
        problems += str(err).split("\n  ")[1:]
    if problems:
        raise TopologyError(f"platform {spec.name!r} ({Path(spec.source).name}) is invalid:\n  " + "\n  ".join(problems))
    return graph
