"""Collective algorithms as schedules of transfers between ranks.

A collective runs over a group of ranks 0..n-1 (the engine maps them to XPUs
in topology order, so neighbours in a server are adjacent in a ring). An
algorithm gives, for each rank, a sequence of steps; in a step a rank sends
some bytes to some ranks and receives from some ranks. Rank r starts step s
when its step s-1 has ended (all its sends done and all its receives
arrived), as real implementations do; this is the ``step`` fidelity.

The ``flow`` fidelity stands in at scale: each (src, dst) pair carries the sum
of its steps' bytes in one transfer, all started together once every rank is
ready, and the collective ends when the last transfer ends plus the latency
its other steps would have paid (sum over steps of the step's largest route
latency, minus the latency the slowest transfer already paid). On an
uncontended, uniform topology both fidelities give the closed forms of
REFERENCE.md exactly.

Add an algorithm by subclassing :class:`Algorithm` and decorating it with
:func:`register`; the engine looks algorithms up by name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hcsim.errors import ConfigError

__all__ = ["Algorithm", "Step", "register", "get_algorithm", "algorithms"]

_REGISTRY: dict[tuple[str, str], type["Algorithm"]] = {}


@dataclass(frozen=True, slots=True)
class Step:
    """What one rank does in one step: (dst, bytes) sends and the ranks it receives from."""

    sends: tuple[tuple[int, float], ...]
    recvs: tuple[int, ...]


class Algorithm:
    """Base class: a collective (`collective`) implemented by a named schedule (`name`)."""

    name = ""
    collective = ""

    def __init__(self, ranks: int, size: float):
        if ranks < 1:
            raise ConfigError(f"{self.name}: a collective needs at least one rank, got {ranks}")
        self.ranks = ranks
        self.size = size

    def steps(self, rank: int) -> int:
        """Number of steps of `rank`."""
        raise NotImplementedError

    def step(self, rank: int, index: int) -> Step:
        """Step `index` (0-based) of `rank`."""
        raise NotImplementedError

    def pairs(self) -> set[tuple[int, int]]:
        """Every (src, dst) pair of ranks that exchanges data."""
        return {(r, dst) for r, s in self._all_steps() for dst, _ in s.sends}

    def flows(self) -> dict[tuple[int, int], float]:
        """Bytes per (src, dst) pair summed over all steps (the ``flow`` fidelity)."""
        total: dict[tuple[int, int], float] = defaultdict(float)
        for rank, step in self._all_steps():
            for dst, size in step.sends:
                total[rank, dst] += size
        return dict(total)

    def step_pairs(self) -> list[set[tuple[int, int]]]:
        """For each step index, the pairs that send in it (for the flow model's latency)."""
        by_step: list[set[tuple[int, int]]] = []
        for rank in range(self.ranks):
            for index in range(self.steps(rank)):
                while len(by_step) <= index:
                    by_step.append(set())
                by_step[index].update((rank, dst) for dst, _ in self.step(rank, index).sends)
        return by_step

    def _all_steps(self):
        for rank in range(self.ranks):
            for index in range(self.steps(rank)):
                yield rank, self.step(rank, index)


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make `cls` available by (collective, name)."""
    _REGISTRY[cls.collective, cls.name] = cls
    return cls


def get_algorithm(collective: str, name: str | None, ranks: int, size: float) -> Algorithm:
    """The algorithm `name` (default "ring") for `collective` over `ranks` ranks and `size` bytes."""
    name = name or "ring"
    try:
        cls = _REGISTRY[collective, name]
    except KeyError:
        known = ", ".join(sorted(n for c, n in _REGISTRY if c == collective)) or "none"
        raise ConfigError(f"no algorithm {name!r} for {collective}; known: {known}") from None
    return cls(ranks, size)


def algorithms() -> dict[str, list[str]]:
    """Registered algorithm names by collective."""
    table: dict[str, list[str]] = defaultdict(list)
    for collective, name in sorted(_REGISTRY):
        table[collective].append(name)
    return dict(table)


class _Ring(Algorithm):
    """Each step every rank sends size/ranks bytes to its right neighbour."""

    rounds = 1  # steps = rounds x (ranks - 1)

    def steps(self, rank: int) -> int:
        return self.rounds * (self.ranks - 1)

    def step(self, rank: int, index: int) -> Step:
        n = self.ranks
        return Step(sends=(((rank + 1) % n, self.size / n),), recvs=((rank - 1) % n,))


@register
class RingAllReduce(_Ring):
    """Reduce-scatter then all-gather: 2(n-1) steps; 2(n-1)a + 2(n-1)/n S/B."""

    name, collective, rounds = "ring", "all_reduce", 2


@register
class CoherentRingAllReduce(_Ring):
    """The paper's coherent ring (section 3.3, Fig. 12): the reduced shards stay in
    coherent memory where every XPU can read them, so the all-gather half is not
    needed: n-1 steps; (n-1)a + (n-1)/n S/B."""

    name, collective, rounds = "coherent_ring", "all_reduce", 1


@register
class RingReduceScatter(_Ring):
    name, collective, rounds = "ring", "reduce_scatter", 1


@register
class RingAllGather(_Ring):
    name, collective, rounds = "ring", "all_gather", 1


@register
class DirectTransfer(Algorithm):
    """A point-to-point transfer: rank 0 sends everything to rank 1 in one step."""

    name, collective = "direct", "p2p"

    def steps(self, rank: int) -> int:
        return 1

    def step(self, rank: int, index: int) -> Step:
        return Step(sends=((1, self.size),), recvs=()) if rank == 0 else Step(sends=(), recvs=(0,))
