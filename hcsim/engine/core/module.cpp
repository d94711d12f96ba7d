/* The Python binding of the engine core (pybind11): flat buffers in, flat buffers out.

   Buffers are anything with the buffer protocol (array.array, memoryview, NumPy arrays): one
   dimension, contiguous, of the item type each argument names. The GIL is released while SimGrid
   runs; no Python object is touched inside the run but by the progress callback, which takes the GIL. */
#include "core.hpp"
#include "steps.hpp"
#include "workload.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/version.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <memory>
#include <string>
#include <unordered_set>

namespace py = pybind11;

namespace {

template <typename T> T* view(const py::buffer& buffer, const char* name, std::size_t count, bool writable)
{
  py::buffer_info info = buffer.request(writable);
  const std::string& format = info.format;
  char code = format.empty() ? '?' : format.back();  // "<d", "=q" and "d" alike
  bool integral = std::strchr("bBhHiIlLqQ", code) != nullptr;
  bool is_signed = std::strchr("bhilq", code) != nullptr;
  bool ok = info.itemsize == static_cast<py::ssize_t>(sizeof(T)) &&
            (std::is_floating_point_v<T> ? code == 'd'
                                         : integral && is_signed == std::is_signed_v<T>);
  if (!ok)
    throw py::type_error(std::string(name) + ": expected " + std::to_string(sizeof(T)) + "-byte " +
                         (std::is_floating_point_v<T> ? "floats (array('d'))"
                                                      : std::is_signed_v<T> ? "signed integers"
                                                                            : "unsigned integers") +
                         ", got format '" + format + "' of " + std::to_string(info.itemsize) + " bytes");
  if (info.ndim != 1 || (info.shape[0] > 1 && info.strides[0] != info.itemsize))
    throw py::value_error(std::string(name) + ": expected a contiguous one-dimensional buffer");
  if (static_cast<std::size_t>(info.shape[0]) != count)
    throw py::value_error(std::string(name) + ": expected " + std::to_string(count) + " entries, got " +
                          std::to_string(info.shape[0]));
  return static_cast<T*>(info.ptr);
}

/* The compiled platform's tables (compile.py's CompiledPlatform.tables; core.hpp's PlatformTables), checked:
   lengths, host and link numbers in range. The buffers stay Python's: `platform` outlives the run. */
hcsim::core::PlatformTables platform_tables(const py::dict& platform)
{
  auto item = [&platform](const char* name) {
    if (!platform.contains(name))
      throw py::value_error(std::string("platform: missing table '") + name + "'");
    return platform[name];
  };
  auto size = [&item](const char* name) {
    return static_cast<std::size_t>(item(name).cast<py::buffer>().request().shape[0]);
  };
  hcsim::core::PlatformTables t;
  t.host_names = item("hosts").cast<std::vector<std::string>>();
  t.host_speed = view<double>(item("speeds").cast<py::buffer>(), "speeds", t.host_names.size(), false);
  t.link_names = item("links").cast<std::vector<std::string>>();
  std::size_t links = t.link_names.size();
  t.link_bandwidth = view<double>(item("bandwidths").cast<py::buffer>(), "bandwidths", links, false);
  t.link_latency = view<double>(item("latencies").cast<py::buffer>(), "latencies", links, false);
  t.routes = size("route_src");
  t.route_src = view<std::int32_t>(item("route_src").cast<py::buffer>(), "route_src", t.routes, false);
  t.route_dst = view<std::int32_t>(item("route_dst").cast<py::buffer>(), "route_dst", t.routes, false);
  t.route_offsets =
      view<std::int64_t>(item("route_offsets").cast<py::buffer>(), "route_offsets", t.routes + 1, false);
  std::size_t crossed = static_cast<std::size_t>(t.route_offsets[t.routes]);
  t.route_links = view<std::int32_t>(item("route_links").cast<py::buffer>(), "route_links", crossed, false);
  auto hosts = static_cast<std::int32_t>(t.host_names.size());
  for (std::size_t r = 0; r < t.routes; ++r) {
    if (t.route_src[r] < 0 || t.route_src[r] >= hosts || t.route_dst[r] < 0 || t.route_dst[r] >= hosts)
      throw py::value_error("platform: route " + std::to_string(r) + " names a host out of range");
    if (t.route_offsets[r] < 0 || t.route_offsets[r] > t.route_offsets[r + 1])
      throw py::value_error("platform: route_offsets must not decrease (route " + std::to_string(r) + ")");
  }
  if (t.route_offsets[0] != 0)
    throw py::value_error("platform: route_offsets must start at 0");
  for (std::size_t k = 0; k < crossed; ++k)
    if (t.route_links[k] < 0 || static_cast<std::size_t>(t.route_links[k]) >= 2 * links)
      throw py::value_error("platform: route_links[" + std::to_string(k) + "] names a link out of range");
  return t;
}

/* `run(hosts)` on the process's Engine, made on `platform` (its tables checked first) with the GIL released:
   its counters, with the Engine's set-up time (create, build, seal) beside them. */
template <typename Run>
hcsim::core::RunCounters run_on_engine(const py::dict& platform, const std::vector<std::string>& host_names, Run run,
                                       int clocks = 1)
{
  using namespace hcsim::core;
  PlatformTables tables = platform_tables(platform);
  py::gil_scoped_release unlocked;
  double begin = wall_seconds();
  std::vector<simgrid::s4u::Host*> hosts = start_engine(tables, host_names, clocks);
  double setup = wall_seconds() - begin;
  RunCounters counters = run(hosts);
  counters.setup_s = setup;
  return counters;
}

py::dict counters_dict(const hcsim::core::RunCounters& counters)
{
  py::dict out;
  out["activities"] = counters.activities;
  out["simulated_s"] = counters.simulated_s;
  out["run_s"] = counters.run_s;
  out["run_cpu_s"] = counters.run_cpu_s;
  out["setup_s"] = counters.setup_s;
  return out;
}

template <typename T> const T* field(const py::dict& arrays, const char* name, std::size_t count)
{
  if (!arrays.contains(name))
    throw py::value_error(std::string("run_workload: missing array '") + name + "'");
  return view<T>(arrays[name].cast<py::buffer>(), name, count, false);
}

std::size_t length(const py::dict& arrays, const char* name)
{
  if (!arrays.contains(name))
    throw py::value_error(std::string("run_workload: missing array '") + name + "'");
  return static_cast<std::size_t>(arrays[name].cast<py::buffer>().request().shape[0]);
}

/* Rows [first, first + n) of a table of `rows` rows, for vertex v's units; else a ValueError naming them. */
void within(std::int64_t first, std::int64_t n, std::size_t rows, const char* name, std::size_t v)
{
  if (n < 0 || first < 0 || first + n > static_cast<std::int64_t>(rows))
    throw py::value_error(std::string("run_workload: ") + name + "[" + std::to_string(v) + "]: rows " +
                          std::to_string(first) + " to " + std::to_string(first + n) + " of a table of " +
                          std::to_string(rows));
}

/* A serving loop's input (steps.hpp) from Python: the layout over its buffers (borrowed: the layout dict outlives
   the run), `next_step` and `landed` as the core's callbacks, each taking the GIL for its call, and what either
   raised, to raise again once SimGrid has run out (it stops every loop). Held by a pointer: the callbacks point
   into it.

   Each replica's loop asks `next_step(replica, now, done)` at the end of its step; it answers None (done), a
   number (idle until then; inf: until a handoff lands) or a tuple of floats (a step), or a list [answer,
   handoffs]: the answer and a tuple of floats, the handoff flows to start now (steps.hpp). `landed(tag, now)`, if
   given, is called when a handoff's last flow ends. Layout arrays r_tp, r_xpus, x_host, x_ext, x_dram, and
   optionally h_src, h_dst: the host pairs handoffs may take. */
struct StepsInput {
  hcsim::core::ReplicaLayout layout;
  hcsim::core::NextStep next;
  hcsim::core::Landed landed = nullptr;
  std::optional<py::error_already_set> raised;
  py::object next_step, on_landed;
};

/* A tuple's floats into `out` (a Python error raised again as error_already_set). */
void tuple_floats(PyObject* tuple, std::vector<double>& out)
{
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  out.resize(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(tuple, i));
    if (out[i] == -1.0 && PyErr_Occurred())
      throw py::error_already_set();
  }
}

