/* An activity graph run with completion callbacks, in SimGrid's maestro: no actor at all.

   Each activity is a plain s4u::Exec or s4u::Comm (Comm::sendto_init, host to host, no mailbox), created
   when it becomes ready and started from the completion callback of its last predecessor; the graph's
   dependencies are counters in arrays, not S4U's own (Activity::add_successor keeps a std::set per
   activity and a vector of references per edge). Only the activities in flight exist at any time. */
#include "core.hpp"

#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>

#include <cmath>
#include <stdexcept>
#include <string>

namespace sg4 = simgrid::s4u;

namespace hcsim::core {

namespace {

std::string activity_name(const ActivityGraph& graph, std::size_t i)
{
  return "activity " + std::to_string(i) + (graph.kind[i] == EXEC ? " (exec)" : " (comm)");
}

/* Successors as CSR, from the predecessors' CSR. */
void successors(const ActivityGraph& graph, std::vector<std::int64_t>& offsets, std::vector<std::int32_t>& next)
{
  offsets.assign(graph.n + 1, 0);
  for (std::int64_t e = 0; e < graph.pred_offsets[graph.n]; ++e)
    ++offsets[graph.preds[e] + 1];
  for (std::size_t i = 0; i < graph.n; ++i)
    offsets[i + 1] += offsets[i];
  next.assign(offsets[graph.n], 0);
  std::vector<std::int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (std::size_t i = 0; i < graph.n; ++i)
    for (std::int64_t e = graph.pred_offsets[i]; e < graph.pred_offsets[i + 1]; ++e)
      next[fill[graph.preds[e]]++] = static_cast<std::int32_t>(i);
}

class CallbackRun {
public:
  CallbackRun(const ActivityGraph& graph, const std::vector<sg4::Host*>& hosts, Times times)
      : graph_(graph), hosts_(hosts), times_(times), waiting_(graph.n), live_(graph.n)
  {
    successors(graph, next_offsets_, next_);
    for (std::size_t i = 0; i < graph.n; ++i)
      waiting_[i] = graph.pred_offsets[i + 1] - graph.pred_offsets[i];
  }

  RunCounters run()
  {
    for (std::size_t i = 0; i < graph_.n; ++i)
      if (waiting_[i] == 0)
        launch(static_cast<std::int32_t>(i));
    RunCounters counters = run_engine();
    counters.activities = ended_;
    if (ended_ != graph_.n)
      throw std::runtime_error(std::to_string(graph_.n - ended_) + " of " + std::to_string(graph_.n) +
                               " activities never ended");
    return counters;
  }

private:
  void launch(std::int32_t i)
  {
    times_.start[i] = sg4::Engine::get_clock();
    sg4::Host* host = hosts_[graph_.host[i]];
    if (graph_.kind[i] == EXEC) {
      sg4::ExecPtr exec = sg4::Exec::init();
      exec->set_flops_amount(graph_.amount[i])->set_host(host);
      exec->on_this_completion_cb([this, i](sg4::Exec const&) { finished(i); });
      // Detached: an Exec created in maestro is otherwise listed among maestro's activities until someone
      // waits for it, which no one does here (about 200 bytes per activity for the whole run).
      exec->detach();
      live_[i] = exec;
    } else {
      // A Comm's size is a whole number of bytes (uint64_t), truncated as SimGrid's CommTask truncates it.
      sg4::CommPtr comm = sg4::Comm::sendto_init(host, hosts_[graph_.peer[i]]);
      comm->set_payload_size(static_cast<std::uint64_t>(graph_.amount[i]));
      comm->on_this_completion_cb([this, i](sg4::Comm const&) { finished(i); });
      comm->start();
      live_[i] = comm;
    }
  }

  void finished(std::int32_t i)
  {
    times_.end[i] = sg4::Engine::get_clock();
    ++ended_;
    // Not released here: SimGrid 4.1's CommImpl::finish fires this callback with no reference of its own,
    // so dropping the last one now would free the Comm while its signal runs. The previous activity's
    // callbacks have all returned by now: release that one instead.
    retired_ = std::move(live_[i]);
    for (std::int64_t e = next_offsets_[i]; e < next_offsets_[i + 1]; ++e)
      if (--waiting_[next_[e]] == 0)
        launch(next_[e]);
  }

