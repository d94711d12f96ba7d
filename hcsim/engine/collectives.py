"""Collective algorithms as schedules of transfers between ranks.

A collective runs over a group of ranks 0..n-1, the XPUs of its workload
vertex in the order the workload lists them (the training builders list them
in topology order, so neighbours in a server are adjacent in a ring). An
algorithm gives, for each rank, a sequence of steps; in a step a rank sends
some bytes to some ranks and receives from some ranks. A send in the sender's
step s is received in the receiver's step s (schedules line their step
numbers up; a rank may have empty steps). Rank r starts step s+1 when its
step s has ended (all its sends done and all its receives arrived), as real
implementations do; this is the ``step`` model.

An algorithm may have several lanes (NCCL's channels): independent step
sequences per rank, the rank done when all are (:attr:`Algorithm.lanes`).

The ``flow`` model stands in at scale (:meth:`Algorithm.flow_phases`):
consecutive steps with the same pattern (the same transfers, pair by pair)
merge into one phase (:class:`FlowPhase`) in which each pair carries the sum
of its bytes in one transfer; a phase starts once the phase before it has
ended everywhere, and ends when its transfers, stretched by the latency their
merged steps would have paid, have ended (or, for a pipeline, when the last
chunk has gone through). A ring is one phase of n transfers instead of
2n(n-1); recursive halving-doubling has 2·log2(n) phases. Steps that differ
stay apart, so the bottleneck of each step is charged where the step model
charges it, and the ranks are in lock step, which is where the two fidelities
differ. An algorithm without an aggregated model (the double binary tree)
runs its steps at both models.

Message size ``S`` (the vertex's ``bytes``) follows nccl-tests: the buffer of
one rank for all-reduce and broadcast, the whole (gathered) buffer for
all-gather, the whole input buffer for reduce-scatter, the send buffer of one
rank (S/n to every rank) for all-to-all.

Chunks (``chunks`` C, ASTRA-sim's ``preferred-dataset-splits``): the message
is split into C chunks of S/C. An algorithm that pipelines its chunks itself
(:attr:`Algorithm.pipelined`: the double binary tree and the chain broadcast
along their edges, the hierarchical all-reduce across its phases) takes C as
its chunk count; any other runs its schedule for S/C C times, one chunk after
the other (:func:`get_algorithm` wraps it): C·T(S/C), each chunk paying the
latencies again.

Closed forms on a uniform, uncontended topology (every route latency α,
every XPU one full-duplex link of bandwidth B, as
:func:`hcsim.platform.single_switch` builds; n ranks; docs/collectives.md
derives them):

=================  ==================  ====================================================
collective         name                time
=================  ==================  ====================================================
all_reduce         ring                2(n-1)α + 2(n-1)/n·S/B
all_reduce         coherent_ring       (n-1)α + (n-1)/n·S/B
all_reduce         hierarchical        2(g-1)α + 2(g-1)/g·S/B + 2(m-1)α + 2(m-1)/(mg)·S/B
                                       (m servers of g ranks; C chunks pipelined across
                                       the phases: :class:`HierarchicalAllReduce`)
all_reduce         halving_doubling    2·log2(n)·α + 2(n-1)/n·S/B (n a power of two)
all_reduce         double_binary_tree  2(D+C-1)(α + S/(C·B)), n = 2^(D+1) - 1, C chunks
all_reduce         coherent_memory     4α + 2(n-1)/n·S/B (n > 1; :class:`CoherentMemoryAllReduce`)
all_reduce         nvls                α + (n+1)/n·S/B (n > 1; the NVSwitch reduces: :class:`NvlsAllReduce`)
all_reduce         pooled_memory       8α + (3n-2)/n·S/B' (n > 1; a region on one memory device whose port
                                       carries B_M: B' = min(B, B_M/n); :class:`PooledMemoryAllReduce`)
reduce_scatter     ring                (n-1)α + (n-1)/n·S/B
reduce_scatter     halving_doubling    log2(n)·α + (n-1)/n·S/B
reduce_scatter     coherent_memory     2α + (n-1)/n·S/B (n > 1)
reduce_scatter     pooled_memory       4α + 2(n-1)/n·S/B' (n > 1)
all_gather         ring                (n-1)α + (n-1)/n·S/B
all_gather         halving_doubling    log2(n)·α + (n-1)/n·S/B
all_gather         coherent_memory     2α + (n-1)/n·S/B (n > 1)
all_gather         pooled_memory       4α + S/B' (n > 1)
all_to_all         pairwise            (n-1)α + (n-1)/n·S/B
broadcast          ring (pipelined)    (n+C-2)(α + S/(C·B))
broadcast          binomial_tree       ceil(log2 n)(α + S/B)
p2p                direct              α + S/B
any other          with C chunks       C·T(S/C) (T: its row above)
=================  ==================  ====================================================

Add an algorithm by subclassing :class:`Algorithm` (set ``name`` and
``collective``, implement :meth:`Algorithm.steps` and :meth:`Algorithm.step`)
and decorating it with :func:`register`; the workload or scenario then names
it, and the engine is not touched. Every simulation runs in a fresh process,
which knows only the algorithms its imports register: name a user algorithm
by its import path, ``"package.module:ClassName"``, and the worker imports it
(a plain registered name works in processes that import its module)::

    @register
    class Star(Algorithm):
        name, collective = "star", "broadcast"
        def steps(self, rank): return 1
        def step(self, rank, index):
            if rank == 0:
                return Step(sends=tuple((r, self.size) for r in range(1, self.ranks)), recvs=())
            return Step(sends=(), recvs=(0,))
"""

from __future__ import annotations

import functools
import importlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from hcsim.errors import ConfigError

__all__ = ["Algorithm", "Step", "FlowPhase", "SequentialChunks", "register", "get_algorithm", "algorithms",
           "server_groups", "shared_region", "endpoint_hosts", "nccl_alternatives", "hierarchical_time",
           "DEFAULT_ALGORITHM", "algorithm_summaries"]

_REGISTRY: dict[tuple[str, str], type["Algorithm"]] = {}

DEFAULT_ALGORITHM = {"all_to_all": "pairwise", "p2p": "direct"}  # every other collective: "ring"
"""The algorithm a collective runs when the workload names none (others: ``ring``)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What one rank does in one step: (dst, bytes) sends and the ranks it receives from."""

    sends: tuple[tuple[int, float], ...]
    recvs: tuple[int, ...]


Transfer = tuple[tuple[int, int], float]  # ((src, dst), bytes)


@dataclass(frozen=True, slots=True)
class FlowPhase:
    """One phase of the ``flow`` model: transfers that run side by side, one per pair.

    Each transfer stands for `steps` steps (or pipeline chunks) of its pair.
    With its measured duration d and route latency α, one step of it takes
    t = α + (d - α)/steps. `feeds` makes the phase a pipeline: feeds[i] lists
    the transfers (indices below i) whose chunks transfer i forwards, so its
    first chunk leaves when theirs have arrived (fill_i = max(fill_f + t_f))
    and its last one after theirs (F_i = max(max F_f + t_i, fill_i + steps·t_i)).
    Without feeds every F_i = d_i + (steps - 1)·α_i: the lock step of merged
    steps. The phase ends at the largest F_i. Phases of one `lane` run one
    after the other; lanes run side by side.
    """

    transfers: tuple[Transfer, ...]
    steps: int
    feeds: tuple[tuple[int, ...], ...] = ()
    lane: int = 0


