/* The executor of paper Fig. 5 on plain s4u activities, driven by completion callbacks in maestro: the one
   copy of its run rules (what follows from the graph and the platform alone comes in the arrays, from
   hcsim/engine/rules.py through hcsim/engine/core/workload.py).

   A unit starts when its predecessors' completions for its next run have all arrived (notify, try_start);
   a completion counts for the successors' units the arrays name, and ends an iteration when every unit has
   run it; with several jobs (v_job), a job's iteration when each of its units has, each job running its own
   iterations (a job that is done stops; the others run on). Events at equal times happen in the order SimGrid reports them. Compute units: an execution
   beside a read of local memory, or the longer of the two when local access is analytic (the arrays say
   which per unit); a read of extended memory beside it, or a copy before it, where data spilled; offload
   CPU steps and moves. Collectives at the flow model (each lane's phases one after the other, a phase
   ending by FlowPhase's rule), at the step model (each rank's lanes step by step) or analytic (one delay).
   Per-XPU clocks split each XPU's time into compute, memory stall, exposed communication by kind and idle.
   The kernel model's times and wire bytes come in the arrays; its per-call latency is a delay after each
   rank's last transfer. */
#include "driver.hpp"
#include "workload.hpp"

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>
#include <simgrid/s4u/Host.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace sg4 = simgrid::s4u;

namespace hcsim::core {

namespace {

double now()
{
  return sg4::Engine::get_clock();
}

/* What one XPU is doing (open compute units and collectives) and its time so far. */
struct Clock {
  // first, in one cache line: what a compute unit's start and end update
  int computing = 0, communicating = 0, waiting = 0;
  double since = 0.0, busy = 0.0;
  double compute = 0.0, stall = 0.0, recompute = 0.0;  // compute, memory stall, recompute s
  double comm = 0.0, idle = 0.0, idle_peers = 0.0;
  std::vector<std::uint8_t> open_kinds;
  double comm_by[COMM_KINDS] = {};
  unsigned present = 0;  // the kinds comm_by holds a key for 

  void advance(double t, int computing_ = 0, int communicating_ = 0, int kind = COMM_KINDS - 1, int waiting_ = 0)
  {
    double span = t - since;
    if (computing) {
      busy += span;
    } else if (communicating) {
      comm += span;
      int first = open_kinds.front();
      comm_by[first] += span;
      present |= 1u << first;
    } else {
      idle += span;
      if (waiting)
        idle_peers += span;
    }
    since = t;
    computing += computing_;
    communicating += communicating_;
    waiting += waiting_;
    if (communicating_ > 0)
      open_kinds.push_back(static_cast<std::uint8_t>(kind));
    else if (communicating_ < 0)
      open_kinds.erase(std::find(open_kinds.begin(), open_kinds.end(), static_cast<std::uint8_t>(kind)));
  }

