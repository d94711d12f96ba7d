"""How the platform layer scales: build, compile, XML size, SimGrid load time and peak memory, 64..131,072 XPUs.

Usage: python benchmarks/platform_scale.py [--sizes 64 256 1024 4096] [--specs paper-cxl paper-traditional]
                                           [--pairs data-parallel|hybrid] [--tp 8] [--pp 8] [--no-load]
                                           [--form xml|core]

Each size is compiled, in a process of its own, for the host pairs of a
data-parallel run (every XPU with its HBM and its extended memory, and a ring
over all XPUs, both directions) or of a hybrid-parallel run
(:func:`hcsim.platform.pairs.hybrid_parallel_pairs`: memory pairs, every pair
inside a TP group of --tp, pipeline neighbours of --pp stages and a ring over
each DP group); the XML is then loaded in SimGrid (CM02, root zone sealed,
every compiled route resolved once) in another process, as SimGrid allows one
Engine per process (--no-load skips it). Peak memory is each process's
maximum resident set size.

``--form core`` measures what runs load instead (:attr:`hcsim.platform.CompiledPlatform.tables`, one zone
routing by a table in hcsim's engine core): compile = routes and tables, no XML; load = the engine started,
the platform built and sealed and every compiled route resolved once (``core.platform_routes``).

DGX clusters: python benchmarks/platform_scale.py --specs dgx-h100 dgx-a100 --sizes 1024 4096 16384 --pairs hybrid
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


def compile_one(spec_name: str, count: int, output: str, pairs_kind: str = "data-parallel", tp: int = 8,
                pp: int = 8, form: str = "xml") -> dict:
    from hcsim.platform import build_platform, compile_platform, load_platform_spec
    from hcsim.platform.pairs import data_parallel_pairs, hybrid_parallel_pairs

    start = time.perf_counter()
    graph = build_platform(load_platform_spec(spec_name, {"xpus": count}))
    built = time.perf_counter()
    pairs = data_parallel_pairs(graph) if pairs_kind == "data-parallel" else hybrid_parallel_pairs(graph, tp, pp)
    compiled = compile_platform(graph, pairs)
    if form == "core":
        tables = compiled.tables
        done = time.perf_counter()
        Path(output).write_bytes(pickle.dumps((tables, sorted(compiled.routes))))
        return {"build_s": built - start, "compile_s": done - built, "xml_bytes": math.nan,
                "routes": len(compiled.routes), "zones": 1, "compile_peak_rss": _peak_rss()}
    Path(output).write_text(compiled.xml)
    done = time.perf_counter()
    Path(output + ".pairs.json").write_text(json.dumps(sorted(compiled.routes)))
    return {"build_s": built - start, "compile_s": done - built, "xml_bytes": len(compiled.xml.encode()),
            "routes": len(compiled.routes), "zones": len(set(compiled.pods.values())), "compile_peak_rss": _peak_rss()}


def load_one_core(platform: str) -> dict:
    from hcsim.engine import core

    tables, pairs = pickle.loads(Path(platform).read_bytes())
    start = time.perf_counter()
    core.load().platform_routes(tables, pairs)
    return {"load_s": time.perf_counter() - start, "hosts": len(tables["hosts"]), "load_peak_rss": _peak_rss()}


def load_one(platform: str) -> dict:
    from hcsim.engine.simgrid_loader import load

    simgrid = load()
    engine = simgrid.Engine(["platform_scale", "--log=root.thres:warning"])
    for setting in ("network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"):
        engine.set_config(setting)
    start = time.perf_counter()
    engine.load_platform(platform)
    engine.netzone_root.seal()
    loaded = time.perf_counter()
    pairs = json.loads(Path(platform + ".pairs.json").read_text())
    hosts = {host.name: host for host in engine.all_hosts}  # as the backend does: Host.by_name is O(zones)
    for src, dst in pairs:
        hosts[src].route_to(hosts[dst])
    return {"load_s": loaded - start, "resolve_all_s": time.perf_counter() - loaded, "hosts": len(hosts),
            "load_peak_rss": _peak_rss()}


def _child(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--specs", nargs="+", default=["paper-cxl", "paper-traditional"])
    parser.add_argument("--pairs", choices=("data-parallel", "hybrid"), default="data-parallel")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel group size (--pairs hybrid)")
    parser.add_argument("--pp", type=int, default=8, help="pipeline stages (--pairs hybrid)")
    parser.add_argument("--no-load", action="store_true", help="compile only; do not load the XML in SimGrid")
    parser.add_argument("--form", choices=("xml", "core"), default="xml",
                        help="the XML file (SimGrid's zones) or the engine core's tables (one table zone)")
    parser.add_argument("--compile-one", nargs=7, metavar=("SPEC", "XPUS", "OUT", "PAIRS", "TP", "PP", "FORM"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--load-one", metavar="XML", help=argparse.SUPPRESS)
    parser.add_argument("--load-one-core", metavar="TABLES", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_one:
        spec, count, out, pairs, tp, pp, form = args.compile_one
        print(json.dumps(compile_one(spec, int(count), out, pairs, int(tp), int(pp), form)))
        return 0
    if args.load_one:
        print(json.dumps(load_one(args.load_one)))
        return 0
    if args.load_one_core:
        print(json.dumps(load_one_core(args.load_one_core)))
        return 0
    header = (f"{'spec':<18} {'XPUs':>5} {'hosts':>6} {'routes':>7} {'zones':>5} {'build':>7} {'compile':>8} "
              f"{'XML':>8} {'peak':>8} {'load':>7} {'peak':>8}")
    print(header)
    print(f"{'':<18} {'':>5} {'':>6} {'':>7} {'':>5} {'s':>7} {'s':>8} {'MB':>8} {'MB':>8} {'s':>7} {'MB':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for spec in args.specs:
            for count in args.sizes:
                output = str(Path(folder) / f"{spec}-{count}.{args.form}")
                built = _child("--compile-one", spec, str(count), output, args.pairs, str(args.tp), str(args.pp),
                               args.form)
                loaded = ({"hosts": "-", "load_s": math.nan, "load_peak_rss": math.nan} if args.no_load
                          else _child("--load-one-core" if args.form == "core" else "--load-one", output))
                print(f"{spec:<18} {count:>5} {loaded['hosts']:>6} {built['routes']:>7} {built['zones']:>5} "
                      f"{built['build_s']:>7.2f} {built['compile_s']:>8.2f} {built['xml_bytes'] / 1e6:>8.1f} "
                      f"{built['compile_peak_rss'] / 1e6:>8.0f} {loaded['load_s']:>7.2f} "
                      f"{loaded['load_peak_rss'] / 1e6:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
