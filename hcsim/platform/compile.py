"""Compile a platform graph for SimGrid 4.1: the routes of the host pairs a run uses, in two forms.

- :attr:`CompiledPlatform.tables`, what hcsim's engine core loads (``hcsim/engine/core/platform.cpp``):
  every host, the links the routes cross and each route as link numbers, which the core puts in one
  zone that routes by a table of the compiled pairs. Load time and memory are linear in hosts and route
  links. SimGrid's own zones are not: a Full zone allocates N^2 route slots for its N netpoints when
  sealed, and a platform of many zones costs hosts x zones twice over while loading (every new host's
  name is checked by searching every zone, and every zone's seal walks every host of the platform). The
  zones below made a rail-optimised DGX fat tree of 131,072 GPUs about 150,000 zones, which SimGrid had
  not loaded after 36 minutes.
- :attr:`CompiledPlatform.xml`, a SimGrid platform file of the same routes, for SimGrid programs of one's
  own (``hcsim platform compile``), planned on first use in the layout below.

Layout of the XML, chosen so that it scales to thousands of
XPUs (SimGrid 4.1's Full routing allocates N^2 route slots for the N
netpoints of a zone, at seal time):

- every link is one SPLITDUPLEX SimGrid link named ``u--v`` (u < v, see
  :func:`link_name`): full duplex, each direction has the full bandwidth; a
  route crosses it as ``u--v_UP`` from u to v and ``u--v_DOWN`` from v to u.
  Only links that some compiled route uses are declared, all in a first
  child zone ``links`` of the root (routing None, no hosts): SimGrid looks a
  link up when it reads a route, and its parser takes a zone whose first child
  is a link for a zone of hosts, which may then hold no zones;
- hosts (XPUs, CPUs, memories) are grouped in *pods*, Full zones that are
  children of a Full root zone. A pod starts as a whole server (the node
  attribute ``server``); routes between two hosts of one pod are routes of
  that pod; routes between pods are ``zoneRoute``s of the root whose gateways
  are hosts of the two pods;
- SimGrid composes a route from host a (pod A) to host b (pod B) as
  ``A:route(a -> gw_A) + root:zoneRoute(A -> B) + B:route(gw_B -> b)`` with
  one zoneRoute per ordered pod pair. When one host pair crosses from A to B,
  its gateways are its own ends. When several do, the compiler looks for
  common gateways: every route through the same exit host of A and entry host
  of B with the same middle, or else through the same first node out of A
  and last node before B (a switch), which become routers of A and B (names
  in the pods, ``gw:SWITCH@POD``, no links). Two server pods whose routes meet
  at one switch (no link between the gateways: SimGrid refuses an empty
  zoneRoute) share a pod. When there are no common gateways, the compiler
  splits the pods involved: a server pod into per-host pods (a host with the
  memories it owns), then into single hosts. A data-parallel ring keeps
  whole-server pods: 4096 XPUs in 512 pods (a 512^2 root table, not
  17,000^2); so do pipeline neighbours, whose routes leave each server
  through its CXL leaf switch (16,384 XPUs in 1024 pods, where per-XPU pods
  made an 18,433-child root whose Full table took 2.8 GB and 3.5 minutes to
  load and seal).

Only the routes of the host pairs the simulation uses are emitted; each is
the route of :func:`hcsim.platform.routes.shortest_routes` (least latency, then
largest bottleneck bandwidth; user routes win), and SimGrid's route for the
pair is exactly that route, in both forms: the table holds it as is, and the
XML compiler only ever composes it from pieces of itself. A pair that is not
compiled has no route in SimGrid: ask for every pair the simulation will use.

Gateways that live in nested zones crash SimGrid 4.1's ``route_to``, so pods
are never nested. The DOCTYPE names SimGrid's DTD; SimGrid's parser
validates against it on load.
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import networkx as nx
from lxml import etree

from hcsim.errors import TopologyError
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import RouteSearch
from hcsim.platform.topology import HOST_KINDS

__all__ = ["CompiledPlatform", "compile_platform", "platform_xml", "write_platform", "link_name", "simgrid_links"]

DTD = "https://simgrid.org/simgrid.dtd"
LINKS_ZONE = "links"
_MAX_LEVEL = 2  # pod levels: 0 server, 1 host with its owned memories, 2 single host


def link_name(u: str, v: str) -> str:
    """The SimGrid name of the link between nodes u and v (SPLITDUPLEX: add _UP or _DOWN)."""
    a, b = sorted((u, v))
    return f"{a}--{b}"


def simgrid_links(route: list[str]) -> list[str]:
    """The SimGrid link names (with _UP/_DOWN) a node route crosses, in order.

    >>> simgrid_links(["xpu1", "sw", "xpu0"])
    ['sw--xpu1_DOWN', 'sw--xpu0_UP']
    """
    return [f"{link_name(u, v)}_{'UP' if u < v else 'DOWN'}" for u, v in zip(route, route[1:])]


class CompiledPlatform:
    """The compiled routes of a platform graph, in the forms SimGrid takes (see the module docstring).

    routes : ``{(src, dst): [node, ...]}`` for every compiled ordered pair.
    tables : what the engine core loads, built on first use: ``hosts`` (every host of the graph, sorted) and
        their ``speeds`` (FLOP/s); ``links`` (the links routes cross, named by :func:`link_name`, sorted) and
        their ``bandwidths`` (B/s, each direction) and ``latencies`` (s); route r from host ``route_src[r]`` to
        host ``route_dst[r]`` over ``route_links[route_offsets[r]:route_offsets[r + 1]]``, where 2 x link is the
        link's ``_UP`` direction (from the smaller node name to the larger) and 2 x link + 1 its ``_DOWN``.
    xml : the SimGrid platform file (zones of hosts, routes and zoneRoutes), planned on first use.
    pods : host -> id of the XML zone that holds it, planned with the XML.
    """

    def __init__(self, graph: nx.Graph, routes: dict[tuple[str, str], list[str]], precision: str):
        self.graph, self.routes, self.precision = graph, routes, precision

    @cached_property
    def tables(self) -> dict:
        hosts = sorted(n for n, kind in self.graph.nodes(data="kind") if kind in HOST_KINDS)
        number = {host: i for i, host in enumerate(hosts)}
        edges = _used_edges(self.routes)
        names = sorted(edges)
        up = {edges[name]: 2 * i for i, name in enumerate(names)}  # (u, v) with u < v: the link's UP direction
        figures = [_link_figures(self.graph, *edges[name]) for name in names]
        src, dst, offsets, crossed = array("i"), array("i"), array("q", [0]), array("i")
        for (a, b), route in sorted(self.routes.items()):
            src.append(number[a])
            dst.append(number[b])
            crossed.extend(up[u, v] if u < v else up[v, u] + 1 for u, v in zip(route, route[1:]))
            offsets.append(len(crossed))
        return {"hosts": hosts, "speeds": array("d", (_speed(self.graph.nodes[h], self.precision) for h in hosts)),
                "links": names, "bandwidths": array("d", (bandwidth for bandwidth, _ in figures)),
                "latencies": array("d", (latency for _, latency in figures)),
                "route_src": src, "route_dst": dst, "route_offsets": offsets, "route_links": crossed}

    @cached_property
    def xml(self) -> str:
        return platform_xml(self.graph, self.routes, *self._layout, self.precision)

    @cached_property
    def pods(self) -> dict[str, str]:
        return {h: _zone_id(p) for h, p in self._layout[0].items()}

    @cached_property
    def _layout(self):
        hosts = {n for n, kind in self.graph.nodes(data="kind") if kind in HOST_KINDS}
        return _plan(self.graph, hosts, self.routes)


def compile_platform(graph: nx.Graph, pairs: Iterable[tuple[str, str]], precision: str = "fp32") -> CompiledPlatform:
    """Compile `graph` to SimGrid XML with routes for the ordered host `pairs`.

    Parameters
    ----------
    graph : a platform graph (:mod:`hcsim.platform.topology`).
    pairs : ordered (source, destination) host pairs the simulation uses;
        pairs of a host with itself are ignored.
    precision : one of :data:`hcsim.platform.devices.PRECISIONS`: an XPU's speed is
        its dense peak at this precision (:func:`~hcsim.platform.devices.peak_flops`,
        a ConfigError when its device has none); a CPU's is its ``flops``
        (1 FLOP/s when 0); a memory's 1 FLOP/s (memories never compute).

    Raises
    ------
    TopologyError
        if a pair names a node that is not a host, a pair has no route, or a
        used link has no positive latency.
    """
    hosts = {n for n, kind in graph.nodes(data="kind") if kind in HOST_KINDS}
    pairs = sorted({(s, d) for s, d in pairs if s != d})
    strangers = sorted({n for pair in pairs for n in pair if n not in hosts})
    if strangers:
        raise TopologyError(f"compile: {', '.join(map(repr, strangers[:5]))} "
                            f"{'is not a host' if len(strangers) == 1 else 'are not hosts'} (xpu, cpu or memory) of "
                            f"platform {graph.graph.get('name', '?')!r}")
    routes = _routes(graph, pairs)
    for u, v in _used_edges(routes).values():
        _link_figures(graph, u, v)  # a bad link fails here, whichever form is built later
    for host in sorted(hosts):
        _speed(graph.nodes[host], precision)  # and a device with no peak at `precision`
    return CompiledPlatform(graph, routes, precision)


def write_platform(graph: nx.Graph, pairs: Iterable[tuple[str, str]], path: str | Path,
                   precision: str = "fp32") -> CompiledPlatform:
    """Compile and write the XML to `path`; returns the compiled platform."""
    compiled = compile_platform(graph, pairs, precision)
    Path(path).write_text(compiled.xml)
    return compiled


def platform_xml(graph, routes, pods, intra, inter, precision: str) -> str:
    """The XML text of a compiled plan (see :func:`compile_platform`)."""
    root = etree.Element("platform", version="4.1")
    zone = etree.SubElement(root, "zone", id="root", routing="Full")
    # links first, in a zone of their own: SimGrid resolves link names when it reads a route, and takes
    # a zone whose first child is a link for a zone of hosts (which then may not hold zones)
    holder = etree.SubElement(zone, "zone", id=LINKS_ZONE, routing="None")
    edges = _used_edges(routes)
    for name in sorted(edges):
        bandwidth, latency = _link_figures(graph, *edges[name])
        etree.SubElement(holder, "link", id=name, bandwidth=f"{bandwidth!r}Bps", latency=f"{latency!r}s",
                         sharing_policy="SPLITDUPLEX")
    members = defaultdict(list)
    for host, pod in pods.items():
        members[pod].append(host)
    routers = defaultdict(set)  # pod -> its gateway routers (names that are no host)
    for (pod_src, pod_dst), (gw_src, gw_dst, _) in inter.items():
        for pod, gateway in ((pod_src, gw_src), (pod_dst, gw_dst)):
            if gateway not in pods:
                routers[pod].add(gateway)
    for pod in sorted(members):
        element = etree.SubElement(zone, "zone", id=_zone_id(pod), routing="Full")
        for host in sorted(members[pod]):
            etree.SubElement(element, "host", id=host, speed=f"{_speed(graph.nodes[host], precision)!r}f")
        for router in sorted(routers[pod]):
            etree.SubElement(element, "router", id=router)
        for (src, dst), route in sorted(intra.get(pod, {}).items()):
            _emit_route(element, "route", route, src=src, dst=dst)
    for (pod_src, pod_dst), (gw_src, gw_dst, route) in sorted(inter.items()):
        _emit_route(zone, "zoneRoute", route, src=_zone_id(pod_src), dst=_zone_id(pod_dst),
                    gw_src=gw_src, gw_dst=gw_dst)
    return etree.tostring(root, pretty_print=True, xml_declaration=True, encoding="UTF-8",
                          doctype=f'<!DOCTYPE platform SYSTEM "{DTD}">').decode()


def _used_edges(routes) -> dict[str, tuple[str, str]]:
    """The links the routes cross: link name -> its ends (u, v), u < v."""
    edges = {}
    for route in routes.values():
        for u, v in zip(route, route[1:]):
            ends = (u, v) if u < v else (v, u)
            edges[f"{ends[0]}--{ends[1]}"] = ends
    return edges


def _link_figures(graph, u: str, v: str) -> tuple[float, float]:
    """The link's (bandwidth B/s, latency s), checked: SimGrid takes neither 0 nor infinity."""
    data = graph.edges[u, v]
    latency, bandwidth = data.get("latency"), data.get("bandwidth")
    if not (isinstance(latency, (int, float)) and latency > 0 and math.isfinite(latency)):
        raise TopologyError(f"link {u!r}--{v!r}: latency must be > 0 s, got {latency!r}")
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0 and math.isfinite(bandwidth)):
        raise TopologyError(f"link {u!r}--{v!r}: bandwidth must be a positive B/s, got {bandwidth!r}")
    return float(bandwidth), float(latency)


