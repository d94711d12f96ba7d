"""The platform layer: topology model, device catalog, builders and the SimGrid compiler.

Public API::

    spec = load_platform_spec("paper-cxl", {"xpus": 1024, "devices": ["H100", "A100"]})
    graph = build_platform(spec, xpus=64)          # networkx.Graph (hcsim.platform.topology)
    compiled = compile_platform(graph, pairs)      # SimGrid XML + the route of every pair

Pure: specs in, graphs and XML out; nothing here imports simgrid or matplotlib
at module level.
"""

from hcsim.platform.builders import build_platform, single_switch
from hcsim.platform.compile import CompiledPlatform, compile_platform, link_name, simgrid_links, write_platform
from hcsim.platform.devices import PRECISIONS, Device, builtin_catalog, load_catalog, peak_flops
from hcsim.platform.pairs import data_parallel_pairs, hybrid_parallel_pairs, memory_pairs, ring_pairs
from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes
from hcsim.platform.spec import PlatformSpec, load_platform_spec
from hcsim.platform.topology import host_nodes, validate_topology, xpus

__all__ = [
    "load_platform_spec", "PlatformSpec", "build_platform", "single_switch",
    "compile_platform", "write_platform", "CompiledPlatform", "link_name", "simgrid_links",
    "data_parallel_pairs", "hybrid_parallel_pairs", "memory_pairs", "ring_pairs",
    "Device", "builtin_catalog", "load_catalog", "peak_flops", "PRECISIONS",
    "shortest_routes", "route_latency", "route_bandwidth",
    "validate_topology", "xpus", "host_nodes",
]
