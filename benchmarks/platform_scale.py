"""How the platform layer scales: build, compile, XML size, SimGrid load time and peak memory, 64..4096 XPUs.

Usage: python benchmarks/platform_scale.py [--sizes 64 256 1024 4096] [--specs paper-cxl paper-traditional]

Each size is compiled for the host pairs of a data-parallel run (every XPU
with its HBM and its extended memory, and a ring over all XPUs, both
directions), in a process of its own; the XML is then loaded in SimGrid (CM02,
root zone sealed, every compiled route resolved once) in another process, as
SimGrid allows one Engine per process. Peak memory is each process's maximum
resident set size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


def compile_one(spec_name: str, count: int, output: str) -> dict:
    from hcsim.platform import build_platform, load_platform_spec, write_platform
    from hcsim.platform.pairs import data_parallel_pairs

    start = time.perf_counter()
    graph = build_platform(load_platform_spec(spec_name, {"xpus": count}))
    built = time.perf_counter()
    pairs = data_parallel_pairs(graph)
    compiled = write_platform(graph, pairs, output)
    done = time.perf_counter()
    Path(output + ".pairs.json").write_text(json.dumps(sorted(compiled.routes)))
    return {"build_s": built - start, "compile_s": done - built, "xml_bytes": len(compiled.xml.encode()),
            "routes": len(compiled.routes), "zones": len(set(compiled.pods.values())), "compile_peak_rss": _peak_rss()}


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
    for src, dst in pairs:
        simgrid.Host.by_name(src).route_to(simgrid.Host.by_name(dst))
    return {"load_s": loaded - start, "resolve_all_s": time.perf_counter() - loaded, "hosts": len(engine.all_hosts),
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
    parser.add_argument("--compile-one", nargs=3, metavar=("SPEC", "XPUS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--load-one", metavar="XML", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_one:
        print(json.dumps(compile_one(args.compile_one[0], int(args.compile_one[1]), args.compile_one[2])))
        return 0
    if args.load_one:
        print(json.dumps(load_one(args.load_one)))
        return 0
    header = (f"{'spec':<18} {'XPUs':>5} {'hosts':>6} {'routes':>7} {'zones':>5} {'build':>7} {'compile':>8} "
              f"{'XML':>8} {'peak':>8} {'load':>7} {'peak':>8}")
    print(header)
    print(f"{'':<18} {'':>5} {'':>6} {'':>7} {'':>5} {'s':>7} {'s':>8} {'MB':>8} {'MB':>8} {'s':>7} {'MB':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for spec in args.specs:
            for count in args.sizes:
                output = str(Path(folder) / f"{spec}-{count}.xml")
                built = _child("--compile-one", spec, str(count), output)
                loaded = _child("--load-one", output)
                print(f"{spec:<18} {count:>5} {loaded['hosts']:>6} {built['routes']:>7} {built['zones']:>5} "
                      f"{built['build_s']:>7.2f} {built['compile_s']:>8.2f} {built['xml_bytes'] / 1e6:>8.1f} "
                      f"{built['compile_peak_rss'] / 1e6:>8.0f} {loaded['load_s']:>7.2f} "
                      f"{loaded['load_peak_rss'] / 1e6:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
