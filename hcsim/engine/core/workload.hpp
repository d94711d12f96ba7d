/* A workload graph as flat arrays, the engine core's input.

   The Python side (hcsim/engine/core/workload.py) lays these out from hcsim.engine.rules (vertex order,
   required counts, groups, collective algorithms and flow phases, compute costs); the core applies the run
   rules (graph contract v2, the flow model's phase rule, the per-XPU clocks) to plain s4u activities.
   All arrays are borrowed from Python buffers. Host numbers index the host names given with the run; the
   delay host is the last one. */
#ifndef HCSIM_ENGINE_CORE_WORKLOAD_HPP
#define HCSIM_ENGINE_CORE_WORKLOAD_HPP

#include "core.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace hcsim::core {

enum VertexKind : std::uint8_t { COMPUTE = 0, COLLECTIVE = 1 };
enum VertexFlag : std::uint8_t { START = 1, RECOMPUTE = 2, CPU_STEP = 4, MOVE = 8 };
enum GroupMode : std::uint8_t { FLOW = 0, ANALYTIC = 1, STEP = 2 };
constexpr int COMM_KINDS = 7;  // hcsim.engine.api.COMM_KINDS, in its order
constexpr int CLOCK_FIELDS = 8 + COMM_KINDS;  // see Clock::record

struct WorkloadArrays {
  std::int32_t iterations = 1;  // the most of any job's
  std::size_t vertices = 0, units = 0, groups = 0, xpus = 0, jobs = 1;
  // vertices (V): kind, START | RECOMPUTE, kind of communication (comm vertices), units and successor edges (CSR)
  const std::uint8_t* v_kind = nullptr;
  const std::uint8_t* v_flags = nullptr;
  const std::uint8_t* v_comm_kind = nullptr;
  const std::int64_t* v_units = nullptr;  // V + 1
  const std::int64_t* v_succs = nullptr;  // V + 1, into the edge arrays (sorted by successor)
  // jobs (J, several jobs on one fabric): each vertex's job, each job's iterations; a job's units stop after its
  // last iteration (the others run on), and each job's iteration ends are recorded on their own
  const std::int32_t* v_job = nullptr;
  const std::int32_t* j_iterations = nullptr;
  // units (U, numbered vertex by vertex: v_units): alike vertices (one per layer and micro-batch) share their
  // units' entries, so each u_ array is a table of rows and a vertex names its first row in it (unit r of
  // vertex v: row v_...row[v] + r). Per vertex: its row in u_xpu, in u_required, in the compute columns
  // (u_flops to u_peer; compute vertices), in u_group (collective vertices), its first group number (each group
  // of each vertex has its own: a collective run's key) and its groups' first row in the g_ tables.
  const std::int64_t* v_xrow = nullptr;
  const std::int64_t* v_rrow = nullptr;
  const std::int64_t* v_crow = nullptr;
  const std::int64_t* v_grow = nullptr;
  const std::int64_t* v_group0 = nullptr;
  const std::int64_t* v_gtab = nullptr;
  // a unit's XPU (clock number, and host number: XPUs are hosts 0..X-1), predecessor completions needed
  // for run 1 and for later runs, compute's execution (FLOPs, 0: none), read (bytes, 0: none) and its
  // source host (local or, spilled on a coherent system, extended memory), FLOPs / FLOP/s (s), a copy
  // before both (spilled without coherence); a collective unit's group among its vertex's (after v_group0, and
  // after v_gtab in the g_ tables)
  const std::int32_t* u_xpu = nullptr;
  const std::int64_t* u_required = nullptr;  // two per row: run 1, later runs
  const double* u_flops = nullptr;
  const double* u_read = nullptr;
  const std::int32_t* u_read_src = nullptr;
  const double* u_compute_s = nullptr;
  const double* u_copy = nullptr;  // bytes copied from u_copy_src before the rest starts (0: none; Fig. 3b)
  const std::int32_t* u_copy_src = nullptr;
  // offload: a CPU_STEP vertex's unit executes u_flops on host u_peer (its CPU) beside a read of u_read bytes
  // from u_read_src to u_peer, not on its XPU; a MOVE vertex's unit copies u_copy bytes u_copy_src -> u_peer
  const std::int32_t* u_peer = nullptr;
  const std::int32_t* u_group = nullptr;
  // edges (E): successor vertex, skip_first_iteration, same rank (unit r -> unit r), where its buckets begin
  // in e_bucket_of (pred units -> bucket, -1: none; unused for same-rank edges)
  const std::int32_t* e_succ = nullptr;
  const std::uint8_t* e_skip = nullptr;
  const std::uint8_t* e_same_rank = nullptr;
  const std::int64_t* e_bucket_of = nullptr;
  const std::int32_t* bucket_of = nullptr;
  const std::int64_t* b_units = nullptr;  // B + 1, into b_unit
  const std::int32_t* b_unit = nullptr;   // successor ranks (units relative to the successor's first)
  // groups: tables of rows, alike vertices' groups sharing theirs (a vertex's g-th group: row v_gtab + g): its
  // first unit after the vertex's first, size, FLOW | ANALYTIC | STEP, seconds (ANALYTIC), plan (FLOW: a flow
  // plan; STEP: a step plan)
  const std::int64_t* g_offset = nullptr;
  const std::int32_t* g_size = nullptr;
  const std::uint8_t* g_mode = nullptr;
  const double* g_seconds = nullptr;
  const std::int32_t* g_plan = nullptr;
  const double* g_call_latency = nullptr;  // s after each rank's last transfer (the roofline model; else 0)
  // the host of the memory device holding the region of a collective through one memory device: its plan's
  // endpoint g_size, after the ranks, with steps of its own at the step model but no unit (-1: none)
  const std::int32_t* g_region = nullptr;
  // plans (P): phases (CSR); phases: lane, steps, transfers (CSR); transfers: hosts, bytes, route latency,
  // feeds (CSR, indices of earlier transfers of the same phase)
  const std::int64_t* p_phases = nullptr;
  const std::int32_t* ph_lane = nullptr;
  const std::int32_t* ph_steps = nullptr;
  const std::int64_t* ph_transfers = nullptr;
  const std::int32_t* t_src = nullptr;
  const std::int32_t* t_dst = nullptr;
  const double* t_bytes = nullptr;
  const double* t_latency = nullptr;
  const std::int64_t* t_feeds = nullptr;
  const std::int32_t* feed = nullptr;
  // step plans (Q): lanes, where its (rank, lane) sequences begin in rl_steps (rank * lanes + lane); each
  // sequence's steps (CSR into the step arrays); a step's sends (CSR: destination rank, bytes) and the
  // number of receives it waits for
  const std::int32_t* q_lanes = nullptr;
  const std::int64_t* q_sequences = nullptr;  // Q + 1
  const std::int64_t* rl_steps = nullptr;     // sequences + 1
  const std::int64_t* st_sends = nullptr;     // steps + 1
  const std::int32_t* st_recvs = nullptr;
  const std::int32_t* sd_dst = nullptr;
  const double* sd_bytes = nullptr;
};

