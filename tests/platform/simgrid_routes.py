"""Run in a subprocess of its own (SimGrid allows one Engine per process, ever).

Usage: python simgrid_routes.py PLATFORM.xml PAIRS.json
Loads the platform with hcsim's network settings, seals the root zone, and
prints JSON: the host count, the load time and, for each [src, dst] pair, the
SimGrid link names of Host.route_to and the route's latency.
"""

import json
import resource
import sys
import time

from hcsim.engine.simgrid_loader import load

simgrid = load()
platform, pairs_file = sys.argv[1], sys.argv[2]
engine = simgrid.Engine(["simgrid_routes"])
for setting in ("network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"):
    engine.set_config(setting)
start = time.perf_counter()
engine.load_platform(platform)
engine.netzone_root.seal()
load_time = time.perf_counter() - start
with open(pairs_file) as stream:
    pairs = json.load(stream)
routes = []
for src, dst in pairs:
    links, latency = simgrid.Host.by_name(src).route_to(simgrid.Host.by_name(dst))
    routes.append([[link.name for link in links], latency])
print(json.dumps({"hosts": len(engine.all_hosts), "load_time": load_time, "routes": routes,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