  /* Advance to t, then busy, comm, idle, idle_peers, compute, stall, recompute, the kinds
     present (a bit mask), comm_by per kind. */
  void record(double t, double* out)
  {
    advance(t);
    double head[8] = {busy, comm, idle, idle_peers, compute, stall, recompute, static_cast<double>(present)};
    std::copy(head, head + 8, out);
    std::copy(comm_by, comm_by + COMM_KINDS, out + 8);
  }
};

class WorkloadRun;

/* A collective run at the flow and analytic models: one run of one group of a collective vertex. */
struct CollectiveRun {
  std::int32_t row = 0, run = 0, vertex = 0;  // row: its group's in the g_ tables
  std::int64_t first = 0;  // its group's first unit
  std::vector<double> start;
  std::vector<std::uint8_t> ready, active, finished_ranks;
  std::int32_t ready_count = 0, finished = 0, lanes_busy = 0;
  struct Lane {
    std::vector<std::int64_t> phases;  // phase numbers, in order
    std::size_t index = 0;
    double begin = 0.0;
    std::vector<double> durations;
    std::int64_t left = 0;
  };
  std::vector<Lane> lanes;
  // the step model (the collective run\'s advance): per (rank, lane) its current step (NOT_READY before
  // the rank is ready, DONE after its last), the sends of it still in flight; per rank its lanes still
  // running; per step of the plan the receives arrived
  std::vector<std::int64_t> step, sends_left;
  std::vector<std::int32_t> lanes_left, arrived;
};

constexpr std::int64_t NOT_READY = -2, DONE = INT64_MAX;

class WorkloadRun : CallbackDriver, public Loop {
public:
  WorkloadRun(const WorkloadArrays& w, const std::vector<sg4::Host*>& hosts, WorkloadOutput out,
              std::size_t* iterations_ended)
      : CallbackDriver(hosts), w_(w), out_(out), iterations_ended_(iterations_ended), units_(w.units),
        arrivals_(w.units * (w.iterations + 1), 0), completed_in_run_(w.iterations + 1, 0),
        units_in_run_(w.iterations + 1, 0), job_units_(w.jobs, 0), completed_in_job_run_(w.jobs * (w.iterations + 1), 0),
        clocks_(w.xpus), xpu_job_(w.xpus, 0)
  {
    for (std::size_t v = 0; v < w.vertices; ++v) {
      job_units_[w.v_job[v]] += w.v_units[v + 1] - w.v_units[v];
      for (std::int64_t u = w.v_units[v]; u < w.v_units[v + 1]; ++u) {
        units_[u].vertex = static_cast<std::int32_t>(v);
        xpu_job_[xpu(u)] = w.v_job[v];
      }
    }
    for (std::size_t j = 0; j < w.jobs; ++j)  // iteration k of the run: every unit of the jobs that run it
      for (std::int32_t run = 1; run <= w.j_iterations[j]; ++run)
        units_in_run_[run] += job_units_[j];
  }

  /* The start vertices' units whose first run needs nothing. */
  void start() override
  {
    for (std::size_t v = 0; v < w_.vertices; ++v)
      if (w_.v_flags[v] & START)
        for (std::int64_t u = w_.v_units[v]; u < w_.v_units[v + 1]; ++u)
          if (required(u, 1) == 0)
            try_start(u);
  }

  /* Done runs, iterations ended and each XPU's clock at its job's last iteration's end (a unit short of its
     runs is the caller's to report: it names the vertices). */
  std::size_t collect() override
  {
    for (std::size_t u = 0; u < w_.units; ++u)
      out_.done_runs[u] = static_cast<std::int32_t>(units_[u].done_runs);
    *iterations_ended_ = ends_;
    for (std::size_t x = 0; x < w_.xpus; ++x) {
      std::int32_t job = xpu_job_[x];
      if (out_.job_ended[job] > 0)
        clocks_[x].record(job_end(job, out_.job_ended[job] - 1), out_.last + x * CLOCK_FIELDS);
    }
    return activities_;
  }

private:
  /* A compute unit's run in flight: what its end needs (its callbacks capture its number in computes_). */
  struct ComputeRun {
    std::int32_t vertex = 0, run = 0, parts = 0;
    std::int64_t unit = 0;
    double begin = 0.0, compute_s = 0.0;  // compute_s: read with the row's other columns at the start
    std::int64_t row = 0;
  };

  struct Send {  // a step-model transfer in flight: its run, ranks, lane and step
    std::int64_t key;
    std::int32_t rank, dst, lane;
    std::int64_t index;
  };
  struct Flow {  // a flow-model transfer in flight: its run, lane and place in its phase
    std::int64_t key;
    std::size_t lane;
    std::int64_t i;
  };

  /* A unit's entries in the tables alike vertices share (workload.hpp): its vertex's row there, plus its rank. */
  std::int64_t row(const std::int64_t* rows, std::int64_t unit) const
  {
    std::int32_t vertex = units_[unit].vertex;
    return rows[vertex] + (unit - w_.v_units[vertex]);
  }
  std::int64_t required(std::int64_t unit, std::int32_t run) const
  {
    return w_.u_required[2 * row(w_.v_rrow, unit) + (run > 1)];
  }
  std::int32_t xpu(std::int64_t unit) const { return w_.u_xpu[row(w_.v_xrow, unit)]; }
  std::int32_t iterations(std::int32_t vertex) const { return w_.j_iterations[w_.v_job[vertex]]; }
  double job_end(std::int32_t job, std::int32_t index) const { return out_.job_ends[job * w_.iterations + index]; }
  std::int64_t compute_row(std::int64_t unit) const { return row(w_.v_crow, unit); }

