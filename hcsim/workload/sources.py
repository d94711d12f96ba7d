"""Workloads that arrive as graphs: node-link JSON files and Chakra execution traces.

A scenario's ``workload:`` is a workload spec (a built-in name or a YAML
file), or a graph:

- a ``.json`` file: networkx node-link JSON as ``hcsim workload export``
  writes it (:func:`hcsim.workload.graph.load_workload`), validated on load;
- ``chakra:PATH_PREFIX``: the Chakra trace ``PATH_PREFIX.<rank>.et``
  (:mod:`hcsim.workload.chakra`).

A graph names its own XPUs. When every name is an XPU of the run's platform,
the graph runs on those XPUs (checked). Otherwise its XPUs, in natural order
(``rank2`` before ``rank10``), are mapped onto the platform's first N XPUs in
the platform's order (N = the graph's XPU count): :func:`place_graph`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import networkx as nx

from hcsim.errors import ConfigError

__all__ = ["is_graph_source", "load_graph_source", "graph_xpus", "place_graph", "XPU_KEYS"]

log = logging.getLogger(__name__)

XPU_KEYS = ("xpus", "spilled_xpus", "groups", "pairs")
"""Vertex attributes that hold XPU names (nested tuples or sets of them): renamed by :func:`place_graph`."""


def is_graph_source(workload: str) -> bool:
    """Whether a scenario's `workload` value names a graph (a .json file or ``chakra:PREFIX``), not a spec."""
    return workload.startswith("chakra:") or workload.lower().endswith(".json")


def load_graph_source(workload: str, base: Path | str = ".") -> nx.DiGraph:
    """The workload graph named by `workload` (relative paths from `base`), validated on its own.

    Its graph attribute ``source_digest`` is a hash of the files read, for the result's inputs hash."""
    from hcsim.workload.chakra import UNITS_NOTE, import_chakra, trace_files
    from hcsim.workload.graph import load_workload

    if workload.startswith("chakra:"):
        prefix = Path(workload[len("chakra:"):])
        prefix = prefix if prefix.is_absolute() else Path(base) / prefix
        log.info("chakra:%s: %s", prefix, UNITS_NOTE)
        graph = import_chakra(prefix)
        groups = prefix.parent / f"{prefix.name}.groups.json"
        files = trace_files(prefix) + ([groups] if groups.is_file() else [])
    else:
        path = Path(workload)
        path = path if path.is_absolute() else Path(base) / path
        if not path.is_file():
            raise ConfigError(f"workload: {workload}: no such graph file (looked for {path})")
        graph, files = load_workload(path), [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    graph.graph["source_digest"] = digest.hexdigest()[:16]
    return graph


def _natural(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def graph_xpus(graph: nx.DiGraph) -> list[str]:
    """Every XPU a graph names, in natural order."""
    names: set[str] = set()
    for _, data in graph.nodes(data=True):
        names.update(_flatten(data.get("xpus", ())))
        names.update(_flatten(data.get("groups", ())))
        names.update(_flatten(data.get("pairs", ())))
    return sorted(names, key=_natural)


def _flatten(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (tuple, list, set, frozenset)):
        for item in value:
            yield from _flatten(item)


def place_graph(graph: nx.DiGraph, platform_xpus: list[str], where: str = "workload") -> tuple[nx.DiGraph, list[str]]:
    """Put `graph` on the platform: (the graph with platform XPU names, the XPUs it runs on in platform order).

    `platform_xpus` are the run's XPUs in platform order. Raises ConfigError when the graph needs more XPUs
    than there are.
    """
    names = graph_xpus(graph)
    known = set(platform_xpus)
    if all(name in known for name in names):
        used = set(names)
        return graph, [x for x in platform_xpus if x in used]
    if len(names) > len(platform_xpus):
        raise ConfigError(f"{where}: the graph runs on {len(names)} XPUs ({names[0]} .. {names[-1]}) but the run has "
                          f"{len(platform_xpus)}; fix: set xpus: {len(names)} (or more) on a platform that has them")
    mapping = dict(zip(names, platform_xpus))
    renamed = graph.copy()
    shared: dict = {}
    for _, data in renamed.nodes(data=True):
        for key in XPU_KEYS:
            if key in data and data[key] is not None:
                value = _rename(data[key], mapping)
                data[key] = shared.setdefault((type(value), value), value)  # equal groups stay one object
    return renamed, platform_xpus[: len(names)]


def _rename(value, mapping):
    if isinstance(value, str):
        return mapping[value]
    if isinstance(value, frozenset):
        return frozenset(_rename(v, mapping) for v in value)
    return tuple(_rename(v, mapping) for v in value)
