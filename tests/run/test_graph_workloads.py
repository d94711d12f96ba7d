"""A scenario's workload may be a graph: a node-link JSON file (as `hcsim workload export` writes) or a Chakra
trace (`chakra:PREFIX`). It gets every result, trace and report a spec-built workload gets.

Simulations run in subprocesses (SimGrid: one engine per process).
"""

import json
import subprocess
import sys

import pytest

from hcsim.errors import ConfigError, WorkloadError
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload, save_workload
from hcsim.workload.sources import graph_xpus, place_graph


def hcsim(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_an_exported_graph_runs_as_the_spec_it_came_from(tmp_path):
    spec = ["--set", "xpus=8", "--set", "granularity=decoder"]
    done = hcsim("workload", "export", "llama2-13b", "--xpus", "8", "--device", "H100", "-o", "graph.json",
                 "--set", "granularity=decoder", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    from_graph = hcsim("simulate", "--set", "workload=graph.json", "--set", "xpus=8", "--json", "--out", "run",
                       cwd=tmp_path)
    assert from_graph.returncode == 0, from_graph.stderr
    from_spec = hcsim("simulate", *spec, "--json", cwd=tmp_path)
    assert from_spec.returncode == 0, from_spec.stderr
    graph, built = json.loads(from_graph.stdout), json.loads(from_spec.stdout)
    assert graph.keys() == built.keys()
    for key in ("iteration_times_s", "batches_per_s", "breakdown", "links", "activities", "xpus", "devices"):
        assert graph[key] == built[key], key
    assert graph["inputs_hash"].count("+") == 1 and "+" not in built["inputs_hash"]  # the graph file's hash too
    for name in ("result.json", "links.csv", "trace.csv", "trace.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0


def test_a_chakra_trace_runs_from_a_scenario(tmp_path):
    """Two ranks of paper-traditional's first server (one XPU switch: 900 GB/s, 100 ns links): compute 1 ms, ring
    all-reduce of 90 MB, compute 0.5 ms: 1.5 ms + 2α + S/B per iteration."""
    from hcsim.workload.chakra import NODE_TYPES, Node, attribute, write_trace

    comp, coll = NODE_TYPES["COMP_NODE"], NODE_TYPES["COMM_COLL_NODE"]
    sizes = [attribute("comm_type", int64_val=0), attribute("comm_size", int64_val=90_000_000)]  # 0: ALL_REDUCE
    for rank in range(2):
        write_trace(tmp_path / f"t.{rank}.et", [Node(id=0, type=comp, duration_micros=1000),
                                                Node(id=1, type=coll, data_deps=[0], attr=sizes),
                                                Node(id=2, type=comp, duration_micros=500, data_deps=[1])])
    (tmp_path / "s.yaml").write_text("platform: paper-traditional\nworkload: chakra:t\nxpus: 2\n")
    done = hcsim("simulate", "s.yaml", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    expected = 1.5e-3 + 2 * 200e-9 + 90e6 / 900e9
    assert result["xpus"] == 2 and result["iteration_time_s"] == pytest.approx(expected, rel=1e-9)
    assert result["breakdown"]["H100"]["compute_s"] == pytest.approx(1.5e-3, rel=1e-9)


def _graph(xpus):
    graph = new_workload("g")
    add_compute(graph, "c", xpus=xpus, flops=1e9, start=True)
    add_comm(graph, "ar", xpus=xpus, bytes=1e6, collective="all_reduce")
    add_dependency(graph, "c", "ar")
    return graph


def test_graph_xpus_map_onto_the_platform_in_order_or_are_checked():
    platform = ["xpu0", "xpu1", "xpu2", "xpu3"]
    graph = _graph(["n10", "n2", "n1"])
    graph.nodes["c"]["spilled_xpus"] = frozenset({"n10"})
    placed, used = place_graph(graph, platform)
    assert used == ["xpu0", "xpu1", "xpu2"]  # n1, n2, n10 in natural order
    assert placed.nodes["c"]["xpus"] == ("xpu2", "xpu1", "xpu0") and placed.nodes["c"]["spilled_xpus"] == {"xpu2"}
    assert placed.nodes["c"]["xpus"] is placed.nodes["ar"]["xpus"]  # equal groups stay shared
    assert graph_xpus(graph) == ["n1", "n2", "n10"]  # the input is not changed
    same, used = place_graph(_graph(["xpu3", "xpu1"]), platform)
    assert same.nodes["c"]["xpus"] == ("xpu3", "xpu1") and used == ["xpu1", "xpu3"]
    with pytest.raises(ConfigError, match=r"the graph runs on 5 XPUs \(a0 .. a4\) but the run has 4; fix: set xpus: 5"):
        place_graph(_graph([f"a{i}" for i in range(5)]), platform)


def test_graph_workload_errors_name_the_key_or_the_file(tmp_path):
    save_workload(_graph(["a", "b"]), tmp_path / "g.json")
    scenario = load_scenario(None, {"workload": str(tmp_path / "g.json"), "xpus": 8, "granularity": "layer"})
    with pytest.raises(ConfigError, match=r"granularity: applies to workload specs only"):
        prepare(scenario)
    prepared = prepare(load_scenario(None, {"workload": str(tmp_path / "g.json"), "xpus": 8, "collective": "hierarchical",
                                            "collective_chunks": 3}))
    assert prepared.xpus == ["xpu0", "xpu1"]
    assert prepared.workload.nodes["ar"]["algorithm"] == "hierarchical" and prepared.workload.nodes["ar"]["chunks"] == 3
    broken = json.loads((tmp_path / "g.json").read_text())
    next(n for n in broken["nodes"] if n["id"] == "c")["flops"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(broken))
    with pytest.raises(WorkloadError, match=r"vertex 'c': flops must be a finite number >= 0"):
        prepare(load_scenario(None, {"workload": str(tmp_path / "bad.json"), "xpus": 8}))
    with pytest.raises(ConfigError, match=r"no such graph file"):
        prepare(load_scenario(None, {"workload": str(tmp_path / "none.json"), "xpus": 8}))
