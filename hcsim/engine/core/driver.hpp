/* Activities started from completion callbacks in maestro, as the core's loops start them (workload runs:
   executor.cpp; serving steps: steps.cpp), with SimGrid 4.1's two pitfalls handled once (activities.cpp):
   an Exec started in maestro is kept in maestro's list until someone waits for it, so it is detached; and
   a Comm's completion callbacks run with no reference of its own, so each activity keeps the reference taken
   at its start until the next one ends (retire), when no callback of it runs any more. */
#ifndef HCSIM_ENGINE_CORE_DRIVER_HPP
#define HCSIM_ENGINE_CORE_DRIVER_HPP

#include <simgrid/s4u/Activity.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>

#include <cstddef>
#include <functional>
#include <utility>

namespace hcsim::core {

class CallbackDriver {
protected:
  /* `flops` on `host`, then `then()` from its completion callback. */
  void execute(simgrid::s4u::Host* host, double flops, std::function<void()> then)
  {
    ++activities_;
    simgrid::s4u::ExecPtr exec = simgrid::s4u::Exec::init();
    exec->set_flops_amount(flops)->set_host(host);
    exec->on_this_completion_cb([this, then = std::move(then)](simgrid::s4u::Exec const& ended) {
      retire(ended);
      then();
    });
    exec->detach();
    exec->add_ref();  // held until it ends (retire)
  }

  /* Adopt the reference an activity's start took, dropping the one before it. */
  void retire(const simgrid::s4u::Activity& ended)
  {
    retired_ = simgrid::s4u::ActivityPtr(const_cast<simgrid::s4u::Activity*>(&ended), false);
  }

  simgrid::s4u::ActivityPtr retired_;
  std::size_t activities_ = 0;  // started so far
};

}  // namespace hcsim::core

#endif
