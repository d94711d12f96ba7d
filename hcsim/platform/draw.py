"""A layered drawing of a platform graph (matplotlib, imported only when drawing).

Rows from top to bottom: Ethernet (core, ToR, NICs), the server (CPUs and
DRAM, PCIe switches, XPU switches, XPUs, HBM), then the CXL fabric (Type 3
expanders, leaf switches, cascade levels). Nodes are coloured by kind (memories
by role), links by kind, every node named. Large systems are drawn in part:
the first `max_racks` racks and the first `max_servers` servers of each, with
what was left out said in the title. Given a run's link loads (``links.csv``
of ``hcsim simulate --out``), links are drawn as wide as they are busy and
coloured by their mean utilization (the busier direction), the busiest
labelled with their percentage.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import networkx as nx

from hcsim.platform.topology import natural_key

__all__ = ["representative_part", "draw_platform", "read_link_loads"]

_ROWS = {  # (kind, role) -> row, top = highest
    ("switch", "core"): 14, ("switch", "tor"): 13, ("nic", None): 12, ("cpu", None): 11,
    ("memory", "dram"): 11, ("switch", "pcie"): 10, ("switch", "xpu"): 9, ("xpu", None): 8,
    ("memory", "hbm"): 7, ("memory", "cxl_type2"): 7, ("memory", "cxl_type3"): 6,
}
_COLOURS = {
    "core switch": "#4d4d4d", "ToR switch": "#7f7f7f", "NIC": "#bcbd22", "CPU": "#1f77b4",
    "DRAM": "#aec7e8", "PCIe switch": "#9467bd", "XPU switch": "#c5b0d5", "XPU": "#d62728",
    "HBM": "#ff9896", "CXL switch": "#17becf", "CXL Type 3": "#2ca02c", "other": "#e377c2",
}
_LINK_COLOURS = {"eth": "#7f7f7f", "ib": "#8c564b", "upi": "#1f77b4", "pcie": "#9467bd", "xpu_link": "#d62728",
                 "hbm": "#ff9896", "dram": "#aec7e8", "cxl": "#17becf"}


def representative_part(graph: nx.Graph, max_racks: int = 2, max_servers: int = 2) -> tuple[nx.Graph, str]:
    """The subgraph of the first `max_racks` racks x `max_servers` servers, and a note of what was left out."""
    racks = sorted({d["rack"] for _, d in graph.nodes(data=True) if d.get("rack") is not None})
    servers = defaultdict(set)
    for _, d in graph.nodes(data=True):
        if d.get("server") is not None:
            servers[d.get("rack")].add(d["server"])
    kept_racks = set(racks[:max_racks])
    kept_servers = {s for r in kept_racks for s in sorted(servers[r], key=natural_key)[:max_servers]}
    most = max((len(s) for s in servers.values()), default=0)
    if len(racks) <= max_racks and most <= max_servers:
        return graph, ""
    keep = {n for n, d in graph.nodes(data=True) if d.get("server") in kept_servers}
    frontier = list(keep)
    while frontier:  # add the switches above the kept servers
        node = frontier.pop()
        for neighbour in graph[node]:
            d = graph.nodes[neighbour]
            if neighbour not in keep and d.get("server") is None and d.get("rack", next(iter(kept_racks))) in kept_racks:
                keep.add(neighbour)
                frontier.append(neighbour)
    part = graph.subgraph(keep).copy()
    pruned = True
    while pruned:  # drop switches that lead only to what was left out
        dangling = [n for n, d in part.nodes(data=True)
                    if d.get("kind") == "switch" and d.get("role") != "core" and part.degree(n) <= 1]
        part.remove_nodes_from(dangling)
        pruned = bool(dangling)
    note = (f"representative part: {len(kept_racks)} of {len(racks)} racks, "
            f"{min(max_servers, most)} of {most} servers per rack")
    return part, note


def draw_platform(graph: nx.Graph, path: str | Path, *, max_racks: int = 2, max_servers: int = 2,
                  dpi: int = 150, loads: dict[tuple[str, str], float] | None = None) -> str:
    """Draw `graph` (or its representative part) to an image file; return the note ("" when drawn whole).

    The format follows the suffix of `path` (.png, .svg, .pdf). `loads`: (source, target) link
    direction -> mean utilization (0..1), as in a run's links.csv; each link is drawn by its busier
    direction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    part, note = representative_part(graph, max_racks, max_servers)
    position, labels = _layout(part)
    width = max(8.0, min(40.0, 0.35 * max(len(row) for row in _rows(part).values())))
    figure, axes = plt.subplots(figsize=(width, 9))
    colours = [_COLOURS[_category(d)] for _, d in part.nodes(data=True)]
    edges = list(part.edges(data="kind"))
    if loads is None:
        edge_colours = [_LINK_COLOURS.get(k, "#cccccc") for _, _, k in edges]
        nx.draw_networkx_edges(part, position, ax=axes, edgelist=[(u, v) for u, v, _ in edges],
                               edge_color=edge_colours, width=0.6, alpha=0.6)
    else:
        busiest = _draw_loads(part, position, axes, figure, loads)
    nx.draw_networkx_nodes(part, position, ax=axes, node_color=colours, node_size=60, linewidths=0.3,
                           edgecolors="black")
    _draw_names(part, position, labels, axes)
    used = sorted({_category(d) for _, d in part.nodes(data=True)}, key=list(_COLOURS).index)
    handles = [Line2D([], [], marker="o", linestyle="", color=_COLOURS[c], label=c) for c in used]
    if loads is None:
        kinds = sorted({k for _, _, k in edges})
        handles += [Line2D([], [], color=_LINK_COLOURS.get(k, "#cccccc"), label=f"{k} link") for k in kinds]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    title = f"{graph.graph.get('name', 'platform')}: {sum(1 for _, k in graph.nodes(data='kind') if k == 'xpu')} XPUs"
    if loads is not None:
        title += ", links by mean utilization over the run (the busier direction)"
    axes.set_title(title + (f"\n{note}" if note else ""), fontsize=10)
    axes.axis("off")
    figure.tight_layout()
    if loads is not None:
        _label_loads(axes, figure, position, busiest)  # after the layout: placed where no name or label is
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return note


