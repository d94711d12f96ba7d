/* The Python binding of the engine core (pybind11): flat buffers in, flat buffers out.

   Buffers are anything with the buffer protocol (array.array, memoryview, NumPy arrays): one
   dimension, contiguous, of the item type each argument names. The GIL is released while SimGrid
   runs; no Python object is touched inside the run. */
#include "core.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <simgrid/version.h>

#include <cstring>
#include <stdexcept>
#include <string>

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

py::dict run_graph(const std::string& platform_xml, const std::vector<std::string>& host_names,
                   const py::buffer& kind, const py::buffer& host, const py::buffer& peer, const py::buffer& amount,
                   const py::buffer& pred_offsets, const py::buffer& preds, const py::buffer& start,
                   const py::buffer& end, const std::string& driver)
{
  using namespace hcsim::core;
  if (driver != "callbacks" && driver != "actors")
    throw py::value_error("driver must be 'callbacks' or 'actors', got '" + driver + "'");
  ActivityGraph graph;
  py::buffer_info kinds = kind.request();
  if (kinds.ndim != 1)
    throw py::value_error("kind: expected a one-dimensional buffer");
  graph.n = static_cast<std::size_t>(kinds.shape[0]);
  graph.host_count = host_names.size();
  graph.kind = view<std::uint8_t>(kind, "kind", graph.n, false);
  graph.host = view<std::int32_t>(host, "host", graph.n, false);
  graph.peer = view<std::int32_t>(peer, "peer", graph.n, false);
  graph.amount = view<double>(amount, "amount", graph.n, false);
  graph.pred_offsets = view<std::int64_t>(pred_offsets, "pred_offsets", graph.n + 1, false);
  auto edges = static_cast<std::size_t>(graph.pred_offsets[graph.n]);
  graph.preds = view<std::int32_t>(preds, "preds", edges, false);
  Times times{view<double>(start, "start", graph.n, true), view<double>(end, "end", graph.n, true)};

  RunCounters counters;
  {
    py::gil_scoped_release unlocked;
    check_graph(graph);
    double begin = wall_seconds();
    std::vector<simgrid::s4u::Host*> hosts = start_engine(platform_xml, host_names);
    double setup = wall_seconds() - begin;
    counters = driver == "callbacks" ? run_with_callbacks(graph, hosts, times) : run_with_actors(graph, hosts, times);
    counters.setup_s = setup;
  }
  py::dict out;
  out["activities"] = counters.activities;
  out["simulated_s"] = counters.simulated_s;
  out["run_s"] = counters.run_s;
  out["run_cpu_s"] = counters.run_cpu_s;
  out["setup_s"] = counters.setup_s;
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m)
{
  m.doc() = "hcsim's engine core on SimGrid's S4U C++ API (see hcsim/engine/core/__init__.py)";
  m.def("run_graph", &run_graph, py::arg("platform_xml"), py::arg("host_names"), py::arg("kind"), py::arg("host"),
        py::arg("peer"), py::arg("amount"), py::arg("pred_offsets"), py::arg("preds"), py::arg("start"),
        py::arg("end"), py::arg("driver") = "callbacks",
        "Run an activity graph on a fresh SimGrid Engine (once per process); fills start and end.");
  m.def("simgrid_version", []() {
    int major = 0, minor = 0, patch = 0;
    sg_version_get(&major, &minor, &patch);
    return py::make_tuple(major, minor, patch);
  }, "The version of the libsimgrid the core runs on: (major, minor, patch).");
  m.attr("header_version") = py::make_tuple(SIMGRID_VERSION_MAJOR, SIMGRID_VERSION_MINOR, SIMGRID_VERSION_PATCH);
}
