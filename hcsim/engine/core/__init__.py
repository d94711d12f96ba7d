"""hcsim's engine core on SimGrid's S4U C++ API: workload runs (:mod:`.workload`) and plain activity graphs.

The C++ extension ``_core`` (sources beside this file, built by ``make`` through
``scripts/build_core.py``) runs an acyclic graph of plain SimGrid activities, given as flat arrays, and
returns each activity's start and end time. Activity ``i`` is an execution of ``amount[i]`` FLOPs on
host ``host[i]`` (:data:`EXEC`) or a transfer of ``amount[i]`` bytes from ``host[i]`` to ``peer[i]``
(:data:`COMM`); it starts when every activity in ``preds[pred_offsets[i]:pred_offsets[i + 1]]`` has
ended. The SimGrid set-up is the workload runs' (engine.cpp): CM02, TCP-gamma 0, no cross-traffic, root
zone sealed, so the same activities take the same times in both.

Two drivers: ``callbacks`` (the default: every activity starts from its last predecessor's completion
callback in SimGrid's maestro, no actor) and ``actors`` (one S4U actor per chain of activities, blocking
waits; chains only), measured side by side by ``benchmarks/engine_speed.py`` (case ``simgrid-cpp``).

Every run needs the extension (``make`` builds it); where it is not built or does not load,
:func:`available` is False and :func:`unavailable_reason` says why, with the fix.

As SimGrid allows one Engine per process, ever, :func:`run_here` may be called once per process;
:func:`run_activities` runs in a fresh process and may be called any number of times.
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hcsim.errors import ConfigError, SimulationError, brief

if TYPE_CHECKING:
    from hcsim.platform import CompiledPlatform

__all__ = ["EXEC", "COMM", "DRIVERS", "ActivityGraph", "GraphBuilder", "ActivityTimes", "available",
           "unavailable_reason", "load", "run_here", "run_activities"]

EXEC, COMM = 0, 1  # ActivityGraph.kind
DRIVERS = ("callbacks", "actors")
SIMGRID_VERSION = (4, 1, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivityGraph:
    """An acyclic graph of SimGrid activities as flat arrays (see the module docstring).

    ``hosts`` are host names of the compiled platform; ``kind`` (``array('B')``), ``host`` and ``peer``
    (``array('i')``, host numbers; ``peer`` is -1 for an execution), ``amount`` (``array('d')``: FLOPs or
    bytes; a transfer's bytes are truncated to a whole number, as SimGrid's Comm takes them),
    ``pred_offsets`` (``array('q')``, n + 1 entries) and ``preds`` (``array('i')``). Any buffer of those
    item types works (NumPy arrays included). The core checks host numbers, amounts and cycles and
    raises ConfigError naming the first bad activity.
    """

    hosts: tuple[str, ...]
    kind: Sequence[int]
    host: Sequence[int]
    peer: Sequence[int]
    amount: Sequence[float]
    pred_offsets: Sequence[int]
    preds: Sequence[int]

    def __post_init__(self) -> None:
        n = len(self.kind)
        for name in ("host", "peer", "amount"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"ActivityGraph: {name} has {len(getattr(self, name))} entries, kind has {n}")
        if len(self.pred_offsets) != n + 1:
            raise ConfigError(f"ActivityGraph: pred_offsets needs {n + 1} entries (one per activity, plus one), "
                              f"got {len(self.pred_offsets)}")
        if len(self.preds) != self.pred_offsets[n]:
            raise ConfigError(f"ActivityGraph: pred_offsets[-1] is {self.pred_offsets[n]}, but preds has "
                              f"{len(self.preds)} entries")

    def __len__(self) -> int:
        return len(self.kind)


class GraphBuilder:
    """Builds an :class:`ActivityGraph` one activity at a time.

    >>> b = GraphBuilder(["xpu0", "xpu1"])
    >>> a = b.exec("xpu0", 1e12)
    >>> c = b.comm("xpu0", "xpu1", 1e9, after=[a])
    >>> graph = b.build()
    >>> len(graph), list(graph.preds)
    (2, [0])
    """

    def __init__(self, hosts: Iterable[str]):
        self.hosts = tuple(hosts)
        self._number = {name: i for i, name in enumerate(self.hosts)}
        self.kind, self.host, self.peer = array("B"), array("i"), array("i")
        self.amount, self.pred_offsets, self.preds = array("d"), array("q", [0]), array("i")

    def exec(self, host: str, flops: float, after: Iterable[int] = ()) -> int:
        """Add an execution of `flops` FLOPs on `host` after the activities `after`; its number."""
        return self._add(EXEC, host, None, flops, after)

    def comm(self, src: str, dst: str, size: float, after: Iterable[int] = ()) -> int:
        """Add a transfer of `size` bytes from `src` to `dst` after the activities `after`; its number."""
        return self._add(COMM, src, dst, size, after)

    def _add(self, kind: int, host: str, peer: str | None, amount: float, after: Iterable[int]) -> int:
        for name in (host, peer):
            if name is not None and name not in self._number:
                raise ConfigError(f"GraphBuilder: host {name!r} is not one of the {len(self.hosts)} hosts given")
        self.kind.append(kind)
        self.host.append(self._number[host])
        self.peer.append(-1 if peer is None else self._number[peer])
        self.amount.append(amount)
        self.preds.extend(after)
        self.pred_offsets.append(len(self.preds))
        return len(self.kind) - 1

    def build(self) -> ActivityGraph:
        """The graph so far, with arrays of its own (adding to the builder later does not change it)."""
        return ActivityGraph(hosts=self.hosts, kind=array("B", self.kind), host=array("i", self.host),
                             peer=array("i", self.peer), amount=array("d", self.amount),
                             pred_offsets=array("q", self.pred_offsets), preds=array("i", self.preds))


@dataclass(frozen=True, slots=True)
class ActivityTimes:
    """What a run returns: per activity start and end (s, ``array('d')``), the activities SimGrid ran, the
    simulated end (s), wall times (s) of the engine set-up (create, load, seal) and of ``run()``, and the
    process's CPU time during ``run()`` (s; steadier than wall time on a shared machine)."""

    start: array
    end: array
    activities: int
    simulated_s: float
    setup_s: float
    run_s: float
    run_cpu_s: float
    driver: str