  void notify(std::int64_t unit, std::int32_t run)
  {
    std::int32_t& count = arrivals_[unit * (w_.iterations + 1) + run];
    if (++count == required(unit, run))
      try_start(unit);
  }

  void try_start(std::int64_t unit)
  {
    UnitState& state = units_[unit];
    if (state.running)
      return;
    std::int32_t run = static_cast<std::int32_t>(state.done_runs) + 1;
    if (run > iterations(state.vertex))
      return;
    std::int64_t needed = required(unit, run);
    std::int32_t& arrived = arrivals_[unit * (w_.iterations + 1) + run];
    if (needed && arrived < needed)
      return;
    arrived = 0;
    state.running = 1;
    std::int32_t vertex = state.vertex;
    if (w_.v_kind[vertex] == COMPUTE) {
      if (!(w_.v_flags[vertex] & CPU_STEP))  // else the XPU waits (idle) while its host CPU computes
        clocks_[xpu(unit)].advance(now(), 1);
      start_compute(vertex, unit, run);
    } else {
      rank_ready(vertex, unit, run);
    }
  }

  bool traced(std::int32_t xpu, std::int32_t run) const
  {
    return out_.traced_xpus != nullptr && out_.traced_xpus[xpu] && out_.traced_runs[run];
  }

  void complete(std::int32_t vertex, std::int64_t unit, std::int32_t run, double start)
  {
    units_[unit].running = 0;
    units_[unit].done_runs = static_cast<std::uint32_t>(run);
    double t = now();
    if (w_.v_kind[vertex] == COMPUTE && !(w_.v_flags[vertex] & CPU_STEP))
      clocks_[xpu(unit)].advance(t, -1);
    if (traced(xpu(unit), run))
      out_.vertices->push_back({run, unit, start, t});
    std::int32_t job = w_.v_job[vertex];
    if (++completed_in_job_run_[job * (w_.iterations + 1) + run] == job_units_[job])
      job_iteration_ended(job, t);
    if (++completed_in_run_[run] == units_in_run_[run])
      out_.iteration_ends[ends_++] = t;
    if (out_.progress && ++completions_ % PROGRESS_EVERY == 0)
      out_.progress(PROGRESS_EVERY);
    std::int64_t rank = unit - w_.v_units[vertex];
    for (std::int64_t e = w_.v_succs[vertex]; e < w_.v_succs[vertex + 1]; ++e) {
      std::int32_t target = run + w_.e_skip[e];
      if (target > iterations(vertex))  // edges join units of one job
        continue;
      std::int64_t first = w_.v_units[w_.e_succ[e]];
      if (w_.e_same_rank[e]) {
        notify(first + rank, target);
        continue;
      }
      std::int32_t bucket = w_.bucket_of[w_.e_bucket_of[e] + rank];
      if (bucket < 0)
        continue;
      for (std::int64_t b = w_.b_units[bucket]; b < w_.b_units[bucket + 1]; ++b)
        notify(first + w_.b_unit[b], target);
    }
    if (run < iterations(vertex))
      try_start(unit);
  }

  /* A compute unit ending now that began before the measured window (the first
     iteration's end) has its compute and stall counted in proportion to its time on each side, the part before
     the window given to the first iteration's record. */
  void before_window(std::size_t x, double begin, double compute, double stall, bool recompute)
  {
    std::int32_t job = xpu_job_[x];
    if (out_.job_ended[job] == 0 || begin >= job_end(job, 0))
      return;
    double share = (job_end(job, 0) - begin) / (now() - begin);
    double* first = out_.first + x * CLOCK_FIELDS;
    first[4] += compute * share;
    first[5] += stall * share;
    if (recompute)
      first[6] += compute * share;
  }

  void job_iteration_ended(std::int32_t job, double t)
  {
    out_.job_ends[job * w_.iterations + out_.job_ended[job]++] = t;
    if (out_.job_ended[job] == 1)  // the job's measured window begins
      for (std::size_t x = 0; x < w_.xpus; ++x)
        if (xpu_job_[x] == job)
          clocks_[x].record(t, out_.first + x * CLOCK_FIELDS);
  }

  // ---- activities ------------------------------------------------------------------------------------------

