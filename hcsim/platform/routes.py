"""Shortest routes on a platform graph.

A route is the path of least total latency; among paths of equal latency the
one with the larger bottleneck bandwidth wins, then the first in node order.
networkx's Dijkstra takes one additive weight and cannot break ties on a
bottleneck (a max-min criterion), so the search below runs Dijkstra on the
pair (latency, -bottleneck) in lexicographic order; both criteria are
monotone along a path, which is what Dijkstra needs. Latencies are summed as
integer femtoseconds so that equal paths compare equal.

A graph may name link kinds that routes never take (``graph.graph["avoid_links"]``:
a coherent platform with ``cxl.xpu_traffic: fabric`` avoids ``eth``, so XPUs
talk over CXL even where Ethernet is faster).

Routes pass through transit nodes only (switches, NICs, CPUs by default: see
:func:`hcsim.platform.topology.is_transit`), with one exception: a host
forwards between the fabric and a memory it owns (``xpu3.hbm -> xpu3 ->
switch``, or ``switch -> xpu3 -> xpu3.hbm``), as its memory controller does.
A NIC with a ``server`` forwards only traffic from or to its own server: a
route enters a NIC only when its source or its target is in the NIC's server
(a network adapter does not relay third parties' packets through its host's
PCIe to another adapter). A node with ``server_only: True`` (a pooled-CXL switch)
is gated the same way and, stricter, forwards what enters it from outside its
server only into its server (its hosts reach the pool's memory; CXL 2.0 switches
carry no host-to-host traffic, whatever else a search from that host looks for).
In the built-in topologies no least-latency route
ever did; the rule keeps each search from wandering into every server of a
large fabric (16,384 GPUs: ~600 nodes settled per source instead of ~35,000).

:class:`RouteSearch` prepares a graph once (integer latencies, transit
flags, NIC servers, laid out as flat arrays) for many searches, as the compiler
runs one per source; each search runs in C++ (``routes.cpp``, the extension
``hcsim.platform._routes`` that ``make`` builds beside the engine core), about
ten times faster than the same loop in Python (16,384 H100 on a DGX fat tree:
3.1 s -> 0.3 s for 49,152 routes), with the same pops in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from hcsim.errors import SimulationError, TopologyError
from hcsim.platform.topology import is_transit

__all__ = ["shortest_routes", "RouteSearch", "route_latency", "route_bandwidth", "route_problems"]

_FS = 1e15  # femtoseconds per second


def shortest_routes(graph: nx.Graph, source: str, targets: Iterable[str]) -> dict[str, list[str]]:
    """Routes (node lists) from `source` to each of `targets`, user routes first.

    User routes are ``graph.graph["routes"][(source, target)]``; the others are
    searched in one Dijkstra run that stops once every target is settled. For
    many sources on one graph, make one :class:`RouteSearch` and call it.

    Raises
    ------
    TopologyError
        if a target cannot be reached or a user route uses a missing link.
    """
    return RouteSearch(graph)(source, targets)


class RouteSearch:
    """Least-latency routes on one graph, prepared once for many sources (see the module docstring).

    The graph must not change while the search is used.
    """

    def __init__(self, graph: nx.Graph):
        self.graph = graph
        self.user = graph.graph.get("routes") or {}
        self.avoid = frozenset(graph.graph.get("avoid_links", ()))
        nodes = graph._node  # read-only fast path; networkx documents _node and _adj as its stores
        self.names = list(nodes)
        self.index = index = {n: i for i, n in enumerate(self.names)}
        self.server_ids: dict = {}  # a node's server (any value) -> a number
        server_id = lambda value: -1 if value is None else self.server_ids.setdefault(value, len(self.server_ids))
        transit = [is_transit(data) for data in nodes.values()]
        server = [server_id(data.get("server")) for data in nodes.values()]
        nic_server = {index[n]: server_id(data["server"]) for n, data in nodes.items()
                      if (data.get("kind") == "nic" or data.get("server_only")) and data.get("server") is not None}
        # links as (position, neighbour, integer femtoseconds, bandwidth) in networkx's order (ties between
        # equal keys fall to push order); links of avoided kinds left out. A transit node lists only its transit
        # neighbours: an endpoint reached from the fabric forwards to nothing but its own memories, so a search
        # adds it only when it is a target or owns one. Links to a NIC with a server are kept apart the same
        # way, by server: a search adds those of the servers it may enter (its source's and targets')
        plain: list[list[tuple]] = [[] for _ in self.names]
        endpoint_links: list[list[tuple]] = [[] for _ in self.names]
        server_links: list[list[tuple]] = [[] for _ in self.server_ids]
        for n, adj in graph._adj.items():
            i = index[n]
            own = plain[i]
            for position, (m, link) in enumerate(adj.items()):
                if link["kind"] in self.avoid:
                    continue
                j = index[m]
                entry = (i, position, j, round(link["latency"] * _FS), link["bandwidth"])
                if j in nic_server:
                    server_links[nic_server[j]].append(entry)
                elif transit[i] and not transit[j]:
                    endpoint_links[j].append(entry)
                else:
                    own.append(entry)
        # transit nodes with at most one transit link (a leaf switch of XPUs or NICs): reached from that link,
        # they lead nowhere unless a node this search adds hangs on them, so a search does not queue them
        dead_end = [int(t and len(own) <= 1) for t, own in zip(transit, plain)]
        inward = [server_id(data["server"]) if data.get("server_only") and data.get("server") is not None else -1
                  for data in nodes.values()]
        native = _extension()
        self._search = native.Search(
            transit=[int(t) for t in transit], memory=[int(d.get("kind") == "memory") for d in nodes.values()],
            owner=[index.get(d.get("owner"), -1) for d in nodes.values()], server=server, inward=inward,
            dead_end=dead_end, adjacency=_links(native, plain), endpoint_links=_links(native, endpoint_links),
            server_links=_links(native, server_links))

    def __call__(self, source: str, targets: Iterable[str]) -> dict[str, list[str]]:
        routes: dict[str, list[str]] = {}
        wanted = set()
        for target in targets:
            given = self.user.get((source, target))
            if given is not None:
                _check_user_route(self.graph, source, target, given)
                routes[target] = list(given)
            elif target == source:
                routes[target] = [source]
            else:
                wanted.add(target)
        if wanted:
            routes.update(self._dijkstra(source, wanted))
        return routes

    def _dijkstra(self, source: str, targets: set[str]) -> dict[str, list[str]]:
        nodes, index, names = self.graph._node, self.index, self.names
        order = list(targets)
        endpoints = {index[e] for e in targets | {nodes[n].get("owner") for n in targets} if e in index}
        servers = {self.server_ids[s] for s in {nodes[n].get("server") for n in (source, *order)} - {None}}
        found, path_nodes, ends = self._search(index[source], [index[t] for t in order], sorted(endpoints),
                                               sorted(servers))
        if not found:
            without = f" without {'/'.join(sorted(self.avoid))} links" if self.avoid else ""
            missing = sorted(names[i] for i in path_nodes)
            raise TopologyError(f"routes from {source!r}: no route{without} to {', '.join(map(repr, missing))}")
        routes, first = {}, 0
        for target, end in zip(order, ends):
            routes[target] = [names[i] for i in path_nodes[first:end]]
            first = end
        return routes


def _extension():
    """The route search's C++ extension, or one error that says how to build it."""
    try:
        from hcsim.platform import _routes
    except ImportError as err:
        raise SimulationError(f"route search: its extension hcsim.platform._routes is not built or does not load "
                              f"({err}). Fix: make core (scripts/build_core.py builds it beside the engine core)") from None
    return _routes