_IDLE = Step(sends=(), recvs=())


class Algorithm:
    """Base class: a collective (`collective`) implemented by a named schedule (`name`).

    Parameters
    ----------
    ranks : group size n (>= 1).
    size : message size S in bytes (see the module docstring for what S is per collective).
    groups : optional, the ranks of each server in rank order (``[[0, 1, ..., 7], [8, ...], ...]``),
        from :func:`server_groups`; algorithms that follow the topology (``hierarchical``) read it,
        the others ignore it. None: one group.
    chunks : optional chunk count C (>= 1) of an algorithm that pipelines its chunks (:attr:`pipelined`);
        None: its own default. :func:`get_algorithm` runs the others chunk after chunk.
    """

    name = ""
    collective = ""
    lanes = 1
    """Independent step sequences per rank (NCCL's channels): a rank's lanes advance on their own and the
    rank is done when all of them are. An algorithm with several implements lane_steps and lane_step."""
    pipelined = False
    """True: the schedule splits S into ``self.chunks`` chunks itself (pipelined); False: get_algorithm
    repeats the schedule of S/C once per chunk."""
    region = False
    """True: the schedule has one endpoint beyond its ranks, number ``ranks``: the memory device that holds the
    region the ranks share (:func:`shared_region`). It is no rank (no unit, no clock): its steps are the device's
    side of the ranks' stores (its receives) and loads (its sends), and it ends before the last rank does."""

    def __init__(self, ranks: int, size: float, groups: Sequence[Sequence[int]] | None = None,
                 chunks: int | None = None):
        if ranks < 1:
            raise ConfigError(f"{self.name}: a collective needs at least one rank, got {ranks}")
        if not size >= 0:
            raise ConfigError(f"{self.name}: message size must be >= 0 bytes, got {size!r}")
        _check_chunks(chunks, self.name)
        self.ranks = ranks
        self.size = float(size)
        self.groups = [list(g) for g in groups] if groups else [list(range(ranks))]
        self.chunks = chunks

    @property
    def endpoints(self) -> int:
        """Ranks, plus the region's memory device where the schedule has one (:attr:`region`)."""
        return self.ranks + self.region

    def steps(self, rank: int) -> int:
        """Number of steps of `rank`."""
        raise NotImplementedError

    def step(self, rank: int, index: int) -> Step:
        """Step `index` (0-based) of `rank`."""
        raise NotImplementedError

    def lane_steps(self, rank: int, lane: int) -> int:
        """Number of steps of `rank` in `lane` (one lane: :meth:`steps`)."""
        return self.steps(rank)

    def lane_step(self, rank: int, index: int, lane: int) -> Step:
        """Step `index` of `rank` in `lane` (one lane: :meth:`step`)."""
        return self.step(rank, index)

    def pairs(self) -> set[tuple[int, int]]:
        """Every (src, dst) pair of ranks that exchanges data."""
        return set(self.flows())

    def flows(self) -> dict[tuple[int, int], float]:
        """Bytes per (src, dst) pair summed over all steps."""
        total: dict[tuple[int, int], float] = defaultdict(float)
        for lane in range(self.lanes):
            for rank in range(self.endpoints):
                for index in range(self.lane_steps(rank, lane)):
                    for dst, size in self.lane_step(rank, index, lane).sends:
                        total[rank, dst] += size
        return dict(total)

    def flow_phases(self) -> list[FlowPhase] | None:
        """The ``flow`` model's phases (:class:`FlowPhase`), lane by lane; None: no aggregated model
        (the step schedule runs at both models).

        Consecutive step indices whose transfers are the same (pair and bytes)
        merge into one phase of that many steps; a pair's bytes in a phase are
        summed. Steps in which nobody sends are dropped.
        """
        phases: list[FlowPhase] = []
        for lane in range(self.lanes):
            merged: list[list] = []  # [pattern, count]
            for index in range(max((self.lane_steps(r, lane) for r in range(self.endpoints)), default=0)):
                pattern = tuple(sorted(((r, dst), size) for r in range(self.endpoints) if index < self.lane_steps(r, lane)
                                       for dst, size in self.lane_step(r, index, lane).sends))
                if not pattern:
                    continue
                if merged and merged[-1][0] == pattern:
                    merged[-1][1] += 1
                else:
                    merged.append([pattern, 1])
            phases += [FlowPhase(tuple((pair, size * count) for pair, size in pattern), count, lane=lane)
                       for pattern, count in merged]
        return phases


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make `cls` available by (``cls.collective``, ``cls.name``)."""
    if not cls.name or not cls.collective:
        raise ConfigError(f"register: {cls.__name__} must set both 'name' and 'collective'")
    _REGISTRY[cls.collective, cls.name] = cls
    return cls


def get_algorithm(collective: str, name: str | None, ranks: int, size: float,
                  groups: Sequence[Sequence[int]] | None = None, chunks: int | None = None) -> Algorithm:
    """The algorithm `name` (default: :data:`DEFAULT_ALGORITHM` or "ring") for `collective`.

    Parameters
    ----------
    collective : "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast" or "p2p".
    name : a registered algorithm name, or None for the collective's default.
    ranks : group size; size : message size S in bytes.
    groups : optional ranks per server (:func:`server_groups`).
    chunks : optional chunk count C >= 1: a pipelined algorithm (:attr:`Algorithm.pipelined`) takes it as
        its own; any other runs C times on S/C, one chunk after the other. None: the algorithm's default
        (one chunk, or its own pipeline rule).

    Returns one shared instance per (algorithm, ranks, size, groups) in this process: treat it as
    read-only.

    Raises
    ------
    ConfigError
        no such algorithm for `collective` (the message lists the known ones), or the algorithm
        cannot run on this group (e.g. halving_doubling on a group that is not a power of two).
    """
    name = name or DEFAULT_ALGORITHM.get(collective, "ring")
    if ":" in name:
        cls = _imported(collective, name)
    else:
        try:
            cls = _REGISTRY[collective, name]
        except KeyError:
            known = ", ".join(sorted(n for c, n in _REGISTRY if c == collective)) or "none"
            raise ConfigError(f"{collective} algorithm {name!r}: not registered; known: {known}") from None
    _check_chunks(chunks, name)
    return _shared(cls, ranks, size, tuple(map(tuple, groups)) if groups else None, chunks)


@functools.lru_cache(maxsize=256)
def _shared(cls: type[Algorithm], ranks: int, size: float, groups: tuple[tuple[int, ...], ...] | None,
            chunks: int | None = None) -> Algorithm:
    """One instance per (class, ranks, size, groups, chunks): the vertices of a workload that run the same
    collective on the same group shape share it, and with it its pairs, flow phases or step table, built once.
    A pipelined class takes `chunks` itself; any other runs chunk after chunk (:class:`SequentialChunks`)."""
    if cls.pipelined:
        return cls(ranks, size, groups, chunks=chunks)
    if chunks is None or chunks == 1:
        return cls(ranks, size, groups)
    return SequentialChunks(_shared(cls, ranks, size / chunks, groups), chunks)


def nccl_alternatives(collective: str, name: str | None, servers: Sequence[Sequence[int]]) -> tuple[str, ...]:
    """The algorithms NCCL may run instead of `name` on a group spanning `servers` (server_groups): ``nvls``
    for an ``nccl`` all-reduce inside one server (NCCL enables NVLS all-reduce within one NVLink domain and
    runs it where its estimate is lower: the engine's roofline rules decide, :mod:`hcsim.engine.rules`)."""
    return ("nvls",) if (collective, name) == ("all_reduce", "nccl") and len(servers) == 1 else ()


def _check_chunks(chunks, name: str) -> None:
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1):
        raise ConfigError(f"{name}: chunks must be an integer >= 1 (or None for the algorithm's default), "
                          f"got {chunks!r}")