def _draw_names(graph: nx.Graph, position: dict, labels: dict, axes) -> None:
    """Every node's name beside it; in crowded rows (XPUs, memories) standing up so they do not overlap."""
    rows = _rows(graph)
    for row, members in rows.items():
        crowded = len(members) > 12
        for node in members:
            x, y = position[node]
            axes.text(x, y + 0.18, labels[node], fontsize=4 if crowded else 5, rotation=90 if crowded else 0,
                      ha="center", va="bottom", zorder=4,  # over the links, which would run through it
                      bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.75})


def _draw_loads(graph: nx.Graph, position: dict, axes, figure, loads: dict[tuple[str, str], float],
                labelled: int = 8) -> list[tuple[tuple[str, str], float]]:
    """Links as wide as they are busy, coloured by utilization; return the `labelled` busiest links and their
    utilization, labelled by :func:`_label_loads` once the figure is laid out."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    from hcsim.units import format_percent

    edges = [(u, v) for u, v in graph.edges]
    busy = [max(loads.get((u, v), 0.0), loads.get((v, u), 0.0)) for u, v in edges]
    colormap, norm = plt.get_cmap("plasma_r"), Normalize(0.0, max(max(busy, default=0.0), 1e-9))
    nx.draw_networkx_edges(graph, position, ax=axes, edgelist=edges, width=[0.4 + 4 * b / norm.vmax for b in busy],
                           edge_color=[colormap(norm(b)) if b > 0 else "#dddddd" for b in busy])
    busiest = sorted((i for i, b in enumerate(busy) if b > 0), key=lambda i: -busy[i])[:labelled]
    mappable = plt.cm.ScalarMappable(norm=norm, cmap=colormap)
    bar = figure.colorbar(mappable, ax=axes, fraction=0.02, pad=0.01, location="left")
    bar.set_label("mean link utilization", fontsize=7)
    bar.ax.yaxis.set_major_formatter(lambda value, _: format_percent(value))
    return [(edges[i], busy[i]) for i in busiest]


def _label_loads(axes, figure, position: dict, busiest: list[tuple[tuple[str, str], float]]) -> None:
    """Each busy link's utilization on the link, at the first point along it (from the middle outwards) where
    the label overlaps no node, no node name and no other label; a link with no such point goes unlabelled."""
    from hcsim.units import format_percent

    from matplotlib.transforms import Bbox

    renderer = figure.canvas.get_renderer()
    taken = [text.get_window_extent(renderer) for text in axes.texts]
    radius = 5 * figure.dpi / 72  # a node's marker (node_size 60 points^2: about 8 points across), with a margin
    taken += [Bbox.from_bounds(x - radius, y - radius, 2 * radius, 2 * radius)
              for x, y in axes.transData.transform(list(position.values()))]
    for (u, v), busy in busiest:
        (x1, y1), (x2, y2) = position[u], position[v]
        for t in (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8):
            label = axes.text(x1 + t * (x2 - x1), y1 + t * (y2 - y1), format_percent(busy), fontsize=5,
                              ha="center", va="center", zorder=5,
                              bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
            box = label.get_window_extent(renderer).padded(1)
            if not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
            label.remove()


def read_link_loads(path: str | Path) -> dict[tuple[str, str], float]:
    """(source, target) -> utilization from a run's links.csv.

    Raises
    ------
    ConfigError
        if the file cannot be read or lacks the source, target and utilization columns.
    """
    import csv

    from hcsim.errors import ConfigError

    try:
        with open(path, newline="") as stream:
            rows = list(csv.DictReader(stream))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    try:
        return {(r["source"], r["target"]): float(r["utilization"]) for r in rows}
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{path}: not a links.csv of hcsim simulate --out (columns source, target, utilization "
                          f"expected): {err}") from err


def _category(data: dict) -> str:
    kind, role = data.get("kind"), data.get("role")
    names = {("switch", "core"): "core switch", ("switch", "tor"): "ToR switch", ("nic", None): "NIC",
             ("cpu", None): "CPU", ("memory", "dram"): "DRAM", ("switch", "pcie"): "PCIe switch",
             ("switch", "xpu"): "XPU switch", ("xpu", None): "XPU", ("memory", "hbm"): "HBM",
             ("switch", "cxl"): "CXL switch", ("memory", "cxl_type3"): "CXL Type 3"}
    return names.get((kind, role if kind in ("switch", "memory") else None), "other")


def _row(data: dict) -> int:
    kind, role = data.get("kind"), data.get("role")
    if kind == "switch" and role == "cxl":
        return 5 - data.get("level", 1)  # leaves just below the expanders, cascade levels further down
    return _ROWS.get((kind, role if kind in ("switch", "memory") else None), 3)


def _rows(graph: nx.Graph) -> dict[int, list[str]]:
    rows = defaultdict(list)
    for node, data in graph.nodes(data=True):
        rows[_row(data)].append(node)
    return rows


def _layout(graph: nx.Graph):
    position, labels = {}, {}
    for row, members in _rows(graph).items():
        members.sort(key=lambda n: (graph.nodes[n].get("rack", -1), natural_key(str(graph.nodes[n].get("server", ""))),
                                    natural_key(n)))
        for i, node in enumerate(members):
            position[node] = ((i + 0.5) / len(members), row)
            server = str(graph.nodes[node].get("server"))
            labels[node] = node.removeprefix(f"{server}.")  # r0s0.nic0.0 -> nic0.0; xpu0.hbm stays
    return position, labels
