"""Execution traces: every vertex run and transfer of the traced XPUs.

Written as CSV (one row per vertex run: iteration, xpu, vertex, kind, start,
end) and as Chrome trace-event JSON that Perfetto opens: a process per server
and, per traced XPU, a group of tracks (threads), in this order:

``XPU schedule (stage s)``
    with a pipeline-parallel workload (vertices with ``micro_batch`` and
    ``step``): one slice per pass of a micro-batch ("mb3 F", "mb3 B", "mb3 W";
    "c1" for a later virtual stage) from its first vertex's start to its last
    vertex's end, so the pipeline schedule (GPipe, 1F1B, interleaved, ZB-H1)
    reads at a glance;
``XPU compute``
    its compute vertices (args: ``flops``, ``memory_bytes``); offload copies
    and optimizer steps on the host CPU go to ``XPU offload`` instead;
``XPU comm KIND``
    its part of each collective and p2p vertex, per kind of communication
    (tp, cp, pp, dp, ep, offload, other: :data:`hcsim.engine.api.COMM_KINDS`;
    args: ``bytes``, the buffer each rank contributes);
``XPU sends KIND``
    the transfers it sends for those collectives (args: ``bytes``, ``dst``);
``XPU memory``
    its memory traffic: reads, copies and offload moves (args: ``bytes``,
    ``src``).

The trace-event format needs the slices of one track to nest, and overlapping
work does not (a gradient all-reduce beside the backward pass, two transfers
of a ring at once). So slices that overlap in time never share a track: each
kind above is packed greedily, in start order, into as few tracks as keep its
slices disjoint, the extra ones named ``... #2``, ``... #3``. Times are
microseconds on a grid of 1/1024 us (about a nanosecond): such values are
exact in binary, so a viewer that adds ``ts + dur`` (catapult) or truncates
each to integer nanoseconds (Perfetto's JSON importer) finds a slice ending
no later than the next one on its track begins.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import networkx as nx

from hcsim.engine.options import COMM_KIND, COMM_KINDS

__all__ = ["TraceRecorder", "TRACE_WARN_BYTES", "pack_lanes"]

TRACE_WARN_BYTES = 50e6  # a trace.json beyond this loads slowly in Perfetto's web UI: the run warns
_TICKS_PER_US = 1024  # the time grid of trace.json (module docstring)


def pack_lanes(spans: list[tuple[int, int]]) -> list[int]:
    """The lane of each (start, end) span such that the spans of a lane do not overlap (end == start is not an
    overlap): greedy in start order, the lowest free lane first.

    >>> pack_lanes([(0, 10), (5, 15), (10, 20), (15, 16)])
    [0, 1, 0, 1]
    """
    ends: list[int] = []  # each lane's last end
    lanes = [0] * len(spans)
    for index in sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1], i)):
        start, end = spans[index]
        lane = next((k for k, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lanes[index] = lane
    return lanes


def _tick(seconds: float) -> int:
    return round(seconds * 1e6 * _TICKS_PER_US)


def _natural(name: str) -> tuple:
    """xpu2 before xpu10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class TraceRecorder:
    """Collects the events of the XPUs in `xpus` (and `iterations`, when given)."""

    def __init__(self, xpus: frozenset[str], iterations: frozenset[int] | None = None):
        self.xpus = xpus
        self.iterations = iterations
        self.vertices: list[tuple[int, str, str, str, float, float]] = []
        self.transfers: list[tuple[int, str, str, str, float, float, float]] = []

    def wants(self, xpu: str, run: int) -> bool:
        return xpu in self.xpus and (self.iterations is None or run in self.iterations)

    def vertex(self, run: int, xpu: str, name: str, kind: str, start: float, end: float) -> None:
        if self.wants(xpu, run):
            self.vertices.append((run, xpu, name, kind, start, end))

    def transfer(self, run: int, src: str, dst: str, label: str, size: float, start: float, end: float) -> None:
        self.transfers.append((run, src, dst, label, size, start, end))

    def write_csv(self, path: Path) -> None:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["iteration", "xpu", "vertex", "kind", "start_s", "end_s"])
            writer.writerows((r, x, n, k, repr(s), repr(e)) for r, x, n, k, s, e in self.vertices if x in self.xpus)

    def write_perfetto(self, path: Path, platform: nx.Graph, workload: nx.DiGraph | None = None) -> int:
        """Chrome trace-event JSON (see the module): pid per server, tracks per traced XPU. Returns its bytes."""
        text = json.dumps({"traceEvents": self.perfetto_events(platform, workload)}, separators=(",", ":"))
        Path(path).write_text(text)
        return len(text)

    def perfetto_events(self, platform: nx.Graph, workload: nx.DiGraph | None = None) -> list[dict]:
        """The trace events of :meth:`write_perfetto`: metadata (process and track names) first, then slices."""

        vertex_data = workload.nodes if workload is not None else {}
        slices: dict[tuple[str, str], list[tuple[int, int, dict]]] = {}  # (xpu, track) -> (start, end, event)

        def add(xpu: str, track: str, start: float, end: float, event: dict) -> None:
            slices.setdefault((xpu, track), []).append((_tick(start), _tick(end), event))

        passes = self._passes(workload) if workload is not None else {}
        stage_of = {xpu: stage for (_, xpu, stage, *_) in passes}
        for (run, xpu, stage, chunk, micro_batch, step), (start, end) in passes.items():
            label = f"mb{micro_batch} {step}" + (f" c{chunk}" if chunk else "")
            add(xpu, "schedule", start, end, {"name": label, "cat": "schedule", "args": {
                "iteration": run, "stage": stage, "chunk": chunk, "micro_batch": micro_batch, "pass": step}})
        kind_of: dict[str, str] = {}  # a communication vertex -> its kind
        for run, xpu, name, kind, start, end in self.vertices:
            if xpu not in self.xpus:
                continue
            data = vertex_data[name] if name in vertex_data else {}
            args = {"iteration": run}
            if kind == "compute":
                track = "offload" if data.get("move") or data.get("host") == "cpu" else "compute"
                args.update(flops=data.get("flops", 0.0), memory_bytes=data.get("memory_bytes", 0.0))
            else:
                track = f"comm {kind_of.setdefault(name, COMM_KIND.get(data.get('phase'), 'other'))}"
                args.update(bytes=data.get("bytes", 0.0), collective=data.get("collective"))
            add(xpu, track, start, end, {"name": name, "cat": kind, "args": args})
        nodes = platform.nodes
        for run, src, dst, label, size, start, end in self.transfers:
            memory = nodes[src].get("kind") == "memory"
            xpu = dst if memory else src
            if xpu not in self.xpus:
                continue
            if memory:
                track, args = "memory", {"src": src, "dst": xpu}
            else:
                kind = kind_of.get(label) or COMM_KIND.get(vertex_data[label].get("phase") if label in vertex_data
                                                           else None, "other")
                track, args = f"sends {kind}", {"src": src, "dst": dst}
            add(xpu, track, start, end, {"name": label, "cat": "memory-traffic" if memory else "network",
                                         "args": {"iteration": run, **args, "bytes": size}})
        return self._layout(slices, platform, stage_of)

    @staticmethod
    def _layout(slices, platform: nx.Graph, stage_of: dict[str, int]) -> list[dict]:
        """Tracks (threads) for `slices`, each kind split into as many as keep its slices disjoint; metadata
        first, tracks in a fixed order per XPU (module docstring)."""
        order = {"schedule": 0, "compute": 1, "offload": 2, "memory": 3 + 2 * len(COMM_KINDS)}
        for i, kind in enumerate(COMM_KINDS):
            order[f"comm {kind}"], order[f"sends {kind}"] = 3 + i, 3 + len(COMM_KINDS) + i
        meta, events, pids = [], [], {}
        tid = 0
        for xpu, track in sorted(slices, key=lambda k: (_natural(k[0]), order.get(k[1], 99), k[1])):
            server = str(platform.nodes[xpu].get("server", "system"))
            if server not in pids:
                pids[server] = len(pids) + 1
                meta.append({"ph": "M", "name": "process_name", "pid": pids[server], "args": {"name": server}})
            spans = slices[xpu, track]
            lanes = pack_lanes([(start, end) for start, end, _ in spans])
            first = tid + 1
            title = f"{xpu} schedule (stage {stage_of[xpu]})" if track == "schedule" else f"{xpu} {track}"
            for lane in range(max(lanes) + 1):
                tid += 1
                name = title if lane == 0 else f"{title} #{lane + 1}"
                meta.append({"ph": "M", "name": "thread_name", "pid": pids[server], "tid": tid, "args": {"name": name}})
                meta.append({"ph": "M", "name": "thread_sort_index", "pid": pids[server], "tid": tid,
                             "args": {"sort_index": tid}})
            for (start, end, event), lane in zip(spans, lanes):
                events.append({"ph": "X", **event, "pid": pids[server], "tid": first + lane,
                               "ts": start / _TICKS_PER_US, "dur": (end - start) / _TICKS_PER_US})
        return meta + events

    def _passes(self, workload: nx.DiGraph) -> dict[tuple, list[float]]:
        """(iteration, xpu, stage, chunk, micro-batch, pass) -> [first start, last end] of the traced XPUs'
        compute vertices that belong to a pipeline pass, in the order the passes begin."""
        nodes = workload.nodes
        passes: dict[tuple, list[float]] = {}
        for run, xpu, name, kind, start, end in sorted(self.vertices, key=lambda v: v[4]):
            data = nodes[name] if xpu in self.xpus and kind == "compute" else {}
            if "step" not in data:
                continue
            key = (run, xpu, data["stage"], data["chunk"], data["micro_batch"], data["step"])
            span = passes.setdefault(key, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        return passes