def _imported(collective: str, path: str) -> type[Algorithm]:
    """The Algorithm class named by "package.module:ClassName" (imported here, so in every worker process)."""
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError, TypeError) as err:  # ValueError, TypeError: ":x", ".mod:x"
        raise ConfigError(f"algorithm {path!r}: cannot import {class_name!r} from {module_name!r} ({err}); fix: "
                          f"give 'package.module:ClassName' of an importable Algorithm subclass") from err
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)) or cls.collective != collective:
        raise ConfigError(f"algorithm {path!r}: not an Algorithm subclass for {collective} "
                          f"(its collective is {getattr(cls, 'collective', None)!r})")
    return cls


def algorithms() -> dict[str, list[str]]:
    """Registered algorithm names by collective."""
    table: dict[str, list[str]] = defaultdict(list)
    for collective, name in sorted(_REGISTRY):
        table[collective].append(name)
    return dict(table)


def algorithm_summaries() -> dict[tuple[str, str], str]:
    """(collective, name) -> the first sentence of each registered algorithm's docstring, whole (its first
    paragraph up to a full stop before a capital letter, its lines joined)."""
    import re

    def first_sentence(doc: str | None) -> str:
        paragraph = " ".join(line.strip() for line in (doc or "").strip().split("\n\n")[0].splitlines())
        return re.split(r"(?<=\.)\s+(?=[A-Z`])", paragraph)[0]

    return {key: first_sentence(cls.__doc__) for key, cls in sorted(_REGISTRY.items())}


def server_groups(platform, xpus: Sequence[str]) -> list[list[int]]:
    """The ranks of `xpus` that share a server, per server in order of first appearance.

    Reads the ``server`` node attribute of the platform graph (XPUs without one
    form a group of their own).

    >>> import networkx as nx
    >>> g = nx.Graph(); g.add_nodes_from([("a", {"server": "s0"}), ("b", {"server": "s1"}), ("c", {"server": "s0"})])
    >>> server_groups(g, ["a", "b", "c"])
    [[0, 2], [1]]
    """
    by_server: dict[object, list[int]] = {}
    for rank, xpu in enumerate(xpus):
        by_server.setdefault(platform.nodes[xpu].get("server", ("xpu", xpu)), []).append(rank)
    return list(by_server.values())


class SequentialChunks(Algorithm):
    """`chunks` runs of `inner` (the algorithm built for S/C), one chunk after the other.

    Each lane of each rank runs inner's steps of that lane once per chunk, padded to the lane's longest
    rank so that sends and receives keep lining up; the flow fidelity repeats inner's phases per chunk,
    merging a phase with the next copy of itself (a ring stays one phase of C·2(n-1) steps). On a
    uniform, uncontended topology this takes C·T(S/C).
    """

    def __init__(self, inner: Algorithm, chunks: int):
        _check_chunks(chunks, inner.name)
        self.inner = inner
        self.name, self.collective, self.lanes, self.region = inner.name, inner.collective, inner.lanes, inner.region
        self.ranks, self.groups = inner.ranks, inner.groups
        self.size = inner.size * chunks
        self.chunks = chunks
        self._period = [max((inner.lane_steps(r, lane) for r in range(inner.endpoints)), default=0)
                        for lane in range(inner.lanes)]

    def lane_steps(self, rank: int, lane: int) -> int:
        own = self.inner.lane_steps(rank, lane)
        return (self.chunks - 1) * self._period[lane] + own if own else 0

    def lane_step(self, rank: int, index: int, lane: int) -> Step:
        index %= self._period[lane]
        return self.inner.lane_step(rank, index, lane) if index < self.inner.lane_steps(rank, lane) else _IDLE

    def steps(self, rank: int) -> int:
        return self.lane_steps(rank, 0)

    def step(self, rank: int, index: int) -> Step:
        return self.lane_step(rank, index, 0)

    def pairs(self) -> set[tuple[int, int]]:
        return self.inner.pairs()

    def flows(self) -> dict[tuple[int, int], float]:
        return {pair: size * self.chunks for pair, size in self.inner.flows().items()}

    def flow_phases(self) -> list[FlowPhase] | None:
        phases = self.inner.flow_phases()
        if phases is None:
            return None
        repeated: list[FlowPhase] = []
        for lane in sorted({phase.lane for phase in phases}):
            own = [phase for phase in phases if phase.lane == lane]
            for phase in own * self.chunks:
                last = repeated[-1] if repeated else None
                if (last is not None and last.lane == lane and not last.feeds and not phase.feeds
                        and [p for p, _ in last.transfers] == [p for p, _ in phase.transfers]
                        and all(math.isclose(a * phase.steps, b * last.steps) for (_, a), (_, b)
                                in zip(last.transfers, phase.transfers))):
                    repeated[-1] = FlowPhase(tuple((p, a + b) for (p, a), (_, b) in zip(last.transfers, phase.transfers)),
                                             last.steps + phase.steps, lane=lane)
                else:
                    repeated.append(phase)
        return repeated


def _chunks(size: float, chunk_bytes: float, max_chunks: int) -> int:
    """Pipeline chunk count: ceil(size / chunk_bytes), between 1 and max_chunks."""
    return max(1, min(max_chunks, math.ceil(size / chunk_bytes))) if size > 0 else 1


