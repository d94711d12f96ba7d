/* The ceiling of an engine on SimGrid's C++ S4U API: plain activities, no hcsim in the loop.

   Every XPU of a compiled ring platform runs a chain of `per_chain` activities, alternately an execution of
   `flops` on its host and a transfer of `bytes` to its ring neighbour (Comm::sendto_init, no mailbox), each
   started when the one before it ends. Two drivers: `callbacks` starts each from the completion callback of
   the one before, in maestro (no actor: how hcsim's engine core runs, hcsim/engine/core/driver.hpp, with its
   two SimGrid 4.1 pitfalls handled the same way), and `actors` runs one S4U actor per chain, blocking on each.
   The SimGrid set-up is the core's (engine.cpp): CM02, TCP-gamma 0, no cross-traffic, root zone sealed.

   Built and run by benchmarks/engine_speed.py (cases simgrid-cpp and simgrid-cpp-actors), which prints each
   case's activities/s against this one's. Usage:
     simgrid_ceiling PLATFORM.xml XPUS PER_CHAIN FLOPS BYTES callbacks|actors
   prints one JSON object: activities, run_s, run_cpu_s, simulated_s. */
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {

struct Chains {
  std::vector<sg4::Host*> hosts;
  long per_chain = 0;
  double flops = 0.0, bytes = 0.0;
  long ended = 0;
  sg4::ActivityPtr retired;  // each activity's own reference, dropped when the next one ends

  /* Step `step` of chain `x`, then the next from its completion callback. */
  void launch(std::size_t x, long step)
  {
    if (step == per_chain)
      return;
    auto then = [this, x, step](sg4::Activity const& done) {
      retired = sg4::ActivityPtr(const_cast<sg4::Activity*>(&done), false);
      ++ended;
      launch(x, step + 1);
    };
    if (step % 2 == 0) {
      sg4::ExecPtr exec = sg4::Exec::init();
      exec->set_flops_amount(flops)->set_host(hosts[x]);
      exec->on_this_completion_cb([then](sg4::Exec const& done) { then(done); });
      exec->detach();  // else maestro keeps it in its list until someone waits for it
      exec->add_ref();
    } else {
      sg4::CommPtr comm = sg4::Comm::sendto_init(hosts[x], hosts[(x + 1) % hosts.size()]);
      comm->set_payload_size(static_cast<std::uint64_t>(bytes));
      comm->on_this_completion_cb([then](sg4::Comm const& done) { then(done); });
      comm->start();
      comm->add_ref();  // its completion callbacks run with no reference of its own
    }
  }

  void actor(std::size_t x)
  {
    sg4::Host* next = hosts[(x + 1) % hosts.size()];
    for (long step = 0; step < per_chain; ++step) {
      if (step % 2 == 0)
        sg4::Exec::init()->set_flops_amount(flops)->set_host(hosts[x])->start()->wait();
      else
        sg4::Comm::sendto_init(hosts[x], next)->set_payload_size(static_cast<std::uint64_t>(bytes))->start()->wait();
      ++ended;
    }
  }
};

double wall_seconds()
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s PLATFORM.xml XPUS PER_CHAIN FLOPS BYTES callbacks|actors\n", argv[0]);
    return 2;
  }
  const std::string driver = argv[6];
  if (driver != "callbacks" && driver != "actors") {
    std::fprintf(stderr, "driver: expected callbacks or actors, got %s\n", argv[6]);
    return 2;
  }
  Chains chains;
  chains.per_chain = std::stol(argv[3]);
  chains.flops = std::stod(argv[4]);
  chains.bytes = std::stod(argv[5]);
  int sg_argc = 3;
  char name[] = "simgrid-ceiling", quiet[] = "--log=root.thres:warning", quiet_cfg[] = "--log=xbt_cfg.thres:warning";
  char* sg_argv[] = {name, quiet, quiet_cfg, nullptr};
  sg4::Engine engine(&sg_argc, sg_argv);
  for (const char* setting : {"network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"})
    sg4::Engine::set_config(setting);
  engine.load_platform(argv[1]);
  engine.get_netzone_root()->seal();
  const long xpus = std::stol(argv[2]);
  for (long x = 0; x < xpus; ++x)
    chains.hosts.push_back(engine.host_by_name("xpu" + std::to_string(x)));
  for (std::size_t x = 0; x < chains.hosts.size(); ++x) {
    if (driver == "callbacks")
      chains.launch(x, 0);
    else
      chains.hosts[x]->add_actor("chain" + std::to_string(x), [&chains, x]() { chains.actor(x); });
  }
  double begin = wall_seconds();
  std::clock_t begin_cpu = std::clock();
  engine.run();
  double run_s = wall_seconds() - begin;
  double run_cpu_s = static_cast<double>(std::clock() - begin_cpu) / CLOCKS_PER_SEC;
  std::printf("{\"activities\": %ld, \"run_s\": %.6f, \"run_cpu_s\": %.6f, \"simulated_s\": %.17g}\n", chains.ended,
              run_s, run_cpu_s, sg4::Engine::get_clock());
  return chains.ended == xpus * chains.per_chain ? 0 : 1;
}
