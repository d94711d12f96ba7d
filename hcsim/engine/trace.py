"""Execution traces: every vertex run and transfer of the traced XPUs.

Written as CSV (one row per vertex run: iteration, xpu, vertex, kind, start,
end) and as Chrome trace-event JSON that Perfetto opens: a process per
server, a thread (track) per XPU for its vertices, and tracks for its memory
traffic and its communication. Times in the JSON are microseconds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import networkx as nx

__all__ = ["TraceRecorder"]


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
            writer.writerows((r, x, n, k, repr(s), repr(e)) for r, x, n, k, s, e in self.vertices)

    def write_perfetto(self, path: Path, platform: nx.Graph) -> None:
        """Chrome trace-event JSON: pid per server, tid per XPU track."""
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
                events.append({"ph": "M", "name": "thread_name", "pid": pids[server], "tid": tids[key],
                               "args": {"name": label}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pids[server], "tid": tids[key],
                               "args": {"sort_index": tids[key]}})
            return pids[server], tids[key]

        for run, xpu, name, kind, start, end in self.vertices:
            pid, tid = track(xpu, "vertices")
            events.append({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid, "ts": start * 1e6,
                           "dur": (end - start) * 1e6, "args": {"iteration": run}})
        for run, src, dst, label, size, start, end in self.transfers:
            memory = platform.nodes[src].get("kind") == "memory"
            xpu = dst if memory else src
            if xpu not in self.xpus:
                continue
            pid, tid = track(xpu, "memory" if memory else "comm")
            events.append({"ph": "X", "name": label, "cat": "memory-traffic" if memory else "network", "pid": pid, "tid": tid,
                           "ts": start * 1e6, "dur": (end - start) * 1e6,
                           "args": {"iteration": run, "src": src, "dst": dst, "bytes": size}})
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
