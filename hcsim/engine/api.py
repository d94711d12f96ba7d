"""The engine's front door: what goes in, what comes out, and ``run(platform, workload, options)``.

Everything above the engine (the run, the trace, the report, sweeps, serving) reaches it through this
module, as ASTRA-sim's layers reach the network through ``AstraNetworkAPI.hh``:

- in: a platform graph (:mod:`hcsim.platform`), a workload graph (:mod:`hcsim.workload.graph`, contract
  v2) and :class:`RunOptions` (each option's choices declared once here and checked where the options
  are built);
- out: a :class:`RunResult` (plain data: iteration ends, per-XPU time split, link bytes, the trace);
- the communication kinds a run's breakdown is split by (:data:`COMM_KINDS`, numbered in this order for
  the C++ core: ``hcsim/engine/core/workload.hpp``) and which vertex kinds count as which
  (:data:`COMM_KIND`).

The rules that run a workload live behind :func:`run`, once: those that follow from the graph and the
platform in :mod:`hcsim.engine.rules`, the run's in the C++ core (``hcsim/engine/core/executor.cpp``), which
:mod:`hcsim.engine.core.workload` feeds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hcsim.engine.options import (COLLECTIVE_MODELS, COMM_KIND, COMM_KINDS, LOCAL_ACCESSES, LOCAL_COLLECTIVES,
                                  RunOptions, RunResult)

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["RunOptions", "RunResult", "run", "host_pairs", "COMM_KINDS", "COMM_KIND", "COLLECTIVE_MODELS",
           "LOCAL_ACCESSES", "LOCAL_COLLECTIVES"]


def run(platform: nx.Graph, workload: nx.DiGraph, options: RunOptions, pairs=None, progress=None,
        beside=None) -> RunResult:
    """Compile `platform` for the host pairs `workload` uses and run `workload` on it (once per process).

    Parameters
    ----------
    platform, workload
        The platform graph and a validated workload graph (:func:`hcsim.workload.validate_workload`).
    options
        How to run.
    pairs
        The (source, destination) host pairs to compile routes for; default: those `workload` uses.
    progress
        Called now and then during the run with how many more vertex runs have completed.
    beside
        Serving steps to run in the same SimGrid run, on the same platform (a serving job beside training jobs):
        a dict of ``host_names`` (their own numbering), ``layout``, ``next_step``, ``analytic`` and ``landed`` as
        the core's ``run_steps`` takes them, ``shared_pairs`` (the host pairs of `workload`'s transfers, whose
        links the steps count as shared) and ``speeds`` (host name -> FLOP/s where the steps' precision sets
        it). `pairs` must then hold the steps' pairs too. The result's ``beside_counters`` are the steps'.

    Raises
    ------
    ConfigError
        if the engine core is not built (it says what to install).
    SimulationError
        if SimGrid fails, or a vertex never completes every iteration.
    """
    from hcsim.engine.core.workload import run_workload
    from hcsim.platform import compile_platform

    compiled = compile_platform(platform, pairs if pairs is not None else host_pairs(platform, workload),
                                workload.graph.get("precision", "fp32"))
    return run_workload(platform, workload, compiled, options, progress, beside)


def host_pairs(platform: nx.Graph, workload: nx.DiGraph) -> set[tuple[str, str]]:
    """The ordered host pairs a run transfers between: memory reads and collective traffic (between a group's
    XPUs, and between them and the memory device of a region they share)."""
    from hcsim.engine.collectives import endpoint_hosts, get_algorithm, nccl_alternatives, server_groups
    from hcsim.engine.rules import form_transfers, memory_form

    nodes = dict(platform.nodes(data=True))  # a plain dict is faster per look-up
    pairs: set[tuple[str, str]] = set()
    done = set()  # collectives already counted: the same algorithm and size on the same group
    alike = set()  # collective vertices already counted: the same groups, algorithm and size
    known: dict[tuple, tuple] = {}  # the same, with the groups' id for the groups (-> them: ids stay unique)
    placed: dict[tuple, object] = {}  # (id, key) of the xpus and spilled_xpus already counted: vertices share them
    for _, data in workload.nodes(data=True):
        if data["kind"] == "compute":
            offloads = data.get("host") or data.get("move") or data.get("offload")
            xpus, spilled = data["xpus"], data["spilled_xpus"]
            if offloads:
                for x in xpus:
                    for coherent in (True, False):
                        pairs.update(form_transfers(nodes, data, x, memory_form(nodes, data, x, coherent)))
            for members, key in ((xpus, "local_memory"), (spilled, "extended_memory")):
                if (id(members), key) not in placed:
                    placed[id(members), key] = members  # keep it alive: ids stay unique
                    pairs.update((nodes[x][key], x) for x in members)
            continue
        collective = data["collective"]
        name = data.get("algorithm") or ("direct" if collective == "p2p" else None)
        if (ident := (collective, name, id(data["groups"]), data["bytes"], data.get("chunks"))) in known:
            continue  # one per layer and micro-batch, sharing one groups tuple: found without hashing it
        known[ident] = data["groups"]
        if (key := (collective, name, data["groups"], data["bytes"], data.get("chunks"))) in alike:
            continue
        alike.add(key)
        for group in data["groups"]:
            if (key := (collective, name, group, data["bytes"], data.get("chunks"))) in done:
                continue
            done.add(key)
            servers = server_groups(platform, group)
            for choice in (name, *nccl_alternatives(collective, name, servers)):  # the rules pick one of them
                algorithm = get_algorithm(collective, choice, len(group), data["bytes"], servers, data.get("chunks"))
                ends = endpoint_hosts(platform, algorithm, group)
                pairs.update((ends[s], ends[d]) for s, d in algorithm.pairs())
    return pairs