def _links(native, groups: list[list[tuple]]):
    """The search's links (the extension `native`'s Links) grouped by key (a node, an endpoint or a server): (at, position, neighbour, femtoseconds,
    bandwidth) tuples, in each group's order."""
    start, columns = [0], ([], [], [], [], [])
    for group in groups:
        for entry in group:
            for column, value in zip(columns, entry):
                column.append(value)
        start.append(len(columns[0]))
    at, position, neighbour, latency, bandwidth = columns
    return native.Links(start=start, at=at, position=position, neighbour=neighbour, latency=latency,
                        bandwidth=bandwidth)


def _check_user_route(graph: nx.Graph, source: str, target: str, route: list[str]) -> None:
    problems = route_problems(graph, route)
    if not route or route[0] != source or route[-1] != target:
        problems.insert(0, f"must start at the source and end at the target, got {route!r}")
    if problems:
        raise TopologyError(f"platform {graph.graph.get('name', '?')}: routes: user route {source!r} -> {target!r}: "
                            f"{problems[0]}; a route lists this platform's node names from source to destination "
                            f"(hcsim platform draw shows them)")


def route_problems(graph: nx.Graph, route: list[str]) -> list[str]:
    """What is wrong with a user route (a list of node names): a missing node, a hop with no link, a node
    visited twice, or an intermediate node that does not forward (an XPU, a memory), except a host between
    the fabric and a memory it owns. Empty when the route is valid."""
    missing = [n for n in route if n not in graph]
    if missing:
        return [f"no node {', '.join(map(repr, dict.fromkeys(missing)))} in this platform"]
    problems = [f"no link {u!r}--{v!r}" for u, v in zip(route, route[1:]) if not graph.has_edge(u, v)]
    repeated = sorted({n for n in route if route.count(n) > 1})
    if repeated:
        problems.append(f"visits {', '.join(map(repr, repeated))} more than once")
    nodes = graph.nodes
    for before, node, after in zip(route, route[1:], route[2:]):
        own = nodes[before].get("owner") == node or nodes[after].get("owner") == node
        if not is_transit(nodes[node]) and not own:
            problems.append(f"passes through {node!r} ({nodes[node].get('kind')}), which does not forward traffic; "
                            "routes pass through switches, NICs and CPUs")
    return problems


def route_latency(graph: nx.Graph, route: list[str]) -> float:
    """Sum of link latencies along a node route, in s."""
    return sum(graph.edges[u, v]["latency"] for u, v in zip(route, route[1:]))


def route_bandwidth(graph: nx.Graph, route: list[str]) -> float:
    """Bottleneck bandwidth along a node route, in B/s."""
    return min(graph.edges[u, v]["bandwidth"] for u, v in zip(route, route[1:]))