  /* A transfer; traced when `trace_xpu` is traced in `run`, labelled by `vertex` and
     `label`. */
  void transfer(std::int32_t src, std::int32_t dst, double bytes, std::function<void()> then, std::int32_t run = 0,
                std::int32_t trace_xpu = -1, std::int32_t vertex = 0, Label label = VERTEX)
  {
    if (trace_xpu >= 0 && traced(trace_xpu, run)) {
      double start = now();
      then = [this, then = std::move(then), run, src, dst, vertex, label, bytes, start]() {
        out_.transfers->push_back({run, src, dst, vertex, label, bytes, start, now()});
        then();
      };
    }
    start_comm(src, dst, bytes, std::move(then));
  }


  // ---- compute units -------------------------------------------------

  void start_compute(std::int32_t vertex, std::int64_t unit, std::int32_t run)
  {
    std::int64_t c = compute_row(unit);
    std::int64_t id = computes_.take({vertex, run, 0, unit, now(), w_.u_compute_s[c], c});
    double flops = w_.u_flops[c], read = w_.u_read[c];
    if (w_.v_flags[vertex] & MOVE) {  // an offload copy: u_copy bytes, nothing computed
      transfer(w_.u_copy_src[c], w_.u_peer[c], w_.u_copy[c], [this, id]() { compute_done(id); }, run, xpu(unit),
               vertex, MOVED);
      return;
    }
    if (w_.v_flags[vertex] & CPU_STEP) {  // on the CPU that owns the XPU's host memory, beside reading it
      computes_[id].parts = read > 0 ? 2 : 1;
      auto part = [this, id]() {  // not the XPU's compute: no busy time
        if (--computes_[id].parts == 0)
          step_done(id);
      };
      execute(w_.u_peer[c], flops, part);
      if (read > 0)
        transfer(w_.u_read_src[c], w_.u_peer[c], read, part, run, xpu(unit), vertex, READ);
      return;
    }
    if (w_.u_copy[c] > 0) {  // spilled data without coherence: copied into local memory first
      transfer(w_.u_copy_src[c], xpu(unit), w_.u_copy[c], [this, id]() { compute_beside(id); }, run, xpu(unit),
               vertex, COPY);
      return;
    }
    compute_beside(id);
  }

  /* compute beside: the execution and the read side by side (the Python side has
     already chosen the longer one alone where local access is analytic). */
  void compute_beside(std::int64_t id)
  {
    const ComputeRun& r = computes_[id];
    std::int64_t unit = r.unit;
    std::int32_t run = r.run, vertex = r.vertex;
    double flops = w_.u_flops[r.row], read = w_.u_read[r.row];
    std::int32_t src = w_.u_read_src[r.row];
    int parts = (flops > 0) + (read > 0);
    if (parts == 0) {
      compute_done(id);
      return;
    }
    if (parts == 1) {
      auto finish = [this, id]() { compute_done(id); };
      if (flops > 0)
        execute(xpu(unit), flops, finish);
      else
        transfer(src, xpu(unit), read, finish, run, xpu(unit), vertex, READ);
      return;
    }
    computes_[id].parts = 2;
    auto part = [this, id]() {
      if (--computes_[id].parts == 0)
        compute_done(id);
    };
    execute(xpu(unit), flops, part);
    transfer(src, xpu(unit), read, part, run, xpu(unit), vertex, READ);
  }

  /* A compute unit's end: its time on the XPU's clock (compute, and the stall beyond it), then its completion. */
  void compute_done(std::int64_t id)
  {
    ComputeRun r = computes_.release(id);
    double elapsed = now() - r.begin;
    double compute = r.compute_s;
    Clock& clock = clocks_[xpu(r.unit)];
    double stall = std::max(0.0, elapsed - compute);
    bool recompute = w_.v_flags[r.vertex] & RECOMPUTE;
    clock.compute += compute;
    clock.stall += stall;
    if (recompute)
      clock.recompute += compute;
    before_window(xpu(r.unit), r.begin, compute, stall, recompute);
    complete(r.vertex, r.unit, r.run, r.begin);
  }

  /* An offload CPU step's end: not the XPU's compute, so no time on its clock. */
  void step_done(std::int64_t id)
  {
    ComputeRun r = computes_.release(id);
    complete(r.vertex, r.unit, r.run, r.begin);
  }

