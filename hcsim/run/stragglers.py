"""Stragglers: XPUs whose compute takes longer than their peers' (scenario keys ``stragglers``,
``straggler_spread``, ``seed``; docs/stragglers.md).

A straggler's factor f is the platform graph's XPU node attribute ``slowdown``
(:mod:`hcsim.platform.topology`): every compute vertex it runs takes f times as long, whether timed as FLOPs /
peak FLOP/s, by a measured duration or by the kernel model (one rule:
:meth:`hcsim.engine.rules.WorkloadRules.compute_cost`). Its memory reads, its transfers, and the CPU steps
and moves of offload are not its compute and keep their times.

Factors come from ``stragglers`` (XPU name -> f) and ``straggler_spread`` σ: every XPU of the run, in topology
order, draws f = 1 + |N(0, σ)| (a half-normal slowdown: never faster than its peak, mean 1 + σ·√(2/π)) from
``random.Random(seed)``; a factor ``stragglers`` names replaces the drawn one (each XPU draws all the same, so
naming one changes no other's factor).

What a straggler costs is reported without a second simulation (:func:`straggler_report`): the time its slowdown
adds to its own compute, and the time its peers spent waiting in collectives.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx

from hcsim.errors import ConfigError

__all__ = ["straggler_factors", "apply_stragglers", "straggler_report"]


def straggler_factors(scenario, xpus: Sequence[str]) -> dict[str, float]:
    """XPU -> slowdown factor of every XPU of the run whose factor is not 1, in the order of `xpus`.

    Parameters
    ----------
    scenario : a :class:`hcsim.run.scenario.Scenario` (its ``stragglers``, ``straggler_spread`` and ``seed``).
    xpus : the run's XPUs in topology order (the order of the draws).

    Raises
    ------
    ConfigError
        naming ``stragglers`` and the XPU, when a name is not one of `xpus`.

    >>> from hcsim.run.scenario import Scenario
    >>> straggler_factors(Scenario(stragglers={"xpu1": 1.5}), ["xpu0", "xpu1"])
    {'xpu1': 1.5}
    """
    unknown = [name for name in scenario.stragglers if name not in set(xpus)]
    if unknown:
        shown = f"{xpus[0]}..{xpus[-1]}" if len(xpus) > 2 else ", ".join(xpus)
        raise ConfigError(f"scenario {scenario.name!r}: stragglers: {', '.join(map(repr, unknown[:5]))} "
                          f"{'is' if len(unknown) == 1 else 'are'} not among this run's {len(xpus)} XPUs ({shown}); "
                          f"name XPUs of the run (xpus: {len(xpus)} takes the platform's first ones)")
    factors = dict.fromkeys(xpus, 1.0)
    if scenario.straggler_spread > 0:
        draw = random.Random(scenario.seed)
        for x in xpus:
            factors[x] = 1.0 + abs(draw.normalvariate(0.0, scenario.straggler_spread))
    factors.update(scenario.stragglers)
    return {x: f for x, f in factors.items() if f != 1.0}


def apply_stragglers(scenario, platform: nx.Graph, xpus: Sequence[str]) -> dict[str, float]:
    """Set the ``slowdown`` of each XPU of `platform` that :func:`straggler_factors` slows; return the factors."""
    factors = straggler_factors(scenario, xpus)
    for x, factor in factors.items():
        platform.nodes[x]["slowdown"] = factor
    return factors


def straggler_report(platform: nx.Graph, xpus: Sequence[str], times: Mapping[str, Any]) -> dict[str, Any]:
    """``{"stragglers": {...}}`` for a run with XPUs whose ``slowdown`` is not 1, else {}.

    Keys (seconds per measured iteration): ``xpu`` and ``factor``, the slowest XPU of the run (the first
    in topology order at the largest factor); ``count``, how many XPUs have a factor other than 1, and
    ``factors``, each of theirs; ``extra_compute_s``, the time the slowest XPU's factor adds to its own
    compute, compute_s x (1 - 1/factor): a closed form, and what the job loses per iteration when that
    compute lies on its critical path throughout (a data-parallel job, whose all-reduce waits for its last
    member: exactly this much longer than without the straggler); an estimate otherwise (less where its
    compute runs beside reads that take longer, or fills a wait it had anyway; under pipeline parallelism the
    schedule decides); ``peers_idle_s``, measured, the mean over the run's other XPUs of the time they waited
    in collectives for their peers (idle_peers_s, :mod:`hcsim.run.results`; a pipeline's other stages wait
    in bubbles, idle_bubble_s, which this leaves out), and ``own_idle_s`` the straggler's own such wait. The
    iteration time without the stragglers is another simulation: run the scenario again with
    ``stragglers: {}`` and ``straggler_spread: 0``.

    `times`: XPU -> its :class:`hcsim.run.results.XpuTimes`.
    """
    nodes = platform.nodes
    factors = {x: nodes[x].get("slowdown", 1.0) for x in xpus}
    slowed = {x: f for x, f in factors.items() if f != 1.0}
    if not slowed:
        return {}
    worst = max(slowed.values())  # the slowest of those given a factor (one below 1 only: the least sped up)
    slowest = next(x for x in xpus if factors[x] == worst)
    own = times[slowest]
    peers = [times[x] for x in xpus if x != slowest and x in times]
    return {"stragglers": {
        "xpu": slowest, "factor": worst, "count": len(slowed), "factors": slowed,
        "extra_compute_s": own.compute_s * (1.0 - 1.0 / worst),
        "peers_idle_s": math.fsum(p.idle_peers_s for p in peers) / len(peers) if peers else 0.0,
        "own_idle_s": own.idle_peers_s,
    }}
