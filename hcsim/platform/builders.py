"""Builders: pure functions from parameters to platform graphs.

Every builder returns a new ``networkx.Graph`` following the attribute
contract of :mod:`hcsim.platform.topology` and never touches disk or SimGrid.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx

from hcsim.errors import ConfigError, TopologyError, brief, invalid
from hcsim.platform.devices import Device
from hcsim.platform.spec import (CxlSpec, DgxNodeSpec, FabricSpec, LinkSpec, PlatformSpec, PoolSpec, ServerSpec,
                                 SuperchipSpec)
from hcsim.platform.topology import add_link, add_memory, add_xpu, validate_topology

__all__ = ["single_switch", "build_platform", "add_spines", "add_tor", "add_server", "add_cxl_fabric",
           "explicit_topology", "dgx_cluster", "add_dgx_node", "add_fat_tree", "superchip_cluster",
           "add_superchip_domain", "add_cxl_pools"]


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
    elif spec.dgx is not None:
        graph = dgx_cluster(spec, count)
    elif spec.superchip is not None:
        graph = superchip_cluster(spec, count)
    else:
        graph = _structured(spec, count)
    graph.graph["routes"] = {(route[0], route[-1]): list(route) for route in spec.routes}
    validate_topology(graph, spec.catalog)
    _check_routes(spec, graph, partial=count < spec.xpus)
    return graph


def _check_routes(spec: PlatformSpec, graph: nx.Graph, partial: bool) -> None:
    """Every user route of `spec`, checked on the built graph whether or not a run uses it.

    On a partial build (fewer XPUs than the spec holds) a route whose ends are not both built is skipped: no
    run on it can use the route. One between built ends is checked whole, so a node it names that this build
    lacks (or no build has) is refused before the run, not when a transfer first asks for the route.
    """
    from hcsim.platform.routes import route_problems

    problems, ends = [], {}
    for i, route in enumerate(spec.routes):
        if partial and (route[0] not in graph or route[-1] not in graph):
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
    memory and the host memory (where CPU offload goes) of an XPU are its CPU's DRAM.
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
        graph.nodes[xpu]["extended_memory"] = graph.nodes[xpu]["host_memory"] = f"{name}.dram{c}"
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


def dgx_cluster(spec: PlatformSpec, count: int) -> nx.Graph:
    """DGX-style nodes of 8 (``node.gpus``) GPUs on an InfiniBand fat tree, holding the first `count` GPUs.

    Nodes ``n0``, ``n1``, ... (:func:`add_dgx_node`) are filled in order, the
    last one possibly in part; node k gets ``devices[k % len(devices)]``. Each
    GPU's NIC joins the fat tree of :func:`add_fat_tree`. Node attribute
    ``rack`` is the scalable unit (radix/2 consecutive nodes, the nodes whose
    NICs of one rail share a leaf in a rail-optimised fabric).
    """
    node, fabric, links = spec.dgx.node, spec.dgx.fabric, spec.links
    graph = nx.Graph(name=spec.name if count == spec.xpus else f"{spec.name}[{count}]", coherent=spec.pool is not None)
    nics: list[tuple[str, int, int]] = []
    for k in range(math.ceil(count / node.gpus)):
        first = k * node.gpus
        device = spec.catalog[spec.devices[k % len(spec.devices)]]
        placed = add_dgx_node(graph, f"n{k}", unit=k // fabric.down_ports, first_xpu=first,
                              xpus=min(node.gpus, count - first), device=device, node=node, links=links)
        nics += [(nic, k, rail) for rail, nic in enumerate(placed)]
    graph.graph["ib_switches"] = add_fat_tree(graph, nics, fabric, links["nic_to_leaf"], links["ib"])
    if spec.pool is not None:
        add_cxl_pools(graph, [f"n{k}" for k in range(math.ceil(count / node.gpus))], spec.pool, links["cxl"])
    return graph


def add_cxl_pools(graph: nx.Graph, hosts: list[str], pool: PoolSpec, port: LinkSpec) -> list[str]:
    """Give every `pool.hosts` consecutive hosts (DGX-style nodes, by name) one pooled CXL Type 3 memory
    behind one CXL switch, and make it the extended memory of their XPUs; return the pool memories.

    Pool p is the switch ``pool{p}.sw`` (role ``cxl``) and the memory ``pool{p}.mem`` (role ``cxl_type3``,
    no owner: shared; `pool.capacity` bytes, one capacity for all its hosts) on one link of
    `pool.device_ports` x `port` bandwidth (the device's heads); every CPU of its hosts reaches the switch
    on one link of `pool.cpu_ports` x `port` bandwidth. Every link has `port`'s latency, so a CPU's access
    crosses two. The switch forwards only to and from its memory (``server_only``:
    :mod:`hcsim.platform.routes`), as a CXL 2.0 switch carries no host-to-host traffic. A host's XPUs keep
    their host CPU's DRAM as host memory (CPU offload).
    """
    memories = []
    for p in range(math.ceil(len(hosts) / pool.hosts)):
        switch, memory, where = f"pool{p}.sw", f"pool{p}.mem", dict(server=f"pool{p}")
        graph.add_node(switch, kind="switch", role="cxl", server_only=True, **where)
        add_memory(graph, memory, capacity=pool.capacity, role="cxl_type3", owner=None, **where)
        add_link(graph, switch, memory, bandwidth=pool.device_ports * port.bandwidth, latency=port.latency, kind="cxl")
        members = set(hosts[p * pool.hosts:(p + 1) * pool.hosts])
        for name, data in list(graph.nodes(data=True)):
            if data.get("server") not in members:
                continue
            if data.get("kind") == "cpu":
                add_link(graph, name, switch, bandwidth=pool.cpu_ports * port.bandwidth, latency=port.latency,
                         kind="cxl")
            elif data.get("kind") == "xpu":
                data["extended_memory"] = memory
        memories.append(memory)
    return memories


def superchip_cluster(spec: PlatformSpec, count: int) -> nx.Graph:
    """NVLink domains of superchips (:func:`add_superchip_domain`) on an InfiniBand fat tree, holding the
    first `count` GPUs.

    Domains ``n0``, ``n1``, ... are filled in order, the last one possibly in part; domain k gets
    ``devices[k % len(devices)]``. Each GPU's NIC joins the fat tree of :func:`add_fat_tree`. Node attribute
    ``rack`` is the scalable unit (radix/2 consecutive domains); ``server`` is the domain. The graph is
    coherent: a GPU's extended memory is its superchip CPU's memory, read in place over NVLink-C2C.
    """
    chip, links = spec.superchip, spec.links
    graph = nx.Graph(name=spec.name if count == spec.xpus else f"{spec.name}[{count}]", coherent=True)
    nics: list[tuple[str, int, int]] = []
    for k in range(math.ceil(count / chip.gpus)):
        first = k * chip.gpus
        device = spec.catalog[spec.devices[k % len(spec.devices)]]
        placed = add_superchip_domain(graph, f"n{k}", unit=k // chip.fabric.down_ports, first_xpu=first,
                                      xpus=min(chip.gpus, count - first), device=device, chip=chip, links=links)
        nics += [(nic, k, rail) for rail, nic in enumerate(placed)]
    graph.graph["ib_switches"] = add_fat_tree(graph, nics, chip.fabric, links["nic_to_leaf"], links["ib"])
    return graph


def add_superchip_domain(graph: nx.Graph, name: str, *, unit: int, first_xpu: int, xpus: int, device: Device,
                         chip: SuperchipSpec, links) -> list[str]:
    """Add one NVLink domain of superchips and return its NICs, NIC i beside GPU i.

    Nodes, for domain ``name`` (e.g. ``n3``): per superchip c, the CPU ``{name}.cpu{c}`` (``chip.cpu``'s FP32
    peak as its FLOP/s) and its memory ``{name}.dram{c}`` (role ``dram``, owner the CPU, the CPU's capacity,
    on ``links.dram``: the CPU's memory bandwidth unless the link gives one); GPU ``xpu{first_xpu + i}`` with
    its HBM on superchip ``i // gpus_per_superchip``, joined to its CPU by ``links.c2c`` (kind ``c2c``): the
    CPU's memory is the GPU's extended memory (read in place: the platform is coherent) and host memory
    (CPU offload). NVLink: every GPU on the switch ``{name}.nvsw`` (``nvlink: switch``) or on a link to
    every other GPU of the domain (``mesh``), by ``links.xpu_link``. NIC ``{name}.nic{i}`` on PCIe to GPU i
    (``nic_attach: gpu``) or to its CPU (``cpu``).
    """
    where = dict(rack=unit, server=name)
    dram = links["dram"]
    cpus = []
    for c in range(math.ceil(xpus / chip.gpus_per_superchip)):
        cpu, memory = f"{name}.cpu{c}", f"{name}.dram{c}"
        graph.add_node(cpu, kind="cpu", flops=chip.cpu.flops, **where)
        add_memory(graph, memory, capacity=chip.cpu.memory, role="dram", owner=cpu, **where)
        add_link(graph, cpu, memory, bandwidth=dram.bandwidth or chip.cpu.memory_bandwidth, latency=dram.latency,
                 kind="dram")
        cpus.append(cpu)
    if xpus > 0 and chip.nvlink == "switch":
        graph.add_node(f"{name}.nvsw", kind="switch", role="xpu", **where)
    hbm, nics, gpus = links["hbm"], [], []
    for i in range(xpus):
        xpu, c, nic = f"xpu{first_xpu + i}", i // chip.gpus_per_superchip, f"{name}.nic{i}"
        add_xpu(graph, xpu, device, hbm_latency=hbm.latency, **where)
        if hbm.bandwidth is not None:
            graph.edges[xpu, f"{xpu}.hbm"]["bandwidth"] = hbm.bandwidth
        graph.nodes[xpu]["extended_memory"] = graph.nodes[xpu]["host_memory"] = f"{name}.dram{c}"
        _link(graph, xpu, cpus[c], links["c2c"], "c2c")
        if chip.nvlink == "switch":
            _link(graph, xpu, f"{name}.nvsw", links["xpu_link"], "xpu_link")
        else:
            for other in gpus:
                _link(graph, other, xpu, links["xpu_link"], "xpu_link")
        graph.add_node(nic, kind="nic", **where)
        _link(graph, nic, xpu if chip.nic_attach == "gpu" else cpus[c], links["pcie"], "pcie")
        gpus.append(xpu)
        nics.append(nic)
    return nics


def add_dgx_node(graph: nx.Graph, name: str, *, unit: int, first_xpu: int, xpus: int, device: Device,
                 node: DgxNodeSpec, links) -> list[str]:
    """Add one DGX-style node and return its NICs, NIC i beside GPU i.

    Nodes, for node ``name`` (e.g. ``n3``): CPUs ``{name}.cpu{c}`` joined
    all-to-all by ``links.upi``, each with its DRAM ``{name}.dram{c}`` (owner:
    the CPU); PCIe uplink switches ``{name}.up{u}``, each on one PCIe link to
    CPU ``u // (uplinks / cpus)``; GPU ``xpu{first_xpu + i}`` with its HBM on
    its own PCIe switch ``{name}.pcie{i}`` (under uplink switch ``i //
    gpus_per_uplink``) beside its NIC ``{name}.nic{i}``; every GPU on the
    NVSwitch ``{name}.nvsw`` (role ``xpu``) by ``links.xpu_link``. A GPU's
    extended memory and host memory (where CPU offload goes) are the DRAM of
    the CPU above it. A GPU reaches its own NIC
    in two PCIe hops and any other NIC in four or more, so least-latency routes
    use each GPU's own NIC, as NCCL does on these systems.
    """
    where = dict(rack=unit, server=name)
    pcie, hbm = links["pcie"], links["hbm"]
    cpus = []
    for c in range(node.cpus):
        cpu, dram = f"{name}.cpu{c}", f"{name}.dram{c}"
        graph.add_node(cpu, kind="cpu", flops=node.cpu_flops, **where)
        add_memory(graph, dram, capacity=node.dram_capacity, role="dram", owner=cpu, **where)
        _link(graph, cpu, dram, links["dram"], "dram")
        for other in cpus:
            _link(graph, other, cpu, links["upi"], "upi")
        cpus.append(cpu)
    per_cpu = node.uplinks // node.cpus
    for u in range(math.ceil(xpus / node.gpus_per_uplink)):
        graph.add_node(f"{name}.up{u}", kind="switch", role="pcie", **where)
        _link(graph, f"{name}.up{u}", cpus[u // per_cpu], pcie, "pcie")
    if xpus > 0:
        graph.add_node(f"{name}.nvsw", kind="switch", role="xpu", **where)
    nics = []
    for i in range(xpus):
        xpu, switch, nic, u = f"xpu{first_xpu + i}", f"{name}.pcie{i}", f"{name}.nic{i}", i // node.gpus_per_uplink
        add_xpu(graph, xpu, device, hbm_latency=hbm.latency, **where)
        if hbm.bandwidth is not None:
            graph.edges[xpu, f"{xpu}.hbm"]["bandwidth"] = hbm.bandwidth
        graph.nodes[xpu]["extended_memory"] = graph.nodes[xpu]["host_memory"] = f"{name}.dram{u // per_cpu}"
        graph.add_node(switch, kind="switch", role="pcie", **where)
        graph.add_node(nic, kind="nic", **where)
        _link(graph, switch, f"{name}.up{u}", pcie, "pcie")
        _link(graph, xpu, switch, pcie, "pcie")
        _link(graph, nic, switch, pcie, "pcie")
        _link(graph, xpu, f"{name}.nvsw", links["xpu_link"], "xpu_link")
        nics.append(nic)
    return nics


def add_fat_tree(graph: nx.Graph, nics: list[tuple[str, int, int]], fabric: FabricSpec, nic_link: LinkSpec,
                 ib_link: LinkSpec) -> dict[str, int]:
    """Join `nics` ((name, node index, rail) each) by a non-blocking fat tree; return the switch count per level.

    Leaves ``ib1.{j}`` take radix/2 NICs each: in NIC order (``fat_tree``),
    or one leaf per rail and scalable unit of radix/2 nodes, rail by rail
    (``rail_optimized``). Above them, levels of groups ``ib{level}.{j}`` of
    radix/2 children each, until at most `radix` children remain, which one
    top group joins (so L levels hold radix x (radix/2)^(L-1) NICs: 2,048 at
    L = 2 and 65,536 at L = 3 for 64-port switches; 800 and 16,000 for 40 ports).

    A group stands for the ``switches`` of a folded Clos network that serve
    its ``nics`` (ceil(nics / (radix/2)) in a middle level, ceil(nics / radix)
    at the top) and is joined to each child by one link of the child's
    ``nics`` x ``ib_link`` bandwidth (every up-port of the child): the
    capacity of a non-blocking fat tree whose load is spread evenly over its
    parallel links (adaptive routing). Modelling each switch with its own
    links would give SimGrid's single static route per pair one of those
    links, so every flow leaving a leaf would share one up-link. Each level
    keeps its latency: a route between two leaves crosses 2 (L - 1) switch
    links of ``ib_link`` latency; a NIC reaches its leaf by ``nic_link``.
    """
    down, radix = fabric.down_ports, fabric.switch_radix
    if fabric.topology == "fat_tree":
        members = [[nic for nic, _, _ in nics[i : i + down]] for i in range(0, len(nics), down)]
    else:
        by_leaf: dict[tuple[int, int], list[str]] = {}
        for nic, node, rail in nics:
            by_leaf.setdefault((rail, node // down), []).append(nic)
        members = [by_leaf[key] for key in sorted(by_leaf)]
    children = []
    for j, group in enumerate(members):
        leaf = f"ib1.{j}"
        graph.add_node(leaf, kind="switch", role="ib", level=1, switches=1, nics=len(group))
        for nic in group:
            _link(graph, nic, leaf, nic_link, "ib")
        children.append(leaf)
    counts = {1: len(children)}
    level = 1
    while len(children) > 1:
        level += 1
        top = len(children) <= radix
        size = len(children) if top else down
        parents = []
        for j in range(0, len(children), size):
            below = sum(graph.nodes[child]["nics"] for child in children[j : j + size])
            parent = f"ib{level}.{j // size}"
            graph.add_node(parent, kind="switch", role="ib", level=level, nics=below,
                           switches=math.ceil(below / (radix if top else down)))
            for child in children[j : j + size]:
                add_link(graph, child, parent, bandwidth=graph.nodes[child]["nics"] * ib_link.bandwidth,
                         latency=ib_link.latency, kind="ib")
            parents.append(parent)
        counts[level] = sum(graph.nodes[p]["switches"] for p in parents)
        children = parents
    return counts


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
        raise TopologyError(invalid(f"platform {spec.name!r} ({Path(spec.source).name})", problems))
    return graph
