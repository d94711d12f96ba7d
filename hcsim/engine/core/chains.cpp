/* The same activities driven by S4U actors: one actor per chain, waiting on each activity in turn.

   In C++ an actor is a user-level context (SimGrid's default raw contexts), not an OS thread as in
   SimGrid's Python API; this driver exists to measure that cost against the completion callbacks of
   activities.cpp on the same activities (benchmarks/engine_speed.py, case simgrid-cpp). It accepts only
   graphs made of chains, where a blocking wait expresses every dependency. */
#include "core.hpp"

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>

#include <memory>
#include <stdexcept>
#include <string>

namespace sg4 = simgrid::s4u;

namespace hcsim::core {

RunCounters run_with_actors(const ActivityGraph& graph, const std::vector<sg4::Host*>& hosts, Times times)
{
  std::vector<std::int32_t> next(graph.n, -1);
  for (std::size_t i = 0; i < graph.n; ++i) {
    std::int64_t count = graph.pred_offsets[i + 1] - graph.pred_offsets[i];
    if (count > 1)
      throw std::invalid_argument("the actor driver runs chains only: activity " + std::to_string(i) + " has " +
                                  std::to_string(count) + " predecessors");
    if (count == 1) {
      std::int32_t pred = graph.preds[graph.pred_offsets[i]];
      if (next[pred] != -1)
        throw std::invalid_argument("the actor driver runs chains only: activity " + std::to_string(pred) +
                                    " has more than one successor");
      next[pred] = static_cast<std::int32_t>(i);
    }
  }
  auto ended = std::make_shared<std::size_t>(0);
  for (std::size_t first = 0; first < graph.n; ++first) {
    if (graph.pred_offsets[first + 1] != graph.pred_offsets[first])
      continue;
    sg4::Host* home = hosts[graph.host[first]];
    home->add_actor("chain" + std::to_string(first), [&graph, &hosts, times, &next, ended, first]() {
      for (auto i = static_cast<std::int32_t>(first); i != -1; i = next[i]) {
        times.start[i] = sg4::Engine::get_clock();
        if (graph.kind[i] == EXEC)
          sg4::Exec::init()->set_flops_amount(graph.amount[i])->set_host(hosts[graph.host[i]])->start()->wait();
        else
          sg4::Comm::sendto_init(hosts[graph.host[i]], hosts[graph.peer[i]])
              ->set_payload_size(static_cast<std::uint64_t>(graph.amount[i]))
              ->start()
              ->wait();
        times.end[i] = sg4::Engine::get_clock();
        ++*ended;
      }
    });
  }
  RunCounters counters = run_engine();
  counters.activities = *ended;
  if (*ended != graph.n)
    throw std::runtime_error(std::to_string(graph.n - *ended) + " of " + std::to_string(graph.n) +
                             " activities never ended");
  return counters;
}

}  // namespace hcsim::core