std::unique_ptr<StepsInput> steps_input(const py::dict& a, const py::object& next_step, const py::object& landed)
{
  using namespace hcsim::core;
  auto array = [&a](const char* name) {
    if (!a.contains(name))
      throw py::value_error(std::string("run_steps: missing array '") + name + "'");
    return a[name].cast<py::buffer>();
  };
  auto input = std::make_unique<StepsInput>();
  input->next_step = next_step;
  input->on_landed = landed;
  ReplicaLayout& layout = input->layout;
  layout.replicas = static_cast<std::size_t>(array("r_tp").request().shape[0]);
  layout.r_tp = view<std::int32_t>(array("r_tp"), "r_tp", layout.replicas, false);
  layout.r_xpus = view<std::int64_t>(array("r_xpus"), "r_xpus", layout.replicas + 1, false);
  std::size_t xpus = static_cast<std::size_t>(array("x_host").request().shape[0]);
  if (layout.r_xpus[0] != 0 || static_cast<std::size_t>(layout.r_xpus[layout.replicas]) != xpus)
    throw py::value_error("run_steps: r_xpus must run from 0 to the " + std::to_string(xpus) + " entries of x_host");
  for (std::size_t r = 0; r < layout.replicas; ++r)
    if (layout.r_xpus[r + 1] < layout.r_xpus[r])
      throw py::value_error("run_steps: r_xpus[" + std::to_string(r + 1) + "] is less than r_xpus[" +
                            std::to_string(r) + "]");
  layout.x_host = view<std::int32_t>(array("x_host"), "x_host", xpus, false);
  layout.x_ext = view<std::int32_t>(array("x_ext"), "x_ext", xpus, false);
  layout.x_dram = view<std::int32_t>(array("x_dram"), "x_dram", xpus, false);
  if (a.contains("h_src")) {
    layout.handoff_pairs = static_cast<std::size_t>(array("h_src").request().shape[0]);
    layout.h_src = view<std::int32_t>(array("h_src"), "h_src", layout.handoff_pairs, false);
    layout.h_dst = view<std::int32_t>(array("h_dst"), "h_dst", layout.handoff_pairs, false);
  }
  StepsInput* in = input.get();
  in->next = [in](std::int32_t replica, double now, std::int64_t done, std::vector<double>& step,
                  std::vector<double>& handoffs) {
    py::gil_scoped_acquire locked;
    try {
      py::object reply = in->next_step(replica, now, done);
      if (PyList_Check(reply.ptr())) {  // [answer, handoffs]
        if (PyList_GET_SIZE(reply.ptr()) != 2 || !PyTuple_Check(PyList_GET_ITEM(reply.ptr(), 1)))
          throw py::cast_error();
        tuple_floats(PyList_GET_ITEM(reply.ptr(), 1), handoffs);
        reply = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(reply.ptr(), 0));
      }
      if (reply.is_none())
        return Reply::DONE;
      PyObject* tuple = reply.ptr();
      if (!PyTuple_Check(tuple)) {
        step.assign(1, reply.cast<double>());  // a number: idle until then (TypeError for anything else)
        return Reply::IDLE;
      }
      tuple_floats(tuple, step);
      return Reply::STEP;
    } catch (py::error_already_set& err) {
      in->raised.emplace(std::move(err));
    } catch (py::cast_error&) {
      PyErr_SetString(PyExc_TypeError, "run_steps: next_step must return None, a number or a tuple of numbers, or "
                                       "a list [that, a tuple of numbers]");
      in->raised.emplace();
    }
    return Reply::STOP;
  };
  if (!landed.is_none())
    in->landed = [in](std::int64_t tag, double now) {
      py::gil_scoped_acquire locked;
      try {
        in->on_landed(tag, now);
        return true;
      } catch (py::error_already_set& err) {
        in->raised.emplace(std::move(err));
      }
      return false;
    };
  return input;
}

