/* Activities started from completion callbacks in maestro, as the core's loops start them (workload runs:
   executor.cpp; serving steps: steps.cpp), with SimGrid 4.1's two pitfalls handled once:
   an Exec started in maestro is kept in maestro's list until someone waits for it, so it is detached; and
   a Comm's completion callbacks run with no reference of its own, so each activity keeps the reference taken
   at its start until the next one ends (retire), when no callback of it runs any more.

   An execution alone on its host runs as a kernel timer, not an activity: nothing shares it, so its end is
   known at its start (start + flops / speed, the date SimGrid's CPU model gives an Exec alone on a host), and a
   timer costs a heap entry where an Exec costs an activity, an action, a variable of the CPU model and its
   solves (GPT-3 175B on 1,024 A100: Engine::run 13.3 s -> 6.4 s). When a second execution starts beside a
   timed one, the timed one goes on as an Exec of the FLOPs it has left and the host's executions share it as
   Execs until none is left, so shared hosts keep SimGrid's CPU model. Delays stay Execs on the clock host
   (1 FLOP/s, a core each): a timer would end them at start + seconds exactly, where SimGrid's lazy updates of
   the clock host's shared actions move their ends in the last bits, and the committed results hold those bits. */
#ifndef HCSIM_ENGINE_CORE_DRIVER_HPP
#define HCSIM_ENGINE_CORE_DRIVER_HPP

#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u/Activity.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

namespace hcsim::core {

/* Records of what callbacks need, by number, numbers of released ones reused: a callback captures `this` and a
   number (16 bytes, held in std::function's own buffer) instead of its state (a heap allocation per callback). */
template <typename T>
class Slots {
public:
  std::int64_t take(const T& value)
  {
    if (free_.empty()) {
      items_.push_back(value);
      return static_cast<std::int64_t>(items_.size()) - 1;
    }
    std::int64_t id = free_.back();
    free_.pop_back();
    items_[id] = value;
    return id;
  }
  /* The record, its number free from now. */
  T release(std::int64_t id)
  {
    free_.push_back(id);
    return items_[id];
  }
  T& operator[](std::int64_t id) { return items_[id]; }

private:
  std::vector<T> items_;
  std::vector<std::int64_t> free_;
};

class CallbackDriver {
protected:
  /* `hosts`: the run's hosts by number, the clock host last. */
  explicit CallbackDriver(const std::vector<simgrid::s4u::Host*>& hosts)
      : hosts_(hosts), clock_host_(hosts.back()), loads_(hosts.size())
  {
    for (std::size_t h = 0; h < hosts.size(); ++h)
      loads_[h].speed = hosts[h]->get_speed();
    static const bool connected = [] {  // once per process: every driver's activities end through these
      simgrid::s4u::Comm::on_completion_cb([](simgrid::s4u::Comm const& ended) { end(ended); });
      simgrid::s4u::Exec::on_completion_cb([](simgrid::s4u::Exec const& ended) { end(ended); });
      return true;
    }();
    (void)connected;
  }

  /* `flops` on host number `host`, then `then()` when they are done: a timer while the host computes nothing
     else. */
  void execute(std::int32_t host, double flops, std::function<void()> then)
  {
    ++activities_;
    HostLoad& load = loads_[host];
    if (load.execs == 0 && load.timer == nullptr) {
      load.end = simgrid::s4u::Engine::get_clock() + flops / load.speed;
      load.then = std::move(then);
      load.timer = simgrid::kernel::timer::Timer::set(load.end, [&load]() {
        load.timer = nullptr;
        std::function<void()> done = std::move(load.then);
        done();
      });
      return;
    }
    if (load.timer != nullptr) {  // shared from now: the timed execution goes on as an Exec of what it has left
      load.timer->remove();
      load.timer = nullptr;
      start_exec(hosts_[host], &load, (load.end - simgrid::s4u::Engine::get_clock()) * load.speed, std::move(load.then));
    }
    start_exec(hosts_[host], &load, flops, std::move(then));
  }

