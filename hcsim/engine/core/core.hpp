/* hcsim's engine core on SimGrid 4.1's S4U C++ API: what its translation units share.

   The boundary is data. Python hands over flat arrays (workload.hpp, steps.hpp, PlatformTables) that point
   into its own buffers, the core runs them on plain s4u activities driven from completion callbacks
   (driver.hpp) and writes flat arrays back; no Python object is touched while SimGrid runs but by the
   callbacks that ask (serving steps, progress). One translation unit per concept:
     engine.cpp      the one SimGrid Engine of the process: configuration, platform, host table
     platform.cpp    the compiled platform as SimGrid hosts, links and one zone routing by a table of routes
     executor.cpp    a workload graph's iterations by the executor's rules
     steps.cpp       serving replicas' steps
     module.cpp      the Python binding (pybind11): buffers in and out, errors as Python exceptions */
#ifndef HCSIM_ENGINE_CORE_HPP
#define HCSIM_ENGINE_CORE_HPP

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace simgrid::s4u {
class Engine;
class Host;
class Link;
}

namespace hcsim::core {

struct RunCounters {
  std::size_t activities = 0;  // activities SimGrid ran
  double simulated_s = 0.0;    // the simulated clock when the run ended
  double run_s = 0.0;          // wall time of Engine::run(), s
  double run_cpu_s = 0.0;      // CPU time of this process during Engine::run(), s (steadier on a busy machine)
  double setup_s = 0.0;        // wall time of engine creation, platform load and seal, s
};

/* A compiled platform (hcsim/platform/compile.py, CompiledPlatform.tables), borrowed: every host with its
   speed (FLOP/s), the links the routes cross (full duplex: each direction has the bandwidth, B/s; latency,
   s), and the route of each compiled ordered host pair: route r runs from host route_src[r] to host
   route_dst[r] over the link directions route_links[route_offsets[r] .. route_offsets[r+1]), direction
   2 x link for the link's UP way (from the smaller name to the larger), 2 x link + 1 for its DOWN way. */
struct PlatformTables {
  std::vector<std::string> host_names;
  const double* host_speed = nullptr;
  std::vector<std::string> link_names;
  const double* link_bandwidth = nullptr;
  const double* link_latency = nullptr;
  std::size_t routes = 0;
  const std::int32_t* route_src = nullptr;
  const std::int32_t* route_dst = nullptr;
  const std::int64_t* route_offsets = nullptr;  // routes + 1 entries
  const std::int32_t* route_links = nullptr;    // route_offsets[routes] entries
};

/* Adds `platform` to `engine`'s root zone (platform.cpp); returns its hosts by name. */
std::unordered_map<std::string, simgrid::s4u::Host*> build_platform(simgrid::s4u::Engine& engine,
                                                                    const PlatformTables& platform);

/* Creates the process's SimGrid Engine (once per process: a second call throws std::logic_error),
   sets CM02 with TCP-gamma 0 and no cross-traffic, builds and seals the platform, and returns the hosts
   named in `host_names`, in that order (std::invalid_argument for an unknown name), then `clocks` delay hosts
   ("hcsim:clock", then "hcsim:clock1", ...; 1 FLOP/s, 2^20 cores each: driver.hpp's delays). Loops that run
   together have a delay host each: delays on one host share its CPU model's lazy updates, which move their ends
   in the last bits, so a loop beside another keeps its results alone bit for bit only on a host of its own. */
std::vector<simgrid::s4u::Host*> start_engine(const PlatformTables& platform,
                                              const std::vector<std::string>& host_names, int clocks = 1);

/* Wall clock and this process's CPU time in s, for the counters. */
double wall_seconds();
double cpu_seconds();

/* Runs SimGrid until no activity is left: the counters' simulated clock and Engine::run()'s wall and CPU
   time (the activities are the driver's to count). */
RunCounters run_engine();

/* A loop of activities on the engine (a workload graph's run: executor.cpp; serving replicas' steps: steps.cpp),
   split around the one SimGrid run so that loops run side by side on one platform (several jobs on one fabric):
   start() starts its first activities; collect(), after SimGrid has run out, writes its results and checks that
   it ended as it should (throwing if not), returning the activities it started. */
class Loop {
public:
  virtual ~Loop() = default;
  virtual void start() = 0;
  virtual std::size_t collect() = 0;
};

/* Starts each loop in order, runs SimGrid once, collects each in order: the counters, and each loop's
   activities in `activities` (their sum in the counters). */
RunCounters run_loops(const std::vector<Loop*>& loops, std::vector<std::size_t>* activities = nullptr);

}  // namespace hcsim::core

#endif