  // ---- collectives ------------------------------------------------------

  void rank_ready(std::int32_t vertex, std::int64_t unit, std::int32_t run)
  {
    std::int32_t local = w_.u_group[row(w_.v_grow, unit)];  // the unit's group among its vertex's
    std::int64_t key = (w_.v_group0[vertex] + local) * (w_.iterations + 1) + run;
    auto& slot = collectives_[key];
    if (!slot) {
      slot = fresh_run();
      slot->row = static_cast<std::int32_t>(w_.v_gtab[vertex] + local);
      slot->first = w_.v_units[vertex] + w_.g_offset[slot->row];
      slot->run = run;
      slot->vertex = vertex;
      std::size_t ranks = w_.g_size[slot->row];
      slot->start.assign(ranks, 0.0);
      slot->ready.assign(ranks, 0);
      slot->active.assign(ranks, 0);
      slot->finished_ranks.assign(ranks, 0);
      if (w_.g_mode[slot->row] == STEP) {
        std::int32_t plan = w_.g_plan[slot->row];
        std::int64_t first = w_.q_sequences[plan], end = w_.q_sequences[plan + 1];
        std::size_t endpoints = static_cast<std::size_t>((end - first) / w_.q_lanes[plan]);  // ranks, a region
        slot->step.assign(endpoints * w_.q_lanes[plan], NOT_READY);
        slot->sends_left.assign(endpoints * w_.q_lanes[plan], 0);
        slot->lanes_left.assign(endpoints, 0);
        slot->arrived.assign(w_.rl_steps[end] - w_.rl_steps[first], 0);
        for (std::size_t region = ranks; region < endpoints; ++region)  // the memory device answers from the start
          start_steps(*slot, static_cast<std::int32_t>(region), key);
      }
    }
    ready(*slot, static_cast<std::int32_t>(unit - slot->first), key);
  }

  std::int32_t member(const CollectiveRun& c, std::int32_t rank) const { return xpu(c.first + rank); }

  /* The host of endpoint `e` of a collective run: rank e's XPU, or the region's memory device after the ranks. */
  std::int32_t endpoint(const CollectiveRun& c, std::int32_t e) const
  {
    return e < w_.g_size[c.row] ? member(c, e) : w_.g_region[c.row];
  }

  /* The XPU a transfer between endpoints belongs to in the trace: the rank's (the sender's between ranks). */
  std::int32_t trace_owner(const CollectiveRun& c, std::int32_t src, std::int32_t dst) const
  {
    return endpoint(c, src < w_.g_size[c.row] ? src : dst);
  }

  /* Set off every lane of endpoint `e` at the step model. */
  void start_steps(CollectiveRun& c, std::int32_t e, std::int64_t key)
  {
    std::int32_t lanes = w_.q_lanes[w_.g_plan[c.row]];
    c.lanes_left[e] = lanes;
    for (std::int32_t lane = 0; lane < lanes; ++lane) {
      c.step[e * lanes + lane] = -1;
      advance(key, e, lane);
    }
  }

  void ready(CollectiveRun& c, std::int32_t rank, std::int64_t key)
  {
    double t = c.start[rank] = now();
    if (!c.ready[rank]) {
      c.ready[rank] = 1;
      ++c.ready_count;
    }
    std::int32_t ranks = w_.g_size[c.row];
    bool everyone = c.ready_count == ranks;
    int kind = w_.v_comm_kind[c.vertex];
    if (everyone) {  // waiting for peers ends
      for (std::int32_t other = 0; other < ranks; ++other) {
        int waited = other != rank ? -1 : 0;
        if (!c.finished_ranks[other]) {
          c.active[other] = 1;
          clocks_[member(c, other)].advance(t, 0, 1, kind, waited);
        } else if (waited) {
          clocks_[member(c, other)].advance(t, 0, 0, kind, waited);
        }
      }
    } else {
      clocks_[member(c, rank)].advance(t, 0, 0, kind, 1);
    }
    if (w_.g_mode[c.row] == STEP) {  // each rank sets off on its own
      start_steps(c, rank, key);
      return;
    }
    if (!everyone)
      return;
    if (w_.g_mode[c.row] == FLOW)
      start_flows(c, key);
    else
      delay(w_.g_seconds[c.row], [this, key]() { flows_done(key); });
  }

