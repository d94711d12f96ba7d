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
flags, NIC servers) for many searches, as the compiler runs one per source.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import networkx as nx

from hcsim.errors import TopologyError
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
        self.transit = {n: is_transit(data) for n, data in nodes.items()}
        nic_server = {n: data["server"] for n, data in nodes.items()
                      if (data.get("kind") == "nic" or data.get("server_only")) and data.get("server") is not None}
        # neighbours as (position, node, integer femtoseconds, bandwidth) in networkx's order (ties between
        # equal keys fall to push order); links of avoided kinds left out. A transit node lists only its transit
        # neighbours: an endpoint reached from the fabric forwards to nothing but its own memories, so a search
        # adds it only when it is a target or owns one. Links to a NIC with a server are kept apart the same
        # way, by server: a search adds those of the servers it may enter (its source's and targets')
        self.adjacency: dict[str, list[tuple]] = {}
        self.endpoint_links: dict[str, list[tuple[str, tuple]]] = {}
        self.server_links: dict[str, list[tuple[str, tuple]]] = {}
        for n, adj in graph._adj.items():
            plain = []
            for position, (m, link) in enumerate(adj.items()):
                if link["kind"] in self.avoid:
                    continue
                entry = (position, m, round(link["latency"] * _FS), link["bandwidth"])
                if m in nic_server:
                    self.server_links.setdefault(nic_server[m], []).append((n, entry))
                elif self.transit[n] and not self.transit[m]:
                    self.endpoint_links.setdefault(m, []).append((n, entry))
                else:
                    plain.append(entry)
            self.adjacency[n] = plain
        # transit nodes with at most one transit link (a leaf switch of XPUs or NICs): reached from that link,
        # they lead nowhere unless a node this search adds hangs on them, so a search does not queue them
        self.dead_ends = {n for n, plain in self.adjacency.items() if self.transit[n] and len(plain) <= 1}
        self.inward = {n: data["server"] for n, data in nodes.items()
                       if data.get("server_only") and data.get("server") is not None}

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
        nodes, adjacency, transit, dead_ends = self.graph._node, self.adjacency, self.transit, self.dead_ends
        extra: dict[str, list[tuple]] = {}
        owners = {nodes[n].get("owner") for n in targets}
        for endpoint in targets | owners:
            for node, entry in self.endpoint_links.get(endpoint, ()):
                extra.setdefault(node, []).append(entry)
        for server in {nodes[n].get("server") for n in (source, *targets)} - {None}:
            for node, entry in self.server_links.get(server, ()):
                extra.setdefault(node, []).append(entry)
        best = {source: (0, float("-inf"))}
        parent: dict[str, str | None] = {source: None}
        heap = [(0, float("-inf"), 0, source)]
        counter = 1
        settled: set[str] = set()
        remaining = set(targets)
        push, pop, inwards = heapq.heappush, heapq.heappop, self.inward
        while heap and remaining:
            dist, neg_bottleneck, _, node = pop(heap)
            if node in settled:
                continue
            settled.add(node)
            remaining.discard(node)
            own_only = False
            node_transit = transit[node]
            if node != source and not node_transit:
                previous = nodes[parent[node]]
                own_only = not (previous.get("kind") == "memory" and previous.get("owner") == node)
            inward = inwards.get(node) if inwards and node != source else None
            if inward is not None and nodes[parent[node]].get("server") == inward:
                inward = None  # from inside its server: it forwards anywhere
            links = adjacency[node]
            if node in extra:  # with the endpoints and NICs this search may enter, in networkx's order
                links = sorted(links + extra[node])
            for _, neighbour, latency, bandwidth in links:
                if neighbour in settled:
                    continue
                if own_only and nodes[neighbour].get("owner") != node:
                    continue
                if inward is not None and nodes[neighbour].get("server") != inward:
                    continue
                if node_transit and neighbour in dead_ends and neighbour not in extra and neighbour not in remaining:
                    continue
                through = dist + latency
                narrowest = -bandwidth if -bandwidth > neg_bottleneck else neg_bottleneck
                known = best.get(neighbour)
                if known is None or (through, narrowest) < known:
                    best[neighbour] = (through, narrowest)
                    parent[neighbour] = node
                    push(heap, (through, narrowest, counter, neighbour))
                    counter += 1
        if remaining:
            without = f" without {'/'.join(sorted(self.avoid))} links" if self.avoid else ""
            raise TopologyError(f"routes from {source!r}: no route{without} to {', '.join(map(repr, sorted(remaining)))}")
        return {target: _walk_back(parent, target) for target in targets}


def _walk_back(parent: dict[str, str | None], target: str) -> list[str]:
    path = [target]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]


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