/* A workload run (its arrays and outputs as run_workload checked them) and serving steps beside it in one SimGrid
   run on one platform (several jobs on one fabric). `beside`: the serving loop's host_names (its own numbering, as
   run_steps takes them), layout, next_step, analytic, landed (or None) and shared_pairs, the (source, destination)
   host names of the workload's transfers, whose routes' links the serving loop counts as shared (steps_loop).
   Each loop has its own delay host (start_engine). The counters, the workload's activities in them; the serving
   loop's counters in `steps_counters`. */
hcsim::core::RunCounters run_beside(const py::dict& platform, const std::vector<std::string>& host_names,
                                    const hcsim::core::WorkloadArrays& w, const hcsim::core::WorkloadOutput& out,
                                    std::size_t* ended, const py::dict& beside, py::dict& steps_counters)
{
  using namespace hcsim::core;
  for (const char* key : {"host_names", "layout", "next_step", "analytic", "landed", "shared_pairs"})
    if (!beside.contains(key))
      throw py::value_error(std::string("run_workload: beside: missing '") + key + "'");
  auto step_names = beside["host_names"].cast<std::vector<std::string>>();
  auto shared_pairs = beside["shared_pairs"].cast<std::vector<std::pair<std::string, std::string>>>();
  bool analytic = beside["analytic"].cast<bool>();
  std::unique_ptr<StepsInput> input =
      steps_input(beside["layout"].cast<py::dict>(), beside["next_step"], beside["landed"]);
  std::vector<std::string> names = host_names;
  names.insert(names.end(), step_names.begin(), step_names.end());
  std::vector<std::size_t> activities;
  RunCounters counters = run_on_engine(platform, names, [&](const std::vector<simgrid::s4u::Host*>& hosts) {
    auto split = hosts.begin() + static_cast<std::ptrdiff_t>(host_names.size());
    std::vector<simgrid::s4u::Host*> workload_hosts(hosts.begin(), split), step_hosts(split, hosts.end() - 2);
    workload_hosts.push_back(hosts[hosts.size() - 2]);  // each loop its delay host
    step_hosts.push_back(hosts.back());
    std::unordered_set<simgrid::s4u::Link*> crossed;
    for (const auto& [src, dst] : shared_pairs) {
      auto* from = simgrid::s4u::Host::by_name_or_null(src);
      auto* to = simgrid::s4u::Host::by_name_or_null(dst);
      if (from == nullptr || to == nullptr)
        throw std::invalid_argument("run_workload: beside: shared pair (" + src + ", " + dst + ") names a host "
                                    "that is not in the compiled platform");
      std::vector<simgrid::s4u::Link*> links;
      from->route_to(to, links, nullptr);
      crossed.insert(links.begin(), links.end());
    }
    std::vector<simgrid::s4u::Link*> shared(crossed.begin(), crossed.end());
    std::unique_ptr<Loop> workload = workload_loop(w, workload_hosts, out, ended);
    std::unique_ptr<Loop> steps = steps_loop(input->layout, step_hosts, input->next, analytic, input->landed, shared);
    return run_loops({workload.get(), steps.get()}, &activities);
  }, 2);
  if (input->raised)
    throw *input->raised;
  counters.activities = activities[0];
  steps_counters["activities"] = activities[1];
  return counters;
}