class _Table(Algorithm):
    """An algorithm whose schedule :meth:`build` describes as :meth:`send` calls.

    __init__ runs :meth:`build` once to check the group and collect the pairs, the step counts
    and the flow phases, merging steps as the sends stream in (:class:`_PhaseRecorder`); the step
    table (step fidelity) is built from another run of :meth:`build` on first use. So a
    flow-fidelity run never holds the step schedule.
    """

    def __init__(self, ranks, size, groups=None, chunks=None):
        super().__init__(ranks, size, groups, chunks)
        self._table: list | None = None
        recorder = self._record(streaming=True)
        if recorder is None:  # build() went back to a finished step: collect every step (phases on demand)
            recorder = self._record(streaming=False)
            self._phases = None
        else:
            self._phases = recorder.phases
        self._pairs, self._length = frozenset(recorder.pairs), recorder.length

    def _record(self, streaming: bool) -> "_PhaseRecorder | None":
        """A replay of :meth:`build` into a :class:`_PhaseRecorder`; None if streaming met an earlier step."""
        recorder = _PhaseRecorder(self.lanes, streaming)
        try:
            self._replay(recorder.send)
        except _OutOfOrder:
            return None
        recorder.close()
        return recorder

    def _replay(self, sink) -> None:
        """Run :meth:`build` with every :meth:`send` going to sink(step, src, dst, size, lane=0)."""
        self.send = sink  # shadows the method for this replay: one call per send, not two
        try:
            self.build()
        finally:
            del self.send

    def build(self) -> None:
        """Fill the schedule with :meth:`send` (called more than once: must depend on the parameters only)."""
        raise NotImplementedError

    def send(self, step: int, src: int, dst: int, size: float, lane: int = 0) -> None:
        """`src` sends `size` bytes to `dst` in `step` of `lane` (merged with other sends of the pair there);
        only :meth:`build` calls it, during a replay."""
        raise ConfigError(f"{type(self).__name__}.send: call it from build() only (the schedule is recorded while "
                          f"build() runs)")

    def _steps_table(self) -> list:
        """[lane][rank][step] -> Step, built on first use."""
        if self._table is None:
            sends = defaultdict(lambda: defaultdict(float))  # (lane, src, step) -> {dst: bytes}
            recvs = defaultdict(set)  # (lane, dst, step) -> {src}

            def record(step: int, src: int, dst: int, size: float, lane: int = 0) -> None:
                sends[lane, src, step][dst] += size
                recvs[lane, dst, step].add(src)

            self._replay(record)

            def entry(key) -> Step:
                if key not in sends and key not in recvs:
                    return _IDLE
                return Step(sends=tuple(sorted(sends.get(key, {}).items())), recvs=tuple(sorted(recvs.get(key, ()))))

            self._table = [[[entry((lane, r, s)) for s in range(self._length[lane])] for r in range(self.endpoints)]
                           for lane in range(self.lanes)]
        return self._table

    def pairs(self) -> set[tuple[int, int]]:
        return set(self._pairs)

    def flow_phases(self) -> list[FlowPhase] | None:
        """As :meth:`Algorithm.flow_phases`, merged while the schedule was built (the step table is not needed)."""
        if self._phases is None:
            self._phases = self._record(streaming=False).phases
        return list(self._phases)

    def steps(self, rank: int) -> int:
        return self._length[0]

    def step(self, rank: int, index: int) -> Step:
        return (self._table or self._steps_table())[0][rank][index]

    def lane_steps(self, rank: int, lane: int) -> int:
        return self._length[lane]

    def lane_step(self, rank: int, index: int, lane: int) -> Step:
        return (self._table or self._steps_table())[lane][rank][index]


class _OutOfOrder(Exception):
    """A send to a step that a streaming :class:`_PhaseRecorder` has already merged."""


class _PhaseRecorder:
    """The pairs, step counts and flow phases of a schedule from its sends (:meth:`Algorithm.flow_phases`'s rule).

    Each step's transfers are summed per pair, in send order, as the step table does; consecutive
    equal steps of a lane merge. Streaming: a lane holds only the step being sent to and merges it
    when a send goes to a later step, so memory is one step per lane plus the phases (a send to an
    earlier step raises :class:`_OutOfOrder`). Otherwise every step is kept until :meth:`close`.
    """

    def __init__(self, lanes: int, streaming: bool):
        self.streaming = streaming
        self.open: list[dict[int, dict[tuple[int, int], float]]] = [{} for _ in range(lanes)]  # lane: step -> pairs
        self.merged: list[list[list]] = [[] for _ in range(lanes)]  # lane: [[pattern, count], ...]
        self.length = [0] * lanes  # steps per lane
        self.pairs: set[tuple[int, int]] = set()
        self.phases: list[FlowPhase] = []

    def send(self, step: int, src: int, dst: int, size: float, lane: int = 0) -> None:
        open_steps = self.open[lane]
        transfers = open_steps.get(step)
        if transfers is None:
            if self.streaming and open_steps:
                (current,) = open_steps
                if step < current:
                    raise _OutOfOrder
                self._merge(lane, open_steps.pop(current))
            transfers = open_steps[step] = {}
            if step >= self.length[lane]:
                self.length[lane] = step + 1
        transfers[src, dst] = transfers.get((src, dst), 0.0) + size

    def _merge(self, lane: int, transfers: dict[tuple[int, int], float]) -> None:
        self.pairs.update(transfers)
        pattern = tuple(sorted(transfers.items()))
        merged = self.merged[lane]
        if merged and merged[-1][0] == pattern:
            merged[-1][1] += 1
        else:
            merged.append([pattern, 1])

    def close(self) -> None:
        """Merge the steps still open and list the phases, lane by lane."""
        for lane, open_steps in enumerate(self.open):
            for step in sorted(open_steps):
                self._merge(lane, open_steps.pop(step))
        self.phases = [FlowPhase(tuple((pair, size * count) for pair, size in pattern), count, lane=lane)
                       for lane, merged in enumerate(self.merged) for pattern, count in merged]
        self.merged = []


# ---- rings ----------------------------------------------------------------------------------------------------


class _Ring(Algorithm):
    """Each step every rank sends size/ranks bytes to its right neighbour: rounds x (n-1) steps."""

    rounds = 1

    def steps(self, rank: int) -> int:
        return self.rounds * (self.ranks - 1)

    def step(self, rank: int, index: int) -> Step:
        n = self.ranks
        return Step(sends=(((rank + 1) % n, self.size / n),), recvs=((rank - 1) % n,))

    # a ring's steps are all alike (listing n x 2(n-1) Steps at 1024 ranks is slow): one phase
    def flows(self) -> dict[tuple[int, int], float]:
        n = self.ranks
        return {(r, (r + 1) % n): self.rounds * (n - 1) * self.size / n for r in range(n)} if n > 1 else {}

    def flow_phases(self) -> list[FlowPhase]:
        return [FlowPhase(tuple(sorted(self.flows().items())), self.steps(0))] if self.ranks > 1 else []


@register
class RingAllReduce(_Ring):
    """Reduce-scatter then all-gather around the ring: 2(n-1) steps of S/n; 2(n-1)α + 2(n-1)/n·S/B."""

    name, collective, rounds = "ring", "all_reduce", 2


@register
class CoherentRingAllReduce(_Ring):
    """The paper's coherent ring (section 3.3, Fig. 12): the reduced shards stay in
    coherent memory where every XPU can read them, so the all-gather half is not
    needed: n-1 steps of S/n; (n-1)α + (n-1)/n·S/B."""

    name, collective, rounds = "coherent_ring", "all_reduce", 1


@register
class RingReduceScatter(_Ring):
    """n-1 steps of S/n (S: the whole input buffer); (n-1)α + (n-1)/n·S/B."""

    name, collective, rounds = "ring", "reduce_scatter", 1


@register
class RingAllGather(_Ring):
    """n-1 steps of S/n (S: the whole gathered buffer); (n-1)α + (n-1)/n·S/B."""

    name, collective, rounds = "ring", "all_gather", 1


def channel_ring_orders(servers: Sequence[Sequence[int]]) -> list[list[int]]:
    """The ring order of each of NCCL's channel rings over a group of `servers` (its ranks, server by server):
    g lanes for servers of g ranks each (more than one server), else the one plain ring. Lane c visits servers in
    even places from local rank c to c + 1 the long way round, those in odd places from c + 1 to c, so that
    consecutive servers meet on the same local rank (:class:`_ChannelRing`).

    >>> channel_ring_orders([[0, 1, 2], [3, 4, 5]])
    [[0, 2, 1, 4, 5, 3], [1, 0, 2, 5, 3, 4], [2, 1, 0, 3, 4, 5]]
    >>> channel_ring_orders([[0, 1], [2]])  # unequal servers: the plain ring
    [[0, 1, 2]]
    """
    sizes = {len(s) for s in servers}
    g = sizes.pop() if len(sizes) == 1 else 1
    if len(servers) < 2 or g < 2:
        return [[rank for server in servers for rank in server]]

    def visit(server, c: int, odd: bool) -> list[int]:
        return [server[(c + 1 + i) % g] if odd else server[(c - i) % g] for i in range(g)]

    return [[rank for k, server in enumerate(servers) for rank in visit(server, c, k % 2 == 1)] for c in range(g)]