def _routes(graph: nx.Graph, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    targets = defaultdict(list)
    for src, dst in pairs:
        targets[src].append(dst)
    routes = {}
    search = RouteSearch(graph)
    for src in sorted(targets):
        for dst, route in search(src, targets[src]).items():
            routes[src, dst] = route
    return routes


def _pod_key(graph, host: str, level: int) -> str:
    data = graph.nodes[host]
    if level == 0 and data.get("server") is not None:
        return f"server:{data['server']}"
    if level <= 1 and data.get("kind") == "memory" and data.get("owner") in graph:
        return data["owner"]
    return host


def _plan(graph, hosts, routes):
    """Group hosts into pods and split routes into pod routes and root zoneRoutes (see the module docstring)."""
    levels = dict.fromkeys(hosts, 0)
    owned = defaultdict(list)
    for host in hosts:
        owner = graph.nodes[host].get("owner")
        if owner in hosts:
            owned[owner].append(host)
    joined: dict[str, str] = {}  # server pod -> the server pod it shares a pod with (servers behind one switch)
    while True:
        pods = {h: _joined(joined, _pod_key(graph, h, level)) for h, level in levels.items()}
        intra, inter, conflicts, touching = _compose(routes, pods)
        servers = [(a, b) for a, b in touching if a.startswith("server:") and b.startswith("server:")]
        if servers:
            for a, b in servers:
                a, b = sorted((_joined(joined, a), _joined(joined, b)))
                if a != b:
                    joined[b] = a
            continue
        touched = {pod for pair in touching for pod in pair}
        conflicts.update(host for host, pod in pods.items() if pod in touched)
        if not conflicts:
            return pods, intra, inter
        bumped = False
        for host in sorted(conflicts):
            level = levels[host]
            if level < _MAX_LEVEL:
                levels[host] = level + 1
                bumped = True
                for memory in owned.get(host, ()):  # a host's memories follow it out of the server pod
                    if level == 0 and levels[memory] == 0:
                        levels[memory] = 1
        if not bumped:
            raise AssertionError(f"compile: cannot place the routes of {sorted(conflicts)[:4]} in zones")


def _joined(joined: dict[str, str], pod: str) -> str:
    while pod in joined:
        pod = joined[pod]
    return pod


def _compose(routes, pods):
    """Pod routes, zoneRoutes, hosts whose crossings share no gateways, and pod pairs that meet at one switch
    (routes between them cross no link outside their pod routes, and SimGrid refuses an empty zoneRoute)."""
    intra: dict[str, dict] = defaultdict(dict)
    crossing = defaultdict(list)
    for (src, dst), route in routes.items():
        if pods[src] == pods[dst]:
            intra[pods[src]][src, dst] = route
        else:
            crossing[pods[src], pods[dst]].append((src, dst, route))
    inter = {}
    conflicts: set[str] = set()
    touching: set[tuple[str, str]] = set()
    for (pod_src, pod_dst), items in sorted(crossing.items()):
        src, dst, route = items[0]
        if len(items) == 1:
            inter[pod_src, pod_dst] = (src, dst, route)
            continue
        for gateways in (_common_gateways, _router_gateways):
            pieces = gateways(items, pods, pod_src, pod_dst)
            if pieces is not None and _fits(intra, pieces):
                break
        else:
            exit_at, entry_at = _crossing(route, pods, pod_src, pod_dst)
            if entry_at - exit_at == 2:
                touching.add(tuple(sorted((pod_src, pod_dst))))
            else:
                conflicts.update(end for item in items for end in item[:2])
            continue
        for pod, key, piece in pieces[1]:
            intra[pod][key] = piece
        inter[pod_src, pod_dst] = pieces[0]
    return intra, inter, conflicts, touching


def _crossing(route, pods, pod_src, pod_dst) -> tuple[int, int]:
    """Indices of the last node of `route` in pod_src and of the first in pod_dst after it."""
    exit_at = max(i for i, n in enumerate(route) if pods.get(n) == pod_src)
    return exit_at, min(i for i, n in enumerate(route) if pods.get(n) == pod_dst and i > exit_at)


def _common_gateways(items, pods, pod_src, pod_dst):
    """Gateways shared by every route from pod_src to pod_dst, with the pod routes they need, or None."""
    first = items[0][2]
    exit_at, entry_at = _crossing(first, pods, pod_src, pod_dst)
    return _split(items, pod_src, pod_dst, first[exit_at], first[entry_at], first[exit_at : entry_at + 1])


def _router_gateways(items, pods, pod_src, pod_dst):
    """Like _common_gateways, with the first node out of pod_src and the last before pod_dst as gateways: each
    a router of its pod (a name, no links), so that routes leaving a server through one switch share them."""
    first = items[0][2]
    exit_at, entry_at = _crossing(first, pods, pod_src, pod_dst)
    if entry_at - exit_at < 3:  # no link between the first node out and the last node in
        return None
    out, into = first[exit_at + 1], first[entry_at - 1]
    return _split(items, pod_src, pod_dst, out, into, first[exit_at + 1 : entry_at],
                  _router_id(pod_src, out), _router_id(pod_dst, into))


def _split(items, pod_src, pod_dst, gw_src, gw_dst, middle, src_name=None, dst_name=None):
    """(the zoneRoute (gateway names, middle), pod routes to and from the gateways), or None when a route
    does not run from gw_src to gw_dst over `middle`."""
    src_name, dst_name = src_name or gw_src, dst_name or gw_dst
    pieces = []
    for src, dst, route in items:
        if gw_src not in route or gw_dst not in route:
            return None
        i, j = route.index(gw_src), route.index(gw_dst)
        if route[i : j + 1] != middle:
            return None
        if src != src_name:
            pieces.append((pod_src, (src, src_name), route[: i + 1]))
        if dst != dst_name:
            pieces.append((pod_dst, (dst_name, dst), route[j:]))
    return (src_name, dst_name, middle), pieces


def _fits(intra, pieces) -> bool:
    added = {}
    for pod, key, piece in pieces[1]:
        known = intra.get(pod, {}).get(key, added.get((pod, key)))
        if known is not None and known != piece:
            return False
        added[pod, key] = piece
    return True


def _emit_route(parent, tag: str, route: list[str], **attributes) -> None:
    element = etree.SubElement(parent, tag, symmetrical="NO", **attributes)
    for u, v in zip(route, route[1:]):
        etree.SubElement(element, "link_ctn", id=link_name(u, v), direction="UP" if u < v else "DOWN")


def _router_id(pod: str, node: str) -> str:
    return f"gw:{node}@{pod}"


def _zone_id(pod: str) -> str:
    return f"pod:{pod}"


def _speed(data: dict, precision: str) -> float:
    if data["kind"] == "xpu":
        return peak_flops(data, precision)
    if data["kind"] == "cpu":
        return float(data.get("flops") or 1.0)
    return 1.0
