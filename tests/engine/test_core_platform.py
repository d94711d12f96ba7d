"""The platform the engine core loads (hcsim/engine/core/platform.cpp: one zone routing by a table of the
compiled routes): SimGrid's route of every compiled pair is the graph's route, link for link, in order and
direction, with its latency, on every built-in platform; loading is linear in hosts (one zone, whatever the
fabric)."""

import json
import pickle
import random
import subprocess
import sys

import pytest

from hcsim.platform import build_platform, compile_platform, load_platform_spec, route_latency
from hcsim.platform.compile import simgrid_links
from hcsim.platform.pairs import data_parallel_pairs, hybrid_parallel_pairs
from hcsim.platform.topology import HOST_KINDS, xpus

# SimGrid allows one Engine per process: each platform is loaded in a process of its own.
_ROUTES = """
import json, pickle, resource, sys, time
from hcsim.engine import core
tables, pairs = pickle.load(open(sys.argv[1], "rb"))
start = time.perf_counter()
routes = core.load().platform_routes(tables, pairs)
print(json.dumps({"routes": routes, "seconds": time.perf_counter() - start}))
"""


def core_routes(tmp_path, compiled, pairs):
    """SimGrid's (link names, latency) for each pair on the core's platform, and the seconds it took."""
    data = tmp_path / "platform.pickle"
    data.write_bytes(pickle.dumps((compiled.tables, pairs)))
    done = subprocess.run([sys.executable, "-c", _ROUTES, str(data)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pairs(graph, tp, pp, extra, seed):
    """The hybrid run's pairs, a data-parallel ring with each XPU's memories, and random XPU pairs."""
    rng = random.Random(seed)
    accelerators = xpus(graph)
    pairs = hybrid_parallel_pairs(graph, tp, pp) + data_parallel_pairs(graph)
    pairs += [(rng.choice(accelerators), rng.choice(accelerators)) for _ in range(extra)]
    return sorted(set(pairs) - {(a, a) for a in graph})


@pytest.mark.parametrize("name, count, tp, pp", [
    ("paper-cxl", 64, 8, 2), ("paper-traditional", 64, 4, 4), ("dgx-h100", 64, 8, 2), ("dgx-a100", 1024, 8, 8),
    ("gb200-nvl72", 144, 4, 2), ("gh200", 32, 4, 2), ("cxl-pool", 64, 8, 2)])
def test_simgrid_routes_on_the_core_platform_are_the_graph_routes(tmp_path, name, count, tp, pp):
    graph = build_platform(load_platform_spec(name, {"xpus": count}))
    pairs = _pairs(graph, tp, pp, 80, count)
    compiled = compile_platform(graph, pairs, "bf16")
    result = core_routes(tmp_path, compiled, pairs)
    assert len(result["routes"]) == len(pairs)
    for (src, dst), (links, latency) in zip(pairs, result["routes"]):
        route = compiled.routes[src, dst]
        assert links == simgrid_links(route), (src, dst)
        assert latency == pytest.approx(route_latency(graph, route), rel=1e-12)
    if count == 1024:  # pipeline neighbours a stage apart cross the fabric's upper levels
        assert max(len(route) for route in compiled.routes.values()) >= 11


def test_the_tables_hold_every_host_and_only_the_links_routes_cross():
    graph = build_platform(load_platform_spec("dgx-h100", {"xpus": 16}))
    compiled = compile_platform(graph, [("xpu0", "xpu8"), ("xpu8", "xpu0"), ("xpu0", "xpu0.hbm")], "bf16")
    tables = compiled.tables
    assert tables["hosts"] == sorted(n for n, kind in graph.nodes(data="kind") if kind in HOST_KINDS)
    crossed = {name.rsplit("_", 1)[0] for route in compiled.routes.values() for name in simgrid_links(route)}
    assert tables["links"] == sorted(crossed)
    assert len(tables["route_src"]) == 3 and tables["route_offsets"][-1] == sum(
        len(route) - 1 for route in compiled.routes.values())
    # xpu0 -> xpu0.hbm crosses one link, UP ("xpu0" < "xpu0.hbm"): number 2 x its index
    r = sorted(compiled.routes).index(("xpu0", "xpu0.hbm"))
    first, last = tables["route_offsets"][r], tables["route_offsets"][r + 1]
    assert list(tables["route_links"][first:last]) == [2 * tables["links"].index("xpu0--xpu0.hbm")]


def test_a_dgx_fat_tree_of_16384_gpus_loads_in_one_zone_in_seconds(tmp_path):
    """The rail-optimised fabric that made one SimGrid zone per GPU (18,433 zones at 16,384 GPUs, 474 s and
    3.2 GB to load): every host in one table zone, loaded with a sample of its pipeline and ring routes."""
    graph = build_platform(load_platform_spec("dgx-h100", {"xpus": 16384}))
    ranks = xpus(graph)
    pairs = [(ranks[i], ranks[i + 8192]) for i in range(0, 8192, 97)] + [(x, f"{x}.hbm") for x in ranks[::50]]
    compiled = compile_platform(graph, pairs, "bf16")
    result = core_routes(tmp_path, compiled, pairs)
    assert result["seconds"] < 20
    for (src, dst), (links, _) in zip(pairs, result["routes"]):
        assert links == simgrid_links(compiled.routes[src, dst]) and len(links) == (1 if dst.endswith(".hbm") else 10)