class _ChannelRing(Algorithm):
    """NCCL's rings over several channels: a group spanning m servers of g ranks each runs g rings side by side
    (lanes), each carrying S/g. Ring c crosses between servers on one rail, from a server's local rank r to the
    next server's local rank r, as NCCL keeps a channel on one NIC of each node (its topology search on
    rail-optimized DGX fabrics): servers in even places are entered at local rank c and left from c + 1, those
    in odd places entered at c + 1 and left from c, so the g rings cross through g different XPUs and NICs
    each way, one ring a NIC (with an odd m the ring's closing crossing alone goes from rank c + 1 to c). Inside
    a server the g rings together move what one ring would (every rank sends S/n per step over its own
    links). A group inside one server, or of one rank per server, or of unequal servers, is the plain ring:
    identical steps and time."""

    rounds = 1

    def __init__(self, ranks, size, groups=None, chunks=None):
        super().__init__(ranks, size, groups, chunks)
        orders = channel_ring_orders(self.groups)
        self.lanes = len(orders)
        self._right = [{order[i]: order[(i + 1) % ranks] for i in range(ranks)} for order in orders]
        self._left = [{right: left for left, right in lane.items()} for lane in self._right]

    def steps(self, rank: int) -> int:
        return self.rounds * (self.ranks - 1)

    def step(self, rank: int, index: int) -> Step:
        return self.lane_step(rank, index, 0)

    def lane_steps(self, rank: int, lane: int) -> int:
        return self.steps(rank)

    def lane_step(self, rank: int, index: int, lane: int) -> Step:
        return Step(sends=((self._right[lane][rank], self.size / (self.ranks * self.lanes)),),
                    recvs=(self._left[lane][rank],))

    def flows(self) -> dict[tuple[int, int], float]:
        n, share = self.ranks, self.rounds * (self.ranks - 1) * self.size / (self.ranks * self.lanes)
        total: dict[tuple[int, int], float] = defaultdict(float)
        for lane in self._right:
            for src, dst in lane.items():
                total[src, dst] += share
        return dict(total) if n > 1 else {}

    def flow_phases(self) -> list[FlowPhase]:
        if self.ranks < 2:
            return []
        share = self.rounds * (self.ranks - 1) * self.size / (self.ranks * self.lanes)
        return [FlowPhase(tuple(sorted(((src, dst), share) for src, dst in lane.items())), self.steps(0), lane=c)
                for c, lane in enumerate(self._right)]


@register
class ChannelRingAllReduce(_ChannelRing):
    """All-reduce on NCCL's channel rings: 2(n-1) steps of S/(n·g) on each of g rings."""

    name, collective, rounds = "nccl", "all_reduce", 2


@register
class ChannelRingReduceScatter(_ChannelRing):
    """Reduce-scatter on NCCL's channel rings: n-1 steps of S/(n·g) on each of g rings."""

    name, collective, rounds = "nccl", "reduce_scatter", 1


@register
class ChannelRingAllGather(_ChannelRing):
    """All-gather on NCCL's channel rings: n-1 steps of S/(n·g) on each of g rings."""

    name, collective, rounds = "nccl", "all_gather", 1


# ---- hierarchical ---------------------------------------------------------------------------------------------


@register
class HierarchicalAllReduce(_Table):
    """All-reduce inside each server, then across servers, then back (2D ring), in C pipelined chunks.

    With m servers of g ranks (``groups``, all of one size) and one chunk: a
    ring reduce-scatter inside each server (RS: g-1 steps of S/g, over the XPU
    switch), then a ring all-reduce of each S/g shard among the ranks with the
    same local index on every server (AR: 2(m-1) steps of S/(gm)), then a ring
    all-gather inside each server (AG: g-1 steps of S/g). Every step every
    rank sends one transfer and receives one, so on a single switch nothing
    contends: 2(g-1)α + 2(g-1)/g·S/B + 2(m-1)α + 2(m-1)/(mg)·S/B. One server
    (or one rank per server) is the plain ring.

    With C chunks (``chunks``; default 1) every phase moves S/C, and the
    phases of different chunks overlap as ASTRA-sim's per-dimension queues
    let them: the links inside a server serve RS_0, RS_1, ..., RS_{C-1}, then
    AG_0, ..., AG_{C-1}; the links across servers serve AR_0, ..., AR_{C-1};
    each phase starts at the first step where its link set is free and its
    chunk's previous phase has ended (so chunk k+1's reduce-scatter runs
    beside chunk k's all-reduce across servers). Steps stay in lock step: a
    step that holds an intra-server and an inter-server transfer ends when
    both have. On a topology where the two link sets are separate and
    uncontended (a switch per server, rings across servers), a step lasts
    t_i = α_i + S/(gC·B_i) (intra only), t_e = α_e + S/(gmC·B_e) (inter only)
    or max(t_i, t_e) (both); with a = g-1 and b = 2(m-1) steps per phase and
    b <= a and C >= 2, the intra link set is busy 2Ca steps in a row, Cb of
    them beside an inter step: (2Ca - Cb)·t_i + Cb·max(t_i, t_e), against
    C(2a·t_i + b·t_e) for the chunks one after the other.

    Raises ConfigError when the servers hold different numbers of ranks.
    """

    name, collective, pipelined = "hierarchical", "all_reduce", True

    def build(self) -> None:
        groups = self.groups
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise ConfigError(f"hierarchical all_reduce needs the same number of ranks on every server, got "
                              f"{sorted(len(g) for g in groups)} over {len(groups)} servers; fix: use whole "
                              f"servers or algorithm 'ring'")
        g, m = sizes.pop(), len(groups)
        self.chunks = chunks = self.chunks or 1
        chunk = self.size / chunks
        for (intra_rs, inter, intra_ag) in _pipeline_starts(g - 1, 2 * (m - 1), chunks):
            self._intra_ring(intra_rs, g, chunk)  # reduce-scatter inside each server
            for step in range(inter, inter + 2 * (m - 1)):  # ring all-reduce of each shard across servers
                for i, group in enumerate(groups):
                    for local, rank in enumerate(group):
                        self.send(step, rank, groups[(i + 1) % m][local], chunk / (g * m))
            self._intra_ring(intra_ag, g, chunk)  # all-gather inside each server

    def _intra_ring(self, step: int, g: int, chunk: float) -> None:
        """g-1 ring steps of chunk/g inside every server from `step`."""
        for offset in range(g - 1):
            for group in self.groups:
                for local, rank in enumerate(group):
                    self.send(step + offset, rank, group[(local + 1) % g], chunk / g)


