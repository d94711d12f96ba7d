"""Execution traces: every vertex run and transfer of the traced XPUs.

Written as CSV (one row per vertex run: iteration, xpu, vertex, kind, start,
end) and as Chrome trace-event JSON that Perfetto opens: a process per
server, a thread (track) per XPU for its vertices, and tracks for its memory
traffic and its communication. Times in the JSON are microseconds. With a
pipeline-parallel workload (vertices with ``micro_batch`` and ``step``), each
traced XPU also gets a schedule track above its vertices: one slice per pass of
a micro-batch ("mb3 F", "mb3 B", "mb3 W"; "c1" for a later virtual stage) from
its first vertex's start to its last vertex's end, so the pipeline schedule
(GPipe, 1F1B, interleaved, ZB-H1) reads at a glance.

With representative XPUs a traced follower runs no memory traffic of its own:
its representative is recorded too, and the follower's memory track shows the
representative's reads and copies (which it follows in lockstep) from the
follower's own memories.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import networkx as nx

__all__ = ["TraceRecorder"]


class TraceRecorder:
    """Collects the events of the XPUs in `xpus` (and `iterations`, when given)."""

    def __init__(self, xpus: frozenset[str] | str, iterations: frozenset[int] | None = None):
        """`xpus`: the XPUs to trace, or "per-class": the representative of each class of alike XPUs."""
        self.per_class = xpus == "per-class"
        self.xpus = frozenset() if self.per_class else xpus
        self.iterations = iterations
        self.recorded = set(self.xpus)  # the traced XPUs and the representatives they follow
        self.followers: dict[str, str] = {}  # traced follower -> its representative
        self.vertices: list[tuple[int, str, str, str, float, float]] = []
        self.transfers: list[tuple[int, str, str, str, float, float, float]] = []

    def follow(self, representative: dict[str, str], xpus: list[str]) -> None:
        """Record also the representatives of the traced followers (`representative`: follower -> the XPU
        it follows; `xpus`: every XPU of the run)."""
        if self.per_class:
            self.xpus = frozenset(x for x in xpus if x not in representative)
            self.recorded = set(self.xpus)
        self.followers = {x: r for x, r in representative.items() if x in self.xpus}
        self.recorded.update(self.followers.values())

    def wants(self, xpu: str, run: int) -> bool:
        return xpu in self.recorded and (self.iterations is None or run in self.iterations)

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

    def write_perfetto(self, path: Path, platform: nx.Graph, workload: nx.DiGraph | None = None) -> None:
        """Chrome trace-event JSON: pid per server, tid per XPU track (and schedule tracks, see the module)."""
        events, pids, tids = [], {}, {}

        def track(xpu: str, lane: str) -> tuple[int, int]:
            server = str(platform.nodes[xpu].get("server", "system"))
            if server not in pids:
                pids[server] = len(pids) + 1
                events.append({"ph": "M", "name": "process_name", "pid": pids[server], "args": {"name": server}})
            key = (xpu, lane)
            if key not in tids:
                tids[key] = len(tids) + 1
                label = xpu if lane == "vertices" else f"{xpu} {lane}"
                if lane == "schedule":
                    label = f"{xpu} schedule (stage {stage_of[xpu]})"
                events.append({"ph": "M", "name": "thread_name", "pid": pids[server], "tid": tids[key],
                               "args": {"name": label}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pids[server], "tid": tids[key],
                               "args": {"sort_index": tids[key]}})
            return pids[server], tids[key]

        passes = self._passes(workload) if workload is not None else {}
        stage_of = {xpu: stage for (_, xpu, stage, *_) in passes}
        for (run, xpu, stage, chunk, micro_batch, step), (start, end) in passes.items():
            pid, tid = track(xpu, "schedule")
            label = f"mb{micro_batch} {step}" + (f" c{chunk}" if chunk else "")
            events.append({"ph": "X", "name": label, "cat": "schedule", "pid": pid, "tid": tid, "ts": start * 1e6,
                           "dur": (end - start) * 1e6, "args": {"iteration": run, "stage": stage, "chunk": chunk,
                                                                "micro_batch": micro_batch, "pass": step}})
        for run, xpu, name, kind, start, end in self.vertices:
            if xpu not in self.xpus:
                continue
            pid, tid = track(xpu, "vertices")
            events.append({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid, "ts": start * 1e6,
                           "dur": (end - start) * 1e6, "args": {"iteration": run}})
        followed_by: dict[str, list[str]] = {}
        for follower, rep in sorted(self.followers.items()):
            followed_by.setdefault(rep, []).append(follower)
        nodes = platform.nodes
        for run, src, dst, label, size, start, end in self.transfers:
            memory = nodes[src].get("kind") == "memory"
            xpu = dst if memory else src
            shown = [(xpu, src, {})] if xpu in self.xpus else []
            if memory:  # followers: the representative's read, from their own memory of the same role
                roles = {nodes[xpu][k]: k for k in ("local_memory", "extended_memory") if nodes[xpu].get(k)}
                shown += [(f, nodes[f][roles[src]], {"follows": xpu}) for f in followed_by.get(xpu, ())
                          if src in roles]
            for owner, source, extra in shown:
                pid, tid = track(owner, "memory" if memory else "comm")
                events.append({"ph": "X", "name": label, "cat": "memory-traffic" if memory else "network", "pid": pid,
                               "tid": tid, "ts": start * 1e6, "dur": (end - start) * 1e6,
                               "args": {"iteration": run, "src": source, "dst": owner if memory else dst,
                                        "bytes": size, **extra}})
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))

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
