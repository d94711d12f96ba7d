/* Serving steps on plain s4u activities, driven by completion callbacks in maestro (steps.hpp): one loop per
   replica, asking its scheduler for the next step when the last one ends.

   A replica's step is a chain of phases (host, swap, then per stage: work, all-reduce, send); a phase's
   activities run side by side and the next phase starts from the completion callback of its last one. Only a
   counter per replica joins them: no S4U dependencies, no actor, nothing kept past its activity's end. A
   question to the scheduler is the only time the loop leaves C++ (the caller takes the GIL for it).

   Private phases: a phase whose transfers cross no link that another replica's transfers cross, nor one that
   another transfer of the same phase crosses, cannot be slowed by anything; its time is what SimGrid gives it
   alone (CM02: the route's latency + bytes / its bottleneck bandwidth per transfer, an execution its seconds),
   so it runs as one delay of that time, and the private phases in a row as one delay. A replica all of whose
   phases are private runs a run of steps as one delay (their times summed one by one, as their delays would
   end): one activity per run instead of one per XPU and transfer per step (a 70B model on tp 8 decoding: 26 a
   step), while the phases that can contend are simulated in full. */
#include "driver.hpp"
#include "steps.hpp"

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace sg4 = simgrid::s4u;

namespace hcsim::core {

namespace {

using namespace step;

double now()
{
  return sg4::Engine::get_clock();
}

/* A number as messages show it (std::to_string keeps 6 decimals: 1e-7 s would read 0.000000). */
std::string number(double value)
{
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

const char* const STEP_NAMES[] = {"K", "UNTIL", "HOST_S", "SWAP_BYTES", "STORE_BYTES"};
const char* const STAGE_NAMES[] = {"COMPUTE", "COMPUTE_SLOPE", "LEAD", "LEAD_SLOPE", "SPILL", "SPILL_PAD",
                                   "COPY", "COPY_PAD", "AR", "AR_PAD", "SEND", "SEND_PAD"};

enum class Phase : std::uint8_t { HOST, SWAP, STORE, WORK, ALLREDUCE, SEND };

struct Replica {
  std::int64_t first = 0;  // its first XPU in the layout
  std::int32_t xpus = 0, tp = 1, stages = 1;
  std::vector<double> step;  // the current step's fields
  std::int64_t k = 0, j = 0;  // steps in the run, steps ended
  Phase phase = Phase::HOST;
  std::int32_t stage = 0, pending = 0;
  bool done = false, started = false;  // every loop done; the current step started an activity
  bool receives = false, sends = false;  // a handoff pair's destination (it receives handoffs); its source
  bool waiting = false;                  // it waits for a landing (IDLE until +inf)
  // per phase, whether it is private (the file's comment): swap, store; per stage work, all-reduce, send
  bool swap_private = false, store_private = false, all_private = false;
  std::vector<std::uint8_t> work_private, allreduce_private, send_private;
};

/* A route between two hosts: its latency, bottleneck bandwidth and links. */
struct Route {
  double latency = 0.0, bandwidth = 0.0;
  std::vector<sg4::Link*> links;
};

class StepLoop : CallbackDriver, public Loop {
public:
  StepLoop(const ReplicaLayout& layout, const std::vector<sg4::Host*>& hosts, NextStep next, bool analytic,
           Landed landed, const std::vector<sg4::Link*>& shared)
      : CallbackDriver(hosts), layout_(layout), next_(std::move(next)), landed_(std::move(landed)),
        replicas_(layout.replicas)
  {
    std::unordered_map<std::int32_t, std::int32_t> replica_of;  // an XPU's host -> its replica
    for (std::size_t r = 0; r < layout.replicas; ++r) {
      Replica& replica = replicas_[r];
      replica.first = layout.r_xpus[r];
      replica.xpus = static_cast<std::int32_t>(layout.r_xpus[r + 1] - layout.r_xpus[r]);
      replica.tp = layout.r_tp[r];
      replica.stages = replica.xpus / replica.tp;
      for (std::int32_t i = 0; i < replica.xpus; ++i)
        replica_of[layout.x_host[replica.first + i]] = static_cast<std::int32_t>(r);
    }
    for (std::size_t h = 0; h < layout.handoff_pairs; ++h) {
      auto found = replica_of.find(layout.h_dst[h]);
      if (found != replica_of.end())
        replicas_[found->second].receives = true;
      found = replica_of.find(layout.h_src[h]);
      if (found != replica_of.end())
        replicas_[found->second].sends = true;
    }
    find_private_phases(analytic, shared);
  }

  /* Every replica asked for its first step. */
  void start() override
  {
    for (std::size_t r = 0; r < replicas_.size(); ++r)
      ask(static_cast<std::int32_t>(r));
  }

  /* Throws for a bad answer, a replica that waits for a handoff that never came, or a loop that stopped short. */
  std::size_t collect() override
  {
    if (!error_.empty())
      throw std::invalid_argument(error_);
    for (std::size_t r = 0; r < replicas_.size() && !stopped_; ++r) {
      if (replicas_[r].waiting)  // it waits for a handoff no replica sent
        throw std::invalid_argument("run_steps: replica " + std::to_string(r) + " waits for a handoff that never "
                                    "came (every other loop done, no handoff in flight)");
      if (!replicas_[r].done)  // every loop has an activity in flight until it is done: a bug if not
        throw std::logic_error("run_steps: replica " + std::to_string(r) + "'s loop stopped before it was done");
    }
    return activities_;
  }

private:
  // ---- the loop ------------------------------------------------------------------------------------------------

  void ask(std::int32_t r)
  {
    if (stopped_)
      return;
    Replica& replica = replicas_[r];
    handoffs_.clear();
    Reply reply = next_(r, now(), replica.j, replica.step, handoffs_);
    replica.j = 0;
    if (!handoffs_.empty() && reply != Reply::STOP && !start_handoffs(r))
      return;
    switch (reply) {
      case Reply::DONE:
        replica.done = true;
        return;
      case Reply::STOP:
        stopped_ = true;
        return;
      case Reply::IDLE: {
        double wake = replica.step.empty() ? std::nan("") : replica.step[0];
        if (wake == std::numeric_limits<double>::infinity() && (replica.receives || replica.sends)) {  // a landing
          replica.waiting = true;
          return;
        }
        if (!(wake > now()) || !std::isfinite(wake))
          return fail(r, "idle until " + number(wake) + " s, which is not a finite time after now (" + number(now()) +
                             " s)");
        delay(wake - now(), [this, r]() { ask(r); });
        return;
      }
      case Reply::STEP:
        if (!check(r))
          return;
        replica.k = static_cast<std::int64_t>(replica.step[K]);
        start_step(r);
        return;
    }
  }

  /* Starts the handoffs replica r's answer gave (steps.hpp); false, the error kept, for a bad one. */
  bool start_handoffs(std::int32_t r)
  {
    using namespace handoff;
    const std::vector<double> flows = handoffs_;  // (a landing's question may refill handoffs_)
    std::int64_t count = static_cast<std::int64_t>(hosts_.size()) - 1;
    if (flows.size() % FIELDS) {
      fail(r, "handoffs of " + std::to_string(flows.size()) + " numbers, not " + std::to_string(FIELDS) +
                  " per flow (src, dst, bytes, pad, replica, tag)");
      return false;
    }
    for (std::size_t f = 0; f < flows.size(); f += FIELDS) {
      const double* h = &flows[f];
      auto whole = [](double v, double high) { return std::isfinite(v) && v >= 0 && v < high && v == std::floor(v); };
      const char* bad = !whole(h[SRC], static_cast<double>(count))   ? "SRC (a host)"
                        : !whole(h[DST], static_cast<double>(count)) || h[DST] == h[SRC] ? "DST (another host)"
                        : !(std::isfinite(h[BYTES]) && h[BYTES] >= 0) ? "BYTES (a finite number >= 0)"
                        : !(std::isfinite(h[PAD]) && h[PAD] >= 0)     ? "PAD (a finite number >= 0)"
                        : !whole(h[REPLICA], static_cast<double>(replicas_.size())) ||
                                  !replicas_[static_cast<std::size_t>(h[REPLICA])].receives
                            ? "REPLICA (one whose XPUs a handoff pair reaches)"
                        : !whole(h[TAG], 9007199254740992.0) ? "TAG (a whole number >= 0)" : nullptr;
      if (bad) {
        fail(r, "handoff flow " + std::to_string(f / FIELDS) + ": " + bad);
        return false;
      }
    }
    for (std::size_t f = 0; f < flows.size(); f += FIELDS) {
      const double* h = &flows[f];
      auto tag = static_cast<std::int64_t>(h[TAG]);
      auto& [left, to] = in_flight_[tag];
      ++left;
      to = static_cast<std::int32_t>(h[REPLICA]);
      transfer(static_cast<std::int32_t>(h[SRC]), static_cast<std::int32_t>(h[DST]), h[BYTES], h[PAD],
               [this, tag]() { handoff_flow_done(tag); });
    }
    return true;
  }

  /* A handoff's flow ended: at its last, `landed`, then its replica asked if it waits, or its run ended after its
     current step; then every other replica that waits for a landing asked again, in order (a landing frees what
     its source held, and may be the last one a replica waits for). */
  void handoff_flow_done(std::int64_t tag)
  {
    auto found = in_flight_.find(tag);
    if (--found->second.first > 0)
      return;
    std::int32_t r = found->second.second;
    in_flight_.erase(found);
    if (stopped_)
      return;
    if (landed_ && !landed_(tag, now())) {
      stopped_ = true;
      return;
    }
    Replica& replica = replicas_[r];
    if (replica.done)
      return fail(r, "handoff " + std::to_string(tag) + " landed after the replica said it was done");
    if (replica.waiting) {
      replica.waiting = false;
      ask(r);
    } else if (replica.step.size() > UNTIL && replica.step[UNTIL] > now()) {
      replica.step[UNTIL] = now();  // (a step in flight: the run ends after it)
    }
    for (std::size_t other = 0; other < replicas_.size() && !stopped_; ++other)
      if (replicas_[other].waiting && static_cast<std::int32_t>(other) != r) {
        replicas_[other].waiting = false;
        ask(static_cast<std::int32_t>(other));
      }
  }

  /* Whether replica r's step is well formed; else the error is kept and every loop stops. */
  bool check(std::int32_t r)
  {
    const Replica& replica = replicas_[r];
    const std::vector<double>& s = replica.step;
    std::size_t expected = HEADER_FIELDS + static_cast<std::size_t>(replica.stages) * STAGE_FIELDS;
    if (s.size() != expected) {
      fail(r, "a step of " + std::to_string(s.size()) + " fields; its " + std::to_string(replica.stages) +
                  " stage(s) need " + std::to_string(expected));
      return false;
    }
    for (std::size_t i = 0; i < s.size(); ++i) {
      bool header = i < HEADER_FIELDS;
      int field = header ? static_cast<int>(i) : static_cast<int>((i - HEADER_FIELDS) % STAGE_FIELDS);
      bool slope = !header && (field == COMPUTE_SLOPE || field == LEAD_SLOPE);
      bool ok = header && field == UNTIL ? !std::isnan(s[i]) : std::isfinite(s[i]) && (slope || s[i] >= 0);
      if (header && field == K)
        ok = ok && s[i] >= 1 && s[i] <= 9007199254740992.0 && s[i] == std::floor(s[i]);  // (2^53: exact)
      if (!ok) {
        std::string name = header ? STEP_NAMES[field]
                                  : std::string(STAGE_NAMES[field]) + " of stage " +
                                        std::to_string((i - HEADER_FIELDS) / STAGE_FIELDS);
        fail(r, name + " = " + number(s[i]) +
                    (header && field == K ? " (steps: a whole number >= 1)"
                                          : slope ? " (a finite number)" : " (a finite number >= 0)"));
        return false;
      }
    }
    return true;
  }

  void fail(std::int32_t r, const std::string& what)
  {
    if (error_.empty())
      error_ = "run_steps: replica " + std::to_string(r) + ": " + what;
    stopped_ = true;
  }

  void start_step(std::int32_t r)
  {
    Replica& replica = replicas_[r];
    replica.started = false;
    if (replica.all_private)
      return private_run(r);
    enter(r, Phase::HOST, 0);
  }

  /* A replica whose every phase is private: the run's steps (from the j-th) timed one after the other as they
     would run alone, up to the last the run takes (its k-th, or the first to end at or after UNTIL), and one
     delay of their sum; then the scheduler is asked. */
  void private_run(std::int32_t r)
  {
    Replica& replica = replicas_[r];
    double start = now(), total = 0.0;
    do {
      double step = 0.0;
      for (std::int32_t stage = 0; stage < replica.stages; ++stage)
        for (Phase phase : {Phase::WORK, Phase::ALLREDUCE, Phase::SEND})
          step += alone_time(replica, phase, stage);
      step += alone_time(replica, Phase::HOST, 0) + alone_time(replica, Phase::SWAP, 0) +
              alone_time(replica, Phase::STORE, 0);
      if (!(step > 0))  // a step of nothing would take no time, over and over
        return fail(r, "a step with nothing to run (every amount 0)");
      total += step;
      ++replica.j;
    } while (replica.j < replica.k && start + total < replica.step[UNTIL]);
    delay(total, [this, r]() { ask(r); });
  }

  static void next_phase(const Replica& replica, Phase& phase, std::int32_t& stage)
  {
    switch (phase) {
      case Phase::HOST:
        phase = Phase::SWAP;
        return;
      case Phase::SWAP:
        phase = Phase::STORE;
        return;
      case Phase::STORE:
        phase = Phase::WORK;
        return;
      case Phase::WORK:
        phase = Phase::ALLREDUCE;
        return;
      case Phase::ALLREDUCE:
        phase = Phase::SEND;
        return;
      case Phase::SEND:
        phase = Phase::WORK;
        ++stage;  // == stages: the step's end
        return;
    }
  }

  bool is_private(const Replica& replica, Phase phase, std::int32_t stage) const
  {
    switch (phase) {
      case Phase::HOST:
        return true;  // a delay
      case Phase::SWAP:
        return replica.swap_private;
      case Phase::STORE:
        return replica.store_private;
      case Phase::WORK:
        return replica.work_private[stage];
      case Phase::ALLREDUCE:
        return replica.allreduce_private[stage];
      case Phase::SEND:
        return replica.send_private[stage];
    }
    return false;
  }

  /* The step's phases in order from (phase, stage): the private ones in a row as one delay of their time, then
     the next phase that can contend started, or the step ended; a phase with nothing to do is passed over. */
  void enter(std::int32_t r, Phase phase, std::int32_t stage)
  {
    Replica& replica = replicas_[r];
    if (stopped_)  // the activities in flight end; nothing new starts
      return;
    double alone = 0.0;
    while (stage < replica.stages) {
      if (is_private(replica, phase, stage)) {
        alone += alone_time(replica, phase, stage);
        next_phase(replica, phase, stage);
        continue;
      }
      if (alone > 0) {
        replica.started = true;
        delay(alone, [this, r, phase, stage]() { start(r, phase, stage); });
        return;
      }
      if (start(r, phase, stage))
        return;
      next_phase(replica, phase, stage);
    }
    if (alone > 0) {
      replica.started = true;
      delay(alone, [this, r]() { step_ended(r); });
    } else if (!replica.started) {  // a step of nothing would take no time, over and over
      fail(r, "a step with nothing to run (every amount 0)");
    } else {
      step_ended(r);
    }
  }

  /* Starts the phase's activities; false when it has none (the caller goes on to the next phase; after a delay,
     this does). */
  bool start(std::int32_t r, Phase phase, std::int32_t stage)
  {
    Replica& replica = replicas_[r];
    if (stopped_)
      return true;
    replica.phase = phase;
    replica.stage = stage;
    replica.pending = 0;
    start_phase(r);
    if (replica.pending > 0) {
      replica.started = true;
      return true;
    }
    if (replica.started) {  // after a delay: on from the next phase
      next_phase(replica, phase, stage);
      enter(r, phase, stage);
      return true;
    }
    return false;
  }

  void part_done(std::int32_t r)
  {
    Replica& replica = replicas_[r];
    if (--replica.pending > 0)
      return;
    Phase phase = replica.phase;
    std::int32_t stage = replica.stage;
    next_phase(replica, phase, stage);
    enter(r, phase, stage);
  }

  void step_ended(std::int32_t r)
  {
    Replica& replica = replicas_[r];
    ++replica.j;
    if (stopped_)
      return;
    if (replica.j < replica.k && now() < replica.step[UNTIL])
      return start_step(r);
    ask(r);
  }

  // ---- private phases ------------------------------------------------------------------------------------------

  /* Which phases are private (the file's comment), from the routes of every transfer a phase may run: a link is
     shared when two replicas' transfers cross it, two transfers of one phase do, or it is one of `shared` (links
     another loop's transfers cross: a training job beside the replicas). With `analytic` false, none is (every
     phase simulated in full: the tests compare both). */
  void find_private_phases(bool analytic, const std::vector<sg4::Link*>& shared)
  {
    // per link: the replica that crosses it first, and whether another replica or a second transfer of one
    // phase crosses it too
    struct Use {
      std::int64_t replica = -1, phase = -1;
      bool shared = false;
    };
    std::unordered_map<const sg4::Link*, Use> uses;
    std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> groups;  // per phase group: its transfers
    std::vector<std::pair<std::int32_t, std::int32_t>> owner;               // its replica, kind and stage
    auto each_group = [this](auto&& visit) {
      for (std::size_t r = 0; r < replicas_.size(); ++r) {
        const Replica& replica = replicas_[r];
        std::vector<std::pair<std::int32_t, std::int32_t>> flows;
        for (std::int32_t i = 0; i < replica.xpus; ++i)
          if (layout_.x_dram[replica.first + i] >= 0)
            flows.emplace_back(layout_.x_dram[replica.first + i], xpu(replica, i));
        visit(r, 0, 0, flows);
        for (auto& [memory, to] : flows)  // the stores: the same pairs the other way
          std::swap(memory, to);
        visit(r, 4, 0, flows);
        for (std::int32_t s = 0; s < replica.stages; ++s) {
          flows.clear();
          for (std::int32_t i = 0; i < replica.tp; ++i)
            if (layout_.x_ext[replica.first + s * replica.tp + i] >= 0)
              flows.emplace_back(layout_.x_ext[replica.first + s * replica.tp + i], xpu(replica, s * replica.tp + i));
          visit(r, 1, s, flows);
          flows.clear();
          for (std::int32_t i = 0; replica.tp > 1 && i < replica.tp; ++i)
            flows.emplace_back(xpu(replica, s * replica.tp + i), xpu(replica, s * replica.tp + (i + 1) % replica.tp));
          visit(r, 2, s, flows);
          flows.clear();
          if (s + 1 < replica.stages)
            flows.emplace_back(xpu(replica, s * replica.tp), xpu(replica, (s + 1) * replica.tp));
          visit(r, 3, s, flows);
        }
      }
    };
    for (std::size_t h = 0; h < layout_.handoff_pairs; ++h)  // handoffs run outside any step: shared
      for (const sg4::Link* link : route(layout_.h_src[h], layout_.h_dst[h]).links)
        uses[link].shared = true;
    for (const sg4::Link* link : shared)
      uses[link].shared = true;
    std::int64_t group = 0;
    each_group([&](std::size_t r, int, std::int32_t, const auto& flows) {
      for (const auto& [src, dst] : flows)
        for (const sg4::Link* link : route(src, dst).links) {
          Use& use = uses[link];
          if (use.replica >= 0 && (use.replica != static_cast<std::int64_t>(r) || use.phase == group))
            use.shared = true;
          use.replica = static_cast<std::int64_t>(r);
          use.phase = group;
        }
      ++group;
    });
    each_group([&](std::size_t r, int kind, std::int32_t s, const auto& flows) {
      Replica& replica = replicas_[r];
      bool alone = analytic;
      for (const auto& [src, dst] : flows)
        for (const sg4::Link* link : route(src, dst).links)
          alone = alone && !uses[link].shared;
      if (kind == 0 || kind == 4) {
        (kind == 0 ? replica.swap_private : replica.store_private) = alone;
        return;
      }
      std::vector<std::uint8_t>& flags = kind == 1 ? replica.work_private
                                         : kind == 2 ? replica.allreduce_private : replica.send_private;
      flags.resize(replica.stages);
      flags[s] = alone;
    });
    for (Replica& replica : replicas_) {
      replica.all_private = analytic && replica.swap_private && replica.store_private &&
                            !replica.receives;  // (a landing ends its run)
      for (std::int32_t s = 0; s < replica.stages; ++s)
        replica.all_private = replica.all_private && replica.work_private[s] && replica.allreduce_private[s] &&
                              replica.send_private[s];
    }
  }

  /* What SimGrid gives `bytes` from src to dst alone, `pad` s after the phase begins. */
  double transfer_alone(std::int32_t src, std::int32_t dst, double bytes, double pad)
  {
    const Route& way = route(src, dst);
    return pad + way.latency + bytes / way.bandwidth;
  }

  /* The time of a private phase alone: its longest part (steps.hpp's phases). */
  double alone_time(const Replica& replica, Phase phase, std::int32_t stage)
  {
    const std::vector<double>& s = replica.step;
    double longest = 0.0;
    switch (phase) {
      case Phase::HOST:
        return s[HOST_S];
      case Phase::SWAP:
        for (std::int32_t i = 0; s[SWAP_BYTES] > 0 && i < replica.xpus; ++i)
          if (layout_.x_dram[replica.first + i] >= 0)
            longest = std::max(longest, transfer_alone(layout_.x_dram[replica.first + i], xpu(replica, i),
                                                       s[SWAP_BYTES], 0.0));
        return longest;
      case Phase::STORE:
        for (std::int32_t i = 0; s[STORE_BYTES] > 0 && i < replica.xpus; ++i)
          if (layout_.x_dram[replica.first + i] >= 0)
            longest = std::max(longest, transfer_alone(xpu(replica, i), layout_.x_dram[replica.first + i],
                                                       s[STORE_BYTES], 0.0));
        return longest;
      case Phase::WORK: {
        const double* f = &s[HEADER_FIELDS + stage * STAGE_FIELDS];
        double j = static_cast<double>(replica.j);
        double compute = std::max(0.0, f[COMPUTE] + j * f[COMPUTE_SLOPE]);
        double lead = std::max(0.0, f[LEAD] + j * f[LEAD_SLOPE]);
        for (std::int32_t i = 0; i < replica.tp; ++i) {
          std::int32_t rank = stage * replica.tp + i, ext = layout_.x_ext[replica.first + rank];
          double part = compute;
          if (f[COPY] > 0 && ext >= 0)
            part = transfer_alone(ext, xpu(replica, rank), f[COPY], f[COPY_PAD]) + compute;
          else if (f[SPILL] > 0 && ext >= 0)
            part = std::max(compute, transfer_alone(ext, xpu(replica, rank), f[SPILL], lead + f[SPILL_PAD]));
          longest = std::max(longest, part);
        }
        return longest;
      }
      case Phase::ALLREDUCE: {
        const double* f = &s[HEADER_FIELDS + stage * STAGE_FIELDS];
        for (std::int32_t i = 0; f[AR] > 0 && replica.tp > 1 && i < replica.tp; ++i)
          longest = std::max(longest, transfer_alone(xpu(replica, stage * replica.tp + i),
                                                     xpu(replica, stage * replica.tp + (i + 1) % replica.tp), f[AR],
                                                     f[AR_PAD]));
        return longest;
      }
      case Phase::SEND: {
        const double* f = &s[HEADER_FIELDS + stage * STAGE_FIELDS];
        if (f[SEND] > 0 && stage + 1 < replica.stages)
          return transfer_alone(xpu(replica, stage * replica.tp), xpu(replica, (stage + 1) * replica.tp), f[SEND],
                                f[SEND_PAD]);
        return 0.0;
      }
    }
    return 0.0;
  }

  /* Starts the activities of replica r's current phase, counting them in `pending`. */
  void start_phase(std::int32_t r)
  {
    Replica& replica = replicas_[r];
    const std::vector<double>& s = replica.step;
    auto done = [this, r]() { part_done(r); };
    switch (replica.phase) {
      case Phase::HOST:
        if (s[HOST_S] > 0) {
          ++replica.pending;
          delay(s[HOST_S], done);
        }
        return;
      case Phase::SWAP:
        if (s[SWAP_BYTES] > 0)
          for (std::int32_t i = 0; i < replica.xpus; ++i) {
            std::int32_t dram = layout_.x_dram[replica.first + i];
            if (dram < 0)
              continue;
            ++replica.pending;
            transfer(dram, xpu(replica, i), s[SWAP_BYTES], 0.0, done);
          }
        return;
      case Phase::STORE:
        if (s[STORE_BYTES] > 0)
          for (std::int32_t i = 0; i < replica.xpus; ++i) {
            std::int32_t dram = layout_.x_dram[replica.first + i];
            if (dram < 0)
              continue;
            ++replica.pending;
            transfer(xpu(replica, i), dram, s[STORE_BYTES], 0.0, done);
          }
        return;
      case Phase::WORK: {
        const double* f = &s[HEADER_FIELDS + replica.stage * STAGE_FIELDS];
        double j = static_cast<double>(replica.j);
        double compute = std::max(0.0, f[COMPUTE] + j * f[COMPUTE_SLOPE]);
        double lead = std::max(0.0, f[LEAD] + j * f[LEAD_SLOPE]);
        for (std::int32_t i = 0; i < replica.tp; ++i) {
          std::int32_t rank = replica.stage * replica.tp + i;
          std::int32_t host = xpu(replica, rank), ext = layout_.x_ext[replica.first + rank];
          if (f[COPY] > 0 && ext >= 0) {  // copied into HBM first, then computed
            ++replica.pending;
            transfer(ext, host, f[COPY], f[COPY_PAD], [this, r, host, compute]() {
              if (compute > 0)
                execute(host, compute, [this, r]() { part_done(r); });
              else
                part_done(r);
            });
            continue;
          }
          if (compute > 0) {
            ++replica.pending;
            execute(host, compute, done);
          }
          if (f[SPILL] > 0 && ext >= 0) {  // read in place, beside the compute
            ++replica.pending;
            transfer(ext, host, f[SPILL], lead + f[SPILL_PAD], done);
          }
        }
        return;
      }
      case Phase::ALLREDUCE: {
        const double* f = &s[HEADER_FIELDS + replica.stage * STAGE_FIELDS];
        if (f[AR] <= 0 || replica.tp < 2)
          return;
        for (std::int32_t i = 0; i < replica.tp; ++i) {
          std::int32_t base = replica.stage * replica.tp;
          ++replica.pending;
          transfer(xpu(replica, base + i), xpu(replica, base + (i + 1) % replica.tp), f[AR], f[AR_PAD], done);
        }
        return;
      }
      case Phase::SEND: {
        const double* f = &s[HEADER_FIELDS + replica.stage * STAGE_FIELDS];
        if (f[SEND] <= 0 || replica.stage + 1 >= replica.stages)
          return;
        ++replica.pending;
        transfer(xpu(replica, replica.stage * replica.tp), xpu(replica, (replica.stage + 1) * replica.tp), f[SEND],
                 f[SEND_PAD], done);
        return;
      }
    }
  }

  std::int32_t xpu(const Replica& replica, std::int32_t index) const { return layout_.x_host[replica.first + index]; }

  // ---- activities (as executor.cpp's) --------------------------------------------------------------------------

  void execute(std::int32_t host, double seconds, std::function<void()> then)
  {
    CallbackDriver::execute(host, seconds * speed(host), std::move(then));
  }

  /* `bytes` from host src to host dst, started `pad` s from now. A Comm takes whole bytes: the fraction of a byte
     is timed at the route's bottleneck bandwidth and added to the pad, so the transfer alone takes its
     route's latency + bytes / bandwidth after the pad, as the closed form. */
  void transfer(std::int32_t src, std::int32_t dst, double bytes, double pad, std::function<void()> then)
  {
    double whole = std::floor(bytes);
    if (bytes > whole)
      pad += (bytes - whole) / route(src, dst).bandwidth;
    if (pad > 0) {
      delay(pad, [this, src, dst, whole, then = std::move(then)]() mutable {
        start_comm(src, dst, whole, std::move(then));
      });
      return;
    }
    start_comm(src, dst, whole, std::move(then));
  }

  /* The route from src to dst, looked up once per pair. */
  const Route& route(std::int32_t src, std::int32_t dst)
  {
    std::int64_t key = static_cast<std::int64_t>(src) * static_cast<std::int64_t>(hosts_.size()) + dst;
    auto found = routes_.find(key);
    if (found != routes_.end())
      return found->second;
    Route& way = routes_[key];
    hosts_[src]->route_to(hosts_[dst], way.links, &way.latency);
    way.bandwidth = std::numeric_limits<double>::infinity();
    for (const sg4::Link* link : way.links)
      way.bandwidth = std::min(way.bandwidth, link->get_bandwidth());
    return way;
  }

  const ReplicaLayout& layout_;
  NextStep next_;
  Landed landed_;
  std::vector<Replica> replicas_;
  std::vector<double> handoffs_;
  std::unordered_map<std::int64_t, std::pair<std::int32_t, std::int32_t>> in_flight_;  // tag -> (flows left, replica)
  std::unordered_map<std::int64_t, Route> routes_;
  bool stopped_ = false;
  std::string error_;
};

}  // namespace

std::unique_ptr<Loop> steps_loop(const ReplicaLayout& layout, const std::vector<sg4::Host*>& hosts, NextStep next,
                                 bool analytic, Landed landed, const std::vector<sg4::Link*>& shared)
{
  if (hosts.empty())
    throw std::invalid_argument("run_steps: no hosts (the delay host comes last)");
  std::int64_t count = static_cast<std::int64_t>(hosts.size()) - 1;  // the delay host is no XPU nor memory
  auto host = [count](std::int32_t h, bool optional) { return (optional && h == -1) || (h >= 0 && h < count); };
  for (std::size_t r = 0; r < layout.replicas; ++r) {
    std::int64_t first = layout.r_xpus[r], end = layout.r_xpus[r + 1];
    std::string where = "run_steps: replica " + std::to_string(r);
    if (end <= first || layout.r_tp[r] < 1 || (end - first) % layout.r_tp[r] != 0)
      throw std::invalid_argument(where + ": " + std::to_string(end - first) + " XPUs are not whole stages of tp " +
                                  std::to_string(layout.r_tp[r]));
    for (std::int64_t x = first; x < end; ++x)
      if (!host(layout.x_host[x], false) || !host(layout.x_ext[x], true) || !host(layout.x_dram[x], true) ||
          layout.x_ext[x] == layout.x_host[x] || layout.x_dram[x] == layout.x_host[x])
        throw std::invalid_argument(where + ": XPU entry " + std::to_string(x) + " names a host that is not one of " +
                                    "the " + std::to_string(count) + " given (or its own memory as itself)");
  }
  for (std::size_t h = 0; h < layout.handoff_pairs; ++h)
    if (!host(layout.h_src[h], false) || !host(layout.h_dst[h], false))
      throw std::invalid_argument("run_steps: handoff pair " + std::to_string(h) + " names a host that is not one of "
                                  "the " + std::to_string(count) + " given");
  return std::make_unique<StepLoop>(layout, hosts, std::move(next), analytic, std::move(landed), shared);
}

RunCounters run_steps(const ReplicaLayout& layout, const std::vector<sg4::Host*>& hosts, NextStep next, bool analytic,
                      Landed landed)
{
  std::unique_ptr<Loop> loop = steps_loop(layout, hosts, std::move(next), analytic, std::move(landed), {});
  return run_loops({loop.get()});
}

}  // namespace hcsim::core