  const ActivityGraph& graph_;
  const std::vector<sg4::Host*>& hosts_;
  Times times_;
  std::vector<std::int64_t> waiting_;  // predecessors not ended yet
  std::vector<sg4::ActivityPtr> live_; // the activities in flight (SimGrid frees the others)
  sg4::ActivityPtr retired_;           // the last one ended, released when the next one ends
  std::vector<std::int64_t> next_offsets_;
  std::vector<std::int32_t> next_;
  std::size_t ended_ = 0;
};

}  // namespace

void check_graph(const ActivityGraph& graph)
{
  if (graph.pred_offsets[0] != 0)
    throw std::invalid_argument("pred_offsets[0] must be 0, got " + std::to_string(graph.pred_offsets[0]));
  auto hosts = static_cast<std::int64_t>(graph.host_count);
  for (std::size_t i = 0; i < graph.n; ++i) {
    if (graph.kind[i] != EXEC && graph.kind[i] != COMM)
      throw std::invalid_argument("activity " + std::to_string(i) + ": kind must be 0 (exec) or 1 (comm), got " +
                                  std::to_string(graph.kind[i]));
    if (graph.host[i] < 0 || graph.host[i] >= hosts)
      throw std::invalid_argument(activity_name(graph, i) + ": host " + std::to_string(graph.host[i]) +
                                  " is not one of the " + std::to_string(hosts) + " hosts");
    if (graph.kind[i] == COMM && (graph.peer[i] < 0 || graph.peer[i] >= hosts || graph.peer[i] == graph.host[i]))
      throw std::invalid_argument(activity_name(graph, i) + ": peer " + std::to_string(graph.peer[i]) +
                                  " must be another of the " + std::to_string(hosts) + " hosts");
    if (!(graph.amount[i] >= 0) || !std::isfinite(graph.amount[i]))  // also rejects NaN
      throw std::invalid_argument(activity_name(graph, i) + ": amount must be finite and >= 0, got " +
                                  std::to_string(graph.amount[i]));
    if (graph.pred_offsets[i + 1] < graph.pred_offsets[i])
      throw std::invalid_argument("pred_offsets must not decrease, at activity " + std::to_string(i));
    for (std::int64_t e = graph.pred_offsets[i]; e < graph.pred_offsets[i + 1]; ++e)
      if (graph.preds[e] < 0 || static_cast<std::size_t>(graph.preds[e]) >= graph.n ||
          static_cast<std::size_t>(graph.preds[e]) == i)
        throw std::invalid_argument(activity_name(graph, i) + ": predecessor " + std::to_string(graph.preds[e]) +
                                    " is not another activity");
  }
  // Kahn's algorithm: every activity must become ready, or the graph has a cycle.
  std::vector<std::int64_t> offsets;
  std::vector<std::int32_t> next;
  successors(graph, offsets, next);
  std::vector<std::int64_t> waiting(graph.n);
  std::vector<std::int32_t> ready;
  for (std::size_t i = 0; i < graph.n; ++i)
    if ((waiting[i] = graph.pred_offsets[i + 1] - graph.pred_offsets[i]) == 0)
      ready.push_back(static_cast<std::int32_t>(i));
  std::size_t seen = 0;
  while (!ready.empty()) {
    std::int32_t i = ready.back();
    ready.pop_back();
    ++seen;
    for (std::int64_t e = offsets[i]; e < offsets[i + 1]; ++e)
      if (--waiting[next[e]] == 0)
        ready.push_back(next[e]);
  }
  if (seen != graph.n) {
    std::size_t stuck = 0;
    while (waiting[stuck] == 0)
      ++stuck;
    throw std::invalid_argument("the graph has a cycle: " + std::to_string(graph.n - seen) +
                                " activities can never start, " + activity_name(graph, stuck) + " among them");
  }
}

RunCounters run_with_callbacks(const ActivityGraph& graph, const std::vector<sg4::Host*>& hosts, Times times)
{
  CallbackRun run(graph, hosts, times);
  return run.run();
}

}  // namespace hcsim::core