  // ---- the step model: a rank's lane starts step s+1 once its step s sends are done and its receives arrived

  std::int64_t sequence(const CollectiveRun& c, std::int32_t rank, std::int32_t lane) const
  {
    std::int32_t plan = w_.g_plan[c.row];
    return w_.q_sequences[plan] + static_cast<std::int64_t>(rank) * w_.q_lanes[plan] + lane;
  }

  /* The arrived slot of step `index` of (rank, lane), or -1 when the sequence has no such step. */
  std::int64_t arrived_slot(const CollectiveRun& c, std::int32_t rank, std::int32_t lane, std::int64_t index) const
  {
    std::int64_t seq = sequence(c, rank, lane);
    if (index < 0 || index >= w_.rl_steps[seq + 1] - w_.rl_steps[seq])
      return -1;
    return w_.rl_steps[seq] + index - w_.rl_steps[w_.q_sequences[w_.g_plan[c.row]]];
  }

  bool step_complete(const CollectiveRun& c, std::int32_t rank, std::int32_t lane) const
  {
    std::int32_t lanes = w_.q_lanes[w_.g_plan[c.row]];
    std::int64_t index = c.step[rank * lanes + lane];
    std::int64_t global = w_.rl_steps[sequence(c, rank, lane)] + index;
    return c.sends_left[rank * lanes + lane] == 0 && c.arrived[arrived_slot(c, rank, lane, index)] >= w_.st_recvs[global];
  }

  void advance(std::int64_t key, std::int32_t rank, std::int32_t lane)
  {
    CollectiveRun& c = *collectives_[key];
    std::int32_t lanes = w_.q_lanes[w_.g_plan[c.row]];
    std::int64_t seq = sequence(c, rank, lane);
    std::int64_t count = w_.rl_steps[seq + 1] - w_.rl_steps[seq];
    while (true) {
      std::int64_t index = c.step[rank * lanes + lane] + 1;
      if (index >= count) {
        c.step[rank * lanes + lane] = DONE;
        if (--c.lanes_left[rank] == 0 && rank < w_.g_size[c.row])  // a region's memory device is no rank
          finish(key, rank);
        return;
      }
      std::int64_t global = w_.rl_steps[seq] + index;
      c.step[rank * lanes + lane] = index;
      c.sends_left[rank * lanes + lane] = w_.st_sends[global + 1] - w_.st_sends[global];
      for (std::int64_t s = w_.st_sends[global]; s < w_.st_sends[global + 1]; ++s)
        send(key, rank, w_.sd_dst[s], lane, index, w_.sd_bytes[s]);
      if (!step_complete(c, rank, lane))
        return;
    }
  }

  void send(std::int64_t key, std::int32_t rank, std::int32_t dst, std::int32_t lane, std::int64_t index, double bytes)
  {
    CollectiveRun& c = *collectives_[key];
    std::int64_t id = sends_.take({key, rank, dst, lane, index});
    transfer(endpoint(c, rank), endpoint(c, dst), bytes, [this, id]() { sent(id); }, c.run,
             trace_owner(c, rank, dst), c.vertex);
  }

  void sent(std::int64_t id)
  {
    Send s = sends_.release(id);
    CollectiveRun& run = *collectives_[s.key];
    std::int32_t lanes = w_.q_lanes[w_.g_plan[run.row]];
    --run.sends_left[s.rank * lanes + s.lane];
    std::int64_t slot = arrived_slot(run, s.dst, s.lane, s.index);
    if (slot >= 0)
      ++run.arrived[slot];
    for (std::int32_t who : {s.rank, s.dst}) {
      if (run.step[who * lanes + s.lane] == s.index && step_complete(run, who, s.lane))
        advance(s.key, who, s.lane);
      if (collectives_.find(s.key) == collectives_.end())
        return;  // its last rank finished: the run is over
    }
  }

  /* the collective run\'s finish: the roofline model's per-call latency after the rank's last transfer. */
  void finish(std::int64_t key, std::int32_t rank)
  {
    double latency = w_.g_call_latency[collectives_[key]->row];
    if (latency > 0)
      delay(latency, [this, key, rank]() { finish_rank(key, rank); });
    else
      finish_rank(key, rank);
  }