def hierarchical_time(g: int, m: int, chunks: int, t_intra: float, t_inter: float) -> float:
    """Time of :class:`HierarchicalAllReduce` over m servers of g ranks in `chunks` chunks, in s, on a platform
    whose intra- and inter-server links are separate and uncontended: the sum over its lock steps of the
    slowest transfer in each, t_intra for an intra-server step (α_i + S/(gC·B_i)), t_inter for an
    inter-server one (α_e + S/(gmC·B_e)).

    >>> hierarchical_time(4, 2, 1, 1.0, 10.0)  # 2(g-1) intra steps + 2(m-1) inter steps
    26.0
    >>> hierarchical_time(4, 2, 2, 1.0, 10.0)  # (2Ca - Cb)·t_i + Cb·max(t_i, t_e), a = 3, b = 2
    48.0
    """
    a, b = g - 1, 2 * (m - 1)
    intra, inter = set(), set()
    for rs, ar, ag in _pipeline_starts(a, b, chunks):
        intra.update(range(rs, rs + a), range(ag, ag + a))
        inter.update(range(ar, ar + b))
    return sum(max(t_intra if s in intra else 0.0, t_inter if s in inter else 0.0) for s in intra | inter)


def _pipeline_starts(a: int, b: int, chunks: int) -> list[tuple[int, int, int]]:
    """First step of each chunk's three phases (intra a steps, inter b steps, intra a steps), served
    first come first served by two link sets: intra RS_0..RS_{C-1} then AG_0..AG_{C-1}, inter AR_0..AR_{C-1}.

    >>> _pipeline_starts(3, 2, 2)  # RS_1 (steps 3-5) beside AR_0 (3-4); AG_0 waits for the intra links
    [(0, 3, 6), (3, 6, 9)]
    """
    rs = [k * a for k in range(chunks)]
    ar, free = [], 0
    for start in rs:
        free = max(start + a, free) + b
        ar.append(free - b)
    ag, free = [], chunks * a
    for start in ar:
        free = max(start + b, free) + a
        ag.append(free - a)
    return list(zip(rs, ar, ag))


# ---- recursive halving-doubling ---------------------------------------------------------------------------------


def _log2_exact(n: int, algorithm: str) -> int:
    if n & (n - 1):
        raise ConfigError(f"{algorithm}: needs a power-of-two group, got {n} ranks; fix: use a group of "
                          f"{1 << (n.bit_length() - 1)} or {1 << n.bit_length()} ranks, or algorithm 'ring'")
    return n.bit_length() - 1


class _HalvingDoubling(_Table):
    """Recursive halving (reduce-scatter) and/or doubling (all-gather) with pairwise exchanges."""

    halving = doubling = True

    def build(self) -> None:
        levels = _log2_exact(self.ranks, f"{self.name} {self.collective}")
        size, step = self.size, 0
        if self.halving:  # distance 1, 2, 4, ...: the largest halves go to the nearest ranks
            for k in range(levels):
                for r in range(self.ranks):
                    self.send(step, r, r ^ (1 << k), size / (2 << k))
                step += 1
        if self.doubling:  # the reverse: distance n/2 first with S/n
            for k in reversed(range(levels)):
                for r in range(self.ranks):
                    self.send(step, r, r ^ (1 << k), size / (2 << k))
                step += 1


@register
class HalvingDoublingAllReduce(_HalvingDoubling):
    """Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather.

    log2(n) pairwise exchanges of S/2, S/4, ..., S/n then the same in reverse;
    each step a rank sends one transfer and receives one (full duplex, no
    contention): 2·log2(n)·α + 2(n-1)/n·S/B. n must be a power of two
    (ConfigError otherwise: no fix-up step is modelled).
    """

    name, collective = "halving_doubling", "all_reduce"


@register
class HalvingReduceScatter(_HalvingDoubling):
    """Recursive halving: log2(n)·α + (n-1)/n·S/B; n a power of two."""

    name, collective, doubling = "halving_doubling", "reduce_scatter", False


@register
class DoublingAllGather(_HalvingDoubling):
    """Recursive doubling: log2(n)·α + (n-1)/n·S/B; n a power of two."""

    name, collective, halving = "halving_doubling", "all_gather", False


# ---- double binary tree -----------------------------------------------------------------------------------------


def _inorder_parents(n: int) -> list[int]:
    """Parent of each position 0..n-1 in an in-order binary tree (-1 for the root), as NCCL's ncclGetBtree.

    The full tree over 2^K - 1 positions (K = n.bit_length()) has heights
    given by the trailing zeros of q + 1; positions >= n are removed and their
    children hang from the nearest remaining ancestor.
    """
    levels = n.bit_length()
    root = (1 << (levels - 1)) - 1
    parents = []
    for q in range(n):
        node = q
        while node != root:
            h = ((node + 1) & -(node + 1)).bit_length() - 1
            node = node + (1 << h) if ((node + 1) >> h) % 4 == 1 else node - (1 << h)
            if node < n:
                break
        parents.append(-1 if q == root else node)
    return parents


@dataclass(frozen=True, slots=True)
class _Tree:
    parent: dict[int, int]  # rank -> parent rank (-1: the root)
    children: dict[int, list[int]]
    height: dict[int, int]  # leaves 0
    depth: dict[int, int]  # root 0
    root: int