  /* The FLOP/s of host number `host`. */
  double speed(std::int32_t host) const { return loads_[host].speed; }

  /* `bytes` from host number `src` to host number `dst`, then `then()` when they have arrived. A Comm's size is a
     whole number of bytes, truncated as SimGrid's CommTask truncates it. */
  void start_comm(std::int32_t src, std::int32_t dst, double bytes, std::function<void()> then)
  {
    ++activities_;
    simgrid::s4u::CommPtr comm = simgrid::s4u::Comm::sendto_init(hosts_[src], hosts_[dst]);
    comm->set_payload_size(static_cast<std::uint64_t>(bytes));
    comm->set_data(hold(nullptr, std::move(then)));
    comm->start();
    comm->add_ref();  // its completion callbacks run with no reference of its own: held until the next ends
  }

  /* `then()` `seconds` from now (the module comment says why an Exec). */
  void delay(double seconds, std::function<void()> then)
  {
    ++activities_;
    start_exec(clock_host_, nullptr, seconds, std::move(then));
  }

  std::size_t activities_ = 0;  // started so far
  const std::vector<simgrid::s4u::Host*> hosts_;  // by host number, the clock host last (8 bytes a host: a transfer's
                                                 // ends are read from here, not from the larger HostLoads)

private:
  struct HostLoad;

  /* What follows an activity's end: kept in the activity's user data (one completion callback for every
     activity, connected by the first driver, instead of a callback per activity: no allocation per activity for
     it). Records are reused. */
  struct Pending {
    CallbackDriver* owner = nullptr;
    HostLoad* load = nullptr;  // an Exec's host load (none for a Comm or a delay)
    std::function<void()> then;
    Pending* next_free = nullptr;
  };

  Pending* hold(HostLoad* load, std::function<void()> then)
  {
    Pending* p = free_;
    if (p != nullptr)
      free_ = p->next_free;
    else
      p = &pending_.emplace_back();
    p->owner = this;
    p->load = load;
    p->then = std::move(then);
    return p;
  }

  /* An activity of a driver's ended (other activities of the process carry no Pending). */
  static void end(const simgrid::s4u::Activity& ended)
  {
    auto* p = ended.get_data<Pending>();
    if (p != nullptr)
      p->owner->ended(ended, p);
  }

  void ended(const simgrid::s4u::Activity& activity, Pending* p)
  {
    retire(activity);
    if (p->load != nullptr)
      --p->load->execs;
    std::function<void()> then = std::move(p->then);
    p->next_free = free_;
    free_ = p;
    then();
  }

  /* Adopt the reference an activity's start took, dropping the one before it. */
  void retire(const simgrid::s4u::Activity& ended)
  {
    retired_ = simgrid::s4u::ActivityPtr(const_cast<simgrid::s4u::Activity*>(&ended), false);
  }

  /* A host's executions: the one timed (timer set), or how many run as Execs. */
  struct HostLoad {
    double speed = 0.0;
    simgrid::kernel::timer::Timer* timer = nullptr;
    double end = 0.0;
    std::function<void()> then;
    int execs = 0;
  };

  /* An Exec of `flops` on `host`, counted in `load` (none for the clock host) while it runs. */
  void start_exec(simgrid::s4u::Host* host, HostLoad* load, double flops, std::function<void()> then)
  {
    if (load != nullptr)
      ++load->execs;
    simgrid::s4u::ExecPtr exec = simgrid::s4u::Exec::init();
    exec->set_flops_amount(flops)->set_host(host);
    exec->set_data(hold(load, std::move(then)));
    exec->detach();
    exec->add_ref();  // held until it ends (retire)
  }

  std::deque<Pending> pending_;  // records never move
  Pending* free_ = nullptr;
  simgrid::s4u::ActivityPtr retired_;
  simgrid::s4u::Host* clock_host_;
  std::vector<HostLoad> loads_;  // by host number (sized once: references to its entries stay valid)
};

}  // namespace hcsim::core

#endif