  /* the collective run\'s finished for one rank; the run is over when every rank is. */
  void finish_rank(std::int64_t key, std::int32_t rank)
  {
    CollectiveRun& c = *collectives_[key];
    ++c.finished;
    c.finished_ranks[rank] = 1;
    if (c.active[rank])
      clocks_[member(c, rank)].advance(now(), 0, -1, w_.v_comm_kind[c.vertex]);
    bool last = c.finished == w_.g_size[c.row];
    complete(c.vertex, c.first + rank, c.run, c.start[rank]);
    if (last) {
      auto done = collectives_.find(key);  // collective_done: its vectors kept for the next run
      spare_runs_.push_back(std::move(done->second));
      collectives_.erase(done);
    }
  }

  void start_flows(CollectiveRun& c, std::int64_t key)
  {
    std::int32_t plan = w_.g_plan[c.row];
    std::vector<std::int32_t> lane_ids;  // in the order lanes first appear
    for (std::int64_t p = w_.p_phases[plan]; p < w_.p_phases[plan + 1]; ++p) {
      if (w_.ph_transfers[p + 1] == w_.ph_transfers[p])
        continue;
      auto found = std::find(lane_ids.begin(), lane_ids.end(), w_.ph_lane[p]);
      std::size_t lane = found - lane_ids.begin();
      if (found == lane_ids.end()) {
        lane_ids.push_back(w_.ph_lane[p]);
        c.lanes.emplace_back();
      }
      c.lanes[lane].phases.push_back(p);
    }
    c.lanes_busy = static_cast<std::int32_t>(c.lanes.size());
    if (c.lanes.empty()) {
      flows_done(key);
      return;
    }
    for (std::size_t lane = 0; lane < c.lanes.size(); ++lane)
      next_phase(key, lane);
  }

  /* Every rank finishes at once (each rank's finish in rank order). With a call
     latency, the ranks' delays would all start now and last as long: one delay stands for them, and its end
     finishes the ranks in rank order, as their delays' ends would. The count of activities stays one delay per rank. */
  void flows_done(std::int64_t key)
  {
    std::int32_t row = collectives_[key]->row;
    std::int32_t ranks = w_.g_size[row];
    double latency = w_.g_call_latency[row];
    if (latency > 0 && ranks > 1) {
      activities_ += ranks - 1;
      delay(latency, [this, key, ranks]() {
        for (std::int32_t rank = 0; rank < ranks; ++rank)
          finish_rank(key, rank);  // the last one ends the run
      });
      return;
    }
    for (std::int32_t rank = 0; rank < ranks; ++rank)
      finish(key, rank);  // the last one may end the run
  }

  void next_phase(std::int64_t key, std::size_t lane_number)
  {
    CollectiveRun& c = *collectives_[key];
    CollectiveRun::Lane& lane = c.lanes[lane_number];
    if (lane.index == lane.phases.size()) {
      if (--c.lanes_busy == 0)
        flows_done(key);
      return;
    }
    std::int64_t phase = lane.phases[lane.index];
    std::int64_t first = w_.ph_transfers[phase], count = w_.ph_transfers[phase + 1] - first;
    lane.begin = now();
    lane.durations.assign(count, 0.0);
    lane.left = count;
    for (std::int64_t i = 0; i < count; ++i) {
      std::int64_t t = first + i;
      transfer(endpoint(c, w_.t_src[t]), endpoint(c, w_.t_dst[t]), w_.t_bytes[t],
               [this, id = flows_.take({key, lane_number, i})]() { flow_done(id); }, c.run,
               trace_owner(c, w_.t_src[t], w_.t_dst[t]), c.vertex);
    }
  }

  void flow_done(std::int64_t id)
  {
    auto [key, lane_number, i] = flows_.release(id);
    CollectiveRun& c = *collectives_[key];
    CollectiveRun::Lane& lane = c.lanes[lane_number];
    double t = now();
    lane.durations[i] = t - lane.begin;
    if (--lane.left > 0)
      return;
    std::int64_t phase = lane.phases[lane.index];
    double extra = lane.begin + phase_time(phase, lane.durations) - t;
    ++lane.index;
    if (extra > 0)
      delay(extra, [this, key, lane_number]() { next_phase(key, lane_number); });
    else
      next_phase(key, lane_number);
  }

