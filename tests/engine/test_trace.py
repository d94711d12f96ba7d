"""Traces Perfetto draws as they are: no two slices of a track overlap without nesting, in several kinds of run.

Each run goes through ``hcsim simulate`` in a subprocess (SimGrid: one engine per process).
"""

import collections
import csv
import json
import logging
import subprocess
import sys

import pytest

from hcsim.engine import trace as trace_module
from hcsim.engine.trace import TraceRecorder, pack_lanes

HYBRID = ["--set", "workload=llama2-13b-shape", "--set", "xpus=16", "--set", "tp=2", "--set", "pp=2",
          "--set", "global_batch=8", "--set", "micro_batch=1", "--set", "compute_model=peak"]  # written for it
RUNS = {
    "data parallel": ["--set", "xpus=8", "--set", "iterations=2"],
    "tp2 pp2 1f1b": [*HYBRID, "--set", "iterations=2"],
    "tp2 pp2 zb-h1, ZeRO-3": [*HYBRID, "--set", "schedule=zb-h1", "--set", "zero=3", "--set", "iterations=1"],
    "interleaved, mixed, cpu offload": [
        *HYBRID, "--set", "schedule=interleaved", "--set", "virtual_stages=2", "--set", "devices=[H100,A100]",
        "--set", "platform_overrides.rack.servers=1", "--set", "zero=1",
        "--set", "offload=cpu", "--set", "platform=paper-traditional",
        "--set", "platform_overrides.server.cpu_flops=2TFLOPS", "--set", "iterations=1"],
}


def partial_overlaps(events: list[dict]) -> list[tuple]:
    """Pairs of slices of one track that overlap without one holding the other, in integer nanoseconds read
    as Perfetto's JSON importer reads them (ts and dur each x 1000, truncated)."""
    tracks = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            start = int(e["ts"] * 1000)
            tracks[e["pid"], e["tid"]].append((start, start + int(e["dur"] * 1000), e["name"]))
    found = []
    for spans in tracks.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ = []
        for span in spans:
            while open_ and open_[-1][1] <= span[0]:
                open_.pop()
            if open_ and span[1] > open_[-1][1]:
                found.append((open_[-1], span))
            open_.append(span)
    return found


def hcsim(*args):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module", params=list(RUNS))
def traced_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    done = hcsim("simulate", *RUNS[request.param], "--out", str(out))
    assert done.returncode == 0, done.stderr
    return request.param, json.loads((out / "trace.json").read_text())["traceEvents"], out


def test_no_track_has_slices_that_overlap_without_nesting(traced_run):
    name, events, _ = traced_run
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and partial_overlaps(events) == [], name
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {names[e["pid"], e["tid"]].split(" #")[0].split(" ", 1)[1] for e in slices} >= {"compute", "memory"}
    for e in slices:  # FLOPs on compute slices, bytes on communication and memory ones
        assert ("flops" in e["args"]) == (e["cat"] == "compute")
        assert "bytes" in e["args"] or e["cat"] in ("compute", "schedule")


def test_the_checker_finds_what_the_former_single_track_layout_drew():
    """A collective beside a compute slice on one track, as before: the check sees it."""
    events = [{"ph": "X", "pid": 1, "tid": 1, "name": "fwd", "ts": 0.0, "dur": 10.0},
              {"ph": "X", "pid": 1, "tid": 1, "name": "all_reduce", "ts": 5.0, "dur": 10.0},
              {"ph": "X", "pid": 1, "tid": 1, "name": "nested", "ts": 6.0, "dur": 2.0}]
    assert [(a[2], b[2]) for a, b in partial_overlaps(events)] == [("fwd", "all_reduce")]


@pytest.mark.parametrize("traced_run", [name for name in RUNS if name.startswith("tp2")], indirect=True)
def test_hybrid_runs_put_communication_on_tracks_of_their_kind(traced_run):
    _, events, _ = traced_run
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"xpu0 comm tp", "xpu0 comm pp", "xpu0 comm dp", "xpu0 sends tp", "xpu0 memory"} <= names
    assert all(" comm " not in n or n.split(" comm ")[1].split(" #")[0] in ("tp", "cp", "pp", "dp", "ep", "offload",
                                                                           "other") for n in names)


def test_lanes_hold_disjoint_spans_and_touching_ones_share_a_lane():
    spans = [(0, 10), (10, 20), (5, 12), (12, 30), (12, 12)]
    lanes = pack_lanes(spans)
    assert lanes[:2] == [0, 0] and max(lanes) == 1
    for lane in set(lanes):
        mine = sorted(s for s, k in zip(spans, lanes) if k == lane)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))


def test_times_sit_on_a_grid_exact_in_binary():
    """ts + dur of one slice is exactly the next slice's ts when they touch (1/1024 us grid)."""
    recorder = TraceRecorder(frozenset({"x"}))
    recorder.vertex(1, "x", "a", "compute", 0.1e-6, 1.0000003)
    recorder.vertex(1, "x", "b", "compute", 1.0000003, 2.7)
    import networkx as nx

    platform = nx.Graph()
    platform.add_node("x", kind="xpu", server="s0")
    a, b = (e for e in recorder.perfetto_events(platform) if e["ph"] == "X")
    assert a["tid"] == b["tid"] and a["ts"] + a["dur"] == b["ts"]
    assert int(a["ts"] * 1000) + int(a["dur"] * 1000) <= int(b["ts"] * 1000)


@pytest.mark.parametrize("settings, expected", [
    (HYBRID, {"xpu0", "xpu8"}),  # one per pipeline stage (tp 2 x dp 4 XPUs per stage)
    (["--set", "xpus=16", "--set", "devices=[H100,A100]", "--set", "platform_overrides.rack.servers=1"],
     {"xpu0", "xpu8"}),  # no pipeline: one per device type
])
def test_the_default_traces_one_xpu_per_stage_and_device_type(tmp_path, settings, expected):
    done = hcsim("simulate", *settings, "--set", "iterations=1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "trace.csv") as handle:
        assert {r["xpu"] for r in csv.DictReader(handle)} == expected


def test_a_large_trace_warns_and_says_how_to_narrow_it(tmp_path, monkeypatch, caplog):
    from hcsim.run.report import _warn_of_a_large_trace

    monkeypatch.setattr(trace_module, "TRACE_WARN_BYTES", 1000)
    recorder = TraceRecorder(frozenset({"xpu0", "xpu8"}))
    with caplog.at_level(logging.WARNING):
        _warn_of_a_large_trace(tmp_path / "trace.json", 3_000_000, recorder, {"iteration_times_s": [1.0, 1.0]})
    assert "3 MB (2 XPUs traced over 2 iterations)" in caplog.text
    assert "trace_xpus=[xpu0]" in caplog.text and "trace_iterations=[2]" in caplog.text
    caplog.clear()
    _warn_of_a_large_trace(tmp_path / "trace.json", 999, recorder, {"iteration_times_s": [1.0]})
    assert not caplog.text
