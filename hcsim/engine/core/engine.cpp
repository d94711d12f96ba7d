/* The one SimGrid Engine of the process: CM02 with TCP-gamma 0 and no cross-traffic, the compiled platform
   (platform.cpp), root zone sealed. */
#include "core.hpp"

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include <chrono>
#include <ctime>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace sg4 = simgrid::s4u;

namespace hcsim::core {

double wall_seconds()
{
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

double cpu_seconds()
{
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

RunCounters run_engine()
{
  double begin = wall_seconds();
  double begin_cpu = cpu_seconds();
  sg4::Engine::get_instance()->run();
  RunCounters counters;
  counters.run_s = wall_seconds() - begin;
  counters.run_cpu_s = cpu_seconds() - begin_cpu;
  counters.simulated_s = sg4::Engine::get_clock();
  return counters;
}

RunCounters run_loops(const std::vector<Loop*>& loops, std::vector<std::size_t>* activities)
{
  for (Loop* loop : loops)
    loop->start();
  RunCounters counters = run_engine();
  for (Loop* loop : loops) {
    std::size_t started = loop->collect();
    counters.activities += started;
    if (activities != nullptr)
      activities->push_back(started);
  }
  return counters;
}

std::vector<sg4::Host*> start_engine(const PlatformTables& platform, const std::vector<std::string>& host_names,
                                     int clocks)
{
  // SimGrid 4.1 aborts the whole process when a second Engine is created, even after the first has run:
  // refuse here, with an exception, instead.
  static bool started = false;
  if (started || sg4::Engine::is_initialized())
    throw std::logic_error("a SimGrid Engine already exists in this process (SimGrid allows one per process, "
                           "ever): run each simulation in a fresh process");
  started = true;
  static std::vector<std::string> arguments = {"hcsim-core", "--log=root.thres:warning",
                                               "--log=xbt_cfg.thres:warning"};
  static std::vector<char*> argv;
  for (auto& argument : arguments)
    argv.push_back(argument.data());
  argv.push_back(nullptr);
  static int argc = static_cast<int>(arguments.size());
  // Never deleted: the Engine lives as long as the process (SimGrid allows one per process, ever).
  auto* engine = new sg4::Engine(&argc, argv.data());
  // CM02 with TCP-gamma 0 and no cross-traffic: one transfer alone costs latency + size / bandwidth
  // (paper eq. 2). Config is accepted only after the Engine exists and before the platform is loaded.
  for (const char* setting : {"network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"})
    sg4::Engine::set_config(setting);
  std::unordered_map<std::string, sg4::Host*> by_name = build_platform(*engine, platform);
  // delays (driver.hpp): executions on a host of 1 FLOP/s with more cores than delays at once
  std::vector<sg4::Host*> clock_hosts;
  for (int c = 0; c < clocks; ++c) {
    std::string name = c == 0 ? "hcsim:clock" : "hcsim:clock" + std::to_string(c);
    sg4::Host* clock = engine->get_netzone_root()->add_host(name, 1.0);
    clock->set_core_count(1 << 20);
    clock->seal();
    clock_hosts.push_back(clock);
  }
  engine->get_netzone_root()->seal();

  std::vector<sg4::Host*> hosts;
  hosts.reserve(host_names.size());
  for (const auto& name : host_names) {
    auto found = by_name.find(name);
    if (found == by_name.end())
      throw std::invalid_argument("host '" + name + "' is not in the compiled platform");
    hosts.push_back(found->second);
  }
  hosts.insert(hosts.end(), clock_hosts.begin(), clock_hosts.end());
  return hosts;
}

}  // namespace hcsim::core
