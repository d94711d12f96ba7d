"""A kernel with closed-form durations, to test the executor's rules without SimGrid.

An execution takes FLOPs / the host's peak FLOP/s; a transfer takes the route's
latency + size / its bottleneck bandwidth, alone, whatever else runs (no
sharing: the rules, not the network model, are under test); a delay takes its
length. Events at equal times run in the order they were scheduled.
"""

from __future__ import annotations

import heapq
import itertools

import networkx as nx

from hcsim.engine.backend import Backend
from hcsim.platform.devices import peak_flops
from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes


class FakeBackend(Backend):
    def __init__(self, platform: nx.Graph, routes: dict, precision: str = "fp32"):
        self.platform, self.routes, self.precision = platform, routes, precision
        self.clock = 0.0
        self.queue: list = []
        self.order = itertools.count()
        self.activities = 0

    def now(self) -> float:
        return self.clock

    def _at(self, seconds: float, then) -> None:
        self.activities += 1
        heapq.heappush(self.queue, (self.clock + seconds, next(self.order), then))

    def execute(self, host, flops, then) -> None:
        self._at(flops / peak_flops(self.platform.nodes[host], self.precision), then)

    def transfer(self, src, dst, size, then) -> None:
        route = self.routes[src, dst]
        self._at(route_latency(self.platform, route) + size / route_bandwidth(self.platform, route), then)

    def delay(self, seconds, then) -> None:
        self._at(seconds, then)

    def run(self) -> None:
        while self.queue:
            self.clock, _, then = heapq.heappop(self.queue)
            then()


def routes_for(platform: nx.Graph, graph: nx.DiGraph) -> dict[tuple[str, str], list[str]]:
    """The least-latency route of every host pair `graph` uses on `platform`, as the compiler would give."""
    from hcsim.engine.api import host_pairs

    pairs = host_pairs(platform, graph)
    routes = {}
    for source in sorted({s for s, _ in pairs}):
        found = shortest_routes(platform, source, sorted(d for s, d in pairs if s == source))
        routes.update({(source, target): route for target, route in found.items()})
    return routes
