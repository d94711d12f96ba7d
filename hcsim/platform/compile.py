"""Compile a platform graph to a SimGrid platform XML (version 4.1).

Layout of the generated platform, chosen so that it scales to thousands of
XPUs (flat Full routing needs N^2 route slots for N hosts):

- every link is one SPLITDUPLEX SimGrid link (full duplex: each direction has
  the full bandwidth), declared in the root zone; a route crosses link
  ``u--v`` (u < v) in direction UP from u to v and DOWN from v to u;
- hosts are grouped in *pods*: a pod is a Full zone holding one head host (an
  XPU, a CPU, or a memory nobody owns) and the memories it owns; the head is
  the pod's gateway (a gateway that lives in a child zone crashes SimGrid
  4.1's ``route_to``, so pods are never nested);
- the root zone is a Full zone over pods, so its route table has P^2 slots for
  P pods, not H^2 for H hosts.

Only the routes of the host pairs the simulation uses are emitted; each is the
shortest route of :mod:`hcsim.platform.routes` and the compiler checks that
the pod composition ``intra(src -> head) + root(head -> head') + intra(head'
-> dst)`` reproduces it exactly, moving a memory into a pod of its own when
its route bypasses its owner.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from lxml import etree

from hcsim.platform.routes import shortest_routes
from hcsim.platform.topology import HOST_KINDS

__all__ = ["CompiledPlatform", "compile_platform", "write_platform", "link_name"]

DTD = "https://simgrid.org/simgrid.dtd"


def link_name(u: str, v: str) -> str:
    """The SimGrid name of the link between nodes u and v."""
    a, b = sorted((u, v))
    return f"{a}--{b}"


@dataclass(frozen=True)
class CompiledPlatform:
    """SimGrid XML plus the node route of every compiled host pair."""

    xml: str
    routes: dict[tuple[str, str], list[str]]
    pods: dict[str, str]  # host -> head of its pod


def compile_platform(graph: nx.Graph, pairs: Iterable[tuple[str, str]], precision: str = "fp32") -> CompiledPlatform:
    """Compile `graph` to SimGrid XML with routes for the ordered host `pairs`.

    An XPU's speed is its FLOP/s at `precision`; a CPU's is its ``flops``;
    memories compute nothing (speed 1 FLOP/s, never used).
    """
    pairs = sorted({(s, d) for s, d in pairs if s != d})
    routes = _routes(graph, pairs)
    pods = _pods(graph, routes)
    root = etree.Element("platform", version="4.1")
    zone = etree.SubElement(root, "zone", id="root", routing="Full")
    used_links = sorted({link_name(u, v) for route in routes.values() for u, v in zip(route, route[1:])})
    for name in used_links:
        u, v = name.split("--", 1)
        data = graph.edges[u, v]
        etree.SubElement(zone, "link", id=name, bandwidth=f"{data['bandwidth']!r}Bps",
                         latency=f"{data['latency']!r}s", sharing_policy="SPLITDUPLEX")
    members = defaultdict(list)
    for host, head in pods.items():
        members[head].append(host)
    intra, inter = _split_routes(routes, pods)
    for head in sorted(members):
        pod = etree.SubElement(zone, "zone", id=_pod_id(head), routing="Full")
        for host in sorted(members[head], key=lambda h: h != head):
            etree.SubElement(pod, "host", id=host, speed=f"{_speed(graph.nodes[host], precision)!r}f")
        for (src, dst), route in sorted(intra.get(head, {}).items()):
            _emit_route(pod, "route", route, src=src, dst=dst)
    for (head_src, head_dst), route in sorted(inter.items()):
        _emit_route(zone, "zoneRoute", route, src=_pod_id(head_src), dst=_pod_id(head_dst),
                    gw_src=head_src, gw_dst=head_dst)
    xml = etree.tostring(root, pretty_print=True, xml_declaration=True, encoding="UTF-8",
                         doctype=f'<!DOCTYPE platform SYSTEM "{DTD}">').decode()
    return CompiledPlatform(xml=xml, routes=routes, pods=pods)


def write_platform(graph: nx.Graph, pairs: Iterable[tuple[str, str]], path: str | Path,
                   precision: str = "fp32") -> CompiledPlatform:
    """Compile and write the XML to `path`; returns the compiled platform."""
    compiled = compile_platform(graph, pairs, precision)
    Path(path).write_text(compiled.xml)
    return compiled


def _routes(graph: nx.Graph, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    targets = defaultdict(list)
    for src, dst in pairs:
        targets[src].append(dst)
    routes = {}
    for src in sorted(targets):
        for dst, route in shortest_routes(graph, src, targets[src]).items():
            routes[src, dst] = route
    return routes


def _pods(graph: nx.Graph, routes: dict) -> dict[str, str]:
    """Map every host to its pod head; owned memories join their owner's pod
    unless a compiled route leaves them other than through the owner."""
    pods = {}
    for node, data in graph.nodes(data=True):
        if data["kind"] not in HOST_KINDS:
            continue
        owner = data.get("owner") if data["kind"] == "memory" else None
        pods[node] = owner if owner in graph else node
    for (src, dst), route in routes.items():
        for end, inner in ((src, route[1:]), (dst, route[-2::-1])):
            head = pods.get(end)
            if head != end and head not in inner and not (pods.get(src) == pods.get(dst)):
                pods[end] = end
    return pods


def _split_routes(routes, pods):
    """Split host routes into intra-pod routes and root routes between pod heads."""
    intra: dict[str, dict] = defaultdict(dict)
    inter: dict[tuple[str, str], list[str]] = {}
    for (src, dst), route in routes.items():
        head_src, head_dst = pods[src], pods[dst]
        if head_src == head_dst:
            intra[head_src][src, dst] = route
            continue
        i, j = route.index(head_src), len(route) - 1 - route[::-1].index(head_dst)
        if src != head_src:
            intra[head_src][src, head_src] = route[: i + 1]
        if dst != head_dst:
            intra[head_dst][head_dst, dst] = route[j:]
        inter.setdefault((head_src, head_dst), route[i : j + 1])
    return intra, inter


def _emit_route(parent, tag: str, route: list[str], **attributes) -> None:
    element = etree.SubElement(parent, tag, symmetrical="NO", **attributes)
    for u, v in zip(route, route[1:]):
        etree.SubElement(element, "link_ctn", id=link_name(u, v), direction="UP" if u < v else "DOWN")


def _pod_id(head: str) -> str:
    return f"pod:{head}"


def _speed(data: dict, precision: str) -> float:
    if data["kind"] == "xpu":
        return data["fp16_flops"] if precision in ("fp16", "bf16") else data["fp32_flops"]
    if data["kind"] == "cpu":
        return data.get("flops") or 1.0
    return 1.0