py::dict run_workload(const py::dict& platform, const std::vector<std::string>& host_names,
                      const py::dict& a, int iterations, std::size_t xpus, const py::buffer& iteration_ends,
                      const py::buffer& first, const py::buffer& last, const py::buffer& done_runs,
                      const py::object& traced_xpus, const py::object& traced_runs, const py::object& progress,
                      const py::object& job_ends, const py::object& job_ended, const py::object& beside)
{
  using namespace hcsim::core;
  if (iterations < 1)
    throw py::value_error("run_workload: iterations must be >= 1, got " + std::to_string(iterations));
  WorkloadArrays w;
  w.iterations = iterations;
  w.xpus = xpus;
  py::buffer_info kinds = a["v_kind"].cast<py::buffer>().request();
  w.vertices = static_cast<std::size_t>(kinds.shape[0]);
  w.v_kind = field<std::uint8_t>(a, "v_kind", w.vertices);
  w.v_flags = field<std::uint8_t>(a, "v_flags", w.vertices);
  w.v_comm_kind = field<std::uint8_t>(a, "v_comm_kind", w.vertices);
  w.v_units = field<std::int64_t>(a, "v_units", w.vertices + 1);
  w.v_succs = field<std::int64_t>(a, "v_succs", w.vertices + 1);
  w.units = static_cast<std::size_t>(w.v_units[w.vertices]);
  w.jobs = length(a, "j_iterations");
  w.v_job = field<std::int32_t>(a, "v_job", w.vertices);
  w.j_iterations = field<std::int32_t>(a, "j_iterations", w.jobs);
  std::int32_t most = 0;
  for (std::size_t j = 0; j < w.jobs; ++j) {
    if (w.j_iterations[j] < 1 || w.j_iterations[j] > iterations)
      throw py::value_error("run_workload: j_iterations[" + std::to_string(j) + "]: " +
                            std::to_string(w.j_iterations[j]) + " is not in 1.." + std::to_string(iterations));
    most = std::max(most, w.j_iterations[j]);
  }
  if (w.jobs == 0 || most != iterations)
    throw py::value_error("run_workload: iterations must be the most of j_iterations (" + std::to_string(most) + ")");
  for (std::size_t v = 0; v < w.vertices; ++v)
    if (w.v_job[v] < 0 || static_cast<std::size_t>(w.v_job[v]) >= w.jobs)
      throw py::value_error("run_workload: v_job[" + std::to_string(v) + "]: " + std::to_string(w.v_job[v]) +
                            " is not a job (0.." + std::to_string(w.jobs - 1) + ")");
  std::size_t edges = static_cast<std::size_t>(w.v_succs[w.vertices]);
  w.v_xrow = field<std::int64_t>(a, "v_xrow", w.vertices);
  w.v_rrow = field<std::int64_t>(a, "v_rrow", w.vertices);
  w.v_crow = field<std::int64_t>(a, "v_crow", w.vertices);
  w.v_grow = field<std::int64_t>(a, "v_grow", w.vertices);
  w.v_group0 = field<std::int64_t>(a, "v_group0", w.vertices);
  w.v_gtab = field<std::int64_t>(a, "v_gtab", w.vertices);
  std::size_t xrows = length(a, "u_xpu"), rrows = length(a, "u_required") / 2, crows = length(a, "u_flops"),
              grows = length(a, "u_group");
  w.u_xpu = field<std::int32_t>(a, "u_xpu", xrows);
  w.u_required = field<std::int64_t>(a, "u_required", 2 * rrows);
  w.u_flops = field<double>(a, "u_flops", crows);
  w.u_read = field<double>(a, "u_read", crows);
  w.u_read_src = field<std::int32_t>(a, "u_read_src", crows);
  w.u_compute_s = field<double>(a, "u_compute_s", crows);
  w.u_copy = field<double>(a, "u_copy", crows);
  w.u_copy_src = field<std::int32_t>(a, "u_copy_src", crows);
  w.u_peer = field<std::int32_t>(a, "u_peer", crows);
  w.u_group = field<std::int32_t>(a, "u_group", grows);
  w.e_succ = field<std::int32_t>(a, "e_succ", edges);
  w.e_skip = field<std::uint8_t>(a, "e_skip", edges);
  w.e_same_rank = field<std::uint8_t>(a, "e_same_rank", edges);
  w.e_bucket_of = field<std::int64_t>(a, "e_bucket_of", edges);
  std::size_t bucket_of = a["bucket_of"].cast<py::buffer>().request().shape[0];
  w.bucket_of = field<std::int32_t>(a, "bucket_of", bucket_of);
  std::size_t buckets = a["b_units"].cast<py::buffer>().request().shape[0];
  w.b_units = field<std::int64_t>(a, "b_units", buckets);
  w.b_unit = field<std::int32_t>(a, "b_unit", static_cast<std::size_t>(w.b_units[buckets - 1]));
  w.groups = a["g_offset"].cast<py::buffer>().request().shape[0];
  w.g_offset = field<std::int64_t>(a, "g_offset", w.groups);
  w.g_size = field<std::int32_t>(a, "g_size", w.groups);
  w.g_mode = field<std::uint8_t>(a, "g_mode", w.groups);
  w.g_seconds = field<double>(a, "g_seconds", w.groups);
  w.g_plan = field<std::int32_t>(a, "g_plan", w.groups);
  w.g_call_latency = field<double>(a, "g_call_latency", w.groups);
  w.g_region = field<std::int32_t>(a, "g_region", w.groups);
  std::int64_t group_numbers = 0;  // the collective vertices' groups so far: each vertex's numbers come after
  for (std::size_t v = 0; v < w.vertices; ++v) {  // every unit's rows inside the tables
    std::int64_t n = w.v_units[v + 1] - w.v_units[v];
    bool compute = w.v_kind[v] == COMPUTE;
    within(w.v_xrow[v], n, xrows, "v_xrow", v);
    within(w.v_rrow[v], n, rrows, "v_rrow", v);
    within(compute ? w.v_crow[v] : 0, compute ? n : 0, crows, "v_crow", v);
    within(compute ? 0 : w.v_grow[v], compute ? 0 : n, grows, "v_grow", v);
    if (compute)
      continue;
    if (w.v_group0[v] < group_numbers)
      throw py::value_error("run_workload: v_group0[" + std::to_string(v) + "]: " + std::to_string(w.v_group0[v]) +
                            " is a number an earlier vertex's group has (from " + std::to_string(group_numbers) + ")");
    for (std::int64_t r = 0; r < n; ++r) {
      std::int32_t local = w.u_group[w.v_grow[v] + r];
      within(w.v_gtab[v] + local, 1, w.groups, "v_gtab + u_group", v);
      std::int64_t row = w.v_gtab[v] + local;
      within(w.g_offset[row], w.g_size[row], static_cast<std::size_t>(n), "g_offset and g_size", v);
      group_numbers = std::max(group_numbers, w.v_group0[v] + local + 1);
    }
  }
  for (std::size_t g = 0; g < w.groups; ++g)
    if (w.g_region[g] < -1 || w.g_region[g] >= static_cast<std::int32_t>(host_names.size()))
      throw py::value_error("run_workload: g_region[" + std::to_string(g) + "]: " + std::to_string(w.g_region[g]) +
                            " is neither -1 nor a host");
  std::size_t plans = a["p_phases"].cast<py::buffer>().request().shape[0];
  w.p_phases = field<std::int64_t>(a, "p_phases", plans);
  std::size_t phases = static_cast<std::size_t>(w.p_phases[plans - 1]);
  w.ph_lane = field<std::int32_t>(a, "ph_lane", phases);
  w.ph_steps = field<std::int32_t>(a, "ph_steps", phases);
  w.ph_transfers = field<std::int64_t>(a, "ph_transfers", phases + 1);
  std::size_t transfers = static_cast<std::size_t>(w.ph_transfers[phases]);
  w.t_src = field<std::int32_t>(a, "t_src", transfers);
  w.t_dst = field<std::int32_t>(a, "t_dst", transfers);
  w.t_bytes = field<double>(a, "t_bytes", transfers);
  w.t_latency = field<double>(a, "t_latency", transfers);
  w.t_feeds = field<std::int64_t>(a, "t_feeds", transfers + 1);
  w.feed = field<std::int32_t>(a, "feed", static_cast<std::size_t>(w.t_feeds[transfers]));
  std::size_t step_plans = a["q_sequences"].cast<py::buffer>().request().shape[0] - 1;
  w.q_lanes = field<std::int32_t>(a, "q_lanes", step_plans);
  w.q_sequences = field<std::int64_t>(a, "q_sequences", step_plans + 1);
  std::size_t sequences = static_cast<std::size_t>(w.q_sequences[step_plans]);
  w.rl_steps = field<std::int64_t>(a, "rl_steps", sequences + 1);
  std::size_t steps = static_cast<std::size_t>(w.rl_steps[sequences]);
  w.st_sends = field<std::int64_t>(a, "st_sends", steps + 1);
  w.st_recvs = field<std::int32_t>(a, "st_recvs", steps);
  std::size_t sends = static_cast<std::size_t>(w.st_sends[steps]);
  w.sd_dst = field<std::int32_t>(a, "sd_dst", sends);
  w.sd_bytes = field<double>(a, "sd_bytes", sends);
  WorkloadOutput out{view<double>(iteration_ends, "iteration_ends", iterations, true),
                     view<double>(first, "first", xpus * CLOCK_FIELDS, true),
                     view<double>(last, "last", xpus * CLOCK_FIELDS, true),
                     view<std::int32_t>(done_runs, "done_runs", w.units, true)};
  std::vector<double> own_job_ends;  // a caller that gives no job buffers (one job) gets them filled here
  std::vector<std::int32_t> own_job_ended;
  if (job_ends.is_none() || job_ended.is_none()) {
    own_job_ends.assign(w.jobs * iterations, 0.0);
    own_job_ended.assign(w.jobs, 0);
    out.job_ends = own_job_ends.data();
    out.job_ended = own_job_ended.data();
  } else {
    out.job_ends = view<double>(job_ends.cast<py::buffer>(), "job_ends", w.jobs * iterations, true);
    out.job_ended = view<std::int32_t>(job_ended.cast<py::buffer>(), "job_ended", w.jobs, true);
  }
  std::vector<VertexEvent> vertex_events;
  std::vector<TransferEvent> transfer_events;
  if (!traced_xpus.is_none()) {
    out.traced_xpus = view<std::uint8_t>(traced_xpus.cast<py::buffer>(), "traced_xpus", xpus, false);
    out.traced_runs = view<std::uint8_t>(traced_runs.cast<py::buffer>(), "traced_runs", iterations + 1, false);
    out.vertices = &vertex_events;
    out.transfers = &transfer_events;
  }
  if (!progress.is_none())
    out.progress = [&progress](std::int64_t runs) {
      py::gil_scoped_acquire locked;
      try {
        progress(runs);
      } catch (py::error_already_set& err) {  // a progress bar that fails does not stop the run
        err.discard_as_unraisable("hcsim engine core progress callback");
      }
    };
  std::size_t ended = 0;
  RunCounters counters;
  py::dict beside_counters;
  if (beside.is_none()) {
    counters = run_on_engine(platform, host_names, [&](const std::vector<simgrid::s4u::Host*>& hosts) {
      return hcsim::core::run_workload(w, hosts, out, &ended);
    });
  } else {
    counters = run_beside(platform, host_names, w, out, &ended, beside.cast<py::dict>(), beside_counters);
  }
  py::dict result = counters_dict(counters);
  result["iterations_ended"] = ended;
  if (!beside.is_none())
    result["beside"] = beside_counters;
  py::list traced_vertices, traced_transfers;
  for (const auto& e : vertex_events)
    traced_vertices.append(py::make_tuple(e.run, e.unit, e.start, e.end));
  for (const auto& e : transfer_events)
    traced_transfers.append(py::make_tuple(e.run, e.src, e.dst, e.vertex, e.label, e.bytes, e.start, e.end));
  result["vertices"] = traced_vertices;
  result["transfers"] = traced_transfers;
  return result;
}


