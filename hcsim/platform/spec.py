"""Platform specs: the YAML description of a computing system, read and checked.

A spec is either *structured* (the paper's Fig. 6 family: servers, racks, an
Ethernet leaf-spine, optionally a CXL fabric; every parameter named in the
YAML with its default documented there), a *DGX cluster* (``kind: dgx``:
DGX-style GPU nodes on an InfiniBand fat tree, plain or rail-optimised) or
*explicit* (a ``topology:`` section listing nodes and links one by one, for
systems of the user's own).

Top-level keys of a structured spec (see ``platforms/paper-cxl.yaml`` for every
default and its source):

    name, xpus, coherent, devices, device_catalog, server, rack, network, cxl,
    links, routes

A DGX spec (see ``platforms/dgx-h100.yaml``) has ``name``, ``kind: dgx``,
``xpus``, ``devices`` (one per node, cycling), ``device_catalog``, ``node``,
``fabric``, ``links`` (:data:`DGX_LINKS`) and ``routes``.

A superchip spec (``kind: superchip``, see ``platforms/gh200.yaml`` and
``platforms/gb200-nvl72.yaml``) has ``name``, ``kind``, ``xpus``, ``devices``
(the GPU, one per NVLink domain, cycling), ``device_catalog``, ``node`` (one
NVLink domain of superchips: :class:`SuperchipSpec`), ``fabric`` and
``links`` (:data:`SUPERCHIP_LINKS`). A pooled-CXL spec (``kind: cxl_pool``,
see ``platforms/cxl-pool.yaml``) is a DGX spec whose hosts share pooled CXL
Type 3 memory behind a CXL switch: ``node``, ``fabric``, ``pool``
(:class:`PoolSpec`) and ``links`` (:data:`POOL_LINKS`).

An explicit spec has ``name``, ``device_catalog``, ``links`` (only ``hbm``
is read, for the XPUs' HBM links), ``topology`` (``nodes`` and ``links``) and
optionally ``routes``.

``device_catalog`` lists device files of the shape of ``platforms/devices.yaml``;
a relative path is looked up in the spec file's folder, then in the current
directory (so ``--set device_catalog=[my-devices.yaml]`` on a built-in spec
finds the file where you are).

Overrides (from a scenario or a sweep) are dotted keys applied to the YAML
before it is checked, so their errors name the key: ``{"links.cxl.latency":
"1us", "coherent": False, "devices": ["H100", "A100"]}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hcsim.config import Fields, _suggest, apply_overrides, load_yaml, resolve_spec
from hcsim.errors import ConfigError, brief
from hcsim.limits import MAX_COMPONENTS
from hcsim.platform.devices import BUILTIN_CATALOG, CpuDevice, Device, load_catalog, load_cpu_catalog
from hcsim.platform.topology import LINK_KINDS, MEMORY_ROLES, NODE_KINDS
from hcsim.units import BytesPerSecond, Bytes, FlopsPerSecond, Seconds

__all__ = [
    "LinkSpec", "ServerSpec", "NetworkSpec", "CxlSpec", "NodeSpec", "EdgeSpec", "TopologySpec",
    "PlatformSpec", "load_platform_spec", "TABLE5_LINKS", "TYPE3_ATTACH",
    "DgxNodeSpec", "FabricSpec", "DgxSpec", "DGX_LINKS", "FABRIC_TOPOLOGIES", "SPEC_KINDS",
    "SuperchipSpec", "PoolSpec", "SUPERCHIP_LINKS", "POOL_LINKS", "NVLINK_LAYOUTS", "NIC_ATTACH",
]

# Links every structured spec names (paper Table 5 plus the ones the paper leaves open).
TABLE5_LINKS = ("tor_to_l1", "nic_to_tor", "upi", "pcie", "xpu_link", "cxl", "hbm", "dram")
# Links every DGX spec names: NVLink (to the node's NVSwitch), PCIe, CPU-to-CPU, NIC to leaf switch,
# switch to switch, HBM and DRAM.
DGX_LINKS = ("xpu_link", "pcie", "upi", "nic_to_leaf", "ib", "hbm", "dram")
# Links every superchip spec names: NVLink-C2C (GPU to its Grace), NVLink (GPU to GPU or to the domain's NVLink
# switch), PCIe (NIC to its host), NIC to leaf switch, switch to switch, HBM and the CPU's DRAM (LPDDR5X).
SUPERCHIP_LINKS = ("c2c", "xpu_link", "pcie", "nic_to_leaf", "ib", "hbm", "dram")
# Links every pooled-CXL spec names: the DGX ones and cxl (one port of the CXL switch).
POOL_LINKS = DGX_LINKS + ("cxl",)
FABRIC_TOPOLOGIES = ("fat_tree", "rail_optimized")
SPEC_KINDS = ("paper", "dgx", "superchip", "cxl_pool")
NVLINK_LAYOUTS = ("switch", "mesh")
NIC_ATTACH = ("cpu", "gpu")
TYPE3_ATTACH = ("switch", "xpu")
XPU_TRAFFIC = ("shortest", "fabric")
UNBOUNDED = ("unbounded", "inf")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """A full-duplex link class: bandwidth in B/s per direction (None: the device's, for hbm), latency in s."""

    name: str
    bandwidth: BytesPerSecond | None
    latency: Seconds

    def __post_init__(self) -> None:
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ConfigError(f"links.{self.name}.bandwidth: must be > 0 B/s, got {self.bandwidth!r}")
        if not self.latency > 0:  # also rejects NaN; CM02 starves flows on zero-latency routes
            raise ConfigError(f"links.{self.name}.latency: must be > 0 s, got {self.latency!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """One server (IEIT NF5468 "balance" layout by default)."""

    cpus: int
    xpus_per_cpu: int
    cpu_pcie_links: int
    xpu_switch: bool
    nics_per_cpu: int
    cpu_flops: FlopsPerSecond
    dram_capacity: Bytes

    @property
    def xpus(self) -> int:
        return self.cpus * self.xpus_per_cpu


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """Ethernet leaf-spine: `servers_per_rack` servers per ToR, every ToR linked to each of `spines` core switches."""

    servers_per_rack: int
    spines: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CxlSpec:
    """CXL fabric: leaf switches of `xpus_per_leaf` XPUs, cascaded `radix` children per switch, per rack then across racks."""

    xpus_per_leaf: int
    radix: int
    type3_attach: str
    type3_capacity: Bytes
    xpu_traffic: str = "shortest"  # "fabric": routes never take Ethernet (XPUs talk over CXL only)


@dataclass(frozen=True, slots=True, kw_only=True)
class DgxNodeSpec:
    """One DGX-style GPU node: `gpus` on an NVSwitch, each with its own PCIe switch and NIC.

    Each GPU's PCIe switch holds the GPU and its NIC (GPUDirect RDMA); the GPU
    switches join `gpus // gpus_per_uplink` uplink switches, each on one PCIe
    link to a CPU (spread evenly over the `cpus`); the CPUs are joined
    all-to-all and each has its DRAM (`dram_capacity` bytes per CPU), which is
    the extended memory of the GPUs under it.
    """

    gpus: int
    cpus: int
    gpus_per_uplink: int
    cpu_flops: FlopsPerSecond
    dram_capacity: Bytes

    def __post_init__(self) -> None:
        if self.gpus % self.gpus_per_uplink or (self.gpus // self.gpus_per_uplink) % self.cpus:
            raise ConfigError(f"node: gpus ({self.gpus}) must split into uplinks of gpus_per_uplink "
                              f"({self.gpus_per_uplink}) spread evenly over the cpus ({self.cpus})")

    @property
    def uplinks(self) -> int:
        return self.gpus // self.gpus_per_uplink


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricSpec:
    """A non-blocking InfiniBand fat tree of `switch_radix`-port switches over one NIC per GPU.

    ``fat_tree``: NICs fill leaf switches in node order, radix/2 per leaf;
    ``rail_optimized``: NIC i of every node of a scalable unit (radix/2 nodes)
    sits on that unit's leaf of rail i, and each rail's leaves share their
    upper levels first (see :func:`hcsim.platform.builders.dgx_cluster`).
    """

    topology: str
    switch_radix: int

    def __post_init__(self) -> None:
        if self.topology not in FABRIC_TOPOLOGIES:
            raise ConfigError(f"fabric.topology: {self.topology!r} is not one of {', '.join(FABRIC_TOPOLOGIES)}")
        if self.switch_radix < 4 or self.switch_radix % 2:
            raise ConfigError(f"fabric.switch_radix: must be an even number >= 4 (half the ports down, half up), "
                              f"got {self.switch_radix}")

    @property
    def down_ports(self) -> int:
        """Ports of a leaf (or a middle-level switch) that face down: half its radix."""
        return self.switch_radix // 2


@dataclass(frozen=True, slots=True, kw_only=True)
class DgxSpec:
    """The node and fabric of a ``kind: dgx`` spec."""

    node: DgxNodeSpec
    fabric: FabricSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SuperchipSpec:
    """One NVLink domain of `superchips` superchips, each a `cpu` joined to `gpus_per_superchip` GPUs by
    NVLink-C2C (cache coherent: a GPU reads and writes its CPU's memory in place), and the InfiniBand fabric
    between domains.

    ``nvlink``: ``switch`` puts every GPU of the domain on one NVLink switch node (NVL72's switch trays,
    modelled as one non-blocking switch) by ``links.xpu_link``; ``mesh`` joins every pair of GPUs of the
    domain by a link of ``links.xpu_link`` (a quad GH200 node's all-to-all NVLink). ``nic_attach``: each
    GPU's NIC sits on PCIe under the superchip's CPU (``cpu``: its RDMA crosses C2C) or the GPU (``gpu``).
    """

    superchips: int
    gpus_per_superchip: int
    cpu: CpuDevice
    nvlink: str
    nic_attach: str
    fabric: "FabricSpec"

    def __post_init__(self) -> None:
        for key in ("superchips", "gpus_per_superchip"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"node.{key}: must be an integer >= 1, got {value!r}")
        if self.nvlink not in NVLINK_LAYOUTS:
            raise ConfigError(f"node.nvlink: {self.nvlink!r} is not one of {', '.join(NVLINK_LAYOUTS)}")
        if self.nic_attach not in NIC_ATTACH:
            raise ConfigError(f"node.nic_attach: {self.nic_attach!r} is not one of {', '.join(NIC_ATTACH)}")

    @property
    def gpus(self) -> int:
        """GPUs per NVLink domain."""
        return self.superchips * self.gpus_per_superchip


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """Pooled CXL Type 3 memory: every `hosts` consecutive hosts (DGX-style nodes) share one multi-headed
    Type 3 device behind one CXL switch.

    The device is one memory of `hosts` x `capacity_per_host` bytes (one capacity: placement refuses what
    the hosts put in it beyond that, naming it); each of its `device_ports` heads and each of a host CPU's
    `cpu_ports` ports is one switch port of ``links.cxl`` bandwidth, so a host's CPU reaches the switch at
    cpu_ports x and the device serves at device_ports x that bandwidth, shared by every host of the pool.
    """

    hosts: int
    capacity_per_host: Bytes
    device_ports: int
    cpu_ports: int

    def __post_init__(self) -> None:
        for key in ("hosts", "device_ports", "cpu_ports"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"pool.{key}: must be an integer >= 1, got {value!r}")
        if not self.capacity_per_host > 0:  # also NaN
            raise ConfigError(f"pool.capacity_per_host: must be > 0 bytes, got {self.capacity_per_host!r}")

    @property
    def capacity(self) -> Bytes:
        """Bytes of one pool device: hosts x capacity_per_host."""
        return self.hosts * self.capacity_per_host


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A node of an explicit topology; `attributes` follow hcsim.platform.topology."""

    name: str
    kind: str
    attributes: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeSpec:
    """A link of an explicit topology (B/s, s)."""

    u: str
    v: str
    bandwidth: BytesPerSecond | None
    latency: Seconds | None
    kind: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologySpec:
    """An explicit topology: nodes and links as the user listed them (duplicates kept, for validation)."""

    nodes: tuple[NodeSpec, ...]
    links: tuple[EdgeSpec, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformSpec:
    """A checked platform spec. Make variants with ``load_platform_spec(..., overrides)``."""

    name: str
    source: str
    xpus: int
    coherent: bool
    devices: tuple[str, ...]
    catalog: Mapping[str, Device]
    server: ServerSpec | None
    network: NetworkSpec | None
    cxl: CxlSpec | None
    links: Mapping[str, LinkSpec]
    routes: tuple[tuple[str, ...], ...] = ()
    topology: TopologySpec | None = None
    dgx: DgxSpec | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    superchip: SuperchipSpec | None = None
    pool: PoolSpec | None = None

    def device_of_rack(self, rack: int) -> Device:
        """The device of every XPU in `rack` (racks cycle through `devices`)."""
        return self.catalog[self.devices[rack % len(self.devices)]]

    @property
    def spill(self) -> str:
        """What a stage whose state does not fit its XPUs' local memory does here (scenario key ``spill``):
        ``error`` on a DGX cluster, whose frameworks (Megatron-LM, PyTorch) have no spill to host memory and stop
        out of memory; ``allow`` on the paper's topologies and explicit ones, where spilling to extended memory
        is the paper's model (Fig. 3: copied in before use without coherence, read in place with it), on
        superchips (the GPU reads its Grace's LPDDR5X in place over NVLink-C2C) and on pooled CXL memory."""
        return "error" if self.dgx is not None and self.pool is None else "allow"


def load_platform_spec(name_or_path: str | Path, overrides: Mapping[str, object] | None = None) -> PlatformSpec:
    """Read, override and check a platform spec.

    Parameters
    ----------
    name_or_path : a built-in name (``"paper-cxl"``, ``"dgx-h100"``, ...) or a YAML path.
    overrides : dotted keys with YAML-style values, applied before checking.

    Raises
    ------
    ConfigError
        listing every problem of the spec at once, each with its field path.

    >>> spec = load_platform_spec("paper-cxl", {"xpus": 64, "links.cxl.bandwidth": "256GB/s"})
    >>> spec.xpus, spec.coherent, spec.links["cxl"].bandwidth
    (64, True, 256000000000.0)
    """
    path = resolve_spec(name_or_path, "platforms")
    where = f"{path.name}: "
    raw = load_yaml(path)
    if isinstance(raw, dict) and "model" in raw and not {"links", "topology", "server", "node"} & set(raw):
        raise ConfigError(f"{path}: a workload spec (it has model:), not a platform spec; give it as the "
                          f"workload (--set workload={path}), and a platform such as paper-cxl or dgx-h100")
    data = apply_overrides(raw, overrides or {}, where)
    if isinstance(data, dict) and "kind" in data and data["kind"] not in SPEC_KINDS:
        # each kind has keys of its own: the others' problems under another kind would be noise
        raise ConfigError(f"{where}kind: {brief(data['kind'])} is not one of {', '.join(SPEC_KINDS)}"
                          f"{_suggest(data['kind'], SPEC_KINDS)}; the rest of the spec is checked against its kind")
    top = Fields(data, where)
    name = top.string("name", path.stem)
    kind = top.choice("kind", SPEC_KINDS, default="paper")
    catalog = _catalog(top, path.parent)
    explicit = top.has("topology")
    names = {"dgx": DGX_LINKS, "superchip": SUPERCHIP_LINKS, "cxl_pool": POOL_LINKS}.get(kind, TABLE5_LINKS)
    links = _links(top.sub("links"), ("hbm",) if explicit else names, optional=explicit,
                   device_bandwidth=("hbm", "dram") if kind == "superchip" else ("hbm",))
    routes = _routes(top)
    if top.has("topology"):
        topology = _topology(top.sub("topology"), catalog)
        top.done()
        xpus = sum(1 for node in topology.nodes if node.kind == "xpu")
        return PlatformSpec(name=name, source=str(path), xpus=xpus, coherent=False, devices=(),
                            catalog=MappingProxyType(catalog), server=None, network=None, cxl=None,
                            links=MappingProxyType(links), routes=routes, topology=topology,
                            overrides=MappingProxyType(dict(overrides or {})))
    xpus = top.number("xpus", kind=int, minimum=1)
    if kind in ("dgx", "cxl_pool"):
        devices = _devices(top, catalog)
        dgx = _dgx(top.sub("node"), top.sub("fabric"))
        pool = _pool(top.sub("pool")) if kind == "cxl_pool" else None
        top.done()
        return PlatformSpec(name=name, source=str(path), xpus=xpus, coherent=pool is not None, devices=devices,
                            catalog=MappingProxyType(catalog), server=None, network=None, cxl=None,
                            links=MappingProxyType(links), routes=routes, dgx=dgx, pool=pool,
                            overrides=MappingProxyType(dict(overrides or {})))
    if kind == "superchip":
        devices = _devices(top, catalog)
        superchip = _superchip(top.sub("node"), top.sub("fabric"), _cpu_catalog(top, path.parent))
        top.done()
        return PlatformSpec(name=name, source=str(path), xpus=xpus, coherent=True, devices=devices,
                            catalog=MappingProxyType(catalog), server=None, network=None, cxl=None,
                            links=MappingProxyType(links), routes=routes, superchip=superchip,
                            overrides=MappingProxyType(dict(overrides or {})))
    coherent = top.flag("coherent")
    devices = _devices(top, catalog)
    server = _server(top.sub("server"))
    network = _network(top.sub("rack"), top.sub("network"))
    cxl = _cxl(top.sub("cxl"))
    top.done()
    return PlatformSpec(name=name, source=str(path), xpus=xpus, coherent=coherent, devices=devices,
                        catalog=MappingProxyType(catalog), server=server, network=network, cxl=cxl,
                        links=MappingProxyType(links), routes=routes,
                        overrides=MappingProxyType(dict(overrides or {})))


def _catalog(top: Fields, base: Path) -> dict[str, Device]:
    files = top.raw("device_catalog", [])
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list):
        top.problems.append(f"{top.path('device_catalog')}: expected a list of device YAML files, got {brief(files)}")
        files = []
    catalog = load_catalog(BUILTIN_CATALOG)
    origin = dict.fromkeys(catalog, BUILTIN_CATALOG.name)
    for i, file in enumerate(files):
        where = f"{top.path('device_catalog')}[{i}]"
        file_path = Path(str(file))
        if not file_path.is_absolute() and (base / file_path).is_file():
            file_path = base / file_path  # beside the spec first; else resolve_spec tries the current directory
        try:
            extra = load_catalog(resolve_spec(file_path, "platforms"))
        except ConfigError as err:
            top.problems.append(f"{where}: {err}")
            continue
        for device_name, device in extra.items():
            if device_name in catalog:
                top.problems.append(f"{where}: device {device_name!r} is already defined in {origin[device_name]}; "
                                    "give yours another name")
                continue
            catalog[device_name] = device
            origin[device_name] = str(file)
    return catalog


def _cpu_catalog(top: Fields, base: Path) -> dict[str, CpuDevice]:
    """The host CPUs of the built-in catalog and of the spec's device_catalog files (their ``cpus:``); the
    files' own problems are reported by _catalog."""
    files = top.data.get("device_catalog") or []
    cpus = load_cpu_catalog(BUILTIN_CATALOG)
    for file in [files] if isinstance(files, str) else files if isinstance(files, list) else []:
        file_path = Path(str(file))
        if not file_path.is_absolute() and (base / file_path).is_file():
            file_path = base / file_path
        try:
            cpus.update({name: cpu for name, cpu in load_cpu_catalog(resolve_spec(file_path, "platforms")).items()
                         if name not in cpus})
        except ConfigError:
            continue
    return cpus


def _devices(top: Fields, catalog: Mapping[str, Device]) -> tuple[str, ...]:
    raw = top.raw("devices")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        top.problems.append(f"{top.path('devices')}: expected a non-empty list of device names (one per rack, cycling), got {brief(raw)}")
        return ()
    from hcsim.config import _suggest  # one suggestion format for the whole code base

    for i, device in enumerate(raw):
        if not isinstance(device, str):
            top.problems.append(f"{top.path('devices')}[{i}]: expected a device name, got {brief(device)}; "
                                f"known: {', '.join(sorted(catalog))}")
        elif device not in catalog:
            top.problems.append(f"{top.path('devices')}[{i}]: unknown device {brief(device)}{_suggest(device, catalog)}; "
                                f"known: {', '.join(sorted(catalog))}")
    return tuple(map(str, raw))


def _capacity(fields: Fields, key: str) -> Any:
    value = fields.data.get(key)
    if isinstance(value, str) and value.strip().lower() in UNBOUNDED:
        fields.raw(key)
        return math.inf
    return fields.quantity(key, "size")


def _server(fields: Fields) -> ServerSpec | None:
    values = dict(
        cpus=fields.number("cpus", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        xpus_per_cpu=fields.number("xpus_per_cpu", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        cpu_pcie_links=fields.number("cpu_pcie_links", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        xpu_switch=fields.flag("xpu_switch"),
        nics_per_cpu=fields.number("nics_per_cpu", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        cpu_flops=fields.quantity("cpu_flops", "flops", positive=False),
        dram_capacity=_capacity(fields, "dram_capacity"),
    )
    fields.check_unknown()
    return None if None in values.values() else ServerSpec(**values)


def _network(rack: Fields, network: Fields) -> NetworkSpec | None:
    servers = rack.number("servers", kind=int, minimum=1)
    rack.check_unknown()
    spines = network.number("spines", kind=int, minimum=1, maximum=MAX_COMPONENTS)
    network.check_unknown()
    return None if None in (servers, spines) else NetworkSpec(servers_per_rack=servers, spines=spines)


def _cxl(fields: Fields) -> CxlSpec | None:
    values = dict(
        xpus_per_leaf=fields.number("xpus_per_leaf", kind=int, minimum=1),
        radix=fields.number("radix", kind=int, minimum=2),
        type3_attach=fields.choice("type3_attach", TYPE3_ATTACH),
        type3_capacity=_capacity(fields, "type3_capacity"),
        xpu_traffic=fields.choice("xpu_traffic", XPU_TRAFFIC, default="shortest"),
    )
    fields.check_unknown()
    return None if None in values.values() else CxlSpec(**values)


def _dgx(node: Fields, fabric: Fields) -> DgxSpec | None:
    values = dict(
        gpus=node.number("gpus", kind=int, minimum=1),
        cpus=node.number("cpus", kind=int, minimum=1),
        gpus_per_uplink=node.number("gpus_per_uplink", kind=int, minimum=1),
        cpu_flops=node.quantity("cpu_flops", "flops", positive=False),
        dram_capacity=_capacity(node, "dram_capacity"),
    )
    node.check_unknown()
    topology = fabric.choice("topology", FABRIC_TOPOLOGIES)
    radix = fabric.number("switch_radix", kind=int, minimum=4)
    fabric.check_unknown()
    if None in values.values() or None in (topology, radix):
        return None
    try:
        return DgxSpec(node=DgxNodeSpec(**values), fabric=FabricSpec(topology=topology, switch_radix=radix))
    except ConfigError as err:
        node.problems.append(f"{node.where.rsplit(': ', 1)[0]}: {err}")
        return None


def _superchip(node: Fields, fabric: Fields, cpus: Mapping[str, CpuDevice]) -> SuperchipSpec | None:
    from hcsim.config import _suggest  # one suggestion format for the whole code base

    values = dict(
        superchips=node.number("superchips", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        gpus_per_superchip=node.number("gpus_per_superchip", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        nvlink=node.choice("nvlink", NVLINK_LAYOUTS),
        nic_attach=node.choice("nic_attach", NIC_ATTACH),
    )
    cpu_name = node.string("cpu")
    cpu = cpus.get(cpu_name) if cpu_name is not None else None
    if cpu_name is not None and cpu is None:
        node.problems.append(f"{node.path('cpu')}: unknown CPU {brief(cpu_name)}{_suggest(cpu_name, cpus)}; known: "
                             f"{', '.join(sorted(cpus)) or 'none'} (the cpus: of platforms/devices.yaml and of "
                             f"device_catalog files)")
    node.check_unknown()
    topology = fabric.choice("topology", FABRIC_TOPOLOGIES)
    radix = fabric.number("switch_radix", kind=int, minimum=4)
    fabric.check_unknown()
    if None in values.values() or None in (cpu, topology, radix):
        return None
    try:
        return SuperchipSpec(cpu=cpu, fabric=FabricSpec(topology=topology, switch_radix=radix), **values)
    except ConfigError as err:
        node.problems.append(f"{node.where.rsplit(': ', 1)[0]}: {err}")
        return None


def _pool(fields: Fields) -> PoolSpec | None:
    values = dict(
        hosts=fields.number("hosts", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        capacity_per_host=fields.quantity("capacity_per_host", "size"),
        device_ports=fields.number("device_ports", kind=int, minimum=1, maximum=MAX_COMPONENTS),
        cpu_ports=fields.number("cpu_ports", kind=int, minimum=1, maximum=MAX_COMPONENTS),
    )
    fields.check_unknown()
    return None if None in values.values() else PoolSpec(**values)


def _links(fields: Fields, names: tuple[str, ...], optional: bool = False,
           device_bandwidth: tuple[str, ...] = ("hbm",)) -> dict[str, LinkSpec]:
    """The link classes `names` (each required unless `optional`); the bandwidth of those in `device_bandwidth`
    may be left to the device (hbm: the XPU's memory bandwidth; a superchip's dram: its CPU's)."""
    links = {}
    for name in names:
        if not fields.has(name):
            if optional:
                continue
            fields.problems.append(f"{fields.path(name)}: is required (bandwidth and latency of this link class)")
            continue
        sub = fields.sub(name)
        own = name in device_bandwidth
        bandwidth = sub.quantity("bandwidth", "bandwidth", default=None if own else ...)
        latency = sub.quantity("latency", "time")
        sub.check_unknown()
        if latency is not None and (bandwidth is not None or (own and not sub.has("bandwidth"))):
            links[name] = LinkSpec(name=name, bandwidth=bandwidth, latency=latency)
    if optional:  # an explicit topology: its links are in topology.links
        for name in sorted(set(map(str, fields.data)) & set(TABLE5_LINKS) - {"hbm"}):
            fields.raw(name)
            fields.problems.append(f"{fields.path(name)}: an explicit topology reads only links.hbm; give each "
                                   "link's bandwidth and latency in topology.links (a scenario's cxl_bandwidth and "
                                   "cxl_latency set links.cxl: leave them out for this platform)")
    fields.check_unknown()
    return links


def _routes(top: Fields) -> tuple[tuple[str, ...], ...]:
    raw = top.raw("routes", [])
    if not isinstance(raw, list):
        top.problems.append(f"{top.path('routes')}: expected a list of routes, each a list of node names from source to destination")
        return ()
    routes = []
    for i, route in enumerate(raw):
        if not isinstance(route, list) or len(route) < 2 or not all(isinstance(n, str) for n in route):
            top.problems.append(f"{top.path('routes')}[{i}]: expected a list of at least 2 node names, got {brief(route)}")
            continue
        routes.append(tuple(route))
    return tuple(routes)


def _topology(fields: Fields, catalog: Mapping[str, Device]) -> TopologySpec:
    nodes, edges = [], []
    raw_nodes = fields.raw("nodes", [])
    raw_links = fields.raw("links", [])
    for i, raw in enumerate(raw_nodes if isinstance(raw_nodes, list) else []):
        node = Fields(raw, f"{fields.path('nodes')}[{i}]", fields.problems)
        name = node.string("name")
        kind = node.choice("kind", NODE_KINDS)
        attributes: dict[str, Any] = {}
        for key in ("rack", "server"):
            if node.has(key):
                attributes[key] = node.raw(key)
        if node.has("transit"):
            attributes["transit"] = node.flag("transit")
        if kind == "xpu":
            attributes["device"] = node.choice("device", sorted(catalog))
            if node.has("extended_memory"):
                attributes["extended_memory"] = node.string("extended_memory")
        elif kind == "cpu":
            attributes["flops"] = node.quantity("flops", "flops", default=0.0, positive=False)
        elif kind == "memory":
            attributes["capacity"] = _capacity(node, "capacity") if node.has("capacity") else None
            attributes["role"] = node.choice("role", MEMORY_ROLES, default="dram")
            attributes["owner"] = node.string("owner", default=None)
        elif kind == "switch":
            attributes["role"] = node.string("role", default=None)
        node.check_unknown()
        if name is not None and kind is not None:
            nodes.append(NodeSpec(name=name, kind=kind, attributes=MappingProxyType(attributes)))
    for i, raw in enumerate(raw_links if isinstance(raw_links, list) else []):
        link = Fields(raw, f"{fields.path('links')}[{i}]", fields.problems)
        ends = link.raw("ends")
        if not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, str) for e in ends)):
            link.problems.append(f"{link.path('ends')}: expected two node names, got {brief(ends)}")
            ends = None
        # bandwidth and latency are checked by validate_topology, which names the link
        bandwidth = link.quantity("bandwidth", "bandwidth", default=None, positive=False)
        latency = link.quantity("latency", "time", default=None, positive=False)
        kind = link.choice("kind", LINK_KINDS)
        link.check_unknown()
        if ends and ends[0] == ends[1]:
            link.problems.append(f"{link.path('ends')}: links {ends[0]!r} to itself; a link joins two nodes")
        elif ends and kind:
            edges.append(EdgeSpec(u=ends[0], v=ends[1], bandwidth=bandwidth, latency=latency, kind=kind))
    if not isinstance(raw_nodes, list) or not raw_nodes:
        fields.problems.append(f"{fields.path('nodes')}: expected a non-empty list of nodes")
    elif nodes and not any(node.kind == "xpu" for node in nodes):
        fields.problems.append(f"{fields.path('nodes')}: no node of kind xpu; an explicit topology needs at least one")
    if not isinstance(raw_links, list):
        fields.problems.append(f"{fields.path('links')}: expected a list of links")
    fields.check_unknown()
    return TopologySpec(nodes=tuple(nodes), links=tuple(edges))