/* Traces (executor's TraceRecorder), in the order the events end: a unit's run, and a transfer of a traced
   XPU's (its label: the vertex's name, or with ".read" or ".copy"). */
struct VertexEvent {
  std::int32_t run;
  std::int64_t unit;
  double start, end;
};
enum Label : std::uint8_t { VERTEX = 0, READ = 1, COPY = 2, MOVED = 3 };
struct TransferEvent {
  std::int32_t run, src, dst, vertex;
  std::uint8_t label;
  double bytes, start, end;
};

/* What a run writes back: iteration ends (iterations entries; iteration k ends when every job that runs k has
   ended it), per job its iteration ends (J * iterations, job j's from j * iterations) and how many ended (J),
   per XPU the clock's fields at the end of its job's iteration 1 and its job's last iteration's end
   (X * CLOCK_FIELDS each), done runs per unit (U); with
   `traced_xpus` (X flags) and `traced_runs` (iterations + 1 flags), the traced events. */
struct WorkloadOutput {
  double* iteration_ends = nullptr;
  double* first = nullptr;
  double* last = nullptr;
  std::int32_t* done_runs = nullptr;
  double* job_ends = nullptr;
  std::int32_t* job_ended = nullptr;
  const std::uint8_t* traced_xpus = nullptr;  // null: trace nothing
  const std::uint8_t* traced_runs = nullptr;
  std::vector<VertexEvent>* vertices = nullptr;
  std::vector<TransferEvent>* transfers = nullptr;
  // called with PROGRESS_EVERY after each PROGRESS_EVERY unit completions (empty: never)
  std::function<void(std::int64_t)> progress;
};

constexpr std::int64_t PROGRESS_EVERY = 1 << 16;

RunCounters run_workload(const WorkloadArrays& w, const std::vector<simgrid::s4u::Host*>& hosts,
                         WorkloadOutput out, std::size_t* iterations_ended);

/* run_workload's loop, to run beside others (core.hpp's run_loops); `w`, `out`'s buffers and `iterations_ended`
   must outlive it. */
std::unique_ptr<Loop> workload_loop(const WorkloadArrays& w, const std::vector<simgrid::s4u::Host*>& hosts,
                                    WorkloadOutput out, std::size_t* iterations_ended);

}  // namespace hcsim::core

#endif
