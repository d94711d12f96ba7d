"""The parallel layout of a training run: named axes mapped onto the platform's XPUs.

A layout has axes ``dp`` (data), ``tp`` (tensor), ``pp`` (pipeline), ``ep``
(expert) and ``cp`` (context) whose sizes multiply to the XPU count. XPUs,
given in topology order (a server's XPUs adjacent), get coordinates by a mixed
radix over the axes in ``order``, innermost first. The default order is
Megatron-LM's (``tp-cp-ep-dp-pp``: ``RankGenerator`` in megatron/core/
parallel_state.py): tensor-parallel groups are runs of consecutive XPUs, so a
TP group of 8 sits inside a server of 8, and pipeline stages are the outermost
blocks.

A group of an axis is the XPUs whose other coordinates are equal, in the
order of that axis's coordinate. Collectives of the axis run over each group.

>>> layout = ParallelLayout([f"x{i}" for i in range(8)], {"tp": 2, "pp": 2, "dp": 2})
>>> layout.groups("tp")
(('x0', 'x1'), ('x2', 'x3'), ('x4', 'x5'), ('x6', 'x7'))
>>> layout.groups("dp")
(('x0', 'x2'), ('x1', 'x3'), ('x4', 'x6'), ('x5', 'x7'))
>>> layout.stage("x5"), layout.coordinates("x5")
(1, {'tp': 1, 'cp': 0, 'ep': 0, 'dp': 0, 'pp': 1})
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cached_property

from hcsim.errors import ConfigError

__all__ = ["AXES", "DEFAULT_ORDER", "ParallelLayout"]

AXES = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = AXES  # Megatron-LM's "tp-cp-ep-dp-pp", innermost first


class ParallelLayout:
    """Axes sizes over `xpus` (topology order), placed innermost-first in `order`.

    Axes not given have size 1, except ``dp``, which takes what is left when
    it is not given (a layout of sizes {} over n XPUs is data parallel over n).
    """

    __slots__ = ("xpus", "sizes", "order", "__dict__")

    def __init__(self, xpus: Sequence[str], sizes: Mapping[str, int] | None = None,
                 order: Sequence[str] = DEFAULT_ORDER):
        self.xpus = tuple(xpus)
        sizes = dict(sizes or {})
        unknown = sorted(set(sizes) - set(AXES))
        if unknown:
            raise ConfigError(f"parallel layout: unknown axis {unknown[0]!r}; axes are {', '.join(AXES)}")
        for axis, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"parallel layout: {axis} must be an integer >= 1, got {size!r}")
        if sorted(order) != sorted(AXES):
            raise ConfigError(f"parallel layout: order must list each of {', '.join(AXES)} once, got {list(order)}")
        n = len(self.xpus)
        if "dp" not in sizes:
            rest = math.prod(sizes.values())
            if rest == 0 or n % rest:
                raise ConfigError(f"parallel layout: {n} XPUs are not a multiple of "
                                  f"{' x '.join(f'{a} {s}' for a, s in sizes.items())} = {rest}")
            sizes["dp"] = n // rest
        full = {axis: sizes.get(axis, 1) for axis in AXES}
        if math.prod(full.values()) != n:
            raise ConfigError(f"parallel layout: {' x '.join(f'{a} {s}' for a, s in full.items() if s > 1) or '1'} = "
                              f"{math.prod(full.values())} XPUs, but the run has {n}: the sizes must multiply to the "
                              f"XPU count")
        self.sizes, self.order = full, tuple(order)

    def __repr__(self) -> str:
        axes = " x ".join(f"{a} {self.sizes[a]}" for a in self.order if self.sizes[a] > 1) or "one XPU"
        return f"ParallelLayout({axes} over {len(self.xpus)} XPUs)"

    def __eq__(self, other) -> bool:
        return isinstance(other, ParallelLayout) and (self.xpus, self.sizes, self.order) == \
            (other.xpus, other.sizes, other.order)

    def __hash__(self) -> int:
        return hash((self.xpus, tuple(self.sizes.items()), self.order))

    def to_dict(self) -> dict:
        """Plain data (a graph attribute, JSON): sizes and order; the XPUs are the graph's."""
        return {"sizes": dict(self.sizes), "order": list(self.order)}

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, stride = {}, 1
        for axis in self.order:
            strides[axis] = stride
            stride *= self.sizes[axis]
        return strides

    @cached_property
    def _index(self) -> dict[str, int]:
        return {x: i for i, x in enumerate(self.xpus)}

    def coordinates(self, xpu: str) -> dict[str, int]:
        """The XPU's coordinate on every axis (in AXES order)."""
        rank = self._index[xpu]
        return {axis: rank // self._strides[axis] % self.sizes[axis] for axis in AXES}

    def stage(self, xpu: str) -> int:
        """The pipeline stage (0-based) the XPU belongs to."""
        return self._index[xpu] // self._strides["pp"] % self.sizes["pp"]

    def groups(self, axis: str) -> tuple[tuple[str, ...], ...]:
        """Every group of `axis`, each ordered by the axis coordinate; groups ordered by their first XPU."""
        return self._groups[axis]

    @cached_property
    def _groups(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        table = {}
        for axis in AXES:
            stride, size = self._strides[axis], self.sizes[axis]
            table[axis] = tuple(tuple(self.xpus[first + k * stride] for k in range(size))
                                for first in range(len(self.xpus)) if first // stride % size == 0)
        return table

    def group_of(self, axis: str, xpu: str) -> tuple[str, ...]:
        """The group of `axis` that `xpu` is in."""
        rank = self._index[xpu]
        stride, size = self._strides[axis], self.sizes[axis]
        first = rank - (rank // stride % size) * stride
        return tuple(self.xpus[first + k * stride] for k in range(size))

    def slowest(self, axis: str, speed) -> list[str]:
        """Per coordinate of `axis` (dp: each data replica, pp: each pipeline stage), in coordinate order, its
        slowest XPU by `speed` (a function of the XPU name; the first XPU among equals)."""
        slowest: dict[int, str] = {}
        for x in self.xpus:
            k = self.coordinates(x)[axis]
            if k not in slowest or speed(x) < speed(slowest[k]):
                slowest[k] = x
        return [slowest[k] for k in sorted(slowest)]

    def stage_xpus(self, stage: int) -> tuple[str, ...]:
        """The XPUs of pipeline stage `stage`, in topology order."""
        return self._stages[stage]

    @cached_property
    def _stages(self) -> tuple[tuple[str, ...], ...]:
        stages: list[list[str]] = [[] for _ in range(self.sizes["pp"])]
        for x in self.xpus:
            stages[self.stage(x)].append(x)
        return tuple(map(tuple, stages))