  /* How long a phase lasts by FlowPhase's rule, from its transfers' durations. */
  double phase_time(std::int64_t phase, const std::vector<double>& durations)
  {
    double k = w_.ph_steps[phase];
    std::int64_t first = w_.ph_transfers[phase];
    std::size_t n = durations.size();
    step_.assign(n, 0.0);
    fill_.assign(n, 0.0);
    last_.assign(n, 0.0);
    double result = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t t = first + i;
      double alpha = w_.t_latency[t];
      step_[i] = alpha + (durations[i] - alpha) / k;
      double fill = 0.0, last = 0.0;
      bool any = false;
      for (std::int64_t f = w_.t_feeds[t]; f < w_.t_feeds[t + 1]; ++f) {
        std::int32_t j = w_.feed[f];
        fill = any ? std::max(fill, fill_[j] + step_[j]) : fill_[j] + step_[j];
        last = any ? std::max(last, last_[j]) : last_[j];
        any = true;
      }
      fill_[i] = any ? fill : 0.0;
      last_[i] = std::max((any ? last : 0.0) + step_[i], fill_[i] + k * step_[i]);
      result = i == 0 ? last_[i] : std::max(result, last_[i]);
    }
    return result;
  }

  const WorkloadArrays& w_;
  WorkloadOutput out_;
  std::size_t* iterations_ended_;
  struct UnitState {  // together (8 bytes): a unit's start and end read all three
    std::int32_t vertex = 0;
    std::uint32_t done_runs : 31, running : 1;  // done_runs: up to INT32_MAX, as the run's iterations
    UnitState() : done_runs(0), running(0) {}
  };
  static_assert(sizeof(UnitState) == 8, "a unit's state: 8 bytes (at 12, the 131,072-XPU row's peak grew by 0.9 GB)");
  std::vector<UnitState> units_;
  std::vector<std::int32_t> arrivals_;  // (unit, run) -> predecessor completions so far
  std::vector<std::int64_t> completed_in_run_, units_in_run_;  // per run: units that ran it, units that run it
  std::vector<std::int64_t> job_units_, completed_in_job_run_;  // per job: its units; per (job, run): ran it
  std::int64_t completions_ = 0;  // unit completions over the run, for the progress callback
  std::vector<Clock> clocks_;
  std::vector<std::int32_t> xpu_job_;
  std::unordered_map<std::int64_t, std::unique_ptr<CollectiveRun>> collectives_;  // (group, run)
  std::vector<std::unique_ptr<CollectiveRun>> spare_runs_;  // ended runs, reused: no allocations per run

  /* A CollectiveRun as new, an ended one's buffers reused when there is one. */
  std::unique_ptr<CollectiveRun> fresh_run()
  {
    if (spare_runs_.empty())
      return std::make_unique<CollectiveRun>();
    std::unique_ptr<CollectiveRun> c = std::move(spare_runs_.back());
    spare_runs_.pop_back();
    c->ready_count = c->finished = c->lanes_busy = 0;
    c->lanes.clear();
    c->step.clear();
    c->sends_left.clear();
    c->lanes_left.clear();
    c->arrived.clear();
    return c;
  }
  std::vector<double> step_, fill_, last_;
  std::size_t ends_ = 0;
  Slots<ComputeRun> computes_;  // compute units in flight
  Slots<Send> sends_;
  Slots<Flow> flows_;

};

}  // namespace

std::unique_ptr<Loop> workload_loop(const WorkloadArrays& w, const std::vector<sg4::Host*>& hosts, WorkloadOutput out,
                                    std::size_t* iterations_ended)
{
  if (hosts.empty())
    throw std::invalid_argument("run_workload: no hosts (the delay host comes last)");
  return std::make_unique<WorkloadRun>(w, hosts, out, iterations_ended);
}

RunCounters run_workload(const WorkloadArrays& w, const std::vector<sg4::Host*>& hosts, WorkloadOutput out,
                         std::size_t* iterations_ended)
{
  std::unique_ptr<Loop> run = workload_loop(w, hosts, out, iterations_ended);
  return run_loops({run.get()});
}

}  // namespace hcsim::core