def _tree(parent: dict[int, int]) -> _Tree:
    """A tree given by parents, with every node's height and depth."""
    children: dict[int, list[int]] = defaultdict(list)
    root = -1
    for node, up in sorted(parent.items()):
        if up < 0:
            root = node
        else:
            children[up].append(node)
    depth, order, stack = {root: 0}, [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        for child in children[node]:
            depth[child] = depth[node] + 1
            stack.append(child)
    height: dict[int, int] = {}
    for node in reversed(order):
        height[node] = 1 + max((height[c] for c in children[node]), default=-1)
    return _Tree(parent, dict(children), height, depth, root)


@register
class DoubleBinaryTreeAllReduce(_Table):
    """NCCL's double binary tree: two complementary trees each reduce then broadcast half of S.

    Tree A is the in-order binary tree over ranks 0..n-1; tree B is the same
    tree over ranks shifted by one (n odd) or mirrored (n even), so a rank is
    an inner node in at most one tree. Each tree carries S/2 in C chunks of
    c = S/(2C) (``chunks``: as given, else ceil(S / chunk_bytes) between 1 and
    max_chunks; chunk_bytes = 4 MiB, max_chunks = 32 by default; subclass to change).

    Each tree is a lane of its own (NCCL runs them on separate channels).
    Schedule of a tree (one chunk per tree edge per step): reduce: a node of
    height h (leaves 0) sends chunk j to its parent in step h + j; broadcast,
    after its reduce (R = H + C - 1 steps, H the root's height): a node of
    depth d sends chunk j to its children in step R + d + j.

    Closed form when both trees are complete (n = 2^(D+1) - 1, depth D): every
    reduce transfer shares its parent's downlink with its sibling's, every
    broadcast transfer its parent's uplink with its sibling's, and no link
    carries more than two, so every step lasts α + 2c/B and the ranks stay in
    lock step: 2(D + C - 1)·(α + S/(C·B)). Other n: some parents have one
    child and those transfers run faster.

    Both fidelities run this schedule (see :meth:`flow_phases`).
    """

    name, collective, pipelined = "double_binary_tree", "all_reduce", True
    chunk_bytes = 4 * 2**20
    max_chunks = 32
    lanes = 2

    def build(self) -> None:
        n = self.ranks
        self.chunks = c = self.chunks or _chunks(self.size / 2, self.chunk_bytes, self.max_chunks)
        self.trees: list[_Tree] = []
        if n < 2:
            return
        positions = _inorder_parents(n)
        if n % 2:
            rank_of = [(q - 1) % n for q in range(n)]  # tree B: position q holds rank q - 1 (shift)
        else:
            rank_of = [n - 1 - q for q in range(n)]  # tree B: mirrored
        for mapping in (list(range(n)), rank_of):
            self.trees.append(_tree({mapping[q]: (mapping[p] if p >= 0 else -1) for q, p in enumerate(positions)}))
        chunk = self.size / (2 * c)
        for lane, tree in enumerate(self.trees):
            reduce_steps = tree.height[tree.root] + c - 1
            for node, up in sorted(tree.parent.items()):
                if up < 0:
                    continue
                for j in range(c):
                    self.send(tree.height[node] + j, node, up, chunk, lane)
                    self.send(reduce_steps + tree.depth[up] + j, up, node, chunk, lane)

    def flow_phases(self) -> None:
        """None: no aggregated model of the tree held 1% against its step schedule under contention.

        Measured on paper-cxl (16..64 XPUs, 1 MB..1 GB): lock-step phases with the
        steady state merged were off by -14%..+18%; one pipelined transfer per tree
        edge (FlowPhase feeds) by up to +56%: in step model a rank's chunk
        waits for the slower of its send and its receive, so which flows overlap
        on a shared link changes chunk by chunk, and no static set of flows
        reproduces it. The step schedule is 4(n-1)·C transfers, linear in n.
        """
        return None


# ---- through coherent shared memory -------------------------------------------------------------------------------


class _CoherentMemory(_Table):
    """Collectives by loads and stores in a coherent memory region the ranks share (NVLink load/store in an
    NVLink domain, CXL 3.x shared memory): each rank's slice of the region is its own buffer, which every
    peer reads in place; no rank forwards another's data, so a pass costs one latency whatever n is.

    A pass is two steps: a flag step, in which every rank stores a ready flag (0 bytes) into every peer's
    slice after a fence that makes its own writes visible, and waits for every peer's flag (a barrier:
    one route latency α, the cost of the flag's store crossing the route; the fence is ordered before it
    on the rank, as in NCCL's LL protocol and PyTorch's SymmetricMemory barrier, and adds no link time);
    then a load step, in which every rank loads the bytes it needs from every peer's slice: a load of b
    bytes from rank p moves b bytes p -> r, so it is scheduled as p's send (the same bytes on the same
    links). Reduce-scatter: one pass, each rank loads its shard (S/n) from every peer and reduces it:
    2α + (n-1)/n·S/B. All-gather: one pass, each rank loads every peer's shard (S/n of the gathered S):
    2α + (n-1)/n·S/B. All-reduce: reduce-scatter then all-gather (two-shot), each pass behind its flags:
    4α + 2(n-1)/n·S/B. On one switch each rank's link carries (n-1)·S/n each way per pass, all flows at
    once, so the bandwidth term is the ring's and the latency term does not grow with n: for small
    messages latency, not bandwidth, decides. The region lives in the ranks' own memories; a region on one
    memory device (a CXL pool, a Grace's LPDDR5X) is pooled_memory's (:class:`_PooledMemory`).
    """

    passes = 1

    def build(self) -> None:
        n = self.ranks
        for p in range(self.passes if n > 1 else 0):
            for r in range(n):
                for peer in range(n):
                    if peer != r:
                        self.send(2 * p, r, peer, 0.0)  # the flag: a store into the peer's slice
            for r in range(n):
                for peer in range(n):
                    if peer != r:
                        self.send(2 * p + 1, peer, r, self.size / n)  # r loads its S/n from peer's slice


@register
class CoherentMemoryAllReduce(_CoherentMemory):
    """Two-shot all-reduce by loads from coherent shared memory: 4α + 2(n-1)/n·S/B."""

    name, collective, passes = "coherent_memory", "all_reduce", 2


@register
class CoherentMemoryReduceScatter(_CoherentMemory):
    """Reduce-scatter by loads from coherent shared memory: 2α + (n-1)/n·S/B."""

    name, collective = "coherent_memory", "reduce_scatter"


@register
class CoherentMemoryAllGather(_CoherentMemory):
    """All-gather by loads from coherent shared memory: 2α + (n-1)/n·S/B."""

    name, collective = "coherent_memory", "all_gather"


class _PooledMemory(_Table):
    """Collectives through a shared region on one memory device (a CXL pool's Type 3 device behind its switch,
    a Grace's LPDDR5X that the GPUs of its superchip share over NVLink-C2C): endpoint ``ranks`` is the device
    (:attr:`Algorithm.region`; :func:`shared_region` finds it on the platform). The device stores and returns
    bytes and computes nothing, so every rank writes what its peers need into the region and loads what it
    needs from it: each byte crosses the device's port twice, and the port is shared by every rank.

    A pass is four steps, each rank's access one route latency α as every transfer is (the CXL.mem read or
    write; loaded latencies of 200-300 ns measured on CXL memory: Sun et al., MICRO 2023; Li et al., Pond,
    ASPLOS 2023; the platform's link latencies give α): (1) every rank stores its contribution into its slot
    of the region; (2) behind a fence, which waits for those stores to complete, it stores a ready flag
    (0 bytes); (3) it polls the flags, a load (0 bytes) that returns once every rank's flag has landed: the
    device answers when all have (its receive of every flag ends its step), so the barrier is two accesses,
    the flag's store and the load that sees it, not one as between ranks' own memories, where the peer polls
    its own memory (CXL 3.x shared memory keeps the flag coherent by back-invalidation: CXL 3.0 specification
    section 3.3; PyTorch's SymmetricMemory and NCCL's LL protocol use the same store-fence-flag order);
    (4) every rank loads what it needs. The device's steps mirror them: receive the stores, receive the
    flags, answer the polls, send the loads.

    Reduce-scatter (S the whole input): store the n-1 shards other ranks reduce ((n-1)/n·S), load one's own
    shard from the n-1 other slots ((n-1)/n·S): 4α + 2(n-1)/n·S/B'. All-gather (S the gathered buffer):
    store one's shard (S/n), load the n-1 others ((n-1)/n·S): 4α + S/B'. All-reduce: the reduce-scatter, then
    the all-gather of the reduced shards: 8α + (3n-2)/n·S/B'. B' = min(B, B_M/n) on one switch whose ranks'
    links carry B and the device's port B_M: the n transfers of a step share the port.
    """

    region = True
    passes: tuple[str, ...] = ("reduce_scatter",)

    def build(self) -> None:
        n, step = self.ranks, 0
        memory = n
        for kind in self.passes if n > 1 else ():
            stored = (n - 1) / n * self.size if kind == "reduce_scatter" else self.size / n
            for size in (stored, 0.0):  # (1) the contribution, (2) the flag behind its fence
                for r in range(n):
                    self.send(step, r, memory, size)
                step += 1
            for size in (0.0, (n - 1) / n * self.size):  # (3) the poll that sees every flag, (4) the loads
                for r in range(n):
                    self.send(step, memory, r, size)
                step += 1


@register
class PooledMemoryAllReduce(_PooledMemory):
    """Two-shot all-reduce through a region on one memory device: 8α + (3n-2)/n·S/min(B, B_M/n)."""

    name, collective, passes = "pooled_memory", "all_reduce", ("reduce_scatter", "all_gather")


@register
class PooledMemoryReduceScatter(_PooledMemory):
    """Reduce-scatter through a region on one memory device: 4α + 2(n-1)/n·S/min(B, B_M/n)."""

    name, collective, passes = "pooled_memory", "reduce_scatter", ("reduce_scatter",)


@register
class PooledMemoryAllGather(_PooledMemory):
    """All-gather through a region on one memory device: 4α + S/min(B, B_M/n)."""

    name, collective, passes = "pooled_memory", "all_gather", ("all_gather",)


def shared_region(platform, xpus: Sequence[str], algorithm: str = "pooled_memory") -> str:
    """The memory device that holds the region of a collective through one memory device over `xpus`: the
    extended memory every one of them spills to (a CXL pool shared by its hosts, a superchip's CPU memory
    shared by its GPUs), on a coherent platform.

    >>> import networkx as nx
    >>> g = nx.Graph(coherent=True)
    >>> g.add_nodes_from([("a", {"extended_memory": "pool"}), ("b", {"extended_memory": "pool"})])
    >>> shared_region(g, ["a", "b"])
    'pool'

    Raises
    ------
    ConfigError
        when the platform is not coherent or the XPUs do not all spill to one memory (the message says which
        groups would do).
    """
    valid = ("valid: a group whose XPUs all spill to one memory device on a coherent platform (the hosts of one "
             "CXL pool on a cxl_pool platform, pool.hosts hosts a pool; the GPUs of one superchip, "
             "node.gpus_per_superchip > 1), or algorithm 'coherent_memory', whose region is the ranks' own memories")
    if not platform.graph.get("coherent"):
        raise ConfigError(f"algorithm {algorithm!r}: the platform is not coherent (coherent: false), so its XPUs "
                          f"share no coherent memory region; {valid}")
    memories = {x: platform.nodes[x].get("extended_memory") for x in xpus}
    distinct = list(dict.fromkeys(memories.values()))
    if len(distinct) != 1 or distinct[0] is None:
        shown = ", ".join(f"{x}: {m}" for x, m in list(memories.items())[:4])
        raise ConfigError(f"algorithm {algorithm!r}: the group's {len(memories)} XPUs do not share one memory "
                          f"device (their extended memories: {shown}{', ...' if len(memories) > 4 else ''}); {valid}")
    return distinct[0]


def endpoint_hosts(platform, algorithm: Algorithm, group: tuple[str, ...]) -> tuple[str, ...]:
    """The hosts of `algorithm`'s endpoints over `group`: its XPUs, then the region's memory device where the
    schedule has one (:attr:`Algorithm.region`)."""
    return group + (shared_region(platform, group, algorithm.name),) if algorithm.region else group


# ---- NVLink SHARP ------------------------------------------------------------------------------------------------


@register
class NvlsAllReduce(_Table):
    """NVLink SHARP (NCCL's NVLS): the NVSwitch reduces, so every rank sends its buffer to the switch once and
    receives the reduced result once, with no ring steps: (n+1)/n·S out and in per rank; α + (n+1)/n·S/B.

    In NVLS each rank loads its S/n shard through the switch's multicast address, which reads that shard from
    all n ranks and returns the sum (multimem.ld_reduce: S out of every rank, S/n into it), then stores the
    reduced shard once for the switch to copy to all n ranks (multimem.st: S/n out, S in): (n+1)/n·S each way
    on a rank's NVLink (NVIDIA NCCL's NVLS kernels; NCCL's maintainer: NVLS reduce-scatter sends S and
    receives S/n, all-gather sends S/n and receives S). The platform has no NVSwitch endpoint to send to, so
    the schedule carries those bytes over the ranks' own links in one step: every rank sends
    (n+1)/(n(n-1))·S to every other rank, which loads each rank's link with (n+1)/n·S each way as the
    switch's traffic would (on one switch: one transfer time α + (n+1)/n·S/B). NCCL runs it inside one NVLink
    domain of Hopper or later GPUs, when its estimate beats the ring's (:mod:`hcsim.engine.rules`); by name
    it runs on any group, at the link's own factors where the link has no NVLS figures."""

    name, collective = "nvls", "all_reduce"

    def build(self) -> None:
        n = self.ranks
        if n < 2:
            return
        share = (n + 1) * self.size / (n * (n - 1))
        for r in range(n):
            for peer in range(n):
                if peer != r:
                    self.send(0, r, peer, share)


# ---- all-to-all, broadcast, p2p ---------------------------------------------------------------------------------


@register
class PairwiseAllToAll(_Table):
    """Pairwise exchange: in step k (1..n-1) rank r sends S/n to r XOR k (n a power of two; the
    classic MPI schedule: with aligned servers of 2^j ranks, the first 2^j - 1 steps stay inside the
    servers and every later one leaves them, so a step's transfers are all alike) or to r+k mod n
    (other n), and receives from its partner.

    One transfer per link direction per step: (n-1)α + (n-1)/n·S/B. Every step
    differs, so the flow model is the step schedule in lock step.
    """

    name, collective = "pairwise", "all_to_all"

    def build(self) -> None:
        n = self.ranks
        power_of_two = not n & (n - 1)
        for k in range(1, n):
            for r in range(n):
                self.send(k - 1, r, r ^ k if power_of_two else (r + k) % n, self.size / n)


@register
class PipelinedRingBroadcast(_Table):
    """Rank 0 streams S in C chunks down the chain 0 -> 1 -> ... -> n-1.

    Rank i forwards chunk j in step i + j; one transfer per link direction per
    step: (n + C - 2)(α + S/(C·B)). C = ``chunks`` as given, else ceil(S / chunk_bytes)
    between 1 and max_chunks (4 MiB, 32).
    """

    name, collective, pipelined = "ring", "broadcast", True
    chunk_bytes = 4 * 2**20
    max_chunks = 32

    def build(self) -> None:
        n = self.ranks
        self.chunks = c = self.chunks or _chunks(self.size, self.chunk_bytes, self.max_chunks)
        for i in range(n - 1):
            for j in range(c):
                self.send(i + j, i, i + 1, self.size / c)

    def flow_phases(self) -> list[FlowPhase]:
        """One pipeline phase: every hop carries S at once, hop i fed by hop i-1.

        Lock-stepping the fill and drain steps would charge every step the
        slowest hop active in it, while the step model's ranks run ahead of
        slow hops downstream of them: fill + (C-1) x the slowest hop, as the
        pipeline rule of :class:`FlowPhase` gives.
        """
        if self.ranks < 2:
            return []
        hops = tuple(((i, i + 1), self.size) for i in range(self.ranks - 1))
        return [FlowPhase(hops, self.chunks, feeds=((),) + tuple((i,) for i in range(self.ranks - 2)))]


@register
class BinomialTreeBroadcast(_Table):
    """Binomial tree from rank 0: in step k every rank r < 2^k sends S to r + 2^k.

    One transfer per sender per step: ceil(log2 n)·(α + S/B). In flow model
    rank 0's ceil(log2 n) transfers share its link, which gives the same.
    """

    name, collective = "binomial_tree", "broadcast"

    def build(self) -> None:
        n = self.ranks
        for k in range((n - 1).bit_length()):
            for r in range(min(1 << k, n - (1 << k))):
                self.send(k, r, r + (1 << k), self.size)


@register
class DirectTransfer(Algorithm):
    """A point-to-point transfer: rank 0 sends everything to rank 1 in one step: α + S/B."""

    name, collective = "direct", "p2p"

    def steps(self, rank: int) -> int:
        return 1

    def step(self, rank: int, index: int) -> Step:
        return Step(sends=((1, self.size),), recvs=()) if rank == 0 else Step(sends=(), recvs=(0,))