@functools.cache
def _load_or_reason():
    from hcsim.engine.simgrid_loader import load_library

    if load_library() is None:
        return None, "libsimgrid.so.4.1 is not installed (run `make setup`)"
    try:
        from hcsim.engine.core import _core
    except ImportError as err:
        return None, f"the extension is not built or does not load ({err}); build it with `make core`"
    if tuple(_core.simgrid_version()) != tuple(_core.header_version) or tuple(_core.header_version) != SIMGRID_VERSION:
        return None, (f"the extension was built with SimGrid {_core.header_version} headers but runs on libsimgrid "
                      f"{_core.simgrid_version()}; rebuild it with `make core`")
    return _core, None


def available() -> bool:
    """True when the C++ core is built and loads against SimGrid 4.1."""
    return _load_or_reason()[0] is not None


def unavailable_reason() -> str | None:
    """Why the core cannot be used, with the fix; None when it can."""
    return _load_or_reason()[1]


def load():
    """The extension module.

    Raises
    ------
    SimulationError
        when it is not built or does not match the installed SimGrid (the message says how to build it).
    """
    module, reason = _load_or_reason()
    if module is None:
        raise SimulationError(f"engine core: {reason}")
    return module


def run_here(platform: CompiledPlatform, graph: ActivityGraph, driver: str = "callbacks") -> ActivityTimes:
    """Run `graph` on the compiled `platform` (:func:`hcsim.platform.compile_platform`) in this process (once
    per process).

    Raises
    ------
    ConfigError
        for a bad graph (the first bad activity named), an unknown host or driver.
    SimulationError
        when the core is not built, or a SimGrid Engine already exists in this process.
    """
    if driver not in DRIVERS:
        raise ConfigError(f"engine core: driver must be one of {', '.join(DRIVERS)}, got {brief(driver)}")
    if not isinstance(graph, ActivityGraph):
        raise ConfigError(f"engine core: expected an ActivityGraph, got {brief(graph)}")
    core = load()
    n = len(graph)
    start, end = array("d", [math.nan]) * n, array("d", [math.nan]) * n
    try:
        counters = core.run_graph(platform.tables, list(graph.hosts), _buffer("B", graph.kind),
                                  _buffer("i", graph.host), _buffer("i", graph.peer), _buffer("d", graph.amount),
                                  _buffer("q", graph.pred_offsets), _buffer("i", graph.preds), start, end, driver)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"engine core: {err}") from err
    except RuntimeError as err:
        raise SimulationError(f"engine core: {err}") from err
    return ActivityTimes(start, end, counters["activities"], counters["simulated_s"], counters["setup_s"],
                         counters["run_s"], counters["run_cpu_s"], driver)


def _buffer(code: str, values):
    """`values` as is when it already exposes a buffer (array, NumPy), else as array(code)."""
    try:
        memoryview(values)
        return values
    except TypeError:
        return array(code, values)


def run_activities(platform: CompiledPlatform, graph: ActivityGraph, driver: str = "callbacks") -> ActivityTimes:
    """:func:`run_here` in a fresh, spawned process (SimGrid: one Engine per process); any number of times.

    Called from a script, put the script's top level under ``if __name__ == "__main__":`` (the spawned
    process imports it again)."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    load()  # fail here, not in the child, when the core is not built
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
            return pool.submit(run_here, platform, graph, driver).result()
    except BrokenProcessPool as err:
        raise SimulationError(f"engine core: the simulation process died before returning a result ({err}); "
                              "SimGrid aborts the process on some platform errors") from None