/* Serving steps (steps.hpp, StepsInput's arguments), every replica's loop in one SimGrid run. An exception
   next_step or landed raises stops every loop and is raised again here once SimGrid has run out. */
py::dict run_steps(const py::dict& platform, const std::vector<std::string>& host_names, const py::dict& a,
                   const py::object& next_step, bool analytic, const py::object& landed)
{
  std::unique_ptr<StepsInput> input = steps_input(a, next_step, landed);
  hcsim::core::RunCounters counters =
      run_on_engine(platform, host_names, [&](const std::vector<simgrid::s4u::Host*>& hosts) {
        return hcsim::core::run_steps(input->layout, hosts, input->next, analytic, input->landed);
      });
  if (input->raised)
    throw *input->raised;
  return counters_dict(counters);
}

/* SimGrid's route of each (source, destination) host pair on the compiled platform: its link names (with
   _UP / _DOWN) and latency (s), as Host::route_to answers them. Starts the process's Engine. */
py::list platform_routes(const py::dict& platform, const std::vector<std::pair<std::string, std::string>>& pairs)
{
  using namespace hcsim::core;
  PlatformTables tables = platform_tables(platform);
  std::vector<std::string> names;
  for (const auto& [src, dst] : pairs) {
    names.push_back(src);
    names.push_back(dst);
  }
  std::vector<simgrid::s4u::Host*> hosts = start_engine(tables, names);
  py::list out;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    std::vector<simgrid::s4u::Link*> links;
    double latency = 0.0;
    hosts[2 * i]->route_to(hosts[2 * i + 1], links, &latency);
    py::list link_names;
    for (const auto* link : links)
      link_names.append(link->get_name());
    out.append(py::make_tuple(link_names, latency));
  }
  return out;
}
}  // namespace

