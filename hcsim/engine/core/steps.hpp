/* Serving steps on the engine: one loop per replica, all replicas in one SimGrid run.

   A serving run has no workload graph: what a replica does next depends on when its last step ended (requests
   arrive, finish, are admitted), so its scheduler (Python, hcsim/run/serving.py) is asked step by step. Each
   replica's loop calls `next` at the end of its step; the answer is "done", "idle until u", or a step: the
   replica's activities (compute on its XPUs, KV reads from extended memory, swap copies, TP all-reduce flows,
   pipeline sends) as plain s4u activities started from completion callbacks in maestro. Replicas whose
   activities cross one link share it (CM02's max-min), as a training run's flows do. */
#ifndef HCSIM_ENGINE_CORE_STEPS_HPP
#define HCSIM_ENGINE_CORE_STEPS_HPP

#include "core.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hcsim::core {

/* The replicas' XPUs as flat arrays (borrowed): replica r's XPUs are entries r_xpus[r] .. r_xpus[r+1], stage
   after stage (r_tp[r] per stage, the stage's TP ring in that order); per XPU its host, the host of its extended
   memory (KV blocks beyond HBM) and of its host memory (swapped KV blocks), -1 where it has none. */
struct ReplicaLayout {
  std::size_t replicas = 0;
  const std::int64_t* r_xpus = nullptr;  // replicas + 1
  const std::int32_t* r_tp = nullptr;
  const std::int32_t* x_host = nullptr;
  const std::int32_t* x_ext = nullptr;
  const std::int32_t* x_dram = nullptr;
  // the (source, destination) host pairs a handoff may take (below), borrowed; their routes' links count as
  // shared; a replica one of whose XPUs is a destination receives handoffs, and one with a source sends them
  std::size_t handoff_pairs = 0;
  const std::int32_t* h_src = nullptr;
  const std::int32_t* h_dst = nullptr;
};

/* A step as `next` gives it: a header, then per pipeline stage STAGE_FIELDS numbers. A run of K steps (K >= 1:
   decodes of the same sequences, nothing else possible between them) repeats it, the j-th step (from 0) taking
   COMPUTE + j * COMPUTE_SLOPE and LEAD + j * LEAD_SLOPE; the run ends early after the first step that ends at or
   after UNTIL (s; inf: never), when the next request arrives. One step:
     host     a delay of HOST_S (the host's scheduling work)
     swap     SWAP_BYTES from each XPU's host memory to it (KV blocks swapped in or loaded back), side by side
     store    then STORE_BYTES from each XPU to its host memory (KV blocks swapped out or offloaded), side by side
     stage s  in turn: each XPU of the stage computes COMPUTE seconds (an execution of COMPUTE x its speed), beside
              (coherent extended memory, read in place) SPILL bytes from its extended memory started LEAD +
              SPILL_PAD after the stage begins; or (without coherence) after COPY bytes copied from it, started
              COPY_PAD after the stage begins. Then the TP all-reduces as one flow per rank to the next rank of
              the ring, AR bytes each, started AR_PAD after the computes end; then SEND bytes from the stage's
              first XPU to the next stage's, started SEND_PAD after the all-reduces end.
   A part whose amount is 0 is left out. The pads make a part alone take the closed form's time (latencies the
   flow does not cross once, per-call latencies). A Comm takes whole bytes: a transfer's fraction of a byte is
   timed at its route's bottleneck bandwidth, added to its pad. */
namespace step {  // (names of their own: workload.hpp has a COMPUTE and a COPY)
enum Field : int { K = 0, UNTIL, HOST_S, SWAP_BYTES, STORE_BYTES, HEADER_FIELDS };
enum StageField : int {
  COMPUTE = 0, COMPUTE_SLOPE, LEAD, LEAD_SLOPE, SPILL, SPILL_PAD, COPY, COPY_PAD, AR, AR_PAD, SEND, SEND_PAD,
  STAGE_FIELDS
};
}  // namespace step

/* A handoff as `next` gives it beside its answer (any answer): HANDOFF_FIELDS numbers per flow, started at once and
   running on their own, outside any replica's step: BYTES from host SRC to host DST, started PAD s from now (as
   a step's transfers: a fraction of a byte timed at the route's bottleneck). The flows of one TAG (an integer
   >= 0) are one handoff to replica REPLICA (a prefilled request's KV cache sent to its decode replica, or KV blocks
   prefetched from a tier memory into its XPUs' HBM): when its last flow ends, `landed(tag, now)` is called, and
   the replica, if it waits (IDLE until +inf), is asked again; if it is running a run of steps, the run ends
   after its current step (as at UNTIL). Then every other replica that waits is asked again, in order: a landing
   frees what its source held for it (a prefill replica's KV blocks), and a replica that waits for handoffs
   routed as they come may have no more coming. */
namespace handoff {
enum Field : int { SRC = 0, DST, BYTES, PAD, REPLICA, TAG, FIELDS };
}  // namespace handoff

/* What `next` answered. */
enum class Reply : std::uint8_t { DONE, IDLE, STEP, STOP };

/* Asked at the end of replica `replica`'s step, run or idle time, at simulated time `now`, with the steps of its
   last run that ran (0 after an idle time or at the start); fills `step` (IDLE: one number, the time to wake at,
   +inf: until a handoff lands, for a replica that receives or sends them; STEP: the fields above) and `handoffs` (the
   flows above, to start now; left empty for none) and says which. STOP ends every loop at its next question (the
   caller keeps why). */
using NextStep = std::function<Reply(std::int32_t replica, double now, std::int64_t done, std::vector<double>& step,
                                     std::vector<double>& handoffs)>;

/* Called when a handoff's last flow ends; false stops every loop (the caller keeps why). */
using Landed = std::function<bool(std::int64_t tag, double now)>;

/* Runs every replica's loop to DONE (or STOP) in one SimGrid run; the counters (activities: those SimGrid ran).
   With `analytic`, a phase no other transfer can slow runs as one delay of its time alone (steps.cpp); else every
   phase runs in full. std::invalid_argument for a bad layout or a bad answer (its replica, field and value named). */
RunCounters run_steps(const ReplicaLayout& layout, const std::vector<simgrid::s4u::Host*>& hosts, NextStep next,
                      bool analytic = true, Landed landed = nullptr);

/* run_steps' loop, to run beside others (core.hpp's run_loops): `shared` are links another loop's transfers cross
   (a training job beside the replicas), which no phase has to itself, so a phase that crosses one is simulated in
   full. `layout` must outlive it. */
std::unique_ptr<Loop> steps_loop(const ReplicaLayout& layout, const std::vector<simgrid::s4u::Host*>& hosts,
                                 NextStep next, bool analytic, Landed landed,
                                 const std::vector<simgrid::s4u::Link*>& shared);

}  // namespace hcsim::core

#endif