PYBIND11_MODULE(_core, m)
{
  m.doc() = "hcsim's engine core on SimGrid's S4U C++ API (see hcsim/engine/core/__init__.py)";
  m.def("run_workload", &run_workload, py::arg("platform"), py::arg("host_names"), py::arg("arrays"),
        py::arg("iterations"), py::arg("xpus"), py::arg("iteration_ends"), py::arg("first"), py::arg("last"),
        py::arg("done_runs"), py::arg("traced_xpus") = py::none(), py::arg("traced_runs") = py::none(),
        py::arg("progress") = py::none(), py::arg("job_ends") = py::none(), py::arg("job_ended") = py::none(),
        py::arg("beside") = py::none(),
        "Run a workload graph's iterations by the executor's rules (arrays: hcsim/engine/core/workload.py); with "
        "beside (a dict: host_names, layout, next_step, analytic, landed, shared_pairs), serving steps as run_steps "
        "runs them, in the same SimGrid run on the same platform.");
  m.def("run_steps", &run_steps, py::arg("platform"), py::arg("host_names"), py::arg("layout"),
        py::arg("next_step"), py::arg("analytic") = true, py::arg("landed") = py::none(),
        "Run serving replicas' steps, asking next_step(replica, now, done) at each one's end (steps.hpp); with "
        "analytic, a phase nothing else can slow runs as one delay of its time alone; handoffs between replicas "
        "given beside a reply, landed(tag, now) called as each lands.");
  m.def("platform_routes", &platform_routes, py::arg("platform"), py::arg("pairs"),
        "SimGrid's route of each (source, destination) pair on the compiled platform: (link names, latency); "
        "starts the process's Engine (once per process).");
  m.def("engine_started", []() { return simgrid::s4u::Engine::is_initialized(); },
        "Whether this process has made its SimGrid Engine (one per process, ever).");
  m.attr("clock_fields") = hcsim::core::CLOCK_FIELDS;
  m.def("simgrid_version", []() {
    int major = 0, minor = 0, patch = 0;
    sg_version_get(&major, &minor, &patch);
    return py::make_tuple(major, minor, patch);
  }, "The version of the libsimgrid the core runs on: (major, minor, patch).");
  m.attr("header_version") = py::make_tuple(SIMGRID_VERSION_MAJOR, SIMGRID_VERSION_MINOR, SIMGRID_VERSION_PATCH);
}
